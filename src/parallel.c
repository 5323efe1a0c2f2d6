/* Host layout work on all cores.
 *
 * A large gather or conversion is cut into bands, which go to a small
 * persistent pool of worker threads and to the caller, who takes bands too
 * and returns when the last one is done. The bands cut the outermost
 * dimension when it is long enough to give every thread several, or one
 * index each to nearly every thread (a batch of planes: each band one or
 * more whole planes). A job whose outermost dimension is shorter (the 3
 * planes of an HWC -> CHW deinterleave or normalization, a batch of fewer
 * planes than threads) is cut along the next one instead, every band
 * taking all of the outermost: its output is then a strip of every plane,
 * written in place (ab__host_gather_into, ab__host_convert_into), and the
 * pixel kernels still take the channels whole. Workers start on first need, are shared by every
 * calling thread (a job waits in a queue; the caller works on its own job
 * meanwhile, so nothing waits for an idle worker), stop at ab_shutdown
 * and when the library is unloaded, and are re-created after fork. */
#include "parallel.h"
#include "element.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "converters/host/gather.h"
#include "internal.h"

#define MAX_THREADS 64
#define BANDS_PER_THREAD 4 /* so a slow thread does not hold the rest up */
#define MIN_STRIP 8192

/* ---- AB_NUM_THREADS, AB_PARALLEL_MIN ------------------------------------- */

static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint env_generation; /* of the values below; 0: never read */
static atomic_int env_threads;
static atomic_size_t env_min;

/* AB_NUM_THREADS and AB_PARALLEL_MIN, read once and again after
 * ab__env_reload (tests). */
static void read_env(void) {
  pthread_mutex_lock(&env_lock);
  const unsigned gen = ab__env_generation();
  if (atomic_load_explicit(&env_generation, memory_order_relaxed) != gen) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    n = (int)ab__env_int("AB_NUM_THREADS", n, 1, MAX_THREADS);
    /* Bytes of result each thread gets at least: a move of fewer than
     * twice this stays on the caller's thread. 256 KiB: on the Intel Xeon
     * (Cascade Lake) VM, two threads against one in six rounds, 512 KiB
     * transposes ran 1.15-1.89x (one round 0.83x), 1 MiB ones 1.70-2.08x
     * (one round 0.67x), 1 MiB copies 1.52-1.87x in four, and float32 ->
     * float16 of 1 and 2 MiB 1.3-2.3x, where 1 MiB a thread (set on the
     * EPYC VM, which measured no size below it) kept them all on one;
     * 256 KiB transposes split in two ran 0.6-1.0x, so not below that
     * (bench/results/2026-11-27-intel-threads-threshold.md). The staging
     * ring's copies split down to 256 KiB already (RING_PART). */
    uint64_t m = ab__env_size("AB_PARALLEL_MIN", (uint64_t)256 << 10, 0, SIZE_MAX, "256KiB");
    atomic_store_explicit(&env_min, m == 0 ? 1 : (size_t)m, memory_order_relaxed);
    atomic_store_explicit(&env_threads, n, memory_order_relaxed);
    atomic_store_explicit(&env_generation, gen, memory_order_release);
  }
  pthread_mutex_unlock(&env_lock);
}

int ab__num_threads(void) {
  if (AB_UNLIKELY(atomic_load_explicit(&env_generation, memory_order_acquire) != ab__env_generation())) read_env();
  return atomic_load_explicit(&env_threads, memory_order_relaxed);
}

size_t ab__parallel_min(void) {
  if (AB_UNLIKELY(atomic_load_explicit(&env_generation, memory_order_acquire) != ab__env_generation())) read_env();
  return atomic_load_explicit(&env_min, memory_order_relaxed);
}

/* ab_convert_opts.threads of the conversion this thread is running. */
static _Thread_local uint32_t call_threads;

uint32_t ab__parallel_call_threads(uint32_t n) {
  uint32_t prev = call_threads;
  call_threads = n;
  return prev;
}

int ab__parallel_threads(void) {
  const int t = call_threads == 0 ? ab__num_threads() : (int)call_threads;
  return t > MAX_THREADS ? MAX_THREADS : t;
}

/* ---- bands ------------------------------------------------------------------- */

struct job {
  const ab__host_job *work;
  int cut;             /* the dim the bands cut: 0, or 1 (then all of dim 0 in each) */
  int64_t band;        /* indices of dim `cut` per band */
  int64_t nbands;
  atomic_llong next;   /* the next band to claim */
  int active;          /* workers inside the job (under lock) */
  struct job *queued;  /* the queue's next job (under lock) */
};

static size_t out_size(const ab__host_job *w) {
  return w->op != NULL ? ab__elsize(w->op->to) : w->es;
}

/* The bytes a whole job reads and writes: its source and its result. */
static size_t whole_bytes(const ab__host_job *w) {
  size_t whole = w->op != NULL ? ab__elsize(w->op->from) + ab__elsize(w->op->to) : w->es * 2;
  for (int32_t i = 0; i < w->ndim; i++) whole *= (size_t)w->shape[i];
  return whole;
}

/* Bands of a gather tell it the bytes of the whole job (its source and
 * output), which decide how a large transpose writes (gather.h); bands
 * of a cast, likewise, which decide how the cast writes (convert.h). */
static void run_whole(const ab__host_job *w, char *dst, const char *src, const int64_t *shape, const ab__cast_op *op) {
  if (op != NULL) {
    ab__host_convert_into(dst, 0, src, w->ndim, shape, w->byte_strides, op, whole_bytes(w));
    return;
  }
  ab__host_gather_part(dst, src, w->ndim, shape, w->byte_strides, w->es, whole_bytes(w));
}

/* Band b: indices [b * band, ...) of dim `cut`, a sub-array of its own.
 * Cutting dim 0, its output is one compact piece of the result's; cutting
 * dim 1, a strip of every index of dim 0, written where the whole's
 * compact layout puts it. */
static void run_band(const struct job *j, int64_t b) {
  const ab__host_job *w = j->work;
  const int c = j->cut;
  const int64_t b0 = b * j->band;
  const size_t osz = out_size(w);
  int64_t shape[AB_MAX_NDIM], inner = 1;
  for (int32_t i = c + 1; i < w->ndim; i++) inner *= w->shape[i];
  memcpy(shape, w->shape, (size_t)w->ndim * sizeof shape[0]);
  shape[c] = w->shape[c] - b0 < j->band ? w->shape[c] - b0 : j->band;
  char *d = w->dst + (size_t)(b0 * inner) * osz;
  const char *src = w->src + b0 * w->byte_strides[c];
  int64_t dst_st[AB_MAX_NDIM], acc = (int64_t)osz; /* the whole output's, compact */
  for (int32_t i = w->ndim - 1; i >= 0; i--) {
    dst_st[i] = acc;
    acc *= w->shape[i];
  }
  if (c == 1 && w->op == NULL) {
    ab__host_gather_into(d, dst_st, src, w->ndim, shape, w->byte_strides, w->es, whole_bytes(w));
    return;
  }
  if (w->op == NULL) {
    run_whole(w, d, src, shape, NULL);
    return;
  }
  /* The channel arrays from this band's first channel on. */
  ab__cast_op op = *w->op;
  if (op.affine && op.channel_dim == c) {
    if (op.channel_scale != NULL) op.channel_scale += b0;
    if (op.channel_offset != NULL) op.channel_offset += b0;
  }
  if (c == 1) {
    ab__host_convert_into(d, dst_st[0], src, w->ndim, shape, w->byte_strides, &op, whole_bytes(w));
    return;
  }
  run_whole(w, d, src, shape, &op);
}

static void work_on(struct job *j) {
  for (;;) {
    const long long b = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (b >= j->nbands) return;
    run_band(j, (int64_t)b);
  }
}

/* ---- the workers -------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static struct job *queue; /* jobs that may have bands left */
static pthread_t workers[MAX_THREADS];
static int nworkers;
static bool stopping;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Under lock: takes j out of the queue if it is still there. */
static void unqueue(struct job *j) {
  for (struct job **l = &queue; *l != NULL; l = &(*l)->queued)
    if (*l == j) {
      *l = j->queued;
      return;
    }
}

static void *worker_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!stopping && queue == NULL) pthread_cond_wait(&work_cv, &lock);
    if (stopping) break;
    struct job *j = queue;
    j->active++;
    pthread_mutex_unlock(&lock);
    work_on(j);
    pthread_mutex_lock(&lock);
    unqueue(j); /* every band is claimed: nobody else need come */
    if (--j->active == 0) pthread_cond_broadcast(&done_cv);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* fork: the child has none of the parent's workers; it starts its own on
 * demand, with a lock and conditions of its own. */
static void atfork_prepare(void) { pthread_mutex_lock(&lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&lock); }
static void atfork_child(void) {
  pthread_mutex_init(&lock, NULL);
  pthread_cond_init(&work_cv, NULL);
  pthread_cond_init(&done_cv, NULL);
  queue = NULL;
  nworkers = 0;
  stopping = false;
}
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Under lock: at least `want` workers, as far as threads can be made (the
 * caller does whatever bands are left, so fewer is only slower). Workers
 * block every signal: signals stay the application's threads' business. */
static void start_workers(int want) {
  if (want > MAX_THREADS - 1) want = MAX_THREADS - 1;
  if (nworkers >= want) return;
  pthread_once(&atfork_once, register_atfork);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (nworkers < want && pthread_create(&workers[nworkers], NULL, worker_main, NULL) == 0) nworkers++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int ab__parallel_workers(void) {
  pthread_mutex_lock(&lock);
  const int n = nworkers;
  pthread_mutex_unlock(&lock);
  return n;
}

void ab__parallel_shutdown(void) {
  pthread_mutex_lock(&lock);
  stopping = true;
  pthread_cond_broadcast(&work_cv);
  const int n = nworkers;
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < n; i++) pthread_join(workers[i], NULL);
  pthread_mutex_lock(&lock);
  nworkers = 0;
  stopping = false;
  pthread_mutex_unlock(&lock);
}

/* At dlclose (and at exit): the workers stop and are joined, so that none
 * is left blocked in the library's code and data once they are unmapped
 * (tests/stress/unload.c). A job still running on another thread is
 * finished by its caller, who takes the bands the workers leave. */
__attribute__((destructor)) static void parallel_unload(void) { ab__parallel_shutdown(); }

/* ---- the entry ------------------------------------------------------------------ */

/* Which dim the bands of a job on t threads cut (see the top), or -1 for
 * none: dim 0 when it gives every thread several bands, or one band each
 * to at least 3/4 of t threads in every round (16 planes on 16 threads or
 * on 2, 12 on 16, not 17 on 16) unless dim 0 is the source's contiguous
 * one (pixel channels: one band a channel would read every pixel once per
 * channel); else dim 1 when it gives every thread several bands. */
static int pick_cut(const ab__host_job *w, int64_t t) {
  const int64_t n0 = w->shape[0], want = BANDS_PER_THREAD * t;
  if (n0 >= want) return 0;
  const int64_t rounds = (n0 + t - 1) / t;
  if (n0 >= t && 4 * n0 >= 3 * rounds * t && w->byte_strides[0] != (int64_t)w->es) return 0;
  if (w->ndim >= 2 && w->shape[1] >= want) return 1;
  return -1;
}

void ab__host_run(const ab__host_job *w) {
  int64_t numel = 1;
  for (int32_t i = 0; i < w->ndim; i++) numel *= w->shape[i]; /* validated: no overflow */
  size_t min = ab__parallel_min();
  if (w->min_part != 0 && w->min_part < min) min = w->min_part;
  const size_t bytes = (size_t)numel * out_size(w);
  int64_t t = ab__parallel_threads();
  if (t > 1 && bytes / min < (size_t)t) t = (int64_t)(bytes / min);
  const int cut = t <= 1 || w->ndim == 0 ? -1 : pick_cut(w, t);
  if (cut < 0) {
    run_whole(w, w->dst, w->src, w->shape, w->op);
    return;
  }
  struct job j = {.work = w, .cut = cut, .active = 0, .queued = NULL};
  const int64_t n = w->shape[cut], nb = t * BANDS_PER_THREAD;
  j.band = (n + nb - 1) / nb;
  /* Bands of whole 16-index blocks where there are enough, so the kernels'
   * tiles and streaming stores stay aligned inside each band. */
  if (j.band >= 32) j.band = (j.band + 15) / 16 * 16;
  /* Where the cut dim is the source's contiguous one (a transpose),
   * a band reads a strip of every source row, and narrow strips read
   * memory in pieces too short for the prefetchers. Two threads on the
   * Intel Xeon VM: 4096^2 uint8 in 512-byte strips ran 9.3 GB/s (1.1x one
   * thread), in 2 KiB ones 12.9-14.3; 4000^2 float32 in 2 KiB strips
   * 0.75-0.80x of memcpy on both threads, in 8 KiB ones 0.90-0.92x. Bands
   * widen up to MIN_STRIP bytes, but never below one band a thread. */
  if (w->byte_strides[cut] == (int64_t)w->es && (size_t)j.band * w->es < MIN_STRIP) {
    const int64_t strip = (int64_t)(MIN_STRIP / w->es), per_thread = (n + t - 1) / t;
    const int64_t want = strip < per_thread ? strip : per_thread; /* a strip, or a band a thread */
    if (want > j.band) j.band = want;
  }
  j.nbands = (n + j.band - 1) / j.band;
  atomic_init(&j.next, 0);

  pthread_mutex_lock(&lock);
  start_workers((int)t - 1);
  struct job **tail = &queue;
  while (*tail != NULL) tail = &(*tail)->queued;
  *tail = &j;
  pthread_cond_broadcast(&work_cv);
  pthread_mutex_unlock(&lock);

  work_on(&j);

  pthread_mutex_lock(&lock);
  unqueue(&j);
  while (j.active > 0) pthread_cond_wait(&done_cv, &lock);
  pthread_mutex_unlock(&lock);
}
