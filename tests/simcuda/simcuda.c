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
 *   - Streams are FIFO queues run by worker threads, each operation after a
 *     delay (AB_SIMCUDA_DELAY_US, default 50): a buffer reused before the
 *     copy that reads it has run, or a result read before a wait, shows up
 *     as wrong data.
 *   - Copies touching pageable host memory follow the documented API
 *     synchronisation: a pageable source is captured at the call (the
 *     caller may reuse it on return), a pageable destination is written
 *     before the call returns (after the stream's earlier work), host to
 *     host is synchronous. Pinned and managed memory are read and written
 *     when the queued copy runs.
 *   - Copies are checked: a device range past its allocation, an explicit
 *     cudaMemcpyKind that does not match the pointers, a peer copy whose
 *     pointers are not on the devices named, a pitch past
 *     cudaDevAttrMaxPitch (AB_SIMCUDA_MAX_PITCH, default 1 MiB, so that
 *     the per-row fallback runs) all fail as the runtime would.
 *   - Errors are remembered per thread for cudaGetLastError; cudaMalloc
 *     fails past AB_SIMCUDA_MEMORY bytes per device (default 1 GiB).
 * Where it is stronger than a GPU: blocking streams of one device share the
 * legacy default stream's queue (one legal order of their work, not the
 * only one), and cudaStreamPerThread is that queue too; kernels do not
 * exist (the library is built without converters/cuda).
 *
 * Failures: simcuda_fail_nth() (simcuda.h) makes the n-th runtime call from
 * then on fail, for the tests' sweeps over the backend's error paths.
 *
 * Devices: AB_SIMCUDA_DEVICES (unset or 0: cudaGetDeviceCount fails with
 * cudaErrorNoDevice). Peer access, AB_SIMCUDA_PEER: "all" (default),
 * "none", or "pairs" (0<->1, 2<->3, ...: NVLink pairs). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <errno.h>
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

static void configure(void) {
  ndev = (int)env_long("AB_SIMCUDA_DEVICES", 0);
  if (ndev > SIM_MAX_DEVICES) ndev = SIM_MAX_DEVICES;
  dev_memory = (size_t)env_long("AB_SIMCUDA_MEMORY", (long)dev_memory);
  max_pitch = (size_t)env_long("AB_SIMCUDA_MAX_PITCH", (long)max_pitch);
  delay_us = env_long("AB_SIMCUDA_DELAY_US", delay_us);
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

static const char *_Atomic failed_call = "";

const char *simcuda_failed_call(void) { return atomic_load(&failed) ? atomic_load(&failed_call) : ""; }

#define INJECT()                                                                             \
  do {                                                                                       \
    const long at_ = atomic_load(&fail_at);                                                  \
    if (at_ > 0 && atomic_fetch_add(&fail_calls, 1) + 1 == at_) {                          \
      atomic_store(&failed_call, __func__);                                                  \
      atomic_fetch_add(&failed, 1);                                                          \
      return fail(atomic_load(&fail_error));                                                 \
    }                                                                                        \
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

struct op {
  enum { OP_COPY, OP_HOST_FN, OP_MARK } kind;
  char *dst;
  const char *src;
  size_t width, height, dpitch, spitch;
  void *owned; /* a captured pageable source, freed after the copy */
  cudaHostFn_t fn;
  void *arg;
  struct CUevent_st *event;
  uint64_t mark;
  struct op *next;
};

struct queue {
  struct op *head, *tail;
  uint64_t issued, done;
  bool started, stopping;
  pthread_t worker;
};

struct CUstream_st {
  int dev;
  struct queue *q; /* the device's queue, or own for a non-blocking stream */
  struct queue own;
};

struct CUevent_st {
  uint64_t recorded, completed;
};

static struct queue legacy[SIM_MAX_DEVICES];
static uint64_t all_issued, all_done; /* over every queue */

static void run_copy(const struct op *o) {
  for (size_t y = 0; y < o->height; y++) memcpy(o->dst + y * o->dpitch, o->src + y * o->spitch, o->width);
}

static void *worker(void *arg) {
  struct queue *q = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (q->head == NULL && !q->stopping) pthread_cond_wait(&progress, &mu);
    if (q->head == NULL) break;
    struct op *o = q->head;
    pthread_mutex_unlock(&mu);
    if (delay_us > 0 && o->kind == OP_COPY) nanosleep(&(struct timespec){0, delay_us * 1000}, NULL);
    if (o->kind == OP_COPY) run_copy(o);
    else if (o->kind == OP_HOST_FN) o->fn(o->arg);
    pthread_mutex_lock(&mu);
    if (o->kind == OP_MARK && o->event->completed < o->mark) o->event->completed = o->mark;
    q->head = o->next;
    if (q->head == NULL) q->tail = NULL;
    q->done++;
    all_done++;
    pthread_cond_broadcast(&progress);
    free(o->owned);
    free(o);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* Under mu. */
static cudaError_t enqueue(struct queue *q, struct op *o) {
  if (!q->started) {
    if (pthread_create(&q->worker, NULL, worker, q) != 0) {
      free(o->owned);
      free(o);
      return cudaErrorMemoryAllocation;
    }
    q->started = true;
  }
  o->next = NULL;
  if (q->tail) q->tail->next = o;
  else q->head = o;
  q->tail = o;
  q->issued++;
  all_issued++;
  pthread_cond_broadcast(&progress);
  return cudaSuccess;
}

/* Under mu: until everything queued on q so far has run. */
static void drain(struct queue *q) {
  const uint64_t target = q->issued;
  while (q->done < target) pthread_cond_wait(&progress, &mu);
}

/* Under mu: until everything queued on any stream so far has run. */
static void drain_all(void) {
  const uint64_t target = all_issued;
  while (all_done < target) pthread_cond_wait(&progress, &mu);
}

/* Under mu. NULL, cudaStreamLegacy and cudaStreamPerThread are the current
 * device's queue. */
static struct queue *queue_of(cudaStream_t s) {
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy[current];
  return s->q;
}

/* ---- copies ---------------------------------------------------------------- */

static bool is_host(enum space s) { return s != DEVICE; }
static bool is_dev(enum space s) { return s == DEVICE || s == MANAGED; }

/* A 2-D copy (a 1-D one is one row), queued on `q` or done here as the
 * documented synchronisation rules for pageable memory say. Under mu. */
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                          enum cudaMemcpyKind kind, struct queue *q, bool sync) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (dpitch > max_pitch && height > 1) return cudaErrorInvalidPitchValue;
  if (spitch > max_pitch && height > 1) return cudaErrorInvalidPitchValue;
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  if (dst == NULL || src == NULL) return cudaErrorInvalidValue;
  enum space ds, ss;
  int dd, sd;
  char *dh, *sh;
  if (resolve(dst, dpitch * (height - 1) + width, &ds, &dd, &dh) != cudaSuccess ||
      resolve(src, spitch * (height - 1) + width, &ss, &sd, &sh) != cudaSuccess)
    return cudaErrorInvalidValue;
  switch (kind) {
  case cudaMemcpyHostToHost: if (!is_host(ss) || !is_host(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyHostToDevice: if (!is_host(ss) || !is_dev(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDeviceToHost: if (!is_dev(ss) || !is_host(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDeviceToDevice: if (!is_dev(ss) || !is_dev(ds)) return cudaErrorInvalidMemcpyDirection; break;
  case cudaMemcpyDefault: break;
  default: return cudaErrorInvalidMemcpyDirection;
  }
  struct op o = {.kind = OP_COPY, .dst = dh, .src = sh, .width = width, .height = height, .dpitch = dpitch,
                 .spitch = spitch};
  const bool host_to_host = ds != DEVICE && ss != DEVICE && (ds == PAGEABLE || ss == PAGEABLE);
  if (sync || ds == PAGEABLE || host_to_host) {
    /* The stream's earlier work first, then this copy, before returning. */
    drain(q);
    pthread_mutex_unlock(&mu);
    run_copy(&o);
    pthread_mutex_lock(&mu);
    return cudaSuccess;
  }
  struct op *h = malloc(sizeof *h);
  if (h == NULL) return cudaErrorMemoryAllocation;
  *h = o;
  if (ss == PAGEABLE) {
    /* Captured now: the caller may overwrite its pageable buffer on return. */
    char *cap = malloc(width * height);
    if (cap == NULL) {
      free(h);
      return cudaErrorMemoryAllocation;
    }
    for (size_t y = 0; y < height; y++) memcpy(cap + y * width, sh + y * spitch, width);
    h->owned = cap;
    h->src = cap;
    h->spitch = width;
  }
  return enqueue(q, h);
}

static cudaError_t memcpy_on(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                             enum cudaMemcpyKind kind, cudaStream_t s, bool sync) {
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  cudaError_t e = copy2d(dst, dpitch, src, spitch, width, height, kind, queue_of(s), sync);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s) {
  INJECT();
  return memcpy_on(dst, count, src, count, count, 1, kind, s, false);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  INJECT();
  return memcpy_on(dst, count, src, count, count, 1, kind, NULL, true);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s) {
  INJECT();
  return memcpy_on(dst, dpitch, src, spitch, width, height, kind, s, false);
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
  if (e == cudaSuccess && n > 0) e = copy2d(dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, queue_of(s), false);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* Ordered after the work on both devices' default streams. */
cudaError_t cudaMemcpyPeer(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
  INJECT();
  pthread_once(&config_once, configure);
  pthread_mutex_lock(&mu);
  cudaError_t e = n == 0 ? cudaSuccess : check_peer(dst, dst_dev, src, src_dev, n);
  if (e == cudaSuccess && n > 0) {
    drain(&legacy[src_dev]);
    e = copy2d(dst, n, src, n, n, 1, cudaMemcpyDeviceToDevice, &legacy[dst_dev], true);
  }
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
  if (p == NULL) return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&mu);
  cudaError_t e = cudaErrorMemoryAllocation;
  if (n <= dev_memory - used[current]) {
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
  if (p == NULL) return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&mu);
  cudaError_t e = add_alloc(p, n, PINNED, -1);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  if (p == NULL || flags != cudaMemAttachGlobal) return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&mu);
  cudaError_t e = add_alloc(p, n, MANAGED, -1);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

/* cudaFree and cudaFreeHost synchronise the device before they free. */
static cudaError_t free_alloc(void *p, bool pinned) {
  if (p == NULL) return cudaSuccess;
  pthread_once(&config_once, configure);
  pthread_mutex_lock(&mu);
  struct alloc **at = &allocs;
  while (*at != NULL && (*at)->addr != p) at = &(*at)->next;
  struct alloc *a = *at;
  if (a == NULL || (a->space == PINNED) != pinned) {
    pthread_mutex_unlock(&mu);
    return fail(cudaErrorInvalidValue);
  }
  drain_all();
  *at = a->next;
  if (a->space == DEVICE) used[a->dev] -= a->size;
  pthread_mutex_unlock(&mu);
  if (a->addr != a->shadow) munmap(a->addr, a->size);
  munmap(a->shadow, a->size);
  free(a);
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) { return free_alloc(p, false); }
cudaError_t cudaFreeHost(void *p) { return free_alloc(p, true); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
  INJECT();
  pthread_once(&config_once, configure);
  if (attr == NULL) return fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof *attr);
  enum space sp;
  int dev;
  char *h;
  pthread_mutex_lock(&mu);
  (void)resolve(p, 1, &sp, &dev, &h);
  pthread_mutex_unlock(&mu);
  static const enum cudaMemoryType types[] = {cudaMemoryTypeUnregistered, cudaMemoryTypeDevice, cudaMemoryTypeHost,
                                              cudaMemoryTypeManaged};
  attr->type = types[sp];
  attr->device = sp == DEVICE ? dev : current;
  attr->devicePointer = sp == PAGEABLE ? NULL : (void *)(uintptr_t)p;
  attr->hostPointer = sp == PAGEABLE || sp == DEVICE ? NULL : (void *)(uintptr_t)p;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
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
  default: return fail(cudaErrorInvalidValue);
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
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL) return fail(cudaErrorMemoryAllocation);
  s->dev = current;
  s->q = flags & cudaStreamNonBlocking ? &s->own : &legacy[current];
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return fail(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&mu);
  drain(s->q);
  const bool join = s->own.started;
  s->own.stopping = true;
  pthread_cond_broadcast(&progress);
  pthread_mutex_unlock(&mu);
  if (join) pthread_join(s->own.worker, NULL);
  free(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  drain(queue_of(s));
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&mu);
  const struct queue *q = queue_of(s);
  const bool idle = q->done == q->issued;
  pthread_mutex_unlock(&mu);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  INJECT();
  pthread_once(&config_once, configure);
  if (ndev == 0) return fail(cudaErrorNoDevice);
  struct op *o = calloc(1, sizeof *o);
  if (o == NULL) return fail(cudaErrorMemoryAllocation);
  o->kind = OP_HOST_FN;
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
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (e == NULL) return fail(cudaErrorMemoryAllocation);
  *out = e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  INJECT();
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  struct op *o = calloc(1, sizeof *o);
  if (o == NULL) return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&mu);
  o->kind = OP_MARK;
  o->event = ev;
  o->mark = ++ev->recorded;
  cudaError_t e = enqueue(queue_of(s), o);
  pthread_mutex_unlock(&mu);
  return e == cudaSuccess ? e : fail(e);
}

static void event_wait(cudaEvent_t ev) {
  pthread_mutex_lock(&mu);
  const uint64_t target = ev->recorded;
  while (ev->completed < target) pthread_cond_wait(&progress, &mu);
  pthread_mutex_unlock(&mu);
}

/* Waits for the work before the latest record (none recorded: at once). */
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  INJECT();
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  event_wait(ev);
  return cudaSuccess;
}

/* The runtime lets a pending event be destroyed; here the destroy waits for
 * it, so that the queued mark never writes freed memory. */
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (ev == NULL) return fail(cudaErrorInvalidResourceHandle);
  event_wait(ev);
  free(ev);
  return cudaSuccess;
}

/* ---- errors ---------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

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
  X(cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices") \
  X(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled")           \
  X(cudaErrorNotSupported, "operation not supported")                             \
  X(cudaErrorLaunchFailure, "unspecified launch failure")

const char *cudaGetErrorName(cudaError_t e) {
#define SIM_NAME(code, text) \
  if (e == code) return #code;
  SIM_ERRORS(SIM_NAME)
#undef SIM_NAME
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
#define SIM_TEXT(code, text) \
  if (e == code) return text;
  SIM_ERRORS(SIM_TEXT)
#undef SIM_TEXT
  return "unknown error";
}
