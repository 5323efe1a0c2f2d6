/* The OpenCL backend: kDLOpenCL devices through the ICD loader.
 *
 * Numbering: device ids flatten every platform's devices, in platform order
 * (as clGetPlatformIDs returns them) and then device order within each
 * platform, after the filters AB_OPENCL_PLATFORM (a case-insensitive
 * substring of the platform name) and AB_OPENCL_DEVICE_TYPE (all, gpu, cpu,
 * accelerator; default all). The numbering is stable for a given machine,
 * driver set and environment.
 *
 * Memory: DLTensor.data of a kDLOpenCL tensor is a cl_mem buffer and
 * byte_offset a byte offset into it. Buffers made by other libraries are
 * accepted: their context is looked up with clGetMemObjectInfo.
 *
 * One context per platform holds its devices, with one in-order queue per
 * device; both are created on first use under a lock and released by
 * ab_shutdown. Every transfer is complete when the call returns.
 *
 * Pinned staging (AB_DEVICE_OPENCL_HOST, the second backend object here):
 * for each device, host memory the driver can DMA from directly, made as
 * buffers with CL_MEM_ALLOC_HOST_PTR mapped for good (the OpenCL way to
 * page-locked memory, which NVIDIA's and AMD's drivers honour). Routes
 * through host memory stage there, and pageable uploads and downloads of
 * 1 MiB and more go through the staging ring (src/staging.c) with
 * non-blocking transfers and marker events as fences. AB_OPENCL_PINNED,
 * read at initialisation: "auto" (the default) stages for devices whose
 * memory is not the host's, since on a CPU device a staged transfer is
 * only one more memcpy; "1" stages for every device; "0" for none.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "converters/host/convert.h"
#include "backends/opencl/icd_preload.h"
#include "converters/host/gather.h"

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

/* The kernels: gathers, one per element width (1, 2, 4, 8, 16 bytes), then
 * the conversions in float32 arithmetic, one per result type (float32,
 * float16, bfloat16) and source kind (convert_kernel), then the narrowing
 * conversions (narrow_kernel), which only devices with doubles have (NULL
 * elsewhere), then the two that take the kinds as arguments: integers
 * exactly (K_INT) and float64 arithmetic (K_WIDE, doubles only). The
 * conversions' lists are converters/opencl/kernels.def, which convert.cl
 * defines its kernels from. */
#include "converters/opencl/kernels.def"
#define AB_COUNT_ONE_(...) +1
#define NGATHER 5
#define NSOURCES (0 AB_CL_SOURCES(AB_COUNT_ONE_, , , ))
#define NFLOAT_RESULTS (0 AB_CL_FLOAT_RESULTS(AB_COUNT_ONE_))
#define NNARROW_RESULTS (0 AB_CL_NARROW_RESULTS(AB_COUNT_ONE_, , , ))
#define NCONVERT (NFLOAT_RESULTS * NSOURCES)
#define NNARROW (NSOURCES * NNARROW_RESULTS)
#define NREQUIRED (NGATHER + NCONVERT)
#define K_INT (NREQUIRED + NNARROW)
#define K_WIDE (K_INT + 1)
#define NKERNELS (K_WIDE + 1)

struct platform {
  cl_platform_id id;
  cl_context ctx; /* lazily */
  int first, count; /* its devices in the flat table */
  /* converters/opencl/gather.cl and convert.cl, built on first need
   * (program_ready) */
  cl_program prog[2];
  cl_kernel kernel[NKERNELS]; /* gathers, then conversions */
  bool prog_failed[2];
};

extern const char ab__opencl_gather_cl[], ab__opencl_convert_cl[];
extern const size_t ab__opencl_gather_cl_len, ab__opencl_convert_cl_len;

struct device {
  cl_device_id id;
  int platform;
  cl_command_queue queue; /* lazily */
  bool unified;           /* CL_DEVICE_HOST_UNIFIED_MEMORY */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct platform platforms[MAX_PLATFORMS];
static struct device devices[MAX_DEVICES];
static int nplatforms, ndevices;

/* AB_OPENCL_PINNED: which devices stage through pinned memory. */
enum pinned_mode { PINNED_AUTO, PINNED_ALL, PINNED_NONE };
static enum pinned_mode pinned_mode;

static const char *cl_err_name(cl_int e) {
  switch (e) {
  case CL_SUCCESS: return "CL_SUCCESS";
  case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
  case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
  case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
  case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
  case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
  case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
  case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
  case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
  case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
  case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
  case CL_MEM_COPY_OVERLAP: return "CL_MEM_COPY_OVERLAP";
  case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL driver installed)";
  default: return "unknown OpenCL error";
  }
}

static bool is_oom(cl_int e) {
  return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY;
}

/* Turns an OpenCL error into a status with the native code in the message. */
static ab_status fail_cl(cl_int e, int32_t id, const char *call) {
  return AB_FAIL(is_oom(e) ? AB_ERR_OUT_OF_MEMORY : AB_ERR_BACKEND, "opencl:%" PRId32 ": %s failed: %s (%d)", id,
                 call, cl_err_name(e), (int)e);
}

static bool contains_nocase(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return true;
  }
  return n == 0;
}

static ab_status device_type_filter(cl_device_type *out) {
  const char *v = ab__env_str("AB_OPENCL_DEVICE_TYPE");
  if (v == NULL || strcmp(v, "all") == 0) *out = CL_DEVICE_TYPE_ALL;
  else if (strcmp(v, "gpu") == 0) *out = CL_DEVICE_TYPE_GPU;
  else if (strcmp(v, "cpu") == 0) *out = CL_DEVICE_TYPE_CPU;
  else if (strcmp(v, "accelerator") == 0) *out = CL_DEVICE_TYPE_ACCELERATOR;
  else
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "AB_OPENCL_DEVICE_TYPE=\"%s\" is not one of all, gpu, cpu, accelerator", v);
  return AB_OK;
}

static enum pinned_mode read_pinned_mode(void) {
  static const struct ab__env_choice modes[] = {{"auto", PINNED_AUTO}, {"1", PINNED_ALL}, {"on", PINNED_ALL},
                                                {"0", PINNED_NONE},   {"off", PINNED_NONE}, {NULL, 0}};
  return (enum pinned_mode)ab__env_choice("AB_OPENCL_PINNED", modes, PINNED_AUTO, "auto, 1 (on) or 0 (off)");
}

static ab_status cl_init(void) {
  cl_platform_id ids[MAX_PLATFORMS];
  cl_uint n = 0;
  cl_device_type type = CL_DEVICE_TYPE_ALL;
  const char *want = ab__env_str("AB_OPENCL_PLATFORM");

  nplatforms = ndevices = 0;
  pinned_mode = read_pinned_mode();
  AB_FORWARD(device_type_filter(&type));
  ab__opencl_preload_icds(); /* before the ICD loader opens any driver */
  cl_int e = clGetPlatformIDs(MAX_PLATFORMS, ids, &n);
  if (e != CL_SUCCESS || n == 0)
    return AB_FAIL(AB_ERR_NO_DEVICE, "no OpenCL platform: clGetPlatformIDs gave %s (%d), %u platforms", cl_err_name(e),
                   (int)e, (unsigned)n);
  if (n > MAX_PLATFORMS) n = MAX_PLATFORMS;
  for (cl_uint p = 0; p < n; p++) {
    char name[256] = "";
    clGetPlatformInfo(ids[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (want != NULL && !contains_nocase(name, want)) continue;
    cl_device_id devs[MAX_DEVICES];
    cl_uint nd = 0;
    if (clGetDeviceIDs(ids[p], type, MAX_DEVICES, devs, &nd) != CL_SUCCESS || nd == 0) continue;
    struct platform *pl = &platforms[nplatforms];
    pl->id = ids[p];
    pl->ctx = NULL;
    pl->first = ndevices;
    pl->count = 0;
    pl->prog[0] = pl->prog[1] = NULL;
    pl->prog_failed[0] = pl->prog_failed[1] = false;
    for (int k = 0; k < NKERNELS; k++) pl->kernel[k] = NULL;
    for (cl_uint d = 0; d < nd && ndevices < MAX_DEVICES; d++) {
      cl_bool unified = CL_FALSE;
      clGetDeviceInfo(devs[d], CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
      devices[ndevices] = (struct device){devs[d], nplatforms, NULL, unified == CL_TRUE};
      ndevices++;
      pl->count++;
    }
    nplatforms++;
  }
  if (ndevices == 0)
    return AB_FAIL(AB_ERR_NO_DEVICE, "%u OpenCL platform%s but no device matched (AB_OPENCL_PLATFORM=%s, AB_OPENCL_DEVICE_TYPE=%s)",
                   (unsigned)n, n == 1 ? "" : "s", want ? want : "(unset)",
                   ab__env_str("AB_OPENCL_DEVICE_TYPE") ? ab__env_str("AB_OPENCL_DEVICE_TYPE") : "(unset)");
  return AB_OK;
}

static void cl_shutdown(void) {
  pthread_mutex_lock(&lock);
  for (int p = 0; p < nplatforms; p++) {
    for (int k = 0; k < NKERNELS; k++)
      if (platforms[p].kernel[k]) clReleaseKernel(platforms[p].kernel[k]);
    for (int w = 0; w < 2; w++)
      if (platforms[p].prog[w]) clReleaseProgram(platforms[p].prog[w]);
  }
  for (int i = 0; i < ndevices; i++)
    if (devices[i].queue) clReleaseCommandQueue(devices[i].queue);
  for (int p = 0; p < nplatforms; p++)
    if (platforms[p].ctx) clReleaseContext(platforms[p].ctx);
  nplatforms = ndevices = 0;
  pthread_mutex_unlock(&lock);
}

static int32_t cl_count(void) { return ndevices; }

static uint32_t cl_device_caps(int32_t id) { return devices[id].unified ? AB_CAP_UNIFIED_MEMORY : 0; }

/* The context and queue of a device, created on first use. */
static ab_status get_queue(int32_t id, cl_context *ctx, cl_command_queue *q) {
  cl_int e = CL_SUCCESS;
  struct device *d = &devices[id];
  struct platform *p = &platforms[d->platform];
  pthread_mutex_lock(&lock);
  if (p->ctx == NULL) {
    cl_device_id ids[MAX_DEVICES];
    for (int i = 0; i < p->count; i++) ids[i] = devices[p->first + i].id;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p->id, 0};
    p->ctx = clCreateContext(props, (cl_uint)p->count, ids, NULL, NULL, &e);
    if (e != CL_SUCCESS) p->ctx = NULL;
  }
  if (e == CL_SUCCESS && d->queue == NULL) {
    d->queue = clCreateCommandQueue(p->ctx, d->id, 0, &e);
    if (e != CL_SUCCESS) d->queue = NULL;
  }
  *ctx = p->ctx;
  *q = d->queue;
  pthread_mutex_unlock(&lock);
  if (e != CL_SUCCESS) return fail_cl(e, id, p->ctx ? "clCreateCommandQueue" : "clCreateContext");
  return AB_OK;
}

/* A device string, cut to fit: clGetDeviceInfo refuses a buffer shorter
 * than the whole string (PoCL's version string runs past 64 bytes). */
static void info_str(cl_device_id d, cl_device_info what, char *buf, size_t len) {
  char full[1024];
  if (clGetDeviceInfo(d, what, sizeof full, full, NULL) != CL_SUCCESS) {
    snprintf(buf, len, "?");
    return;
  }
  full[sizeof full - 1] = '\0';
  snprintf(buf, len, "%.*s", (int)len - 1, full);
}

static ab_status cl_info(int32_t id, struct ab_device_info *out) {
  cl_device_id d = devices[id].id;
  char name[128], vendor[64], version[64];
  cl_ulong global = 0;
  cl_bool unified = CL_FALSE;
  info_str(d, CL_DEVICE_NAME, name, sizeof name);
  info_str(d, CL_DEVICE_VENDOR, vendor, sizeof vendor);
  info_str(d, CL_DEVICE_VERSION, version, sizeof version);
  clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
  clGetDeviceInfo(d, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
  snprintf(out->name, sizeof out->name, "%s", name);
  snprintf(out->vendor, sizeof out->vendor, "%s", vendor);
  snprintf(out->version, sizeof out->version, "%s", version);
  clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof out->max_alloc_size, &out->max_alloc_size, NULL);
  out->total_memory = global;
  out->free_memory = 0; /* OpenCL 1.2 cannot say */
  out->unified_memory = unified == CL_TRUE;
  return AB_OK;
}

static ab_status cl_alloc(int32_t id, size_t bytes, void **out) {
  cl_context ctx;
  cl_command_queue q;
  cl_int e;
  AB_FORWARD(get_queue(id, &ctx, &q));
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &e);
  if (e == CL_INVALID_BUFFER_SIZE) {
    cl_ulong max = 0;
    clGetDeviceInfo(devices[id].id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max, &max, NULL);
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl:%" PRId32 ": %zu bytes is more than one buffer may hold (%llu)", id,
                   bytes, (unsigned long long)max);
  }
  if (e != CL_SUCCESS) return fail_cl(e, id, "clCreateBuffer");
  *out = m;
  return AB_OK;
}

static void cl_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  clReleaseMemObject((cl_mem)ptr);
}

/* The caller's stream if it belongs to `ctx`. A stream of another context
 * cannot touch this buffer (our result buffers live in our own context):
 * it is finished first, so that work the caller queued on it is ordered
 * before ours, and our queue is used instead. */
static ab_status use_stream(int32_t id, cl_context ctx, void *stream, cl_command_queue *q) {
  cl_context sctx = NULL;
  cl_command_queue s = (cl_command_queue)stream;
  cl_int e = clGetCommandQueueInfo(s, CL_QUEUE_CONTEXT, sizeof sctx, &sctx, NULL);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": opts->stream is not a cl_command_queue (%s)", id,
                   cl_err_name(e));
  /* An out-of-order queue would not order our work after the caller's
   * (nor the caller's next work after ours): finished first, not used,
   * like a queue of another context. */
  cl_command_queue_properties props = 0;
  e = clGetCommandQueueInfo(s, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  if (e != CL_SUCCESS) return fail_cl(e, id, "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
  if (sctx == ctx && !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    *q = s;
    return AB_OK;
  }
  e = clFinish(s);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "clFinish(opts->stream)");
}

/* The queue to use for a buffer on device `id`: the caller's stream when
 * it belongs to the buffer's context; ours when the buffer lives in our
 * context; otherwise a temporary queue on the buffer's own context (a
 * foreign cl_mem). *tmp is then set and must be released. */
static ab_status queue_for(int32_t id, cl_mem m, void *stream, cl_command_queue *q, bool *tmp) {
  cl_context ours, theirs = NULL;
  *tmp = false;
  AB_FORWARD(get_queue(id, &ours, q));
  cl_int e = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof theirs, &theirs, NULL);
  if (e != CL_SUCCESS) return fail_cl(e, id, "clGetMemObjectInfo(CL_MEM_CONTEXT)");
  if (stream != NULL) {
    cl_command_queue s = *q;
    AB_FORWARD(use_stream(id, theirs, stream, &s));
    if (s == (cl_command_queue)stream) {
      *q = s;
      return AB_OK;
    }
  }
  if (theirs == ours) return AB_OK;
  *q = clCreateCommandQueue(theirs, devices[id].id, 0, &e);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the buffer's context does not contain this device (clCreateCommandQueue: %s)", id,
                   cl_err_name(e));
  *tmp = true;
  return AB_OK;
}

/* One blocking transfer between host memory and a buffer, on the queue
 * queue_for picks. Rectangles are compact on one side: the device side for
 * writes (host pitches given), the host side for reads (device pitches). */
enum xfer_kind { XFER_WRITE, XFER_READ, XFER_WRITE_RECT, XFER_READ_RECT };

struct xfer {
  enum xfer_kind kind;
  uint64_t offset;      /* bytes into the buffer */
  size_t bytes;         /* plain transfers */
  const size_t *region; /* rectangles: row bytes, rows, slices */
  size_t row_pitch, slice_pitch;
  void *host;
};

static ab_status transfer(int32_t id, cl_mem m, void *stream, const struct xfer *x) {
  static const char *calls[] = {"clEnqueueWriteBuffer", "clEnqueueReadBuffer", "clEnqueueWriteBufferRect",
                                "clEnqueueReadBufferRect"};
  const size_t origin[3] = {(size_t)x->offset, 0, 0}, host_origin[3] = {0, 0, 0};
  cl_command_queue q;
  bool tmp;
  cl_int e = CL_INVALID_VALUE;
  AB_FORWARD(queue_for(id, m, stream, &q, &tmp));
  switch (x->kind) {
  case XFER_WRITE:
    e = clEnqueueWriteBuffer(q, m, CL_TRUE, (size_t)x->offset, x->bytes, x->host, 0, NULL, NULL);
    break;
  case XFER_READ:
    e = clEnqueueReadBuffer(q, m, CL_TRUE, (size_t)x->offset, x->bytes, x->host, 0, NULL, NULL);
    break;
  case XFER_WRITE_RECT:
    e = clEnqueueWriteBufferRect(q, m, CL_TRUE, origin, host_origin, x->region, x->region[0],
                                 x->region[0] * x->region[1], x->row_pitch, x->slice_pitch, x->host, 0, NULL, NULL);
    break;
  case XFER_READ_RECT:
    e = clEnqueueReadBufferRect(q, m, CL_TRUE, origin, host_origin, x->region, x->row_pitch, x->slice_pitch,
                                x->region[0], x->region[0] * x->region[1], x->host, 0, NULL, NULL);
    break;
  }
  if (tmp) clReleaseCommandQueue(q);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, calls[x->kind]);
}

static ab_status cl_write(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  struct xfer x = {XFER_WRITE, offset, bytes, NULL, 0, 0, (void *)src};
  return transfer(id, (cl_mem)handle, stream, &x);
}

static ab_status cl_read(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  struct xfer x = {XFER_READ, offset, bytes, NULL, 0, 0, dst};
  return transfer(id, (cl_mem)handle, stream, &x);
}

static ab_status cl_read_rect(int32_t id, const void *handle, uint64_t offset, const size_t region[3],
                              size_t row_pitch, size_t slice_pitch, void *dst, void *stream) {
  struct xfer x = {XFER_READ_RECT, offset, 0, region, row_pitch, slice_pitch, dst};
  return transfer(id, (cl_mem)handle, stream, &x);
}

static ab_status cl_write_rect(int32_t id, void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                               size_t slice_pitch, const void *src, void *stream) {
  struct xfer x = {XFER_WRITE_RECT, offset, 0, region, row_pitch, slice_pitch, (void *)src};
  return transfer(id, (cl_mem)handle, stream, &x);
}

static ab_status cl_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  size_t size = 0;
  cl_mem_object_type type = 0;
  cl_int e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_TYPE, sizeof type, &type, NULL);
  if (e == CL_SUCCESS) e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_SIZE, sizeof size, &size, NULL);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": data %p is not a cl_mem buffer (%s)", id, handle,
                   cl_err_name(e));
  if (type != CL_MEM_OBJECT_BUFFER)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": data is an OpenCL image, not a buffer", id);
  /* The device the tensor names must be one of the buffer's context. */
  cl_context ctx = NULL;
  cl_uint n = 0;
  cl_device_id in_ctx[MAX_DEVICES];
  e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
  if (e == CL_SUCCESS) e = clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
  if (e == CL_SUCCESS && n <= MAX_DEVICES) e = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof in_ctx, in_ctx, NULL);
  if (e != CL_SUCCESS) return fail_cl(e, id, "clGetContextInfo");
  bool found = false;
  for (cl_uint i = 0; i < n && i < MAX_DEVICES; i++) found |= in_ctx[i] == devices[id].id;
  if (!found)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the tensor's buffer belongs to a context without this device", id);
  if (end > size)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the tensor addresses bytes [%" PRIu64 ", %" PRIu64 ") of a %zu-byte buffer", id,
                   begin, end, size);
  return AB_OK;
}

/* ---- gather kernels --------------------------------------------------- */

/* A source layout as the kernel takes it: up to 8 dims after dropping
 * size-1 dims and merging contiguous neighbours, in units of the element
 * width `w` (the element size, or 1 byte when the offset or the size does
 * not suit a typed move, with the element's bytes as an extra inner dim). */
struct klayout {
  int n, k; /* dims, kernel index */
  cl_long8 shape, stride;
  uint64_t offset; /* in units of w */
  uint64_t count;  /* elements of width w */
};

static int width_index(size_t w) {
  switch (w) {
  case 1: return 0;
  case 2: return 1;
  case 4: return 2;
  case 8: return 3;
  case 16: return 4;
  default: return -1;
  }
}

static bool kernel_layout(const DLTensor *t, struct klayout *kl) {
  size_t es = ab__elsize(t->dtype), w = es;
  int64_t shape[AB_MAX_NDIM + 1], stride[AB_MAX_NDIM + 1];
  int n = 0;
  if (width_index(es) < 0 || t->byte_offset % es != 0) w = 1;
  int64_t scale = (int64_t)(es / w);
  if (t->strides == NULL) return false; /* compact: clEnqueueCopyBuffer's job */
  int64_t units[AB_MAX_NDIM];
  for (int32_t i = 0; i < t->ndim; i++)
    units[i] = t->shape[i] == 1 ? 0 : t->strides[i] * scale; /* validated: (sh - 1) * st * es fits */
  n = ab__merge_dims(t->ndim, t->shape, units, shape, stride);
  if (scale > 1) { /* the element's bytes, contiguous */
    if (n > 0 && stride[n - 1] == scale) {
      shape[n - 1] *= scale;
      stride[n - 1] = 1;
    } else {
      shape[n] = scale;
      stride[n] = 1;
      n++;
    }
  }
  if (n > 8) return false;
  memset(kl, 0, sizeof *kl);
  kl->n = n;
  kl->k = width_index(w);
  kl->offset = t->byte_offset / w;
  kl->count = 1;
  for (int i = 0; i < n; i++) {
    kl->shape.s[i] = shape[i];
    kl->stride.s[i] = stride[i];
    kl->count *= (uint64_t)shape[i];
  }
  for (int i = n; i < 8; i++) kl->shape.s[i] = 1;
  return true;
}

/* The platform's programs, each built on first use: 0 is gather.cl
 * (kernels [0, NGATHER)), 1 is convert.cl (the rest), apart so that a
 * driver that cannot build one keeps the other. False when the program
 * cannot be built (no compiler in the driver, for instance); that is
 * remembered, and those copies or conversions go through the host. Under
 * `lock`. */
static bool program_ready(struct platform *p, int which) {
  /* In the order of the kernel indexes (see NGATHER), from kernels.def. */
#define AB_NAME_TO_(SUFFIX, TS, LOAD, KIND, RSUFFIX, TD, STORE) "ab_to_" #RSUFFIX "_" #SUFFIX,
#define AB_NAMES_INTO_(RSUFFIX, TD, STORE, KIND) AB_CL_SOURCES(AB_NAME_TO_, RSUFFIX, TD, STORE)
  /* The source's suffix is pasted (ab_<suffix>) before it is passed on, so
   * that one that is a C macro (bool) is not expanded on the way. */
#define AB_NAME_NARROW_(RSUFFIX, TD, CONV, KIND, PREFIX, TS, LOAD) #PREFIX "_to_" #RSUFFIX,
#define AB_NAMES_FROM_(SUFFIX, TS, LOAD, KIND, A, B, C) AB_CL_NARROW_RESULTS(AB_NAME_NARROW_, ab_##SUFFIX, TS, LOAD)
  static const char *const names[NKERNELS] = {
    "ab_gather_1", "ab_gather_2", "ab_gather_4", "ab_gather_8", "ab_gather_16",
    AB_CL_FLOAT_RESULTS(AB_NAMES_INTO_)
    AB_CL_SOURCES(AB_NAMES_FROM_, , , )
    "ab_convert_int", "ab_convert_wide"};
#undef AB_NAME_TO_
#undef AB_NAMES_INTO_
#undef AB_NAME_NARROW_
#undef AB_NAMES_FROM_
  const int first = which == 0 ? 0 : NGATHER, required = which == 0 ? NGATHER : NREQUIRED,
            last = which == 0 ? NGATHER : NKERNELS;
  if (p->prog[which] != NULL) return true;
  if (p->prog_failed[which] || p->ctx == NULL) return false;
  const char *src = which == 0 ? ab__opencl_gather_cl : ab__opencl_convert_cl;
  size_t len = which == 0 ? ab__opencl_gather_cl_len : ab__opencl_convert_cl_len;
  cl_int e;
  cl_program prog = clCreateProgramWithSource(p->ctx, 1, &src, &len, &e);
  const char *opts = "";
#ifdef AB_FAULT_INJECTION
  /* test_opencl builds convert.cl as other compilers would (one that
   * refuses the generic kernels, one without doubles): test builds only. */
  const char *test_opts = which == 1 ? ab__env_str("AB_TEST_OPENCL_CONVERT_OPTIONS") : NULL;
  if (test_opts != NULL) opts = test_opts;
#endif
  if (e == CL_SUCCESS) e = clBuildProgram(prog, 0, NULL, opts, NULL, NULL);
  if (e == CL_BUILD_PROGRAM_FAILURE && which == 1) {
    /* A compiler that cannot take the two kernels with the kinds as
     * arguments keeps the per-pair ones: built again without them. */
    char again[256];
    snprintf(again, sizeof again, "%s -DAB_NO_GENERIC_KERNELS", opts);
    AB_LOG(AB_LOG_INFO, "OpenCL: convert.cl did not build whole; again without ab_convert_int/ab_convert_wide");
    e = clBuildProgram(prog, 0, NULL, again, NULL, NULL);
  }
  for (int k = first; k < required && e == CL_SUCCESS; k++) p->kernel[k] = clCreateKernel(prog, names[k], &e);
  /* The narrowing and float64 kernels do not exist without cl_khr_fp64
   * (on some device of the context), nor the two generic ones in a
   * program built without them: those conversions stay on the host. */
  for (int k = required; k < last && e == CL_SUCCESS; k++) {
    cl_int ke;
    p->kernel[k] = clCreateKernel(prog, names[k], &ke);
    if (ke != CL_SUCCESS) p->kernel[k] = NULL;
  }
  if (e != CL_SUCCESS) {
    AB_LOG(AB_LOG_WARN, "OpenCL %s kernels unavailable (%s, %d): %s go through the host",
           which == 0 ? "gather" : "conversion", cl_err_name(e), (int)e,
           which == 0 ? "strided copies" : "conversions");
    for (int k = first; k < last; k++)
      if (p->kernel[k]) clReleaseKernel(p->kernel[k]), p->kernel[k] = NULL;
    if (prog) clReleaseProgram(prog);
    p->prog_failed[which] = true;
    return false;
  }
  p->prog[which] = prog;
  return true;
}

static bool kernels_ready(struct platform *p) { return program_ready(p, 0); }

/* Copies within one context: a compact source with clEnqueueCopyBuffer, a
 * strided one (up to 8 dims after merging) with the gather kernel. */
static bool cl_can_copy(const DLTensor *from, DLDevice to, bool from_compact) {
  cl_context theirs = NULL;
  struct klayout kl;
  if (clGetMemObjectInfo((cl_mem)from->data, CL_MEM_CONTEXT, sizeof theirs, &theirs, NULL) != CL_SUCCESS)
    return false;
  struct platform *p = &platforms[devices[to.device_id].platform];
  pthread_mutex_lock(&lock);
  bool ok = p->ctx != NULL && theirs == p->ctx && (from_compact || (kernel_layout(from, &kl) && kernels_ready(p)));
  pthread_mutex_unlock(&lock);
  return ok;
}

/* The arguments every kernel here starts with (gather.cl, convert.cl):
 * source buffer and offset, destination buffer and offset (in elements),
 * the layout's dims, shape and strides, and the element count. Under
 * `lock`: arguments are captured at enqueue, so two threads must not
 * interleave their calls on a shared kernel. */
static cl_int set_layout_args(cl_kernel k, cl_mem src, cl_ulong src_off, cl_mem dst, cl_ulong dst_off, cl_int ndim,
                              const cl_long8 *shape, const cl_long8 *stride, cl_ulong n) {
  cl_int e = clSetKernelArg(k, 0, sizeof src, &src);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 1, sizeof src_off, &src_off);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 2, sizeof dst, &dst);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 3, sizeof dst_off, &dst_off);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 4, sizeof ndim, &ndim);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 5, sizeof *shape, shape);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 6, sizeof *stride, stride);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 7, sizeof n, &n);
  return e;
}

/* Completes work just queued on `q`, or with an early return (see
 * ab_backend) only starts it, when `q` is the caller's own queue. Not on
 * the library's queue when the caller gave none: the next call's work on
 * another device's queue would not be ordered after it. If the start
 * fails the work is waited for all the same: the caller is about to give
 * the buffers back. */
static cl_int done_or_started(cl_command_queue q, void *stream, bool async) {
  if (!async || stream == NULL || q != (cl_command_queue)stream) return clFinish(q);
  cl_int e = clFlush(q);
  if (e != CL_SUCCESS) clFinish(q);
  return e;
}

static ab_status gather(int32_t id, const DLTensor *from, DLTensor *to, cl_command_queue q, void *stream, bool async) {
  struct klayout kl;
  struct platform *p = &platforms[devices[id].platform];
  if (!kernel_layout(from, &kl))
    return AB_FAIL(AB_ERR_INTERNAL, "opencl:%" PRId32 ": gather asked for a layout the kernel cannot take", id);
  size_t w = (size_t)1 << kl.k; /* kernels 0..4 move 1, 2, 4, 8, 16 bytes */
  cl_ulong src_off = kl.offset, dst_off = to->byte_offset / w, n = kl.count;
  cl_int ndim = kl.n;
  cl_mem src = (cl_mem)from->data, dst = (cl_mem)to->data;
  size_t global = (size_t)n; /* the driver picks the work-group size */
  cl_int e;
  /* Arguments are captured at enqueue: the lock keeps two threads from
   * interleaving their clSetKernelArg calls on the shared kernel. */
  pthread_mutex_lock(&lock);
  if (!kernels_ready(p)) {
    pthread_mutex_unlock(&lock);
    return AB_FAIL(AB_ERR_BACKEND, "opencl:%" PRId32 ": the gather kernels could not be built", id);
  }
  cl_kernel k = p->kernel[kl.k];
  e = set_layout_args(k, src, src_off, dst, dst_off, ndim, &kl.shape, &kl.stride, n);
  if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL);
  pthread_mutex_unlock(&lock);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "the gather kernel");
}

static ab_status cl_copy(const DLTensor *from, DLTensor *to, void *stream, bool async) {
  cl_context ctx;
  cl_command_queue q;
  int32_t id = to->device.device_id;
  AB_FORWARD(get_queue(id, &ctx, &q));
  if (stream != NULL) AB_FORWARD(use_stream(id, ctx, stream, &q));
  if (!ab__is_compact(from)) return gather(id, from, to, q, stream, async);
  const size_t bytes = ab__elsize(from->dtype) * (size_t)ab__numel(from);
  cl_int e = clEnqueueCopyBuffer(q, (cl_mem)from->data, (cl_mem)to->data, (size_t)from->byte_offset,
                                 (size_t)to->byte_offset, bytes, 0, NULL, NULL);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "clEnqueueCopyBuffer");
}

/* ---- conversions (converters/opencl/convert.cl) ---------------------- */

/* The element kinds of convert.cl, by the codes ab_convert_int and
 * ab_convert_wide take (AB_CL_KINDS, kernels.def). */
#define AB_KIND_CODE_(KIND) CK_##KIND,
enum cl_kind { AB_CL_KINDS(AB_KIND_CODE_) CK_COUNT };
#undef AB_KIND_CODE_

/* A one-lane dtype's kind, -1 for one the kernels do not take. */
static int cl_kind(DLDataType d) {
  if (d.lanes != 1) return -1;
  switch (d.code) {
  case kDLBool: return d.bits == 8 ? CK_BOOL : -1;
  case kDLInt: return d.bits == 8 ? CK_I8 : d.bits == 16 ? CK_I16 : d.bits == 32 ? CK_I32 : d.bits == 64 ? CK_I64 : -1;
  case kDLUInt:
    return d.bits == 8 ? CK_U8 : d.bits == 16 ? CK_U16 : d.bits == 32 ? CK_U32 : d.bits == 64 ? CK_U64 : -1;
  case kDLFloat: return d.bits == 16 ? CK_F16 : d.bits == 32 ? CK_F32 : d.bits == 64 ? CK_F64 : -1;
  case kDLBfloat: return d.bits == 16 ? CK_BF16 : -1;
  default: return -1;
  }
}

/* Whether the wide kernel goes through float for a kind (float16,
 * bfloat16, float32). */
static bool is_float_kind(int k) { return k == CK_F16 || k == CK_BF16 || k == CK_F32; }

/* The float32-arithmetic kernel for a source dtype (its index among those
 * of one result type: AB_FOR_EACH_SOURCE's order in convert.cl), -1 when
 * convert.cl has none. */
static int convert_kernel(DLDataType d) {
  static const int kinds[NSOURCES] = {
#define AB_SOURCE_KIND_(SUFFIX, TS, LOAD, KIND, A, B, C) CK_##KIND,
    AB_CL_SOURCES(AB_SOURCE_KIND_, , , )
#undef AB_SOURCE_KIND_
  };
  const int k = cl_kind(d);
  for (int i = 0; i < NSOURCES && k >= 0; i++)
    if (kinds[i] == k) return i;
  return -1;
}

#define MAX_CHANNELS 16

/* Which kernel family a conversion runs in, and so which arguments it
 * takes after the layout's. */
enum kfamily {
  F_FLOAT32, /* mode, chan, a and b as float16 vectors */
  F_NARROW,  /* mode, chan, ad and bd (float64) */
  F_INT,     /* from, to */
  F_WIDE,    /* mode, chan, ad, bd, from, to */
};

/* A conversion as the kernel takes it: at most 8 dims after dropping
 * size-1 dims and merging neighbours that are contiguous in the source
 * (never the channel axis), and the channel's a and b. */
struct kconv {
  int n, chan, mode, k;
  enum kfamily family;
  cl_int from, to; /* cl_kind codes, for F_INT and F_WIDE */
  cl_long8 shape, stride;
  cl_float16 a, b;
  cl_double16 ad, bd;
};

/* The narrowing kernel (its index after the float32-arithmetic ones) from
 * a source kind (convert_kernel's order) into uint8, int8, uint16 or int16;
 * -1 for none. */
static int narrow_kernel(DLDataType from, DLDataType to) {
  static const int results[NNARROW_RESULTS] = {
#define AB_NARROW_KIND_(RSUFFIX, TD, CONV, KIND, SS, TS, LOAD) CK_##KIND,
    AB_CL_NARROW_RESULTS(AB_NARROW_KIND_, , , )
#undef AB_NARROW_KIND_
  };
  const int f = convert_kernel(from), k = cl_kind(to);
  int t = -1;
  for (int i = 0; i < NNARROW_RESULTS && k >= 0; i++)
    if (results[i] == k) t = i;
  return f < 0 || t < 0 ? -1 : f * NNARROW_RESULTS + t;
}

/* The kernel for op (by the arithmetic the rules give it): the
 * float32-arithmetic ones; for float64 arithmetic the narrowing ones
 * where one exists, else ab_convert_wide; ab_convert_int for integers
 * without a map. False when none takes it. */
static bool choose_kernel(const ab__cast_op *op, struct kconv *kc) {
  const ab__arith ar = ab__cast_arith(op->from, op->to, op->affine);
  if (ar == AB_ARITH_FLOAT32) {
    const int k = convert_kernel(op->from);
    static const int results[NFLOAT_RESULTS] = {
#define AB_FLOAT_KIND_(RSUFFIX, TD, STORE, KIND) CK_##KIND,
      AB_CL_FLOAT_RESULTS(AB_FLOAT_KIND_)
#undef AB_FLOAT_KIND_
    };
    const int to = cl_kind(op->to);
    int result = -1;
    for (int i = 0; i < NFLOAT_RESULTS && to >= 0; i++)
      if (results[i] == to) result = i;
    if (result < 0) return false;
    /* A permutation of float16 or bfloat16 goes through float and back,
     * which would quiet a signalling NaN the host's gather keeps as it is. */
    if (k < 0 || (to != CK_F32 && !op->affine && op->from.code == op->to.code && op->from.bits == op->to.bits))
      return false;
    kc->k = NGATHER + result * NSOURCES + k;
    kc->family = F_FLOAT32;
    return true;
  }
  if (ar != AB_ARITH_INT && ar != AB_ARITH_FLOAT64) return false;
  const int nk = ar == AB_ARITH_FLOAT64 ? narrow_kernel(op->from, op->to) : -1;
  if (nk >= 0) {
    kc->k = NREQUIRED + nk;
    kc->family = F_NARROW;
    return true;
  }
  kc->from = cl_kind(op->from);
  kc->to = cl_kind(op->to);
  if (kc->from < 0 || kc->to < 0) return false;
  /* integers need no floating point at all: the devices without doubles have this one */
  kc->k = ar == AB_ARITH_INT ? K_INT : K_WIDE;
  kc->family = ar == AB_ARITH_INT ? F_INT : F_WIDE;
  return true;
}

static bool conv_layout(const ab__convert_args *args, struct kconv *kc) {
  const ab__cast_op *op = &args->op;
  const bool per_channel = op->affine && op->channel_dim >= 0;
  int64_t sh[AB_MAX_NDIM], st[AB_MAX_NDIM];
  int n = 0, chan = -1;
  memset(kc, 0, sizeof *kc);
  if (!choose_kernel(op, kc)) return false;
  if (per_channel && args->shape[op->channel_dim] > MAX_CHANNELS) return false;
  for (int32_t i = 0; i < args->ndim; i++) {
    const bool is_chan = per_channel && i == op->channel_dim;
    if (args->shape[i] == 1) continue; /* a size-1 channel axis: channel 0 everywhere */
    if (n > 0 && !is_chan && n - 1 != chan && st[n - 1] == args->stride[i] * args->shape[i]) {
      sh[n - 1] *= args->shape[i];
      st[n - 1] = args->stride[i];
      continue;
    }
    if (n == 8) return false;
    if (is_chan) chan = n;
    sh[n] = args->shape[i];
    st[n] = args->stride[i];
    n++;
  }
  kc->n = n;
  kc->chan = chan;
  kc->mode = op->affine ? 1 : 0;
  for (int i = 0; i < 8; i++) {
    kc->shape.s[i] = i < n ? sh[i] : 1;
    kc->stride.s[i] = i < n ? st[i] : 0;
  }
  for (int c = 0; c < MAX_CHANNELS; c++) {
    kc->ad.s[c] = 1.0;
    kc->bd.s[c] = 0.0;
  }
  if (per_channel) {
    const int64_t nc = args->shape[op->channel_dim];
    for (int64_t c = 0; c < nc; c++) {
      kc->ad.s[c] = op->channel_scale ? op->channel_scale[c] : 1.0;
      kc->bd.s[c] = op->channel_offset ? op->channel_offset[c] : 0.0;
    }
  } else if (op->affine) {
    kc->ad.s[0] = op->scale;
    kc->bd.s[0] = op->offset;
  }
  /* float32 arithmetic takes them rounded to float, as the host does */
  for (int c = 0; c < MAX_CHANNELS; c++) {
    kc->a.s[c] = (float)kc->ad.s[c];
    kc->b.s[c] = (float)kc->bd.s[c];
  }
  return true;
}

/* The kernels give the host's bits only where float arithmetic rounds to
 * nearest and keeps denormals (CL_DEVICE_SINGLE_FP_CONFIG); elsewhere the
 * host converts. */
static bool fp_exact(int32_t id, cl_device_info which) {
  cl_device_fp_config fp = 0;
  return clGetDeviceInfo(devices[id].id, which, sizeof fp, &fp, NULL) == CL_SUCCESS &&
         (fp & (CL_FP_ROUND_TO_NEAREST | CL_FP_DENORM)) == (CL_FP_ROUND_TO_NEAREST | CL_FP_DENORM);
}

static bool cl_can_convert(int32_t id, const void *src, uint64_t src_offset, const ab__convert_args *args) {
  struct kconv kc;
  cl_context ctx, theirs = NULL;
  cl_command_queue q;
  if (!conv_layout(args, &kc)) return false;
  /* The kernels index whole elements of the source */
  if (src_offset % ab__elsize(args->op.from) != 0) return false;
  /* float32 arithmetic or loads (denormal sources too) in the float32 and
   * narrowing kernels, and in the wide one where a side is a 16- or 32-bit
   * float; float64 in the narrowing and wide ones */
  const bool singles = kc.family == F_FLOAT32 || kc.family == F_NARROW ||
                       (kc.family == F_WIDE && (is_float_kind(kc.from) || is_float_kind(kc.to)));
  const bool doubles = kc.family == F_NARROW || kc.family == F_WIDE;
  if ((singles && !fp_exact(id, CL_DEVICE_SINGLE_FP_CONFIG)) || (doubles && !fp_exact(id, CL_DEVICE_DOUBLE_FP_CONFIG)))
    return false;
  /* A buffer of another context cannot be an argument of our kernels. */
  if (src != NULL && clGetMemObjectInfo((cl_mem)src, CL_MEM_CONTEXT, sizeof theirs, &theirs, NULL) != CL_SUCCESS)
    return false;
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  const bool have_ctx = get_queue(id, &ctx, &q) == AB_OK;
  ab__restore_error(saved);
  if (!have_ctx) return false;
  struct platform *p = &platforms[devices[id].platform];
  if (src != NULL && theirs != ctx) return false;
  pthread_mutex_lock(&lock);
  const bool ok = program_ready(p, 1) && p->kernel[kc.k] != NULL;
  pthread_mutex_unlock(&lock);
  return ok;
}

static ab_status cl_convert(int32_t id, const void *src, uint64_t src_offset, void *dst, uint64_t dst_offset,
                            const ab__convert_args *args, void *stream, bool async) {
  struct kconv kc;
  cl_context ctx;
  cl_command_queue q;
  const size_t es = ab__elsize(args->op.from), os = ab__elsize(args->op.to);
  if (!conv_layout(args, &kc) || src_offset % es != 0 || dst_offset % os != 0)
    return AB_FAIL(AB_ERR_INTERNAL, "opencl:%" PRId32 ": convert asked for a conversion the kernels cannot take", id);
  AB_FORWARD(get_queue(id, &ctx, &q));
  if (stream != NULL) AB_FORWARD(use_stream(id, ctx, stream, &q));
  cl_ulong n = 1, src_off = src_offset / es, dst_off = dst_offset / os;
  for (int32_t i = 0; i < args->ndim; i++) n *= (cl_ulong)args->shape[i];
  if (n == 0) return AB_OK;
  cl_mem s = (cl_mem)src, d = (cl_mem)dst;
  cl_int ndim = kc.n, mode = kc.mode, chan = kc.chan;
  size_t global = (size_t)n;
  struct platform *p = &platforms[devices[id].platform];
  cl_int e;
  /* As for the gathers: the lock keeps two threads' arguments apart. */
  pthread_mutex_lock(&lock);
  if (!program_ready(p, 1) || p->kernel[kc.k] == NULL) {
    pthread_mutex_unlock(&lock);
    return AB_FAIL(AB_ERR_BACKEND, "opencl:%" PRId32 ": the conversion kernels could not be built", id);
  }
  cl_kernel k = p->kernel[kc.k];
  e = set_layout_args(k, s, src_off, d, dst_off, ndim, &kc.shape, &kc.stride, n);
  cl_uint next = 8; /* the family's arguments (enum kfamily) */
  if (kc.family != F_INT) {
    const bool f64 = kc.family != F_FLOAT32;
    if (e == CL_SUCCESS) e = clSetKernelArg(k, next++, sizeof mode, &mode);
    if (e == CL_SUCCESS) e = clSetKernelArg(k, next++, sizeof chan, &chan);
    if (e == CL_SUCCESS) e = f64 ? clSetKernelArg(k, next++, sizeof kc.ad, &kc.ad) : clSetKernelArg(k, next++, sizeof kc.a, &kc.a);
    if (e == CL_SUCCESS) e = f64 ? clSetKernelArg(k, next++, sizeof kc.bd, &kc.bd) : clSetKernelArg(k, next++, sizeof kc.b, &kc.b);
  }
  if (kc.family == F_INT || kc.family == F_WIDE) {
    if (e == CL_SUCCESS) e = clSetKernelArg(k, next++, sizeof kc.from, &kc.from);
    if (e == CL_SUCCESS) e = clSetKernelArg(k, next++, sizeof kc.to, &kc.to);
  }
  if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL);
  pthread_mutex_unlock(&lock);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "the conversion kernel");
}

/* ab_synchronize: the caller's queue, or ours for the device. */
static ab_status cl_synchronize(int32_t id, void *stream) {
  cl_context ctx;
  cl_command_queue q;
  if (stream != NULL) {
    cl_int e = clFinish((cl_command_queue)stream);
    return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "clFinish(stream)");
  }
  AB_FORWARD(get_queue(id, &ctx, &q));
  cl_int e = clFinish(q);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, "clFinish");
}

/* ---- pinned staging memory and the ring's operations ------------------- */

/* A pinned block: one CL_MEM_ALLOC_HOST_PTR buffer, mapped while it lives.
 * Its header sits in the mapped bytes just before the 256-byte aligned
 * pointer handed out, so freeing needs no lookup and no host allocation;
 * the headers form a list that host_is_staged walks (the pool keeps the
 * blocks few: staging chunks and intermediate buffers). */
struct pinned {
  cl_mem mem;
  cl_command_queue queue; /* retained: the unmap may come after ab_shutdown released ours */
  void *base;
  size_t len;
  struct pinned *prev, *next;
};
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pinned *pinned_list;

static ab_status fail_pinned(cl_int e, int32_t id, const char *call) {
  return AB_FAIL(is_oom(e) ? AB_ERR_OUT_OF_MEMORY : AB_ERR_BACKEND, "opencl_host:%" PRId32 ": %s failed: %s (%d)", id,
                 call, cl_err_name(e), (int)e);
}

static ab_status pinned_alloc(int32_t id, size_t bytes, void **out) {
  cl_context ctx;
  cl_command_queue q;
  cl_int e;
  size_t len;
  /* Room for the header and for aligning the block past it. */
  if (__builtin_add_overflow(bytes, 2 * (size_t)AB_ALIGNMENT, &len))
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl_host:%" PRId32 ": %zu bytes is too many", id, bytes);
  AB_FORWARD(get_queue(id, &ctx, &q));
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, len, NULL, &e);
  if (e == CL_INVALID_BUFFER_SIZE)
    /* Not an out-of-memory the OOM sequence could cure: the caller stages
     * in pageable memory instead. */
    return AB_FAIL(AB_ERR_UNSUPPORTED, "opencl_host:%" PRId32 ": %zu bytes is more than one buffer may hold", id, len);
  if (e != CL_SUCCESS) return fail_pinned(e, id, "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)");
  void *base = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, len, 0, NULL, NULL, &e);
  if (e != CL_SUCCESS || base == NULL) {
    clReleaseMemObject(m);
    return fail_pinned(e != CL_SUCCESS ? e : CL_OUT_OF_HOST_MEMORY, id, "clEnqueueMapBuffer");
  }
  uintptr_t user = ((uintptr_t)base + sizeof(struct pinned) + AB_ALIGNMENT - 1) & ~(uintptr_t)(AB_ALIGNMENT - 1);
  struct pinned *h = (struct pinned *)(user - sizeof(struct pinned));
  clRetainCommandQueue(q);
  *h = (struct pinned){m, q, base, len, NULL, NULL};
  pthread_mutex_lock(&pinned_lock);
  h->next = pinned_list;
  if (pinned_list != NULL) pinned_list->prev = h;
  pinned_list = h;
  pthread_mutex_unlock(&pinned_lock);
  *out = (void *)user;
  return AB_OK;
}

static void pinned_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  struct pinned *h = (struct pinned *)((char *)ptr - sizeof(struct pinned));
  pthread_mutex_lock(&pinned_lock);
  if (h->prev != NULL) h->prev->next = h->next;
  else pinned_list = h->next;
  if (h->next != NULL) h->next->prev = h->prev;
  pthread_mutex_unlock(&pinned_lock);
  struct pinned copy = *h; /* the header lives in the bytes being unmapped */
  clEnqueueUnmapMemObject(copy.queue, copy.mem, copy.base, 0, NULL, NULL);
  clFinish(copy.queue);
  clReleaseMemObject(copy.mem);
  clReleaseCommandQueue(copy.queue);
}

static bool cl_host_is_staged(const void *p) {
  bool found = false;
  pthread_mutex_lock(&pinned_lock);
  for (struct pinned *h = pinned_list; h != NULL && !found; h = h->next)
    found = (const char *)p >= (const char *)h->base && (const char *)p < (const char *)h->base + h->len;
  pthread_mutex_unlock(&pinned_lock);
  return found;
}

/* Each device stages in its own pinned pool (its buffers belong to the
 * device's context); see AB_OPENCL_PINNED above. */
static int32_t cl_staging_id(int32_t id) {
  if (pinned_mode == PINNED_NONE || (pinned_mode == PINNED_AUTO && devices[id].unified)) return -1;
  return id;
}

static int32_t pinned_count(void) { return pinned_mode == PINNED_NONE ? 0 : ndevices; }

static ab_status pinned_info(int32_t id, struct ab_device_info *out) {
  char name[sizeof out->name];
  AB_FORWARD(cl_info(id, out));
  snprintf(name, sizeof name, "%s", out->name);
  snprintf(out->name, sizeof out->name, "pinned host memory of opencl:%" PRId32 " (%.80s)", id, name);
  out->total_memory = out->free_memory = 0; /* host memory: not the device's */
  out->unified_memory = 1;
  return AB_OK;
}

/* The queue the ring's fences go on: the caller's stream when use_stream
 * takes it (our context, in order; the ring's transfers are then queued on
 * it too), else our queue. */
static ab_status fence_queue(int32_t id, void *stream, cl_command_queue *q) {
  cl_context ctx;
  AB_FORWARD(get_queue(id, &ctx, q));
  return stream != NULL ? use_stream(id, ctx, stream, q) : AB_OK;
}

/* A ring transfer: non-blocking when it goes on the queue the fences go
 * on; blocking otherwise (a buffer of another context), which completes
 * before the fence is recorded and so keeps the ring's promise. */
static ab_status async_xfer(int32_t id, cl_mem m, uint64_t offset, void *host, size_t bytes, void *stream, bool write) {
  cl_command_queue q, fq;
  bool tmp;
  AB_FORWARD(queue_for(id, m, stream, &q, &tmp));
  ab_status st = fence_queue(id, stream, &fq);
  cl_int e = CL_SUCCESS;
  if (st == AB_OK) {
    const cl_bool block = tmp || q != fq ? CL_TRUE : CL_FALSE;
    e = write ? clEnqueueWriteBuffer(q, m, block, (size_t)offset, bytes, host, 0, NULL, NULL)
              : clEnqueueReadBuffer(q, m, block, (size_t)offset, bytes, host, 0, NULL, NULL);
    if (e == CL_SUCCESS && !block) e = clFlush(q); /* started without a fence behind it (an early return) */
  }
  if (tmp) clReleaseCommandQueue(q);
  AB_FORWARD(st);
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, id, write ? "clEnqueueWriteBuffer (staged)" : "clEnqueueReadBuffer (staged)");
}

static ab_status cl_write_async(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  return async_xfer(id, (cl_mem)handle, offset, (void *)src, bytes, stream, true);
}

static ab_status cl_read_async(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  return async_xfer(id, (cl_mem)handle, offset, dst, bytes, stream, false);
}

/* A fence is the event of a marker: complete when everything queued
 * before it is. */
struct fence {
  cl_event ev; /* NULL until recorded */
};

static ab_status cl_fence_new(int32_t id, void **out) {
  struct fence *f = ab__malloc(sizeof *f);
  if (f == NULL) return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl:%" PRId32 ": no host memory for a fence", id);
  f->ev = NULL;
  *out = f;
  return AB_OK;
}

static ab_status cl_fence_record(int32_t id, void *fence, void *stream) {
  struct fence *f = fence;
  cl_command_queue q;
  AB_FORWARD(fence_queue(id, stream, &q));
  if (f->ev != NULL) clReleaseEvent(f->ev);
  f->ev = NULL;
  cl_int e = clEnqueueMarkerWithWaitList(q, 0, NULL, &f->ev);
  if (e != CL_SUCCESS) {
    f->ev = NULL;
    return fail_cl(e, id, "clEnqueueMarkerWithWaitList");
  }
  clFlush(q); /* start the queued transfers now, not at the first wait */
  return AB_OK;
}

static ab_status cl_fence_wait(void *fence) {
  struct fence *f = fence;
  cl_int status = CL_COMPLETE;
  if (f->ev == NULL) return AB_OK;
  cl_int e = clWaitForEvents(1, &f->ev);
  if (e == CL_SUCCESS || e == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    e = clGetEventInfo(f->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (e == CL_SUCCESS && status < 0) e = status; /* the transfers before the marker failed */
  return e == CL_SUCCESS ? AB_OK : fail_cl(e, -1, "waiting for a staged transfer");
}

static void cl_fence_free(void *fence) {
  struct fence *f = fence;
  if (f->ev != NULL) clReleaseEvent(f->ev);
  ab__free(f);
}

static void cl_stream_sync(int32_t id, void *stream) {
  cl_command_queue q;
  if (fence_queue(id, stream, &q) == AB_OK) clFinish(q);
}

const struct ab_backend ab__backend_opencl_host = {
  .device_type = AB_DEVICE_OPENCL_HOST,
  .name = "opencl",
  .caps = AB_CAP_HOST_ACCESSIBLE | AB_CAP_STAGING_ONLY,
  /* no init or shutdown: the OpenCL backend's, which runs before */
  .device_count = pinned_count,
  .device_info = pinned_info,
  .alloc = pinned_alloc,
  .free = pinned_free,
};

const struct ab_backend ab__backend_opencl = {
  .device_type = kDLOpenCL,
  .name = "opencl",
  .caps = 0,
  .staging = AB_DEVICE_OPENCL_HOST,
  .staging_id = cl_staging_id,
  .preload = ab__opencl_preload_icds,
  .init = cl_init,
  .shutdown = cl_shutdown,
  .device_count = cl_count,
  .device_caps = cl_device_caps,
  .device_info = cl_info,
  .alloc = cl_alloc,
  .free = cl_free,
  .copy = cl_copy,
  .can_copy = cl_can_copy,
  .write = cl_write,
  .read = cl_read,
  .read_rect = cl_read_rect,
  .write_rect = cl_write_rect,
  .check_range = cl_check_range,
  .synchronize = cl_synchronize,
  .can_convert = cl_can_convert,
  .convert = cl_convert,
  .write_async = cl_write_async,
  .read_async = cl_read_async,
  .fence_new = cl_fence_new,
  .fence_record = cl_fence_record,
  .fence_wait = cl_fence_wait,
  .fence_free = cl_fence_free,
  .host_is_staged = cl_host_is_staged,
  .stream_sync = cl_stream_sync,
};
