/* The CUDA backend, through the CUDA runtime (cudart, linked statically so
 * that the library loads on machines without the toolkit or a driver).
 *
 * Three memory spaces, one backend object each, all served by this file:
 *   kDLCUDA         device memory of cuda:<gpu_id> (cudaMalloc)
 *   kDLCUDAHost     page-locked host memory (cudaHostAlloc, portable to
 *                   every device); device_id 0
 *   kDLCUDAManaged  unified memory (cudaMallocManaged); device_id 0
 * The last two are host-accessible: the core moves them with host copies
 * and uploads/downloads them like any host memory, which the driver then
 * moves by DMA without staging.
 *
 * No driver, a driver older than the runtime, or no device all mean zero
 * devices of each type, and the cudart error text is kept for the
 * AB_ERR_NO_DEVICE message. Nothing here aborts.
 *
 * Streams: ab_convert_opts.stream is a cudaStream_t; NULL is the legacy
 * default stream, and the DLPack values 1 (legacy default) and 2
 * (per-thread default) are cudart's own cudaStreamLegacy and
 * cudaStreamPerThread, so they pass through. Every copy is queued on that
 * stream and the stream is synchronised before the call returns.
 *
 * The caller's current device is saved and restored around every call that
 * needs another one: the library never leaves a cudaSetDevice behind.
 */
#include <cuda_runtime_api.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "converters/host/convert.h"
#include "converters/host/gather.h"

/* A NULL stream is the legacy default stream here, as the header
 * promises; a per-thread default stream build (nvcc --default-stream
 * per-thread) would make it the calling thread's stream instead, with
 * other ordering (found in review). */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "arraybridge's CUDA code takes a NULL stream as the legacy default stream: build it without --default-stream per-thread or CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif
#ifdef AB_HAVE_CUDA_KERNELS
#include "converters/cuda/convert.h"
#include "converters/cuda/gather.h"
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ndev;             /* devices, 0 when none or no driver */
static char why[256];        /* why there are none */

/* Peer access, per ordered pair (to, from): 0 not yet asked, 1 enabled,
 * 2 unavailable or disabled by AB_CUDA_PEER=0, under a lock. A failure
 * that may pass (not a refusal) is asked again at the next copy, up to
 * PEER_TRIES times in all (peer_tries). */
#define MAX_GPUS AB__MAX_IDS /* the ids the core uses (ab__dev_count) */
#define PEER_TRIES 3
static pthread_mutex_t peer_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char peer[MAX_GPUS][MAX_GPUS], peer_tries[MAX_GPUS][MAX_GPUS];

static void probe(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, sizeof why, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError(); /* leave no error behind for the caller's own checks */
    n = 0;
  } else if (n == 0) {
    snprintf(why, sizeof why, "the CUDA driver reports no devices");
  }
  ndev = n;
}

/* Sticky errors. The runtime documents each of these with "any further
 * CUDA work will return the same error. To continue using CUDA, the
 * process must be terminated and relaunched" (cudaErrorIllegalAddress,
 * cudaErrorLaunchFailure, ...; cudaErrorAssert: "The device cannot be used
 * again"). The first one seen is kept, and from then on every operation of
 * the three CUDA backends (cuda, cuda_host, cuda_managed) fails at once with
 * it (usable(), enter()), before a runtime call or a cached block of their
 * pools is handed out: nothing more is done on CUDA in this process. */
static _Atomic int sticky;  /* the cudaError_t; 0: none */
static char sticky_why[192]; /* written once, before `sticky` is published */
static pthread_mutex_t sticky_lock = PTHREAD_MUTEX_INITIALIZER;

static bool is_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchTimeout:
  case cudaErrorAssert:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorLaunchFailure:
    return true;
  default:
    /* Newer codes the runtime documents as needing the process relaunched,
     * by value (older toolkits' headers lack the names):
     * cudaErrorContained (226: Hopper's contained hardware errors),
     * cudaErrorTensorMemoryLeak (721), cudaErrorMpsClientTerminated (810),
     * cudaErrorExternalDevice (911). */
    return (int)e == 226 || (int)e == 721 || (int)e == 810 || (int)e == 911;
  }
}

static void note_sticky(cudaError_t e, int32_t id, const char *what) {
  pthread_mutex_lock(&sticky_lock);
  if (atomic_load_explicit(&sticky, memory_order_relaxed) == 0) {
    if (id < 0) snprintf(sticky_why, sizeof sticky_why, "%s (in %s)", cudaGetErrorName(e), what);
    else snprintf(sticky_why, sizeof sticky_why, "%s on cuda:%d (in %s)", cudaGetErrorName(e), (int)id, what);
    atomic_store_explicit(&sticky, (int)e, memory_order_release);
    AB_LOG(AB_LOG_ERROR, "CUDA is unusable in this process from now on: %s", sticky_why);
  }
  pthread_mutex_unlock(&sticky_lock);
}

/* AB_OK, or the failure every CUDA operation returns after a sticky error. */
static ab_status cuda_usable(int32_t id) {
  if (AB_LIKELY(atomic_load_explicit(&sticky, memory_order_acquire) == 0)) return AB_OK;
  return AB_FAIL(AB_ERR_BACKEND,
                 "cuda:%" PRId32 ": CUDA is unusable in this process since %s, a sticky error: the CUDA runtime "
                 "returns it for any further work until the process is restarted",
                 id, sticky_why);
}

/* A failure cleared from the runtime's error state (a non-sticky one goes;
 * a sticky one stays, and is recorded): for a call whose failure is not
 * the caller's to see (a release, a restore, a drain), and the first half
 * of fail_cuda. */
static void drop_error(cudaError_t e, int32_t id, const char *what) {
  if (is_sticky(e)) note_sticky(e, id, what);
  (void)cudaGetLastError();
}

static ab_status fail_cuda(cudaError_t e, int32_t id, const char *what) {
  drop_error(e, id, what);
  ab_status st = e == cudaErrorMemoryAllocation ? AB_ERR_OUT_OF_MEMORY
               : e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer ? AB_ERR_INVALID_ARGUMENT
               : AB_ERR_BACKEND;
  if (id < 0) return AB_FAIL(st, "cuda: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return AB_FAIL(st, "cuda:%" PRId32 ": %s failed: %s (%s)", id, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static ab_status cuda_init(void) {
  pthread_once(&once, probe);
  if (ndev == 0) return AB_FAIL(AB_ERR_NO_DEVICE, "%s", why);
  return AB_OK;
}

static int32_t cuda_count(void) { return ndev; }
/* Pinned and managed memory are one space each, device_id 0. */
static int32_t space_count(void) { return ndev > 0 ? 1 : 0; }

/* Makes `id` current, remembering the caller's device in *prev. */
static ab_status enter(int32_t id, int *prev) {
  AB_FORWARD(cuda_usable(id));
  cudaError_t e = cudaGetDevice(prev);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaGetDevice");
  if (*prev == id) return AB_OK;
  e = cudaSetDevice(id);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, "cudaSetDevice");
}

/* A failed restore (it takes a broken context) is logged and its error
 * cleared: the caller's work was done, and the error is not the caller's. */
static void set_back(int32_t id, int prev) {
  cudaError_t e = cudaSetDevice(prev);
  if (e == cudaSuccess) return;
  drop_error(e, id, "cudaSetDevice");
  AB_LOG(AB_LOG_WARN, "cuda:%d: could not make the caller's device cuda:%d current again: %s", (int)id, prev,
         cudaGetErrorName(e));
}

/* enter's pair: prev current again where enter changed it. */
static void leave(int32_t id, int prev) {
  if (prev != id) set_back(id, prev);
}

/* Waits for `stream`, returning the first error of the copy or the wait.
 * The stream is waited for even after a failed queueing: part of a
 * transfer (the first slices of a rectangle) may be in flight, and the
 * caller is about to give its buffers back. With an early return (`async`,
 * see ab_backend) work queued without an error is left on the stream. */
static ab_status finish_or_queued(cudaError_t e, int32_t id, const char *what, void *stream, bool async) {
  if (async && e == cudaSuccess) return AB_OK;
  cudaError_t w = cudaStreamSynchronize((cudaStream_t)stream);
  if (e == cudaSuccess) e = w;
  else if (w != cudaSuccess && is_sticky(w)) note_sticky(w, id, "cudaStreamSynchronize"); /* e is reported */
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, what);
}

static ab_status finish(cudaError_t e, int32_t id, const char *what, void *stream) {
  return finish_or_queued(e, id, what, stream, false);
}

static ab_status cuda_info(int32_t id, struct ab_device_info *out) {
  struct cudaDeviceProp p;
  int prev, drv = 0;
  cudaError_t e = cudaGetDeviceProperties(&p, id);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaGetDeviceProperties");
  snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, p.name);
  snprintf(out->vendor, sizeof out->vendor, "NVIDIA");
  if (cudaDriverGetVersion(&drv) != cudaSuccess) (void)cudaGetLastError(); /* not the caller's error */
  snprintf(out->version, sizeof out->version, "CUDA driver %d.%d, runtime %d.%d", drv / 1000, drv % 1000 / 10,
           CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
  out->compute_capability = p.major * 10 + p.minor;
  if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, id) != cudaSuccess) {
    (void)cudaGetLastError();
    out->pci_bus_id[0] = '\0';
  }
  out->total_memory = p.totalGlobalMem;
  out->max_alloc_size = p.totalGlobalMem;
  out->unified_memory = p.integrated != 0;
  /* Free memory needs the device's context (created here if need be). */
  AB_FORWARD(enter(id, &prev));
  size_t fr = 0, tot = 0;
  e = cudaMemGetInfo(&fr, &tot);
  leave(id, prev);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaMemGetInfo");
  out->free_memory = fr;
  return AB_OK;
}

static uint32_t cuda_device_caps(int32_t id) {
  int integrated = 0;
  if (cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, id) != cudaSuccess) (void)cudaGetLastError();
  return integrated ? AB_CAP_UNIFIED_MEMORY : 0;
}

static ab_status space_info(const char *name, struct ab_device_info *out) {
  snprintf(out->name, sizeof out->name, "%s", name);
  snprintf(out->vendor, sizeof out->vendor, "NVIDIA");
  snprintf(out->version, sizeof out->version, "CUDA runtime %d.%d", CUDART_VERSION / 1000,
           CUDART_VERSION % 1000 / 10);
  return AB_OK;
}

static ab_status host_info(int32_t id, struct ab_device_info *out) {
  (void)id;
  return space_info("CUDA page-locked host memory", out);
}

static ab_status managed_info(int32_t id, struct ab_device_info *out) {
  (void)id;
  return space_info("CUDA managed memory", out);
}

/* ---- memory ------------------------------------------------------------ */

static ab_status cuda_alloc(int32_t id, size_t bytes, void **out) {
  int prev;
  void *p = NULL;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaMalloc(&p, bytes);
  leave(id, prev);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaMalloc");
  *out = p;
  return AB_OK;
}

static void cuda_free(int32_t id, void *ptr, size_t bytes) {
  int prev;
  (void)bytes;
  if (enter(id, &prev) != AB_OK) return;
  cudaError_t e = cudaFree(ptr);
  if (e != cudaSuccess) drop_error(e, id, "cudaFree");
  leave(id, prev);
}

static ab_status pinned_alloc(int32_t id, size_t bytes, void **out) {
  void *p = NULL;
  /* Portable: page-locked for every device, not only the current one. */
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaHostAlloc");
  *out = p;
  return AB_OK;
}

static void pinned_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static ab_status managed_alloc(int32_t id, size_t bytes, void **out) {
  void *p = NULL;
  cudaError_t e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaMallocManaged");
  *out = p;
  return AB_OK;
}

static void managed_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* ---- transfers ----------------------------------------------------------- */

static size_t compact_bytes(const DLTensor *t, bool *compact) {
  *compact = ab__is_compact(t);
  return ab__elsize(t->dtype) * (size_t)ab__numel(t);
}

/* Whether cudaMemcpy2DAsync takes these pitches on device `id`: not past
 * cudaDevAttrMaxPitch (about 2 GiB; a crop along the leading axis of a
 * huge tensor goes past it). The limit is asked once per device: rectangle
 * copies are on the small-tensor path. */
static _Atomic int max_pitch[MAX_GPUS]; /* 0: not asked yet */

static bool pitches_fit(int32_t id, size_t a, size_t b) {
  int max = id < MAX_GPUS ? atomic_load_explicit(&max_pitch[id], memory_order_relaxed) : 0;
  if (max == 0) {
    if (cudaDeviceGetAttribute(&max, cudaDevAttrMaxPitch, id) != cudaSuccess || max <= 0) {
      (void)cudaGetLastError();
      return true; /* let the copy say */
    }
    if (id < MAX_GPUS) atomic_store_explicit(&max_pitch[id], max, memory_order_relaxed);
  }
  return a <= (size_t)max && b <= (size_t)max;
}

/* Rectangles: region[2] slices of region[1] rows of region[0] bytes, one
 * cudaMemcpy2DAsync per slice; with a pitch past the GPU's limit (which
 * it refuses with cudaErrorInvalidPitchValue, a non-sticky error) one
 * cudaMemcpyAsync per row instead, which has no pitch to limit. *what
 * names the call that was made last (for the error message). */
static cudaError_t copy_rect(int32_t id, char *dst, size_t dpitch, size_t dslice, const char *src, size_t spitch,
                             size_t sslice, const size_t region[3], enum cudaMemcpyKind kind, void *stream,
                             const char **what) {
  cudaError_t e = cudaSuccess;
  bool by_rows = !pitches_fit(id, dpitch, spitch);
  *what = by_rows ? "cudaMemcpyAsync per row (a pitch past cudaDevAttrMaxPitch)" : "cudaMemcpy2DAsync";
  for (size_t z = 0; z < region[2] && e == cudaSuccess; z++) {
    char *d = dst + z * dslice;
    const char *s = src + z * sslice;
    if (!by_rows) {
      e = cudaMemcpy2DAsync(d, dpitch, s, spitch, region[0], region[1], kind, (cudaStream_t)stream);
      if (e != cudaErrorInvalidPitchValue) continue;
      (void)cudaGetLastError();
      e = cudaSuccess;
      by_rows = true;
      *what = "cudaMemcpyAsync per row (cudaMemcpy2DAsync refused the pitch)";
    }
    for (size_t y = 0; y < region[1] && e == cudaSuccess; y++)
      e = cudaMemcpyAsync(d + y * dpitch, s + y * spitch, region[0], kind, (cudaStream_t)stream);
  }
  return e;
}

/* Any strided layout on the current device, by converters/cuda's kernel
 * over the merged dims. */
static cudaError_t gather(char *dst, const char *src, const DLTensor *from, size_t es, void *stream) {
#ifdef AB_HAVE_CUDA_KERNELS
  int64_t bytes[AB_MAX_NDIM], shape[AB_MAX_NDIM], stride[AB_MAX_NDIM];
  for (int32_t i = 0; i < from->ndim; i++)
    bytes[i] = from->shape[i] == 1 ? 0 : from->strides[i] * (int64_t)es; /* validated: no overflow */
  int n = ab__merge_dims(from->ndim, from->shape, bytes, shape, stride);
  return ab__cuda_gather(dst, src, n, shape, stride, es, (cudaStream_t)stream);
#else
  (void)dst, (void)src, (void)from, (void)es, (void)stream;
  return cudaErrorNotSupported;
#endif
}

/* Before a cudaMemcpyPeerAsync on the destination's `stream`: the copy
 * must not read the source before the work already queued for it on the
 * source GPU has run. An event recorded on the source's legacy stream (an
 * operation there: after every blocking stream's earlier work, runtime API
 * "Stream synchronization behavior"), or on its per-thread stream when the
 * caller names that one, and waited for by `stream` (cudaStreamWaitEvent:
 * "event may be from a different device than stream"). The event may be
 * destroyed at once: its resources go when the wait has run. Leaves `did`
 * current when it succeeds; after a failure `did` or `sid` may be (a
 * switch back that failed), and the caller makes its own current again. */
static cudaError_t wait_for_source(int32_t sid, int32_t did, cudaStream_t stream) {
  cudaEvent_t ev;
  cudaError_t e = cudaSetDevice(sid);
  if (e == cudaSuccess) {
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(ev, stream == cudaStreamPerThread ? cudaStreamPerThread : cudaStreamLegacy);
      cudaError_t back = cudaSetDevice(did);
      if (back != cudaSuccess) {
        /* The copy must not go on from sid (a cudaSetDevice to a device
         * that took work a moment ago fails only on a sticky error, after
         * which no CUDA device is used again). */
        (void)cudaEventDestroy(ev);
        return back;
      }
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, ev, 0);
      cudaError_t gone = cudaEventDestroy(ev);
      return e == cudaSuccess ? gone : e;
    }
  }
  if (cudaSetDevice(did) != cudaSuccess) (void)cudaGetLastError(); /* e is the error to report */
  return e;
}

/* Lets device `to` reach `from`'s memory directly, once per ordered pair;
 * called with `to` current. cudaMemcpyPeerAsync is correct either way (the
 * driver stages through the host without it), so a refusal is only logged;
 * so is any other failure, which is tried again at the next copy between
 * the two (up to PEER_TRIES times: the call "may also return error codes
 * from previous, asynchronous launches", runtime API 6.14, which must not
 * cost the pair P2P for good).
 * AB_CUDA_PEER=0 keeps it off: on some PCIe systems staging beats P2P. */
static void ensure_peer(int32_t to, int32_t from) {
  if (to >= MAX_GPUS || from >= MAX_GPUS) return;
  pthread_mutex_lock(&peer_lock);
  if (peer[to][from] == 0) {
    int can = 0;
    peer[to][from] = 2;
    if (!ab__env_choice("AB_CUDA_PEER", ab__env_on_off, 1, "1 (on) or 0 (off)")) {
      AB_LOG(AB_LOG_INFO, "cuda:%d -> cuda:%d: peer access disabled by AB_CUDA_PEER", (int)from, (int)to);
    } else if (cudaDeviceCanAccessPeer(&can, to, from) == cudaSuccess && can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(from, 0);
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) {
        peer[to][from] = 1;
      } else {
        const bool refused = e == cudaErrorPeerAccessUnsupported || e == cudaErrorInvalidDevice;
        if (!refused && ++peer_tries[to][from] < PEER_TRIES) peer[to][from] = 0; /* ask again next time */
        AB_LOG(AB_LOG_INFO, "cuda:%d -> cuda:%d: cudaDeviceEnablePeerAccess: %s%s", (int)from, (int)to,
               cudaGetErrorName(e), peer[to][from] == 0 ? " (will try again)" : "; copies are staged by the driver");
      }
    }
    (void)cudaGetLastError(); /* AlreadyEnabled and refusals are not the caller's errors */
  }
  pthread_mutex_unlock(&peer_lock);
}

static ab_status cuda_copy(const DLTensor *from, DLTensor *to, void *stream, bool async) {
  const int32_t sid = from->device.device_id, did = to->device.device_id;
  const char *src = (const char *)from->data + from->byte_offset;
  char *dst = (char *)to->data + to->byte_offset;
  bool compact;
  size_t bytes = compact_bytes(from, &compact);
  int prev;
  cudaError_t e;
  const char *what;

  bool moved = false; /* the current device may be neither did nor prev */
  AB_FORWARD(enter(did, &prev));
  if (compact && sid == did) {
    what = "cudaMemcpyAsync (device to device)";
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
  } else if (compact) {
    /* Peer access when enabled, else the driver stages through the host.
     * Without a stream, or with the legacy one (DLPack's 1, the same
     * stream), cudaMemcpyPeer: it is "serialized with respect to all
     * pending and future asynchronous work" of both devices, so data a
     * kernel just wrote on the source is seen. cudaMemcpyPeerAsync is
     * ordered only after the caller's stream on the destination, so on
     * any other stream the copy first waits for the source GPU. */
    ensure_peer(did, sid);
    if (stream == NULL || stream == cudaStreamLegacy) {
      what = "cudaMemcpyPeer";
      e = cudaMemcpyPeer(dst, did, src, sid, bytes);
    } else {
      what = "a wait for the source GPU before cudaMemcpyPeerAsync";
      e = wait_for_source(sid, did, (cudaStream_t)stream);
      /* failed, it may have left sid current, even where the caller's
       * device was did: the caller's is made current again below */
      if (e != cudaSuccess) moved = true;
      if (e == cudaSuccess) {
        what = "cudaMemcpyPeerAsync";
        e = cudaMemcpyPeerAsync(dst, did, src, sid, bytes, (cudaStream_t)stream);
      }
    }
  } else {
    /* can_copy admitted one-device strided sources only: a rectangle, else
     * the gather kernel. */
    ab__rect r;
    size_t es = ab__elsize(from->dtype);
    if (ab__rect_of(from, es, &r)) {
      e = copy_rect(did, dst, r.region[0], r.region[0] * r.region[1], src, r.row_pitch, r.slice_pitch, r.region,
                    cudaMemcpyDeviceToDevice, stream, &what);
    } else {
      what = "the gather kernel";
      e = gather(dst, src, from, es, stream);
    }
  }
  ab_status st = finish_or_queued(e, did, what, stream, async);
  if (moved) set_back(did, prev); /* whichever of sid and did is current */
  else leave(did, prev);
  return st;
}

#ifdef AB_HAVE_CUDA_KERNELS
/* Whether the gather kernel has code for device `id` (built for sm_75 and
 * later plus PTX of Turing's and of the newest: a GPU older than 7.5 has
 * none). The answer is kept once known: yes, or no for the errors that say
 * the binary has no code for this GPU; any other failure (a device switch
 * refused, memory short while the driver compiles PTX) says nothing about
 * the binary, so the next call asks again. */
static unsigned char kernel_state[MAX_GPUS]; /* 0 unknown, 1 yes, 2 no */

static bool no_code_for_gpu(cudaError_t e) {
  return e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
         e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx || e == cudaErrorInvalidKernelImage ||
         e == cudaErrorJitCompilerNotFound || e == cudaErrorJitCompilationDisabled;
}

static bool kernel_runs_on(int32_t id) {
  if (id >= MAX_GPUS) return false;
  pthread_mutex_lock(&peer_lock);
  if (kernel_state[id] == 0) {
    int prev;
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    if (enter(id, &prev) == AB_OK) {
      cudaError_t e = ab__cuda_gather_available();
      if (e == cudaSuccess) kernel_state[id] = 1;
      else if (no_code_for_gpu(e)) kernel_state[id] = 2;
      if (e != cudaSuccess)
        AB_LOG(AB_LOG_INFO, "cuda:%d: %s the gather kernel (%s): strided copies go through the host%s", (int)id,
               kernel_state[id] == 2 ? "no code for this GPU in" : "could not look up", cudaGetErrorName(e),
               kernel_state[id] == 2 ? "" : " this time");
      (void)cudaGetLastError();
      leave(id, prev);
    }
    ab__restore_error(saved);
  }
  bool ok = kernel_state[id] == 1;
  pthread_mutex_unlock(&peer_lock);
  return ok;
}
#endif

#ifdef AB_HAVE_CUDA_KERNELS
/* Conversions on the device (converters/cuda/convert.cu), built for the
 * same architectures as the gather, whose availability stands for both. */
static bool cuda_can_convert(int32_t id, const void *src, uint64_t src_offset, const ab__convert_args *a) {
  /* The kernels load whole elements: a misaligned source would fault
   * (cudaErrorMisalignedAddress, which ruins the context). */
  const size_t es = ab__elsize(a->op.from);
  if (es == 0 || ((uintptr_t)src + src_offset) % es != 0) return false;
  return ab__cuda_convert_supported(a) && kernel_runs_on(id);
}

static ab_status cuda_convert(int32_t id, const void *src, uint64_t src_offset, void *dst, uint64_t dst_offset,
                              const ab__convert_args *a, void *stream, bool async) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = ab__cuda_convert((char *)dst + dst_offset, (const char *)src + src_offset, a, (cudaStream_t)stream);
  ab_status st = finish_or_queued(e, id, "the conversion kernel", stream, async);
  leave(id, prev);
  return st;
}
#endif

static bool cuda_can_copy(const DLTensor *from, DLDevice to, bool from_compact) {
  ab__rect r;
  if (from_compact) return true;
  if (from->device.device_id != to.device_id) return false;
  if (ab__rect_of(from, ab__elsize(from->dtype), &r)) return true;
#ifdef AB_HAVE_CUDA_KERNELS
  return kernel_runs_on(from->device.device_id);
#else
  return false;
#endif
}

static ab_status cuda_write(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaMemcpyAsync((char *)handle + offset, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  ab_status st = finish(e, id, "cudaMemcpyAsync (host to device)", stream);
  leave(id, prev);
  return st;
}

static ab_status cuda_read(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaMemcpyAsync(dst, (const char *)handle + offset, bytes, cudaMemcpyDefault,
                                  (cudaStream_t)stream);
  ab_status st = finish(e, id, "cudaMemcpyAsync (device to host)", stream);
  leave(id, prev);
  return st;
}

static ab_status cuda_read_rect(int32_t id, const void *handle, uint64_t offset, const size_t region[3],
                                size_t row_pitch, size_t slice_pitch, void *dst, void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  const char *what;
  cudaError_t e = copy_rect(id, dst, region[0], region[0] * region[1], (const char *)handle + offset, row_pitch,
                            slice_pitch, region, cudaMemcpyDefault, stream, &what);
  ab_status st = finish(e, id, what, stream);
  leave(id, prev);
  return st;
}

static ab_status cuda_write_rect(int32_t id, void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                                 size_t slice_pitch, const void *src, void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  const char *what;
  cudaError_t e = copy_rect(id, (char *)handle + offset, region[0], region[0] * region[1], src, row_pitch,
                            slice_pitch, region, cudaMemcpyDefault, stream, &what);
  ab_status st = finish(e, id, what, stream);
  leave(id, prev);
  return st;
}

/* ---- the staging ring's operations (src/staging.c) ------------------------ */

static ab_status cuda_write_async(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes,
                                  void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaMemcpyAsync((char *)handle + offset, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  leave(id, prev);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, "cudaMemcpyAsync (staged, host to device)");
}

static ab_status cuda_read_async(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes,
                                 void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaMemcpyAsync(dst, (const char *)handle + offset, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  leave(id, prev);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, "cudaMemcpyAsync (staged, device to host)");
}

/* Fences are events without timing (the cheap kind), on device `id`. */
static ab_status cuda_fence_new(int32_t id, void **fence) {
  int prev;
  cudaEvent_t ev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  leave(id, prev);
  if (e != cudaSuccess) return fail_cuda(e, id, "cudaEventCreateWithFlags");
  *fence = ev;
  return AB_OK;
}

static ab_status cuda_fence_record(int32_t id, void *fence, void *stream) {
  int prev;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = cudaEventRecord((cudaEvent_t)fence, (cudaStream_t)stream);
  leave(id, prev);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, "cudaEventRecord");
}

static ab_status cuda_fence_wait(void *fence) {
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)fence);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, -1, "cudaEventSynchronize");
}

static void cuda_fence_free(void *fence) {
  cudaError_t e = cudaEventDestroy((cudaEvent_t)fence);
  if (e != cudaSuccess) drop_error(e, -1, "cudaEventDestroy");
}

/* Whether copies from `from` to `to` go directly: not where AB_CUDA_PEER=0
 * keeps peer access off or enabling it was refused (ensure_peer; the
 * driver then stages them), else what the hardware can (enabled at the
 * pair's first copy). */
static bool cuda_peer_access(int32_t from, int32_t to) {
  if (to >= MAX_GPUS || from >= MAX_GPUS) return false;
  pthread_mutex_lock(&peer_lock);
  const unsigned char state = peer[to][from];
  pthread_mutex_unlock(&peer_lock);
  if (state != 0) return state == 1;
  if (!ab__env_choice("AB_CUDA_PEER", ab__env_on_off, 1, "1 (on) or 0 (off)")) return false;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, to, from) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return can != 0;
}

static cudaError_t wait_stream(cudaStream_t s, const char **what);

static ab_status cuda_synchronize(int32_t id, void *stream) {
  int prev;
  const char *what;
  AB_FORWARD(enter(id, &prev));
  cudaError_t e = wait_stream((cudaStream_t)stream, &what);
  leave(id, prev);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, id, what);
}

static void cuda_stream_sync(int32_t id, void *stream) {
  int prev;
  cudaError_t e;
  const cudaStream_t s = (cudaStream_t)stream;
  if (s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread) {
    /* A named stream is its device's whatever device is current: no
     * switch, so a drain (ring_close, before its pinned chunks go back to
     * the pool) does not depend on one succeeding. */
    if ((e = cudaStreamSynchronize(s)) != cudaSuccess) drop_error(e, id, "cudaStreamSynchronize");
    return;
  }
  if (enter(id, &prev) != AB_OK) return;
  if ((e = cudaStreamSynchronize(s)) != cudaSuccess) drop_error(e, id, "cudaStreamSynchronize");
  leave(id, prev);
}

/* A wait on the legacy stream whose event could not be made or recorded
 * (e) still waits for the stream's own work, so that a caller told of the
 * failure does not hand back memory a copy queued there still uses (its
 * blocking streams are then not waited for: the failure says so). */
static cudaError_t waited_anyway(cudaStream_t s, cudaError_t e) {
  (void)cudaGetLastError(); /* e is returned, and reported by the caller */
  const cudaError_t w = cudaStreamSynchronize(s);
  if (w != cudaSuccess) drop_error(w, -1, "cudaStreamSynchronize");
  return e;
}

/* Waits for a stream of the current device: a stream the caller names, or
 * without one (or with cudaStreamLegacy) the legacy default stream and so
 * its blocking streams, so that a kernel's writes are complete. Before
 * host code reads pinned or managed memory (space_host_sync) and for
 * ab_synchronize (cuda_synchronize). The runtime API ("Stream
 * synchronization behavior") says that an operation issued to the legacy
 * stream first waits for every blocking stream; of cudaStreamSynchronize
 * it says only that it waits for the stream's own operations. So for the
 * legacy stream an event is recorded there (an operation) and waited for. */
static cudaError_t wait_stream(cudaStream_t s, const char **what) {
  if (s != NULL && s != cudaStreamLegacy) {
    *what = "cudaStreamSynchronize";
    return cudaStreamSynchronize(s);
  }
  cudaEvent_t ev;
  *what = "cudaEventCreateWithFlags";
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return waited_anyway(s, e);
  *what = "cudaEventRecord on the legacy stream";
  e = cudaEventRecord(ev, s);
  if (e == cudaSuccess) {
    *what = "cudaEventSynchronize";
    e = cudaEventSynchronize(ev);
  } else {
    e = waited_anyway(s, e);
  }
  cudaError_t gone = cudaEventDestroy(ev);
  if (gone != cudaSuccess && e == cudaSuccess) drop_error(gone, -1, "cudaEventDestroy"); /* else e is reported */
  return e;
}

static ab_status space_host_sync(int32_t id, void *stream) {
  const char *what;
  AB_FORWARD(cuda_usable(id));
  cudaError_t e = wait_stream((cudaStream_t)stream, &what);
  return e == cudaSuccess ? AB_OK : fail_cuda(e, -1, what);
}

/* Managed memory where the CPU may not touch it while a GPU has work in
 * flight: a GPU without cudaDevAttrConcurrentManagedAccess (WSL2, Windows)
 * holds every managed allocation, used by its work or not, while any of
 * its work runs, and a host access then faults (the Programming Guide's
 * "Unified Memory on devices without full CUDA Unified Memory support").
 * Whether every GPU has the attribute is asked once (it needs no context). */
static atomic_int managed_concurrency = -1; /* -1 not asked; 0 or 1 */

static bool managed_concurrent(void) {
  int v = atomic_load_explicit(&managed_concurrency, memory_order_acquire);
  if (v >= 0) return v != 0;
  v = 1;
  for (int d = 0; d < ndev; d++) {
    int a = 0;
    if (cudaDeviceGetAttribute(&a, cudaDevAttrConcurrentManagedAccess, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return false; /* unknown this time: the careful reading, and ask again */
    }
    if (!a) v = 0;
  }
  if (!v) AB_LOG(AB_LOG_INFO, "cuda: a GPU without concurrent managed access: host code touches managed memory "
                               "only with every GPU idle (cudaDeviceSynchronize)");
  atomic_store_explicit(&managed_concurrency, v, memory_order_release);
  return v != 0;
}

/* Every GPU idle, where host code may not otherwise touch managed memory. */
static ab_status managed_idle(void) {
  if (managed_concurrent()) return AB_OK;
  for (int32_t d = 0; d < ndev; d++) {
    int prev;
    AB_FORWARD(enter(d, &prev));
    cudaError_t e = cudaDeviceSynchronize();
    leave(d, prev);
    if (e != cudaSuccess) return fail_cuda(e, d, "cudaDeviceSynchronize before host code touches managed memory");
  }
  return AB_OK;
}

/* Before host code reads managed memory: the stream, as for pinned, and
 * the GPUs idle where managed memory asks for that. */
static ab_status managed_host_sync(int32_t id, void *stream) {
  AB_FORWARD(space_host_sync(id, stream));
  return managed_idle();
}

/* Before host code writes a managed result. */
static ab_status managed_host_write_sync(int32_t id) {
  AB_FORWARD(cuda_usable(id));
  return managed_idle();
}

/* cudaPointerGetAttributes's answer for memory the runtime does not know
 * ("if pointer was not allocated in, mapped by or registered with context
 * supporting unified addressing cudaErrorInvalidValue is returned"; from
 * CUDA 11 it answers cudaMemoryTypeUnregistered instead). Any other error
 * is the runtime's failure, not the tensor's. */
static bool not_cuda_memory(cudaError_t e) { return e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer; }

/* cudaPointerGetAttributes, asked where a context can answer: where the
 * calling thread's current device has no context yet (a thread that never
 * used CUDA, in a process that uses only another GPU), the runtime says
 * cudaErrorInvalidValue even for device memory (CUDA 10.1 and later; CuPy
 * issue 3991, worked around there the same way). That answer is asked
 * again with GPU `id` (the one the memory is said to be on; -1: the
 * caller's current one, for pinned and managed memory, which belong to
 * none) made current by cudaSetDevice, which initialises its primary
 * context (CUDA 12); the caller's device is restored. A pointer the first
 * query knows costs one call. *what names the call whose error is
 * returned; that error is left for the caller to clear. */
static cudaError_t pointer_attributes(int32_t id, const void *p, struct cudaPointerAttributes *a, const char **what) {
  *what = "cudaPointerGetAttributes";
  cudaError_t e = cudaPointerGetAttributes(a, p);
  if (!not_cuda_memory(e)) return e;
  (void)cudaGetLastError();
  int prev;
  cudaError_t s = cudaGetDevice(&prev);
  const int dev = id < 0 ? prev : (int)id;
  if (s == cudaSuccess) s = cudaSetDevice(dev);
  if (s != cudaSuccess) { /* no context to ask in: that is the answer */
    *what = "cudaSetDevice, to ask cudaPointerGetAttributes with a context";
    return s;
  }
  e = cudaPointerGetAttributes(a, p);
  if (prev != dev) set_back(dev, prev); /* leaves e, if any, for cudaGetLastError */
  return e;
}

/* Page-locked (cudaHostAlloc) or registered (cudaHostRegister) memory:
 * DMA reaches it directly. */
static bool cuda_host_is_staged(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeManaged;
}

/* The runtime cannot tell an allocation's size, but it can tell whose
 * memory the first and last addressed bytes are: a host pointer or another
 * device's memory labelled cuda:<id> is caught here, before any copy. */
static ab_status cuda_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  const uint64_t at[2] = {begin, end - 1};
  for (int k = 0; k < 2; k++) {
    /* The first byte was this device's memory (k = 1): a last byte that
     * is not runs past the end of the allocation; it is no host memory. */
    const char *past = k == 1 ? " (the first addressed byte is, so the tensor runs past its allocation)" : "";
    struct cudaPointerAttributes a;
    const char *p = (const char *)handle + at[k];
    const char *what;
    cudaError_t e = pointer_attributes(id, p, &a, &what);
    if (e != cudaSuccess && !not_cuda_memory(e)) return fail_cuda(e, id, what); /* not the tensor's fault */
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "cuda:%" PRId32 ": data %p + %" PRIu64 " is not CUDA memory (%s)%s", id,
                     handle, at[k], cudaGetErrorName(e), past);
    }
    if (k == 1 && a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "cuda:%" PRId32 ": data %p + %" PRIu64 " is not device memory%s", id,
                     handle, at[k], past);
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                     "cuda:%" PRId32 ": data %p + %" PRIu64 " is %s memory, not device memory (label it %s)", id,
                     handle, at[k], a.type == cudaMemoryTypeHost ? "page-locked host" : "unregistered host",
                     a.type == cudaMemoryTypeHost ? "kDLCUDAHost" : "kDLCPU");
    if (a.type == cudaMemoryTypeDevice && a.device != id)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "cuda:%" PRId32 ": data %p + %" PRIu64 " belongs to cuda:%d", id, handle,
                     at[k], a.device);
  }
  return AB_OK;
}

/* Pinned and managed memory are read and written by host code: device
 * memory labelled kDLCUDAHost or kDLCUDAManaged would fault there, so the
 * first and last addressed bytes must not be device memory. (Other host
 * memory so labelled is readable; the routes that need it pinned ask.) */
static ab_status space_check_range(const char *label, int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  const uint64_t at[2] = {begin, end - 1};
  for (int k = 0; k < 2; k++) {
    struct cudaPointerAttributes a;
    const char *what;
    cudaError_t e = pointer_attributes(-1, (const char *)handle + at[k], &a, &what);
    if (e != cudaSuccess && !not_cuda_memory(e)) return fail_cuda(e, id, what);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      continue; /* memory the runtime does not know: host memory */
    }
    if (a.type == cudaMemoryTypeDevice)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                     "%s:%" PRId32 ": addressed byte %p is device memory of cuda:%d, which host code cannot read "
                     "(label it kDLCUDA)", label, id, (const void *)((const char *)handle + at[k]), a.device);
  }
  return AB_OK;
}
static ab_status host_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  return space_check_range("cuda_host", id, handle, begin, end);
}
static ab_status managed_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  return space_check_range("cuda_managed", id, handle, begin, end);
}

const struct ab_backend ab__backend_cuda = {
  .device_type = kDLCUDA,
  .name = "cuda",
  .caps = AB_CAP_ADDRESSED,
  .staging = kDLCUDAHost,
  .init = cuda_init,
  .device_count = cuda_count,
  .device_caps = cuda_device_caps,
  .usable = cuda_usable,
  .device_info = cuda_info,
  .alloc = cuda_alloc,
  .free = cuda_free,
  .copy = cuda_copy,
  .can_copy = cuda_can_copy,
  .write = cuda_write,
  .read = cuda_read,
  .read_rect = cuda_read_rect,
  .write_rect = cuda_write_rect,
  .check_range = cuda_check_range,
  .write_async = cuda_write_async,
  .read_async = cuda_read_async,
  .fence_new = cuda_fence_new,
  .fence_record = cuda_fence_record,
  .fence_wait = cuda_fence_wait,
  .fence_free = cuda_fence_free,
  .host_is_staged = cuda_host_is_staged,
  .stream_sync = cuda_stream_sync,
  .synchronize = cuda_synchronize,
  .peer_access = cuda_peer_access,
#ifdef AB_HAVE_CUDA_KERNELS
  .can_convert = cuda_can_convert,
  .convert = cuda_convert,
#endif
};

/* Host-accessible: copies between them and any host memory are the host
 * backend's, so only memory and identity are here, and the wait for the
 * device work that may still write them. */
#define CUDA_HOST_SPACE                                                                             \
  .name = "cuda", .caps = AB_CAP_HOST_ACCESSIBLE, .family = &ab__backend_cuda, .init = cuda_init, \
  .device_count = space_count

const struct ab_backend ab__backend_cuda_host = {
  .device_type = kDLCUDAHost,
  CUDA_HOST_SPACE,
  .usable = cuda_usable,
  .device_info = host_info,
  .host_sync = space_host_sync,
  .synchronize = space_host_sync,
  .alloc = pinned_alloc,
  .free = pinned_free,
  .check_range = host_check_range,
};

const struct ab_backend ab__backend_cuda_managed = {
  .device_type = kDLCUDAManaged,
  CUDA_HOST_SPACE,
  .usable = cuda_usable,
  .device_info = managed_info,
  .host_sync = managed_host_sync,
  .host_write_sync = managed_host_write_sync,
  .synchronize = managed_host_sync,
  .alloc = managed_alloc,
  .free = managed_free,
  .check_range = managed_check_range,
};
