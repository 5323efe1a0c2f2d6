/* simcuda: the part of the CUDA runtime API the CUDA backend and its tests
 * call, simulated on the host, so that backends/cuda/cuda.c and the core's
 * CUDA routes run in CI, where there is no GPU. Test-only: it is linked
 * into a second build of the library (tests/CMakeLists.txt) instead of
 * cudart, never into anything installed.
 *
 * What it models, strictly where the CUDA documentation allows latitude,
 * so that code that only works by luck on a real GPU fails here:
 *   - Device memory is address space the host cannot touch (PROT_NONE); the
 *     simulated device reads and writes a second mapping of the same size.
 *     A host dereference of a device pointer is a segfault, not a silent
 *     success.
 *   - Every stream is a FIFO queue run by a worker thread, each copy after a
 *     delay (AB_SIMCUDA_DELAY_US, default 50): a buffer reused before the
 *     copy that reads it has run, or a result read before a wait, shows up
 *     as wrong data. The legacy default stream (NULL, cudaStreamLegacy)
 *     and the blocking streams of a device wait for each other's earlier
 *     work (an operation issued to either), but cudaStreamSynchronize of
 *     the legacy stream waits for its own operations only; non-blocking
 *     streams wait for nothing. Events and streams
 *     belong to the device current at their creation, and an event is
 *     recorded only on a stream of its device.
 *   - cudaMemcpyAsync is asynchronous even for pageable memory (the
 *     documentation only says it "might be synchronous"): the pageable
 *     buffer is read or written when the copy runs, so the caller must wait
 *     before reusing or reading it. Host to host is synchronous.
 *     cudaMemcpy follows its documented rules (device to device and a
 *     pageable upload return early; the rest complete), cudaMemcpyPeer is
 *     asynchronous to the host and ordered with all work of both devices.
 *   - Copies are checked: a device range past its allocation, an explicit
 *     cudaMemcpyKind that does not match the pointers, a peer copy whose
 *     pointers are not on the devices named, a pitch past
 *     cudaDevAttrMaxPitch (AB_SIMCUDA_MAX_PITCH, default 1 MiB, so that
 *     the per-row fallback runs) all fail as the runtime would.
 *   - cudaFree waits only for queued copies that touch the memory it frees
 *     (the documentation says only that it "may" synchronise). Destroying
 *     a stream or an event returns at once; its resources go when its work
 *     is done.
 *   - cudaPointerGetAttributes answers only where the current device has a
 *     context (cudaSetDevice makes one, as from CUDA 12; so do allocations
 *     and cudaMemGetInfo); elsewhere it fails with cudaErrorInvalidValue,
 *     as the runtime does for another GPU's memory (CuPy issue 3991).
 *   - Errors are remembered per thread for cudaGetLastError; cudaMalloc
 *     fails past AB_SIMCUDA_MEMORY bytes per device (default 1 GiB).
 * cudaStreamPerThread is a blocking stream per thread and device.
 *   - Sticky errors (simcuda_poison): from then on every call that does
 *     work fails with the error, as the runtime documents.
 * Where it differs from a GPU: errors become sticky only when a test says
 * so; kernels do not exist (the library is built without converters/cuda).
 *
 * Failures: simcuda_fail_nth() (simcuda.h) makes the n-th runtime call from
 * then on fail, for the tests' sweeps over the backend's error paths;
 * AB_SIMCUDA_FAIL_CALL=name (a runtime function's name) makes that
 * function's first call in the process fail with cudaErrorUnknown, for
 * tests of whole programs (abtool).
 *
 * Devices: AB_SIMCUDA_DEVICES (unset or 0: cudaGetDeviceCount fails with
 * cudaErrorNoDevice). Peer access, AB_SIMCUDA_PEER: "all" (default),
 * "none", or "pairs" (0<->1, 2<->3, ...: NVLink pairs). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "simcuda.h"

enum { SIM_MAX_DEVICES = 16 };

/* ---- configuration ------------------------------------------------------- */

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static int ndev;
static size_t dev_memory = (size_t)1 << 30;
static size_t max_pitch = (size_t)1 << 20;
static long delay_us = 50;
static enum { PEER_ALL, PEER_NONE, PEER_PAIRS } peer_mode = PEER_ALL;

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return dflt;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < 0) {
    fprintf(stderr, "simcuda: %s=%s is not a count\n", name, v);
    abort();
  }
  return x;
}

static void init_queues(void);

/* cudaDevAttrConcurrentManagedAccess of every device (AB_SIMCUDA_CONCURRENT_MANAGED=0:
 * none has it, as on WSL2 and Windows, where the CPU may touch no managed
 * memory while the GPU has work in flight). */
static bool concurrent_managed = true;

static void configure(void) {
  ndev = (int)env_long("AB_SIMCUDA_DEVICES", 0);
  if (ndev > SIM_MAX_DEVICES) ndev = SIM_MAX_DEVICES;
  init_queues();
  dev_memory = (size_t)env_long("AB_SIMCUDA_MEMORY", (long)dev_memory);
  max_pitch = (size_t)env_long("AB_SIMCUDA_MAX_PITCH", (long)max_pitch);
  if (max_pitch > INT_MAX) max_pitch = INT_MAX; /* an int attribute */
  delay_us = env_long("AB_SIMCUDA_DELAY_US", delay_us);
  if (delay_us >= 1000000) {
    fprintf(stderr, "simcuda: AB_SIMCUDA_DELAY_US=%ld: at most 999999\n", delay_us);
    abort();
  }
  concurrent_managed = env_long("AB_SIMCUDA_CONCURRENT_MANAGED", 1) != 0;
  const char *f = getenv("AB_SIMCUDA_FAIL_CALL");
  if (f != NULL && *f != '\0') simcuda_fail_call(f, cudaErrorUnknown);
  const char *p = getenv("AB_SIMCUDA_PEER");
  if (p != NULL && strcmp(p, "none") == 0) peer_mode = PEER_NONE;
  else if (p != NULL && strcmp(p, "pairs") == 0) peer_mode = PEER_PAIRS;
}

static bool can_peer(int a, int b) {
  if (a == b) return false;
  return peer_mode == PEER_ALL || (peer_mode == PEER_PAIRS && a / 2 == b / 2);
}

/* ---- state: one lock for all of it ------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* an operation finished */
static _Thread_local int current;                          /* cudaSetDevice is per thread */
static _Thread_local cudaError_t last_error;

static cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

/* The failure armed by simcuda_fail_nth: every call but the error queries
 * and the release calls (cudaFree, cudaFreeHost, cudaStreamDestroy,
 * cudaEventDestroy) counts. */
static atomic_long fail_at, fail_calls, failed;
static _Atomic cudaError_t fail_error;

void simcuda_fail_nth(long n, cudaError_t error) {
  atomic_store(&fail_error, error);
  atomic_store(&fail_calls, 0);
  atomic_store(&failed, 0);
  atomic_store(&fail_at, n);
}

long simcuda_failures(void) { return atomic_load(&failed); }

long simcuda_calls(void) { return atomic_load(&fail_calls); }

static const char *_Atomic failed_call = "";

const char *simcuda_failed_call(void) { return atomic_load(&failed) ? atomic_load(&failed_call) : ""; }

/* The call armed by simcuda_fail_call: its next call fails, once. */
static const char *_Atomic fail_name;
static _Atomic cudaError_t fail_name_error;

void simcuda_fail_call(const char *name, cudaError_t error) {
  atomic_store(&fail_name_error, error);
  atomic_store(&failed, 0);
  atomic_store(&fail_name, name);
}

/* Whether this call (`fn`, its name) is the one armed to fail. */
static bool injected(const char *fn, cudaError_t *error) {
  pthread_once(&config_once, configure); /* AB_SIMCUDA_FAIL_CALL is armed there */
  const char *name = atomic_load(&fail_name);
  if (name != NULL && strcmp(name, fn) == 0 && atomic_compare_exchange_strong(&fail_name, &name, NULL)) {
    *error = atomic_load(&fail_name_error);
    return true;
  }
  const long at = atomic_load(&fail_at);
  *error = atomic_load(&fail_error);
  return at > 0 && atomic_fetch_add(&fail_calls, 1) + 1 == at;
}

/* Sticky errors (simcuda_poison). The runtime documents cudaErrorIllegalAddress
 * and its kin with "any further CUDA work will return the same error. To
 * continue using CUDA, the process must be terminated and relaunched": for
 * the process, not one device. So once poisoned, every call but the
 * queries that do no work on a device (counting and choosing devices,
 * their properties, versions, the error queries) returns the error, the
 * release calls included, and cudaGetLastError returns it without
 * clearing it. */
static _Atomic cudaError_t sticky;

void simcuda_poison(cudaError_t error) { atomic_store(&sticky, error); }

static bool sticky_exempt(const char *fn) {
  static const char *const exempt[] = {"cudaGetDeviceCount", "cudaGetDevice", "cudaSetDevice", "cudaDriverGetVersion",
                                       "cudaGetDeviceProperties", "cudaDeviceGetAttribute", "cudaDeviceGetPCIBusId",
                                       "cudaDeviceCanAccessPeer"};
  for (size_t i = 0; i < sizeof exempt / sizeof exempt[0]; i++)
    if (strcmp(fn, exempt[i]) == 0) return true;
  return false;
}

/* The sticky error for this call, or cudaSuccess. */
static cudaError_t sticky_for(const char *fn) {
  const cudaError_t e = atomic_load(&sticky);
  return e != cudaSuccess && !sticky_exempt(fn) ? fail(e) : cudaSuccess;
}

#define STICKY()                                       \
  do {                                                 \
    const cudaError_t st_ = sticky_for(__func__);      \
    if (st_ != cudaSuccess) return st_;                \
  } while (0)

static cudaError_t injected_failure(const char *call, cudaError_t error) {
  atomic_store(&failed_call, call);
  atomic_fetch_add(&failed, 1);
  return fail(error);
}

#define INJECT()                                                 \
  do {                                                           \
    STICKY();                                                    \
    cudaError_t inj_;                                            \
    if (injected(__func__, &inj_)) return injected_failure(__func__, inj_); \
  } while (0)

enum space { PAGEABLE, DEVICE, PINNED, MANAGED };

struct alloc {
  char *addr;   /* what the caller sees */
  char *shadow; /* what the simulated device reads and writes */
  size_t size;
  enum space space;
  int dev;
  struct alloc *next;
};
static struct alloc *allocs;
static size_t used[SIM_MAX_DEVICES];

/* Primary contexts (runtime API, "Initialization" and "Context
 * Management"): a device's is created the first time a call needs one on
 * it: cudaSetDevice ("will now immediately initialize the runtime state on
 * the primary context", CUDA 12.0 on) and the calls that work on the
 * current device (memory, streams, events, cudaMemGetInfo); not by the
 * calls that only describe devices (cudaGetDeviceCount,
 * cudaGetDeviceProperties, cudaDeviceGetAttribute, cudaDeviceCanAccessPeer,
 * cudaDeviceGetPCIBusId). A real context costs hundreds of MB of the GPU's
 * memory and tens to hundreds of ms: counted, so tests can hold the
 * library to what it documents (simcuda_contexts). */
static atomic_bool ctx_active[SIM_MAX_DEVICES];
static atomic_long contexts_made, meminfo_calls;

static void need_context(int d) {
  bool no = false;
  if (atomic_compare_exchange_strong(&ctx_active[d], &no, true)) atomic_fetch_add(&contexts_made, 1);
}

void simcuda_contexts(long *made, long *meminfo) {
  *made = atomic_load(&contexts_made);
  *meminfo = atomic_load(&meminfo_calls);
}

bool simcuda_context_active(int dev) { return dev >= 0 && dev < SIM_MAX_DEVICES && atomic_load(&ctx_active[dev]); }

static unsigned char peer_on[SIM_MAX_DEVICES][SIM_MAX_DEVICES];

/* Where [p, p + n) lives; *host is the address to touch it through. Under
 * mu. An address inside an allocation with a range past its end is
 * invalid; an address in none is pageable host memory. */
static cudaError_t resolve(const void *p, size_t n, enum space *sp, int *dev, char **host) {
  const char *c = p;
  for (struct alloc *a = allocs; a != NULL; a = a->next) {
    if (c < a->addr || c >= a->addr + a->size) continue;
    if (n > a->size - (size_t)(c - a->addr)) return cudaErrorInvalidValue;
    *sp = a->space;
    *dev = a->dev;
    *host = a->shadow + (c - a->addr);
    return cudaSuccess;
  }
  *sp = PAGEABLE;
  *dev = -1;
  *host = (char *)(uintptr_t)p;
  return cudaSuccess;
}

/* ---- queues ---------------------------------------------------------------- */

/* Every operation gets a number from one counter when it is queued: an
 * operation waits for the unfinished operations with smaller numbers on
 * the queues it depends on, so dependencies never form a cycle. */
static uint64_t next_seq = 1;

struct op {
  enum { OP_COPY, OP_HOST_FN, OP_MARK, OP_WAIT } kind;
  uint64_t seq;
  int peer_devs[3]; /* cudaMemcpyPeer: ordered with all work of these (-1: none) */
  char *dst;
  const char *src;
  size_t width, height, dpitch, spitch;
  void *owned; /* a captured pageable source, freed after the copy */
  cudaHostFn_t fn;
  void *arg;
  struct CUevent_st *event;
  uint64_t mark;
  struct record *rec; /* OP_MARK: the record it completes; OP_WAIT: the one it waits for */
  struct op *next;
};

enum qkind { Q_LEGACY, Q_BLOCKING, Q_NONBLOCKING };

struct queue {
  struct op *head, *tail; /* head: the oldest unfinished, running or not */
  int dev;
  enum qkind kind;
  bool started, destroyed;
};

/* A created stream is its queue; the list holds the live ones, and a
 * destroyed one until its worker has run its last operation. */
struct CUstream_st {
  struct queue q;
  struct CUstream_st *next;
};

/* One cudaEventRecord: whether the work it captured has run. Shared, with
 * a count, by the mark that runs it, the event (its latest record) and
 * every cudaStreamWaitEvent and cudaEventSynchronize that waits for it:
 * records of one event may run out of order (on different streams), so a
 * waiter waits for its own record, not for "some later mark ran". */
struct record {
  bool done;
  int refs;
};

struct CUevent_st {
  int dev;
  uint64_t recorded, completed; /* the latest record's mark, and the highest run */
  struct record *latest;        /* the latest record, or NULL */
  unsigned pending;             /* marks and waits queued and not yet run */
  bool destroyed;
};

/* Under mu. */
static void drop_record(struct record *r) {
  if (r != NULL && --r->refs == 0) free(r);
}

static void free_event(struct CUevent_st *ev) {
  drop_record(ev->latest);
  free(ev);
}

static struct queue legacy[SIM_MAX_DEVICES];
static struct CUstream_st *streams;

static void init_queues(void) {
  for (int d = 0; d < SIM_MAX_DEVICES; d++) legacy[d].dev = d;
}

static void run_copy(const struct op *o) {
  for (size_t y = 0; y < o->height; y++) memcpy(o->dst + y * o->dpitch, o->src + y * o->spitch, o->width);
}

static bool pending_before(const struct queue *q, uint64_t seq) { return q->head != NULL && q->head->seq < seq; }

static bool involves(const struct op *o, int dev) {
  return o->peer_devs[0] == dev || o->peer_devs[1] == dev || o->peer_devs[2] == dev;
}

/* Whether work numbered below `seq` that an operation on q must follow is
 * unfinished: q's own; for the legacy stream its device's blocking streams,
 * and for a blocking stream its device's legacy stream; a cudaMemcpyPeer
 * that involves q's device. Under mu. */
static bool busy_before(const struct queue *q, uint64_t seq) {
  if (pending_before(q, seq)) return true;
  if (q->kind == Q_BLOCKING && pending_before(&legacy[q->dev], seq)) return true;
  for (struct CUstream_st *s = streams; s != NULL; s = s->next)
    if (q->kind == Q_LEGACY && s->q.dev == q->dev && s->q.kind == Q_BLOCKING && pending_before(&s->q, seq))
      return true;
  for (int d = 0; d < ndev; d++)
    for (const struct op *o = legacy[d].head; o != NULL && o->seq < seq; o = o->next)
      if (o->peer_devs[0] >= 0 && involves(o, q->dev)) return true;
  return false;
}

/* Whether o, at the head of q, must wait. Under mu. */
static bool blocked(const struct queue *q, const struct op *o) {
  /* cudaStreamWaitEvent: until the work before the record it saw has run. */
  if (o->kind == OP_WAIT && o->rec != NULL && !o->rec->done) return true;
  if (o->peer_devs[0] < 0) {
    struct queue probe = *q;
    probe.head = NULL; /* o itself heads q */
    return busy_before(&probe, o->seq);
  }
  /* cudaMemcpyPeer: after all earlier work of every device it involves,
   * earlier cudaMemcpyPeer copies that share one of them included. */
  for (int d = 0; d < ndev; d++) {
    if (involves(o, d) && &legacy[d] != q && pending_before(&legacy[d], o->seq)) return true;
    for (const struct op *p = legacy[d].head; p != NULL && p->seq < o->seq; p = p->next)
      if (p->peer_devs[0] >= 0 && (involves(o, p->peer_devs[0]) || involves(o, p->peer_devs[1]) ||
                                   involves(o, p->peer_devs[2])))
        return true;
  }
  for (struct CUstream_st *s = streams; s != NULL; s = s->next)
    if (involves(o, s->q.dev) && pending_before(&s->q, o->seq)) return true;
  return false;
}

static void unlink_stream(struct CUstream_st *s) {
  struct CUstream_st **at = &streams;
  while (*at != s) at = &(*at)->next;
  *at = s->next;
}

static void *worker(void *arg) {
  struct queue *q = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while ((q->head == NULL && !q->destroyed) || (q->head != NULL && blocked(q, q->head)))
      pthread_cond_wait(&progress, &mu);
    if (q->head == NULL) break; /* a destroyed stream, its work done */
    struct op *o = q->head;
    pthread_mutex_unlock(&mu);
    if (delay_us > 0 && o->kind == OP_COPY) nanosleep(&(struct timespec){0, delay_us * 1000}, NULL);
    if (o->kind == OP_COPY) run_copy(o);
    else if (o->kind == OP_HOST_FN) o->fn(o->arg);
    pthread_mutex_lock(&mu);
    if (o->kind == OP_MARK || o->kind == OP_WAIT) {
      struct CUevent_st *ev = o->event;
      if (o->kind == OP_MARK) {
        if (ev->completed < o->mark) ev->completed = o->mark;
        o->rec->done = true;
      }
      drop_record(o->rec);
      if (--ev->pending == 0 && ev->destroyed) free_event(ev);
    }
    q->head = o->next;
    if (q->head == NULL) q->tail = NULL;
    pthread_cond_broadcast(&progress);
    free(o->owned);
    free(o);
  }
  struct CUstream_st *s = (struct CUstream_st *)q; /* only streams are destroyed */
  unlink_stream(s);
  pthread_cond_broadcast(&progress);
  pthread_mutex_unlock(&mu);
  free(s);
  return NULL;
}

/* Under mu; takes o (freed on failure). */
static cudaError_t enqueue(struct queue *q, struct op *o) {
  if (!q->started) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, q) != 0) {
      free(o->owned);
      free(o);
      return cudaErrorMemoryAllocation;
    }
    pthread_detach(t);
    q->started = true;
  }
  o->seq = next_seq++;
  o->next = NULL;
  if (q->tail) q->tail->next = o;
  else q->head = o;
  q->tail = o;
  pthread_cond_broadcast(&progress);
  return cudaSuccess;
}

static struct op *new_op(int kind) {
  struct op *o = calloc(1, sizeof *o);
  if (o != NULL) {
    o->kind = kind;
    o->peer_devs[0] = o->peer_devs[1] = o->peer_devs[2] = -1;
  }
  return o;
}

/* Whether the host, waiting for q, must wait for work numbered below
 * `target`: q's own operations (each of which waited for what it depended
 * on when it ran). For the legacy stream too: the runtime API says an
 * operation issued to the legacy stream first waits for the blocking
 * streams, but of cudaStreamSynchronize only that it "blocks until stream
 * has completed all operations"; so, strictly, synchronising an idle
 * legacy stream does not wait for a blocking stream's work (record an
 * event there and wait for it instead). Under mu. */
static bool host_waits(const struct queue *q, uint64_t target) {
  return pending_before(q, target);
}

/* Under mu: until the work queued on q so far has run. */
static void drain(struct queue *q) {
  const uint64_t target = next_seq;
  while (host_waits(q, target)) pthread_cond_wait(&progress, &mu);
}

/* The calling thread's default stream per device (cudaStreamPerThread): a
 * blocking stream of its own, made when first used and kept for the
 * process's life (it stays on the stream list, so nothing leaks). */
static _Thread_local struct CUstream_st *per_thread[SIM_MAX_DEVICES];

/* Under mu. NULL and cudaStreamLegacy are the current device's legacy
 * stream. */
static struct queue *queue_of(cudaStream_t s) {
  if (s == NULL || s == cudaStreamLegacy) return &legacy[current];
  if (s == cudaStreamPerThread) {
    if (per_thread[current] == NULL) {
      struct CUstream_st *t = calloc(1, sizeof *t);
      if (t == NULL) return &legacy[current]; /* more ordered, still right */
      t->q.dev = current;
      t->q.kind = Q_BLOCKING;
      t->next = streams;
      streams = t;
      per_thread[current] = t;
    }
    return &per_thread[current]->q;
  }
  return &s->q;
}

/* ---- copies ---------------------------------------------------------------- */

static bool is_host(enum space s) { return s != DEVICE; }
static bool is_dev(enum space s) { return s == DEVICE || s == MANAGED; }

enum when {
  ASYNC,       /* queued: cudaMemcpyAsync */
  SYNC,        /* queued, then waited for: cudaMemcpy's completing cases */
  SYNC_MEMCPY, /* cudaMemcpy: its own rules per kind of memory */
};

/* A 2-D copy (a 1-D one is one row) on q. Under mu. */
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                          enum cudaMemcpyKind kind, struct queue *q, enum when when, const int peer_devs[3]) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch || dst == NULL || src == NULL) return cudaErrorInvalidValue;
  size_t dext, sext, area;
  if (__builtin_mul_overflow(dpitch, height - 1, &dext) || __builtin_add_overflow(dext, width, &dext) ||
      __builtin_mul_overflow(spitch, height - 1, &sext) || __builtin_add_overflow(sext, width, &sext) ||
      __builtin_mul_overflow(width, height, &area))
    return cudaErrorInvalidValue;
  enum space ds, ss;
  int dd, sd;
  char *dh, *sh;
  if (resolve(dst, dext, &ds, &dd, &dh) != cudaSuccess || resolve(src, sext, &ss, &sd, &sh) != cudaSuccess)
    return cudaErrorInvalidValue;
  switch (kind) {
  case cudaMemcpyHostToHost: if (!is_host(ss) || !is_host(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyHostToDevice: if (!is_host(ss) || !is_dev(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDeviceToHost: if (!is_dev(ss) || !is_host(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDeviceToDevice: if (!is_dev(ss) || !is_dev(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDefault: break;
  default: return cudaErrorInvalidMemcpyDirection;
  }
  /* Between pageable or pinned memory only: managed memory is the copy
   * engine's, like device memory. */
  const bool host_to_host = (ds == PAGEABLE || ds == PINNED) && (ss == PAGEABLE || ss == PINNED);
  bool capture = false, wait = when == SYNC || host_to_host;
  if (when == SYNC_MEMCPY && !host_to_host) {
    /* cudaMemcpy: device to device and a pageable upload (once staged)
     * return early; everything else completes before it returns. */
    const bool d2d = ds == DEVICE && ss == DEVICE;
    capture = ss == PAGEABLE && ds == DEVICE;
    wait = !d2d && !capture;
  }
  if (host_to_host) {
    /* Fully synchronous, after the stream's earlier work. */
    struct op o = {.dst = dh, .src = sh, .width = width, .height = height, .dpitch = dpitch, .spitch = spitch};
    drain(q);
    pthread_mutex_unlock(&mu);
    run_copy(&o);
    pthread_mutex_lock(&mu);
    return cudaSuccess;
  }
  struct op *o = new_op(OP_COPY);
  if (o == NULL) return cudaErrorMemoryAllocation;
  o->dst = dh;
  o->src = sh;
  o->width = width;
  o->height = height;
  o->dpitch = dpitch;
  o->spitch = spitch;
  if (peer_devs != NULL) memcpy(o->peer_devs, peer_devs, sizeof o->peer_devs);
  if (capture) {
    drain(q); /* "a stream sync is performed before the copy is initiated" */
    char *cap = malloc(area);
    if (cap == NULL) {
      free(o);
      return cudaErrorMemoryAllocation;
    }
    for (size_t y = 0; y < height; y++) memcpy(cap + y * width, sh + y * spitch, width);
    o->owned = cap;
    o->src = cap;
    o->spitch = width;
  }
  const uint64_t seq = next_seq;
  cudaError_t e = enqueue(q, o);
  if (e == cudaSuccess && wait)
    while (host_waits(q, seq + 1)) pthread_cond_wait(&progress, &mu);
  return e;
}

static cudaError_t memcpy_on(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                             enum cudaMemcpyKind kind, cudaStream_t s, enum when when) {
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  cudaError_t e = copy2d(dst, dpitch, src, spitch, width, height, kind, queue_of(s), when, NULL);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s) {
  INJECT();
  return memcpy_on(dst, count, src, count, count, 1, kind, s, ASYNC);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  INJECT();
  return memcpy_on(dst, count, src, count, count, 1, kind, NULL, SYNC_MEMCPY);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s) {
  INJECT();
  /* "returns an error if dpitch or spitch exceeds the maximum allowed",
   * whatever the height (a one-row rectangle included) */
  pthread_once(&config_once, configure);
  if (width > 0 && height > 0 && (dpitch > max_pitch || spitch > max_pitch)) return fail(cudaErrorInvalidPitchValue);
  return memcpy_on(dst, dpitch, src, spitch, width, height, kind, s, ASYNC);
}

/* Peer copies, direct or staged (simcuda_peer_copies). CUDA Runtime API,
 * "Peer Device Memory Access": cudaDeviceEnablePeerAccess makes the peer's
 * allocations "accessible by the current device", one direction, for the
 * device's (primary) context, whichever thread asks; cudaMemcpyPeer[Async]
 * copy between devices whether or not access is enabled (without it the
 * driver stages through host memory). Modelled strictly: a copy is direct
 * only when the destination device was given access to the source's
 * memory (the destination pulls), so enabling the wrong direction, or from
 * the wrong current device, shows up as a staged copy. The bytes and the
 * ordering are the same either way. */
static atomic_long peer_direct, peer_staged;

void simcuda_peer_copies(long *direct, long *staged) {
  *direct = atomic_load(&peer_direct);
  *staged = atomic_load(&peer_staged);
}

/* Under mu: counts one peer copy. */
static void count_peer(int dst_dev, int src_dev) {
  if (peer_on[dst_dev][src_dev]) atomic_fetch_add(&peer_direct, 1);
  else atomic_fetch_add(&peer_staged, 1);
}

/* Under mu: both pointers must be device memory of the devices named. */
static cudaError_t check_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
  enum space ds, ss;
  int dd, sd;
  char *h;
  if (dst_dev < 0 || dst_dev >= ndev || src_dev < 0 || src_dev >= ndev) return cudaErrorInvalidDevice;
  if (resolve(dst, n, &ds, &dd, &h) != cudaSuccess || resolve(src, n, &ss, &sd, &h) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (ds != DEVICE || ss != DEVICE || dd != dst_dev || sd != src_dev) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n, cudaStream_t s) {
  INJECT();
  pthread_once(&config_once, configure);
  pthread_mutex_lock(&mu);
  cudaError_t e = n == 0 ? cudaSuccess : check_peer(dst, dst_dev, src, src_dev, n);
  if (e == cudaSuccess && n > 0)
    e = copy2d(dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, queue_of(s), ASYNC, NULL);
  if (e == cudaSuccess && n > 0) count_peer(dst_dev, src_dev);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* Asynchronous to the host, and ordered with all earlier and later work of
 * the current device and both devices named (on the destination's legacy
 * stream, waiting for every stream of the three). */
cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
  INJECT();
  pthread_once(&config_once, configure);
  pthread_mutex_lock(&mu);
  cudaError_t e = n == 0 ? cudaSuccess : check_peer(dst, dst_dev, src, src_dev, n);
  const int devs[3] = {dst_dev, src_dev, current};
  if (e == cudaSuccess && n > 0)
    e = copy2d(dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, &legacy[dst_dev], ASYNC, devs);
  if (e == cudaSuccess && n > 0) count_peer(dst_dev, src_dev);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* ---- memory ----------------------------------------------------------------- */

static size_t page_round(size_t n) {
  const size_t page = 4096;
  return n == 0 ? page : (n + page - 1) / page * page;
}

static cudaError_t add_alloc(void **out, size_t n, enum space sp, int dev) {
  size_t len = page_round(n);
  struct alloc *a = malloc(sizeof *a);
  if (a == NULL) return cudaErrorMemoryAllocation;
  void *shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void *addr = shadow;
  if (shadow != MAP_FAILED && sp == DEVICE) {
    addr = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (addr == MAP_FAILED) munmap(shadow, len);
  }
  if (shadow == MAP_FAILED || addr == MAP_FAILED) {
    free(a);
    return cudaErrorMemoryAllocation;
  }
  *a = (struct alloc){addr, shadow, len, sp, dev, allocs};
  allocs = a;
  *out = addr;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  if (p == NULL) return fail(cudaErrorInvalidValue);
  if (n > SIZE_MAX - 4096) return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&mu);
  cudaError_t e = cudaErrorMemoryAllocation;
  if (page_round(n) <= dev_memory - used[current]) {
    e = add_alloc(p, n, DEVICE, current);
    if (e == cudaSuccess) used[current] += page_round(n);
  }
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  INJECT();
  (void)flags;
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  if (p == NULL) return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&mu);
  cudaError_t e = n > SIZE_MAX - 4096 ? cudaErrorMemoryAllocation : add_alloc(p, n, PINNED, current);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  if (p == NULL || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)) return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&mu);
  cudaError_t e = n > SIZE_MAX - 4096 ? cudaErrorMemoryAllocation : add_alloc(p, n, MANAGED, current);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* Whether a queued operation still reads or writes a. Under mu. */
static bool op_touches(const struct op *o, const struct alloc *a) {
  if (o->kind != OP_COPY) return false;
  const char *lo = a->shadow, *hi = a->shadow + a->size;
  const char *d = o->dst, *de = o->dst + o->dpitch * (o->height - 1) + o->width;
  const char *s = o->src, *se = o->src + o->spitch * (o->height - 1) + o->width;
  return (d < hi && de > lo) || (s < hi && se > lo);
}

static bool in_flight(const struct alloc *a) {
  for (int d = 0; d < ndev; d++)
    for (const struct op *o = legacy[d].head; o != NULL; o = o->next)
      if (op_touches(o, a)) return true;
  for (const struct CUstream_st *st = streams; st != NULL; st = st->next)
    for (const struct op *o = st->q.head; o != NULL; o = o->next)
      if (op_touches(o, a)) return true;
  return false;
}

/* cudaFree and cudaFreeHost wait for the queued copies that touch the
 * memory, then free it. */
static cudaError_t free_alloc(void *p, bool pinned) {
  if (p == NULL) return cudaSuccess;
  pthread_once(&config_once, configure);
  pthread_mutex_lock(&mu);
  struct alloc **at;
  for (;;) {
    at = &allocs;
    while (*at != NULL && (*at)->addr != p) at = &(*at)->next;
    if (*at == NULL || ((*at)->space == PINNED) != pinned) {
      pthread_mutex_unlock(&mu);
      return fail(cudaErrorInvalidValue);
    }
    if (!in_flight(*at)) break;
    pthread_cond_wait(&progress, &mu); /* the list may change meanwhile: look again */
  }
  struct alloc *a = *at;
  *at = a->next;
  if (a->space == DEVICE) used[a->dev] -= a->size;
  pthread_mutex_unlock(&mu);
  if (a->addr != a->shadow) munmap(a->addr, a->size);
  munmap(a->shadow, a->size);
  free(a);
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  STICKY();
  return free_alloc(p, false);
}
cudaError_t cudaFreeHost(void *p) {
  STICKY();
  return free_alloc(p, true);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
  INJECT();
  pthread_once(&config_once, configure);
  if (attr == NULL) return fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof *attr);
  /* Without a context on the current device the runtime answers
   * cudaErrorInvalidValue, device memory of another GPU included (CUDA
   * 10.1 and later: CuPy issue 3991, "no longer working ... if the device
   * the pointer resides and the current device do not match"; CuPy makes a
   * context first). */
  if (ndev > 0 && !ctx_active[current]) return fail(cudaErrorInvalidValue);
  enum space sp = PAGEABLE; /* resolve() of one byte always answers; the analyzer cannot tell */
  int dev = -1;
  char *h;
  pthread_mutex_lock(&mu);
  (void)resolve(p, 1, &sp, &dev, &h);
  pthread_mutex_unlock(&mu);
  static const enum cudaMemoryType types[] = {cudaMemoryTypeUnregistered, cudaMemoryTypeDevice, cudaMemoryTypeHost,
                                              cudaMemoryTypeManaged};
  attr->type = types[sp];
  attr->device = sp == PAGEABLE ? current : dev;
  attr->devicePointer = sp == PAGEABLE ? NULL : (void *)(uintptr_t)p;
  attr->hostPointer = sp == DEVICE ? NULL : (void *)(uintptr_t)p;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  atomic_fetch_add(&meminfo_calls, 1);
  pthread_mutex_lock(&mu);
  *free_bytes = dev_memory - used[current];
  *total = dev_memory;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* ---- devices ----------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n) {
  INJECT();
  pthread_once(&config_once, configure);
  *n = 0;
  if (ndev == 0) return fail(cudaErrorNoDevice);
  *n = ndev;
  return cudaSuccess;
}

static bool bad_device(int d) { return d < 0 || d >= ndev; }

cudaError_t cudaGetDevice(int *d) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  *d = current;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  INJECT();
  pthread_once(&config_once, configure);
  if (bad_device(d)) return fail(ndev == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  current = d;
  need_context(d);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  INJECT();
  pthread_once(&config_once, configure);
  if (bad_device(d)) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "simcuda device %d", d);
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = dev_memory;
  p->pciBusID = d + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d) {
  INJECT();
  pthread_once(&config_once, configure);
  if (bad_device(d)) return fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrMaxPitch: *v = (int)max_pitch; return cudaSuccess;
  case cudaDevAttrIntegrated: *v = 0; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
  case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
  case cudaDevAttrUnifiedAddressing: *v = 1; return cudaSuccess;
  case cudaDevAttrConcurrentManagedAccess: *v = concurrent_managed; return cudaSuccess;
  default:
    /* Say so rather than invent a value: add it here. */
    fprintf(stderr, "simcuda: cudaDeviceGetAttribute(%d) is not simulated\n", (int)attr);
    return fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d) {
  INJECT();
  pthread_once(&config_once, configure);
  if (bad_device(d)) return fail(cudaErrorInvalidDevice);
  snprintf(buf, (size_t)len, "0000:%02x:00.0", d + 1);
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  INJECT();
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer) {
  INJECT();
  pthread_once(&config_once, configure);
  if (bad_device(d) || bad_device(peer)) return fail(cudaErrorInvalidDevice);
  *can = can_peer(d, peer);
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  INJECT();
  pthread_once(&config_once, configure);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (bad_device(peer) || peer == current) return fail(cudaErrorInvalidDevice);
  if (!can_peer(current, peer)) return fail(cudaErrorPeerAccessUnsupported);
  pthread_mutex_lock(&mu);
  const bool was = peer_on[current][peer];
  peer_on[current][peer] = 1;
  pthread_mutex_unlock(&mu);
  return was ? fail(cudaErrorPeerAccessAlreadyEnabled) : cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  if (out == NULL || (flags & ~(unsigned)cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL) return fail(cudaErrorMemoryAllocation);
  s->q.dev = current;
  s->q.kind = flags & cudaStreamNonBlocking ? Q_NONBLOCKING : Q_BLOCKING;
  pthread_mutex_lock(&mu);
  s->next = streams;
  streams = s;
  pthread_mutex_unlock(&mu);
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

/* Returns at once; the stream goes when its work is done. */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  STICKY();
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&mu);
  s->q.destroyed = true;
  const bool running = s->q.started; /* its worker unlinks and frees it */
  if (!running) unlink_stream(s);
  pthread_cond_broadcast(&progress);
  pthread_mutex_unlock(&mu);
  if (!running) free(s);
  return cudaSuccess;
}

/* An armed failure of a wait is reported after the wait: it stands for an
 * error of the work waited for, which then has ended. */
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  STICKY();
  cudaError_t inj;
  const bool fails = injected(__func__, &inj);
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  drain(queue_of(s));
  pthread_mutex_unlock(&mu);
  return fails ? injected_failure(__func__, inj) : cudaSuccess;
}

/* Runtime API 6.2: "Blocks until the device has completed all preceding
 * requested tasks": every stream of the current device, the legacy one,
 * created ones and every thread's per-thread one. */
cudaError_t cudaDeviceSynchronize(void) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  pthread_mutex_lock(&mu);
  const uint64_t target = next_seq;
  for (;;) {
    bool busy = pending_before(&legacy[current], target);
    for (struct CUstream_st *st = streams; st != NULL && !busy; st = st->next)
      busy = st->q.dev == current && pending_before(&st->q, target);
    if (!busy) break;
    pthread_cond_wait(&progress, &mu);
  }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  const bool busy = host_waits(queue_of(s), next_seq);
  pthread_mutex_unlock(&mu);
  return busy ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  if (fn == NULL) return fail(cudaErrorInvalidValue);
  struct op *o = new_op(OP_HOST_FN);
  if (o == NULL) return fail(cudaErrorMemoryAllocation);
  o->fn = fn;
  o->arg = arg;
  pthread_mutex_lock(&mu);
  cudaError_t e = enqueue(queue_of(s), o);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  INJECT();
  (void)flags;
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  need_context(current);
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (e == NULL) return fail(cudaErrorMemoryAllocation);
  e->dev = current;
  *out = e;
  return cudaSuccess;
}

/* Only on a stream of the event's device, as the runtime requires. */
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  INJECT();
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  struct op *o = new_op(OP_MARK);
  struct record *rec = calloc(1, sizeof *rec);
  if (o == NULL || rec == NULL) {
    free(o);
    free(rec);
    return fail(cudaErrorMemoryAllocation);
  }
  pthread_mutex_lock(&mu);
  struct queue *q = queue_of(s);
  if (q->dev != ev->dev) {
    pthread_mutex_unlock(&mu);
    free(o);
    free(rec);
    return fail(cudaErrorInvalidResourceHandle);
  }
  o->event = ev;
  o->mark = ev->recorded + 1;
  o->rec = rec;
  rec->refs = 2; /* the mark's and the event's */
  cudaError_t e = enqueue(q, o); /* frees o on failure */
  if (e == cudaSuccess) {
    ev->recorded = o->mark;
    ev->pending++;
    drop_record(ev->latest);
    ev->latest = rec;
  } else {
    free(rec);
  }
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* Runtime API 6.4, cudaStreamWaitEvent: work queued on s after the call
 * waits for the work captured by the event's latest record (none recorded:
 * no wait); "event may be from a different device than stream". The wait
 * is an operation of s, so later work of s, and of streams that wait for
 * s, is held too. flags must be 0 (cudaEventWaitDefault). */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  INJECT();
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  struct op *o = new_op(OP_WAIT);
  if (o == NULL) return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&mu);
  o->event = ev;
  o->mark = ev->recorded;
  o->rec = ev->latest;
  if (o->rec != NULL) o->rec->refs++;
  cudaError_t e = enqueue(queue_of(s), o);
  if (e == cudaSuccess) ev->pending++;
  else if (ev->latest != NULL) ev->latest->refs--; /* o is gone; the event still holds it */
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* Waits for the work before the latest record (none recorded: at once). */
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  STICKY();
  cudaError_t inj;
  const bool fails = injected(__func__, &inj);
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&mu);
  struct record *r = ev->latest;
  if (r != NULL) {
    r->refs++;
    while (!r->done) pthread_cond_wait(&progress, &mu);
    drop_record(r);
  }
  pthread_mutex_unlock(&mu);
  return fails ? injected_failure(__func__, inj) : cudaSuccess;
}

/* Returns at once; a pending event goes when its last mark has run. */
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  STICKY();
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&mu);
  const bool now = ev->pending == 0;
  ev->destroyed = true;
  if (now) free_event(ev);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* ---- errors ---------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
  const cudaError_t st = atomic_load(&sticky);
  if (st != cudaSuccess) return st; /* never cleared */
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t st = atomic_load(&sticky);
  return st != cudaSuccess ? st : last_error;
}

#define SIM_ERRORS(X)                                                              \
  X(cudaSuccess, "no error")                                                       \
  X(cudaErrorInvalidValue, "invalid argument")                                     \
  X(cudaErrorMemoryAllocation, "out of memory")                                    \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                              \
  X(cudaErrorInvalidPitchValue, "invalid pitch argument")                          \
  X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")          \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected (simcuda: set AB_SIMCUDA_DEVICES)") \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")                     \
  X(cudaErrorNotReady, "device not ready")                                         \
  X(cudaErrorIllegalAddress, "an illegal memory access was encountered")           \
  X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")         \
  X(cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices") \
  X(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled")           \
  X(cudaErrorNotSupported, "operation not supported")                             \
  X(cudaErrorLaunchFailure, "unspecified launch failure")

const char *cudaGetErrorName(cudaError_t e) {
#define SIM_NAME(code, text) \
  if (e == code) return #code;
  SIM_ERRORS(SIM_NAME)
#undef SIM_NAME
  if ((int)e == 226) return "cudaErrorContained"; /* by value: older headers lack it */
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
#define SIM_TEXT(code, text) \
  if (e == code) return text;
  SIM_ERRORS(SIM_TEXT)
#undef SIM_TEXT
  if ((int)e == 226) return "an exception on the device was contained by the GPU's error containment";
  return "unknown error";
}
