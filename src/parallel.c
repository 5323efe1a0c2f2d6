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
#define _GNU_SOURCE 1 /* sched_getaffinity, CPU_COUNT */
#include "parallel.h"
#include "element.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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
static atomic_bool env_auto; /* AB_PARALLEL_MIN unset or auto: measured where it matters */
static atomic_int env_spin_us; /* AB_THREAD_SPIN_US */

#define AUTO_MIN ((size_t)256 << 10)
#define SPIN_US 100

/* The cores this process may run on: its CPU affinity (taskset, a
 * container's cpuset), else the online ones. A worker for every online
 * core of a 64-core host, in a container given 2, would only take turns.
 * The process's mask is its main thread's (as taskset sets it), not the
 * calling thread's: a thread pinned to one core must not decide for all.
 * A main thread an OpenMP runtime pinned (OMP_PROC_BIND) counts as one
 * core; AB_NUM_THREADS says otherwise (docs/performance.md). */
/* glibc's and musl's, with _GNU_SOURCE (CMakeLists.txt checks the calls;
 * the test was of __GLIBC__, and on musl a pinned first caller's sysconf,
 * its own mask there, set one thread for the whole process) */
#if defined(CPU_COUNT) && defined(AB_HAVE_SCHED_GETAFFINITY)
#define HAVE_PROCESS_MASK 1
static bool process_mask(cpu_set_t *set) {
  return sched_getaffinity(getpid(), sizeof *set, set) == 0 && CPU_COUNT(set) > 0;
}
#endif

static long usable_cores(void) {
#ifdef HAVE_PROCESS_MASK
  cpu_set_t set;
  if (process_mask(&set)) return CPU_COUNT(&set);
#endif
  return sysconf(_SC_NPROCESSORS_ONLN);
}

/* AB_NUM_THREADS and AB_PARALLEL_MIN, read once and again after
 * ab__env_reload (tests). A fork waits for env_lock (atfork_prepare). */
static void read_env(void) {
  pthread_mutex_lock(&env_lock);
  const unsigned gen = ab__env_generation();
  if (atomic_load_explicit(&env_generation, memory_order_relaxed) != gen) {
    long cores = usable_cores();
    int n = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    n = (int)ab__env_int("AB_NUM_THREADS", n, 1, MAX_THREADS);
    /* Bytes of result each thread gets at least: a move of fewer than
     * twice this stays on the caller's thread. Unset (or auto): 256 KiB,
     * and where that and AUTO_FEWER times it give a move different
     * numbers of threads, the move's first calls measure both (see "the
     * measured bound" below). 256 KiB: on the Intel Xeon (Cascade Lake)
     * VM, two threads against one in six rounds, 512 KiB transposes ran
     * 1.15-1.89x (one round 0.83x), 1 MiB ones 1.70-2.08x (one round
     * 0.67x), 1 MiB copies 1.52-1.87x in four, and float32 -> float16 of 1
     * and 2 MiB 1.3-2.3x; 256 KiB transposes split in two ran 0.6-1.0x, so
     * not below that (bench/results/2026-11-27-intel-threads-threshold.md).
     * On the Intel VM of 2026-11-28 (2 MiB L2) the same copies and
     * transposes of 512 KiB - 1 MiB ran 0.44-1.03x on two threads, while
     * float32 -> float16 with 1 MiB of result still gained 1.8-2.0x
     * (bench/results/2026-11-28-intel-copy-ceiling.md): no one bound suits
     * every machine and every kind of move. The staging ring's copies
     * split down to 256 KiB whatever this is (RING_PART). */
    const char *v = ab__env_str("AB_PARALLEL_MIN");
    uint64_t m = AUTO_MIN;
    bool automatic = v == NULL || strcasecmp(v, "auto") == 0;
    /* malformed: logged, and the default (auto). A size past what this
     * process addresses (4 GiB and up in a 32-bit build) is SIZE_MAX: no
     * move is split, as asked. */
    if (!automatic && !ab__parse_size(v, strlen(v), &m)) {
      char q[AB__QUOTED];
      ab__quote(v, q, sizeof q);
      AB_LOG(AB_LOG_ERROR, "AB_PARALLEL_MIN=\"%s\" ignored: want a size such as 256KiB, or auto; using auto", q);
      m = AUTO_MIN;
      automatic = true;
    } else if (m > SIZE_MAX) {
      m = SIZE_MAX;
    }
    atomic_store_explicit(&env_min, m == 0 ? 1 : (size_t)m, memory_order_relaxed);
    atomic_store_explicit(&env_auto, automatic, memory_order_relaxed);
    atomic_store_explicit(&env_threads, n, memory_order_relaxed);
    atomic_store_explicit(&env_spin_us, (int)ab__env_int("AB_THREAD_SPIN_US", SPIN_US, 0, 1000000),
                          memory_order_relaxed);
    atomic_store_explicit(&env_generation, gen, memory_order_release);
  }
  pthread_mutex_unlock(&env_lock);
}

/* The values below as the settings' generation has them. */
static inline void env_current(void) {
  if (AB_UNLIKELY(atomic_load_explicit(&env_generation, memory_order_acquire) != ab__env_generation())) read_env();
}

int ab__num_threads(void) {
  env_current();
  return atomic_load_explicit(&env_threads, memory_order_relaxed);
}

static int spin_us(void) {
  env_current();
  return atomic_load_explicit(&env_spin_us, memory_order_relaxed);
}

size_t ab__parallel_min(void) {
  env_current();
  return atomic_load_explicit(&env_min, memory_order_relaxed);
}

/* Whether AB_PARALLEL_MIN is unset or auto (ab__parallel_min is then
 * AUTO_MIN). */
static bool min_is_auto(void) {
  env_current();
  return atomic_load_explicit(&env_auto, memory_order_relaxed);
}

/* ab_convert_opts.threads of the conversion this thread is running. */
static _Thread_local uint32_t call_threads;

uint32_t ab__parallel_call_threads(uint32_t n) {
  uint32_t prev = call_threads;
  call_threads = n;
  return prev;
}

int ab__parallel_threads(void) {
  if (call_threads == 0) {
    const int t = ab__num_threads();
    return t > MAX_THREADS ? MAX_THREADS : t;
  }
  /* compared unsigned: 2^31 and more asked for is "at most 64" too, not
   * a negative int that fell through to one thread */
  return call_threads > (uint32_t)MAX_THREADS ? MAX_THREADS : (int)call_threads;
}

/* ---- bands ------------------------------------------------------------------- */

struct job {
  const ab__host_job *work;
  int cut;             /* the dim the bands cut: 0, or 1 (then all of dim 0 in each) */
  int64_t band;        /* indices of dim `cut` per band */
  int64_t nbands;
  atomic_llong next;   /* the next band to claim */
  atomic_int active;   /* workers inside the job (changed under lock) */
  int most;            /* workers it may have: its thread count less the caller */
  struct job *queued;  /* the queue's next job (under lock) */
};

static size_t out_size(const ab__host_job *w) {
  return w->op != NULL ? ab__elsize(w->op->to) : w->es;
}

/* The bytes of a whole job's result. */
static size_t result_bytes(const ab__host_job *w) {
  size_t n = out_size(w);
  for (int32_t i = 0; i < w->ndim; i++) n *= (size_t)w->shape[i]; /* validated: no overflow */
  return n;
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
  AB_ASSUME(c >= 0 && c < w->ndim);
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

/* ---- the measured bound ------------------------------------------------------------ */

/* With AB_PARALLEL_MIN unset, a move whose result gives each thread less
 * than AUTO_FEWER times AUTO_MIN, so that the bound AUTO_MIN and the
 * bound AUTO_FEWER times it give it different numbers of threads (two and
 * one on two cores, for results of 512 KiB - 2 MiB), runs on the threads
 * measured to be faster for its kind and size: its kind's first
 * LEARN_CALLS calls at its size (a power of two of result bytes) run on
 * the fewer threads, the next LEARN_CALLS on the more, each timed; the
 * more stay only where the best of theirs is 10% faster than the best
 * of the fewer (a thread that gains less is better left to the
 * application). Every RELEARN-th call after the pick starts the trial
 * again, so that a pick made in a noisy moment (other tenants, the
 * application's own threads) does not hold for the whole process: on the
 * Intel VM of 2026-11-28 one trial in three of a float32 -> float16 cast
 * with 1 MiB of result timed two threads as slow as one. The bytes are
 * the same either way. Moves with a bound of
 * their own (the staging ring's copies) are not timed. A kind is a plain
 * gather by its element size and whether its innermost source dim is
 * contiguous (copies, transposes), or a cast by its element sizes and
 * whether it is affine: on the Intel VM of 2026-11-28 copies and
 * transposes of 512 KiB - 1 MiB lost on two threads and a float32 ->
 * float16 cast of 1 MiB of result gained 1.8-2.0x. Each block of calls
 * is timed back to back, not alternated: a call on one thread right after
 * one on two finds half of its data in the other core's cache. */
#define AUTO_FEWER 4
#define LEARN_CALLS 3
#define RELEARN AB__PARALLEL_RELEARN
#define LEARN_KINDS 40 /* 8 gathers, 32 casts */
#define LEARN_SIZES 8  /* results of 512 KiB * 2^k bytes, k < 8 */

enum { PICK_UNKNOWN, PICK_SPLIT, PICK_FEWER, ARM_FEWER, ARM_SPLIT };

struct learned {
  int claimed[2], done[2]; /* calls of each arm started and timed (under lock) */
  double best[2];          /* seconds, the fastest of each arm's timed calls (under lock) */
  atomic_int pick;         /* PICK_*: set once both arms are timed */
  atomic_uint uses;        /* calls since the pick */
  atomic_int most;         /* the threads a call could take when timed (its cap); 0: not yet */
};

static struct learned learned[LEARN_KINDS][LEARN_SIZES];
static atomic_uint learned_generation; /* of the env the table was learned under; 0: never */

/* ---- the workers -------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static struct job *queue; /* jobs that may have bands left */
static pthread_t workers[MAX_THREADS];
static int nworkers;
static int peak_in_job; /* the most workers in one job (under lock; tests) */
static bool stopping;

/* Under lock: takes j out of the queue if it is still there. */
static void unqueue(struct job *j) {
  for (struct job **l = &queue; *l != NULL; l = &(*l)->queued)
    if (*l == j) {
      *l = j->queued;
      return;
    }
}

/* Under lock: the first queued job that may take one more worker, or
 * NULL. A job asked for t threads runs on at most t, whatever the pool
 * holds: a call with opts.threads = 2 beside 15 idle workers keeps to 2. */
static struct job *open_job(void) {
  /* with bands left: a job whose caller spins for its last workers stays
   * queued, and a worker joining it then would only make the caller wait */
  for (struct job *j = queue; j != NULL; j = j->queued)
    if (atomic_load_explicit(&j->active, memory_order_relaxed) < j->most &&
        atomic_load_explicit(&j->next, memory_order_relaxed) < j->nbands)
      return j;
  return NULL;
}

/* ---- spinning before sleeping ------------------------------------------------ */

/* A worker that finds no job, and a caller whose workers are still in its
 * job, spin for AB_THREAD_SPIN_US (default SPIN_US) before they sleep on
 * a condition: waking a sleeping thread costs a futex call and, in a VM,
 * the wake-up of an idle virtual CPU. On the 2-core Intel VM two threads
 * took 29.6 us for a 512 KiB copy that one thread did in 10.2 (bench_threads'
 * threads trial): the wake-ups, not the copy. Calls back to back (a
 * batch, a loop over frames) find the workers still spinning. 0: no
 * spinning. */
static atomic_uint posted;         /* jobs queued so far: what a spinning worker watches */
static atomic_ulong spun_pickups;  /* jobs a worker took while spinning (tests) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins until *v differs from seen (true) or the clock reaches end
 * (false). */
static bool spin_uint(const atomic_uint *v, unsigned seen, double end) {
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (atomic_load_explicit(v, memory_order_relaxed) != seen) return true;
      cpu_relax();
    }
    if (ab__seconds() >= end) return false;
  }
}

/* Spins until *v is 0 or us microseconds have passed. */
static void spin_zero(const atomic_int *v, int us) {
  const double end = ab__seconds() + us * 1e-6;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (atomic_load_explicit(v, memory_order_acquire) == 0) return;
      cpu_relax();
    }
    if (ab__seconds() >= end) return;
  }
}

unsigned long ab__parallel_spun_pickups(void) { return atomic_load_explicit(&spun_pickups, memory_order_relaxed); }

#ifdef HAVE_PROCESS_MASK
static cpu_set_t workers_mask; /* the process's cores when workers last started (under lock) */
static bool have_workers_mask;
#endif

static atomic_int started_beside_creator; /* workers whose first core was their creator's (tests) */

int ab__parallel_started_beside_creator(void) {
  return atomic_load_explicit(&started_beside_creator, memory_order_relaxed);
}

/* creator: the core its creator ran on (start_workers), or -1 */
static void *worker_main(void *creator) {
  int us = spin_us(); /* read outside lock: env_lock is never taken under it */
#ifdef AB_HAVE_SCHED_GETCPU /* CMakeLists.txt checks for these calls */
  if ((intptr_t)creator >= 0 && sched_getcpu() == (int)(intptr_t)creator)
    atomic_fetch_add_explicit(&started_beside_creator, 1, memory_order_relaxed);
#else
  (void)creator;
#endif
  pthread_mutex_lock(&lock);
#if defined(HAVE_PROCESS_MASK) && defined(AB_HAVE_PTHREAD_SETAFFINITY_NP)
  /* started away from its creator's core (start_workers), or with its
   * creator's mask (one core, if pinned: where a thread's start cannot
   * be given one): now every core of the process's is its own (it stays
   * where it is) */
  if (have_workers_mask) (void)pthread_setaffinity_np(pthread_self(), sizeof workers_mask, &workers_mask);
#endif
  for (;;) {
    struct job *j = NULL;
    bool spun = false;
    double end = 0; /* when this worker's spin after its last job ends; 0: not started */
    while (!stopping && (j = open_job()) == NULL) {
      /* us from its last job on, however many jobs it saw and could not
       * join (full, or no bands left) in the meantime; never after a sleep */
      const double now = us > 0 ? ab__seconds() : 0;
      if (us > 0 && end == 0) end = now + us * 1e-6;
      if (us > 0 && now < end) {
        const unsigned seen = atomic_load_explicit(&posted, memory_order_relaxed);
        pthread_mutex_unlock(&lock);
        spun = spin_uint(&posted, seen, end);
        pthread_mutex_lock(&lock);
        continue;
      }
      end = -1; /* slept: no spin until the next job */
      spun = false;
      pthread_cond_wait(&work_cv, &lock);
    }
    if (stopping) break;
    if (spun) atomic_fetch_add_explicit(&spun_pickups, 1, memory_order_relaxed);
    const int in = atomic_fetch_add_explicit(&j->active, 1, memory_order_relaxed) + 1;
    if (in > peak_in_job) peak_in_job = in;
    pthread_mutex_unlock(&lock);
    work_on(j);
    us = spin_us();
    pthread_mutex_lock(&lock);
    unqueue(j); /* every band is claimed: nobody else need come */
    /* release: the caller may see 0 spinning, without the lock */
    if (atomic_fetch_sub_explicit(&j->active, 1, memory_order_release) == 1) pthread_cond_broadcast(&done_cv);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* fork: the child has none of the parent's workers; it starts its own on
 * demand, with conditions of its own (no thread of the child waits on the
 * parent's). lock is unlocked, not initialised again: this thread holds it
 * (atfork_prepare), and initialising a held mutex is undefined (TSan then
 * takes it as held for ever). env_lock is a leaf (no
 * other lock is taken while it is held, and it is not taken under lock). */
static void atfork_prepare(void) {
  pthread_mutex_lock(&env_lock);
  pthread_mutex_lock(&lock);
}
static void atfork_parent(void) {
  pthread_mutex_unlock(&lock);
  pthread_mutex_unlock(&env_lock);
}
static void atfork_child(void) {
  pthread_mutex_unlock(&env_lock);
  pthread_mutex_unlock(&lock);
  pthread_cond_init(&work_cv, NULL);
  pthread_cond_init(&done_cv, NULL);
  queue = NULL;
  nworkers = 0;
  stopping = false;
  /* Calls the parent's other threads were timing never finish here, nor
   * does a call that was about to start a re-trial. */
  for (int k = 0; k < LEARN_KINDS; k++)
    for (int s = 0; s < LEARN_SIZES; s++) {
      struct learned *l = &learned[k][s];
      for (int a = 0; a < 2; a++) l->claimed[a] = l->done[a];
      atomic_store_explicit(&l->uses, 0, memory_order_relaxed);
    }
}
/* Registered as the library is loaded, before either lock can be held:
 * see "fork" in src/lifetime.c. */
__attribute__((constructor)) static void register_atfork(void) {
  ab__atfork(atfork_prepare, atfork_parent, atfork_child, "the host worker threads' locks");
}

/* Under lock: at least `want` workers, as far as threads can be made (the
 * caller does whatever bands are left, so fewer is only slower). Workers
 * block every signal but a fault's: signals stay the application's threads'
 * business (src/lifetime.c, "signals").
 * They run on the process's cores (usable_cores counted them), not only on
 * those of the thread that happened to need them first: a new thread takes
 * its creator's mask, and a caller pinned to one core would otherwise leave
 * every caller's workers on that core. */
static void start_workers(int want) {
  if (want > MAX_THREADS - 1) want = MAX_THREADS - 1;
  if (nworkers >= want) return;
  sigset_t old;
  ab__block_async_signals(&old);
  pthread_attr_t *ap = NULL;
#ifdef AB_HAVE_SCHED_GETCPU
  const int here = sched_getcpu();
#else
  const int here = -1;
#endif
#ifdef HAVE_PROCESS_MASK
  cpu_set_t set;
  const bool masked = process_mask(&set);
  if (masked) { /* never unset: a worker started before still widens to the last mask known */
    workers_mask = set;
    have_workers_mask = true;
  }
#ifdef AB_HAVE_PTHREAD_ATTR_SETAFFINITY_NP /* not musl's: there a worker starts where the kernel puts it */
  pthread_attr_t attr;
  if (masked && pthread_attr_init(&attr) == 0) {
    /* A new thread starts on a core the kernel picks, at times its
     * creator's own, and there it cannot run while its creator works
     * through the bands. On the 2-core Intel VM, 2 threads, 1 MiB uint8
     * transposes: in 4-6 processes of 15 (three sets) the worker started
     * on the caller's core and joined at most one job, and the calls ran
     * 14-16 GB/s where the other processes' ran 36-41. So a worker starts
     * on the other cores (then none of 35 processes ran slow), and widens
     * its mask to all of the process's once it runs (worker_main;
     * bench/results/2026-12-04-worker-start-core.md). */
    if (CPU_COUNT(&set) > 1 && here >= 0 && here < CPU_SETSIZE && CPU_ISSET(here, &set)) CPU_CLR(here, &set);
    if (pthread_attr_setaffinity_np(&attr, sizeof set, &set) == 0) ap = &attr;
    else pthread_attr_destroy(&attr);
  }
#endif
#endif
  while (nworkers < want) {
    int rc = pthread_create(&workers[nworkers], ap, worker_main, (void *)(intptr_t)here);
#if defined(HAVE_PROCESS_MASK) && defined(AB_HAVE_PTHREAD_ATTR_SETAFFINITY_NP)
    /* the cores left may all be closed to this thread (a cpuset of its
     * own that holds only its core): then the whole mask (glibc 2.34 and
     * later end and reap the thread a failed affinity made; older ones
     * leave it, BZ 19511) */
    if (rc == EINVAL && ap != NULL && pthread_attr_setaffinity_np(ap, sizeof workers_mask, &workers_mask) == 0)
      rc = pthread_create(&workers[nworkers], ap, worker_main, (void *)(intptr_t)here);
#endif
    if (rc != 0) break;
#ifdef AB_HAVE_PTHREAD_SETNAME_NP
    /* as top, gdb and /proc name it; by its creator, so that it has its name
     * when the call that started it returns (it may not have run yet) */
    pthread_setname_np(workers[nworkers], "arraybridge");
#endif
    nworkers++;
  }
  if (ap != NULL) pthread_attr_destroy(ap);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int ab__parallel_workers(void) {
  pthread_mutex_lock(&lock);
  const int n = nworkers;
  pthread_mutex_unlock(&lock);
  return n;
}

int ab__parallel_peak_in_job(void) {
  pthread_mutex_lock(&lock);
  const int n = peak_in_job;
  peak_in_job = 0;
  pthread_mutex_unlock(&lock);
  return n;
}

void ab__parallel_shutdown(void) {
  pthread_mutex_lock(&lock);
  stopping = true;
  pthread_cond_broadcast(&work_cv);
  atomic_fetch_add_explicit(&posted, 1, memory_order_relaxed); /* and spinning ones look */
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

/* ---- the measured bound: its calls ---------------------------------------------- */

/* 0 for 1 byte, 1 for 2, 2 for 4, 3 for 8 or more. */
static int size_class(size_t n) {
  int k = 0;
  while (k < 3 && ((size_t)2 << k) <= n) k++;
  return k;
}

/* The entry of w's kind at its result size, or NULL for sizes past the
 * table. */
static struct learned *slot_of(const ab__host_job *w, size_t bytes) {
  int k = -19; /* 512 KiB: 0 */
  for (size_t b = bytes; b > 1; b >>= 1) k++;
  if (k < 0 || k >= LEARN_SIZES) return NULL;
  int kind;
  if (w->op == NULL) {
    const bool rows = w->ndim > 0 && w->byte_strides[w->ndim - 1] == (int64_t)w->es;
    kind = size_class(w->es) * 2 + rows;
  } else {
    kind = 8 + (size_class(ab__elsize(w->op->from)) * 4 + size_class(ab__elsize(w->op->to))) * 2 + w->op->affine;
  }
  return &learned[kind][k];
}

bool ab__parallel_split_wins(double fewer_s, double split_s) { return split_s * 1.1 <= fewer_s; }

/* Under lock: l as if never timed. */
static void forget(struct learned *l) {
  l->claimed[0] = l->claimed[1] = l->done[0] = l->done[1] = 0;
  l->best[0] = l->best[1] = 0;
  atomic_store_explicit(&l->uses, 0, memory_order_relaxed);
  atomic_store_explicit(&l->most, 0, memory_order_relaxed);
  atomic_store_explicit(&l->pick, PICK_UNKNOWN, memory_order_relaxed);
}

/* Under lock: a fresh table when the settings changed since it was
 * learned (ab__env_reload: AB_NUM_THREADS changes what each arm is). */
static void learned_current(unsigned gen) {
  /* forward only: a caller that read the generation before a reload must
   * not take the table back to it */
  const unsigned cur = atomic_load_explicit(&learned_generation, memory_order_relaxed);
  if (cur != 0 && (int)(gen - cur) <= 0) return;
  for (int k = 0; k < LEARN_KINDS; k++)
    for (int s = 0; s < LEARN_SIZES; s++) {
      forget(&learned[k][s]);
    }
  atomic_store_explicit(&learned_generation, gen, memory_order_release);
}

/* What this call of l's kind and size, which may take up to `most`
 * threads, does: PICK_SPLIT or PICK_FEWER once learned; ARM_FEWER or
 * ARM_SPLIT for a call to time (*gen: the table's generation, for
 * learn_record), the RELEARN-th call after a pick too; PICK_UNKNOWN (the
 * call takes the more threads, untimed) while the calls claimed for both
 * arms are still running, and for calls whose cap differs from the one
 * the entry is learned for (opts.threads: the arms would not be the
 * same; the first cap to ask has it) or that read the settings before a
 * reload. */
static int learn_arm(struct learned *l, int64_t most, unsigned *gen) {
  const unsigned now = ab__env_generation();
  bool again = false;
  if (atomic_load_explicit(&learned_generation, memory_order_acquire) == now) {
    const int pick = atomic_load_explicit(&l->pick, memory_order_relaxed);
    if (pick != PICK_UNKNOWN) {
      if (atomic_load_explicit(&l->most, memory_order_relaxed) != most) return PICK_UNKNOWN;
      if (atomic_fetch_add_explicit(&l->uses, 1, memory_order_relaxed) != RELEARN - 1) return pick;
      again = true;
    }
  }
  pthread_mutex_lock(&lock);
  learned_current(now);
  int arm = PICK_UNKNOWN;
  if (atomic_load_explicit(&learned_generation, memory_order_relaxed) == now) {
    if (again && atomic_load_explicit(&l->pick, memory_order_relaxed) != PICK_UNKNOWN) forget(l);
    const int has = atomic_load_explicit(&l->most, memory_order_relaxed);
    if (has == 0 || has == most) {
      arm = atomic_load_explicit(&l->pick, memory_order_relaxed);
      if (arm == PICK_UNKNOWN) {
        if (l->claimed[0] < LEARN_CALLS) arm = ARM_FEWER;
        else if (l->claimed[0] == l->done[0] && l->claimed[1] < LEARN_CALLS) arm = ARM_SPLIT;
        if (arm != PICK_UNKNOWN) {
          l->claimed[arm - ARM_FEWER]++;
          atomic_store_explicit(&l->most, (int)most, memory_order_relaxed);
        }
      }
    }
  }
  pthread_mutex_unlock(&lock);
  *gen = now;
  return arm;
}

/* Records a timed call of l (w, `bytes` of result, on n threads; the
 * other arm's is `other`), and picks once both arms have LEARN_CALLS. A
 * call timed under settings since changed is dropped. */
static void learn_record(const ab__host_job *w, size_t bytes, struct learned *l, unsigned gen, int arm, double dt,
                         int64_t n, int64_t other) {
  const int a = arm - ARM_FEWER;
  int pick = PICK_UNKNOWN;
  double best[2];
  pthread_mutex_lock(&lock);
  if (atomic_load_explicit(&learned_generation, memory_order_relaxed) == gen &&
      atomic_load_explicit(&l->pick, memory_order_relaxed) == PICK_UNKNOWN) {
    if (l->done[a] == 0 || dt < l->best[a]) l->best[a] = dt;
    l->done[a]++;
    if (l->done[0] >= LEARN_CALLS && l->done[1] >= LEARN_CALLS) {
      pick = ab__parallel_split_wins(l->best[0], l->best[1]) ? PICK_SPLIT : PICK_FEWER;
      best[0] = l->best[0];
      best[1] = l->best[1];
      atomic_store_explicit(&l->pick, pick, memory_order_relaxed);
    }
  }
  pthread_mutex_unlock(&lock);
  if (pick != PICK_UNKNOWN) {
    const int64_t few = a == 0 ? n : other, more = a == 0 ? other : n;
    AB_LOG(AB_LOG_DEBUG,
           "threads trial, %s %zu- to %zu-byte elements%s, %zu-byte result: %lld threads %.1f us, %lld threads %.1f us: %lld",
           w->op == NULL ? "gather" : "cast", w->op == NULL ? w->es : ab__elsize(w->op->from),
           w->op == NULL ? w->es : ab__elsize(w->op->to), w->op != NULL && w->op->affine ? ", affine" : "", bytes,
           (long long)few, best[0] * 1e6, (long long)more, best[1] * 1e6, (long long)(pick == PICK_SPLIT ? more : few));
  }
}

int ab__parallel_learned(const ab__host_job *w, int done[2]) {
  struct learned *l = slot_of(w, result_bytes(w));
  if (l == NULL) return -1;
  pthread_mutex_lock(&lock);
  learned_current(ab__env_generation());
  done[0] = l->done[0];
  done[1] = l->done[1];
  const int pick = atomic_load_explicit(&l->pick, memory_order_relaxed);
  pthread_mutex_unlock(&lock);
  return pick == PICK_SPLIT ? 2 : pick == PICK_FEWER ? 1 : 0;
}

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

/* Indices of dim `cut` in each band of a job on t threads (cut and t as
 * run_on has them). */
int64_t ab__parallel_band(const ab__host_job *w, int cut, int64_t t) {
  const int64_t n = w->shape[cut], nb = t * BANDS_PER_THREAD;
  int64_t band = (n + nb - 1) / nb;
  /* Bands of whole 16-index blocks where there are enough, so the kernels'
   * tiles and streaming stores stay aligned inside each band. */
  if (band >= 32) band = (band + 15) / 16 * 16;
  /* Where the cut dim is the source's contiguous one (a transpose),
   * a band reads a strip of every source row, and narrow strips read
   * memory in pieces too short for the prefetchers. Two threads on the
   * Intel Xeon VM: 4096^2 uint8 in 512-byte strips ran 9.3 GB/s (1.1x one
   * thread), in 2 KiB ones 12.9-14.3; 4000^2 float32 in 2 KiB strips
   * 0.75-0.80x of memcpy on both threads, in 8 KiB ones 0.90-0.92x. Bands
   * widen up to MIN_STRIP bytes, but never below one band a thread. */
  if (w->byte_strides[cut] == (int64_t)w->es && (size_t)band * w->es < MIN_STRIP) {
    const int64_t strip = (int64_t)(MIN_STRIP / w->es), per_thread = (n + t - 1) / t;
    const int64_t want = strip < per_thread ? strip : per_thread; /* a strip, or a band a thread */
    if (want > band) band = want;
  }
  /* Bands along the result's rows (its last dim cut) start on cache lines
   * where a band is a line or more: 16 indices are a line's worth only
   * of 4-byte elements, so 1- and 2-byte results round to theirs (32
   * float16 a line), or every other band of 48 float16 started mid-line
   * and went past the kernels that write whole lines (the one-pass
   * casts). Up to a whole line, unless that leaves fewer bands than
   * threads where there were that many; down then. */
  const size_t os = out_size(w);
  const int64_t per_line = os != 0 && AB_CACHE_LINE % os == 0 ? (int64_t)(AB_CACHE_LINE / os) : 0;
  if (cut == w->ndim - 1 && per_line > 16 && band >= per_line) {
    const int64_t up = (band + per_line - 1) / per_line * per_line, had = (n + band - 1) / band;
    const int64_t floor_bands = had < t ? had : t;
    band = (n + up - 1) / up >= floor_bands ? up : band / per_line * per_line;
  }
  return band;
}

/* Runs the job on t threads (the caller among them), or on the caller's
 * alone where t is 1 or no dim can be cut. */
static void run_on(const ab__host_job *w, int64_t t) {
  const int cut = t <= 1 || w->ndim == 0 ? -1 : pick_cut(w, t);
  if (cut < 0) {
    run_whole(w, w->dst, w->src, w->shape, w->op);
    return;
  }
  struct job j = {.work = w, .cut = cut, .most = (int)t - 1, .queued = NULL};
  atomic_init(&j.active, 0);
  const int64_t n = w->shape[cut];
  j.band = ab__parallel_band(w, cut, t);
  j.nbands = (n + j.band - 1) / j.band;
  atomic_init(&j.next, 0);

  pthread_mutex_lock(&lock);
  start_workers((int)t - 1);
  struct job **tail = &queue;
  while (*tail != NULL) tail = &(*tail)->queued;
  *tail = &j;
  /* as many as may join it (a worker that finds every queued job full
   * waits again; one that finishes a job looks for another first) */
  for (int i = 0; i < j.most && i < nworkers; i++) pthread_cond_signal(&work_cv);
  atomic_fetch_add_explicit(&posted, 1, memory_order_relaxed); /* spinning workers look */
  pthread_mutex_unlock(&lock);

  work_on(&j);

  /* Every band is claimed; the workers still in the job finish theirs. A
   * worker that joins after the spin, before the lock, is waited for
   * below: the job leaves the queue only under the lock. */
  const int us = spin_us();
  if (us > 0) spin_zero(&j.active, us);
  pthread_mutex_lock(&lock);
  unqueue(&j);
  while (atomic_load_explicit(&j.active, memory_order_relaxed) > 0) pthread_cond_wait(&done_cv, &lock);
  pthread_mutex_unlock(&lock);
}

/* Threads for a move of `bytes` of result, each taking at least `min`
 * (one, if even that is too many), up to `most`. */
static int64_t threads_for(size_t bytes, size_t min, int64_t most) {
  if (most > 1 && bytes / min < (size_t)most) return bytes / min > 1 ? (int64_t)(bytes / min) : 1;
  return most;
}

void ab__host_run(const ab__host_job *w) {
  size_t min = ab__parallel_min();
  if (w->min_part != 0 && w->min_part < min) min = w->min_part;
  const size_t bytes = result_bytes(w);
  const int64_t most = ab__parallel_threads();
  const int64_t t = threads_for(bytes, min, most);
  /* The staging ring's copies (a min_part of their own) keep their bound:
   * they overlap the DMA of other chunks, which a timed call cannot see. */
  if (t > 1 && w->min_part == 0 && min_is_auto()) {
    const int64_t fewer = threads_for(bytes, min * AUTO_FEWER, most);
    struct learned *l = fewer < t ? slot_of(w, bytes) : NULL;
    if (l != NULL) {
      unsigned gen = 0;
      const int arm = learn_arm(l, most, &gen);
      if (arm == PICK_SPLIT || arm == PICK_UNKNOWN) { /* unknown: the calls claimed to time still run */
        run_on(w, t);
        return;
      }
      const int64_t n = arm == ARM_SPLIT ? t : fewer;
      if (arm == PICK_FEWER) {
        run_on(w, n);
        return;
      }
      const double t0 = ab__seconds();
      run_on(w, n);
      learn_record(w, bytes, l, gen, arm, ab__seconds() - t0, n, arm == ARM_FEWER ? t : fewer);
      return;
    }
  }
  run_on(w, t);
}
