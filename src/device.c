/* Backend registry, lazy initialisation, device checks and the wrappers
 * that are the only callers of the backend tables. */
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "parallel.h"
#include "pool.h"
#include "converters/host/gather.h"

/* Adding a backend is one line here (plus its folder). */
static const struct ab_backend *const backends[] = {
  &ab__backend_host,
#ifdef AB_HAVE_CUDA
  &ab__backend_cuda, &ab__backend_cuda_host, &ab__backend_cuda_managed,
#endif
#ifdef AB_HAVE_OPENCL
  &ab__backend_opencl, &ab__backend_opencl_host,
#endif
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

static atomic_bool inited;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool backend_up[NBACKENDS];
static char backend_why[NBACKENDS][256]; /* why a backend has no devices */

void ab_preload_drivers(void) {
  for (size_t i = 0; i < NBACKENDS; i++)
    ab__dev_preload(backends[i]);
}

void ab__ensure_init(void) {
  if (AB_LIKELY(atomic_load_explicit(&inited, memory_order_acquire))) return;
  pthread_mutex_lock(&init_lock);
  if (!atomic_load_explicit(&inited, memory_order_relaxed)) {
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    for (size_t i = 0; i < NBACKENDS; i++) {
      ab_status st = ab__dev_init(backends[i]);
      backend_up[i] = st == AB_OK;
      if (st != AB_OK) {
        /* The reason is kept for NO_DEVICE messages; the caller's own
         * (successful) call must not see it in ab_last_error(). */
        snprintf(backend_why[i], sizeof backend_why[i], "%s", ab_last_error());
        ab__restore_error(saved);
        AB_LOG(AB_LOG_INFO, "backend %s has no devices: %s", backends[i]->name, backend_why[i]);
      }
    }
    atomic_store_explicit(&inited, true, memory_order_release);
  }
  pthread_mutex_unlock(&init_lock);
}

void ab_shutdown(void) {
  ab__parallel_shutdown();
  ab__pool_shutdown();
  pthread_mutex_lock(&init_lock);
  if (atomic_load_explicit(&inited, memory_order_relaxed)) {
    for (size_t i = NBACKENDS; i-- > 0;) {
      if (backend_up[i]) ab__dev_shutdown(backends[i]);
      backend_up[i] = false;
    }
    atomic_store_explicit(&inited, false, memory_order_release);
  }
  pthread_mutex_unlock(&init_lock);
}

static int backend_index(DLDeviceType type) {
  for (size_t i = 0; i < NBACKENDS; i++)
    if (backends[i]->device_type == type) return (int)i;
  return -1;
}

const struct ab_backend *ab__backend_for(DLDeviceType type) {
  int i = backend_index(type);
  return i < 0 ? NULL : backends[i];
}

const char *ab_device_type_name(DLDeviceType type) {
  switch ((int)type) {
  case 1: return "cpu";
  case 2: return "cuda";
  case 3: return "cuda_host";
  case 4: return "opencl";
  case 7: return "vulkan";
  case 8: return "metal";
  case 9: return "vpi";
  case 10: return "rocm";
  case 11: return "rocm_host";
  case 12: return "ext_dev";
  case 13: return "cuda_managed";
  case 14: return "oneapi";
  case 15: return "webgpu";
  case 16: return "hexagon";
  case 17: return "maia";
  case 18: return "trn";
  case (int)AB_DEVICE_OPENCL_HOST: return "opencl_host";
  default: return "unknown";
  }
}

static int32_t count_of(int i) {
  ab__ensure_init();
  return backend_up[i] ? ab__dev_count(backends[i]) : 0;
}

int32_t ab_device_count(DLDeviceType type) {
  int i = backend_index(type);
  return i < 0 ? 0 : count_of(i);
}

ab_status ab__check_device(DLDevice dev, const char *what, bool is_target,
                           DLDevice *resolved, const struct ab_backend **be) {
  const char *tname = ab_device_type_name(dev.device_type);
  int i = backend_index(dev.device_type);
  /* (A type with a backend is a known one: the name check is for the rest.) */
  if (i < 0 && strcmp(tname, "unknown") == 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s type %d is not a DLPack device type",
                   what, (int)dev.device_type);
  if (i < 0)
    return AB_FAIL(AB_ERR_NO_DEVICE, "%s %s:%" PRId32 ": no %s backend is built into this library",
                   what, tname, dev.device_id, tname);
  int32_t n = count_of(i);
  if (n == 0)
    return AB_FAIL(AB_ERR_NO_DEVICE, "%s %s:%" PRId32 ": no %s devices (%s)", what, tname,
                   dev.device_id, tname, backend_why[i][0] ? backend_why[i] : "none found");
  if (dev.device_id == AB_DEVICE_AUTO && is_target) {
    /* The device with the most free memory; ties go to the lowest id. A
     * device that cannot say is skipped without touching the message. */
    int32_t best = 0;
    uint64_t best_free = 0;
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    for (int32_t id = 0; id < n; id++) {
      struct ab_device_info info;
      if (ab__dev_info(backends[i], id, &info) != AB_OK) continue;
      /* OpenCL cannot say how much is free: total memory stands in. */
      uint64_t avail = info.free_memory ? info.free_memory : info.total_memory;
      if (id == 0 || avail > best_free) {
        best = id;
        best_free = avail;
      }
    }
    ab__restore_error(saved);
    dev.device_id = best;
  } else if (dev.device_id < 0) {
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s id %" PRId32 " is negative%s", what,
                   dev.device_id, is_target ? " (AB_DEVICE_AUTO is -1)" : "");
  } else if (dev.device_id >= n) {
    return AB_FAIL(AB_ERR_NO_DEVICE, "%s %s:%" PRId32 " does not exist: %" PRId32 " %s device%s (ids 0..%" PRId32 ")",
                   what, tname, dev.device_id, n, tname, n == 1 ? "" : "s", n - 1);
  }
  if (resolved) *resolved = dev;
  if (be) *be = backends[i];
  return AB_OK;
}

ab_status ab__check_tensor_device(DLDevice dev, const char *what, bool is_target, DLDevice *resolved,
                                  const struct ab_backend **be) {
  /* By its capability, and by value in builds without the backend. */
  const struct ab_backend *b = ab__backend_for(dev.device_type);
  if ((b != NULL && (b->caps & AB_CAP_STAGING_ONLY)) || dev.device_type == AB_DEVICE_OPENCL_HOST)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "%s %s:%" PRId32 " is the library's own staging memory, not a DLPack device type: no tensor may name it",
                   what, ab_device_type_name(dev.device_type), dev.device_id);
  return ab__check_device(dev, what, is_target, resolved, be);
}

bool ab__staging_device(const struct ab_backend *be, int32_t id, DLDevice *out) {
  if (be->staging == 0) return false;
  const int32_t sid = ab__dev_staging_id(be, id);
  if (sid < 0 || sid >= ab_device_count(be->staging)) return false;
  *out = (DLDevice){be->staging, sid};
  return true;
}

ab_status ab_device_info(DLDevice dev, struct ab_device_info *out) {
  const struct ab_backend *be;
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(ab__check_device(dev, "device", false, &dev, &be));
  return ab__dev_info(be, dev.device_id, out);
}

void ab__dev_meminfo(const struct ab_backend *be, int32_t id, uint64_t *free_b, uint64_t *total_b) {
  struct ab_device_info info = {0}; /* written only on success; zeroed to quiet -Wmaybe-uninitialized */
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  if (ab__dev_info(be, id, &info) == AB_OK) {
    *free_b = info.free_memory;
    *total_b = info.total_memory;
  } else {
    *free_b = *total_b = 0;
  }
  ab__restore_error(saved);
}

/* ---- layouts the transfers share ---------------------------------------- */

bool ab__rect_of(const DLTensor *t, size_t elsize, ab__rect *rect) {
  int64_t bytes[AB_MAX_NDIM], shape[AB_MAX_NDIM], stride[AB_MAX_NDIM]; /* outermost first */
  if (t->strides == NULL) return false;
  /* Byte strides; a size-1 dim's stride says nothing (and may be huge). */
  for (int32_t i = 0; i < t->ndim; i++) {
    bytes[i] = 0;
    if (t->shape[i] != 1 && __builtin_mul_overflow(t->strides[i], (int64_t)elsize, &bytes[i])) return false;
  }
  int n = ab__merge_dims(t->ndim, t->shape, bytes, shape, stride);
  if (n > 3) return false;
  for (int k = 0; k < n; k++)
    if (stride[k] <= 0) return false;
  if (n == 0 || stride[n - 1] != (int64_t)elsize) return false;
  /* Pad to 3 dims: [slices, rows, row bytes]. */
  int64_t s3[3] = {1, 1, 1}, p3[3] = {0, 0, 0};
  for (int k = 0; k < n; k++) {
    s3[3 - n + k] = shape[k];
    p3[3 - n + k] = stride[k];
  }
  size_t row_bytes = (size_t)s3[2] * elsize;
  size_t row_pitch = s3[1] > 1 ? (size_t)p3[1] : row_bytes;
  size_t slice_pitch = s3[0] > 1 ? (size_t)p3[0] : row_pitch * (size_t)s3[1];
  /* OpenCL's rules: rows and slices may not overlap, and the slice pitch is
   * a whole number of row pitches. */
  if (row_pitch < row_bytes || slice_pitch < row_pitch * (size_t)s3[1] || slice_pitch % row_pitch != 0) return false;
  rect->region[0] = row_bytes;
  rect->region[1] = (size_t)s3[1];
  rect->region[2] = (size_t)s3[0];
  rect->row_pitch = row_pitch;
  rect->slice_pitch = slice_pitch;
  return true;
}

/* ---- device strings and the best device ---------------------------------- */

/* Writes `text` into buf for a message: at most 40 characters, anything
 * unprintable as '?'. */
static void quote(const char *text, char *buf, size_t len) {
  size_t n = 0;
  for (; text[n] != '\0' && n + 4 < len && n < 40; n++) buf[n] = isprint((unsigned char)text[n]) ? text[n] : '?';
  if (text[n] != '\0') {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
}

ab_status ab_parse_device(const char *text, DLDevice *out) {
  char q[48];
  if (text == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "device string is NULL");
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  quote(text, q, sizeof q);
  const char *colon = strchr(text, ':');
  size_t tlen = colon ? (size_t)(colon - text) : strlen(text);
  int type = -1;
  for (int slot = 1; slot < AB__TYPE_SLOTS && type < 0; slot++) {
    const char *name = ab_device_type_name(ab__slot_type(slot));
    if (strcmp(name, "unknown") != 0 && strlen(name) == tlen && strncasecmp(name, text, tlen) == 0)
      type = (int)ab__slot_type(slot);
  }
  if (type < 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "device string \"%s\": unknown device type (cpu, cuda, cuda_host, cuda_managed, opencl, ...)", q);
  int64_t id = 0;
  if (colon != NULL) {
    const char *d = colon + 1;
    if (strcasecmp(d, "auto") == 0) {
      id = AB_DEVICE_AUTO;
    } else {
      if (*d == '\0')
        return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "device string \"%s\": nothing after ':' (want an id or auto)", q);
      for (; *d != '\0'; d++) {
        if (*d < '0' || *d > '9')
          return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "device string \"%s\": the id must be a decimal number or auto", q);
        id = id * 10 + (*d - '0');
        if (id > INT32_MAX)
          return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "device string \"%s\": id is larger than %d", q, INT32_MAX);
      }
    }
  }
  out->device_type = (DLDeviceType)type;
  out->device_id = (int32_t)id;
  return AB_OK;
}

/* The id of the largest OpenCL device that is not host memory, or -1. */
static int32_t discrete_opencl(void) {
  const struct ab_backend *be = ab__backend_for(kDLOpenCL);
  int32_t best = -1;
  uint64_t best_total = 0;
  if (be == NULL) return -1;
  for (int32_t id = 0; id < ab_device_count(kDLOpenCL); id++) {
    struct ab_device_info info = {0};
    if (ab__dev_info(be, id, &info) != AB_OK || info.unified_memory) continue;
    if (best < 0 || info.total_memory > best_total) {
      best = id;
      best_total = info.total_memory;
    }
  }
  return best;
}

DLDevice ab_best_device(void) {
  char saved[AB_ERRBUF_SIZE];
  DLDevice dev = {kDLCPU, 0}, want;
  ab__save_error(saved);
  const char *env = getenv("AB_DEFAULT_DEVICE");
  if (env != NULL && *env != '\0') {
    if (ab_parse_device(env, &want) == AB_OK && ab__check_device(want, "AB_DEFAULT_DEVICE", true, &want, NULL) == AB_OK) {
      ab__restore_error(saved);
      return want;
    }
    AB_LOG(AB_LOG_WARN, "AB_DEFAULT_DEVICE ignored: %s", ab_last_error());
  }
  int32_t cl;
  if (ab_device_count(kDLCUDA) > 0 &&
      ab__check_device((DLDevice){kDLCUDA, AB_DEVICE_AUTO}, "best device", true, &want, NULL) == AB_OK)
    dev = want;
  else if ((cl = discrete_opencl()) >= 0)
    dev = (DLDevice){kDLOpenCL, cl};
  ab__restore_error(saved);
  return dev;
}

ab_status ab_synchronize(DLDevice dev, void *stream) {
  const struct ab_backend *be;
  AB_FORWARD(ab__check_device(dev, "device", false, &dev, &be));
  return ab__dev_synchronize(be, dev.device_id, stream);
}

ab_status ab_peer_access(DLDevice from, DLDevice to, int *can) {
  const struct ab_backend *fb, *tb;
  if (can == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "can is NULL");
  AB_FORWARD(ab__check_device(from, "from device", false, &from, &fb));
  AB_FORWARD(ab__check_device(to, "to device", false, &to, &tb));
  if (from.device_type == to.device_type && from.device_id == to.device_id) *can = 1;
  else *can = fb == tb && ab__dev_peer_access(fb, from.device_id, to.device_id);
  return AB_OK;
}
