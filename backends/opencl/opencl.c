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
 * ab_shutdown. A transfer is complete when the call returns, except the
 * work AB_CONVERT_ASYNC leaves queued on the caller's queue (backend.h,
 * "Early return").
 *
 * The backend is four files: this one (platforms, devices, contexts and
 * queues, the two tables), transfers.c, kernels.c (the gather and
 * conversion kernels of converters/opencl/) and pinned.c.
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
#include "backends/opencl/opencl.h"

pthread_mutex_t ab__cl_lock = PTHREAD_MUTEX_INITIALIZER;
struct platform ab__cl_platforms[MAX_PLATFORMS];
struct device ab__cl_devices[MAX_DEVICES];
int ab__cl_nplatforms, ab__cl_ndevices;
enum ab__cl_pinned_mode ab__cl_pinned_mode;

const char *ab__cl_err_name(cl_int e) {
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
  case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
  case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
  case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
  case CL_INVALID_PROGRAM: return "CL_INVALID_PROGRAM";
  case CL_INVALID_PROGRAM_EXECUTABLE: return "CL_INVALID_PROGRAM_EXECUTABLE";
  case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
  case CL_INVALID_KERNEL: return "CL_INVALID_KERNEL";
  case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
  case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
  case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
  case CL_INVALID_WORK_DIMENSION: return "CL_INVALID_WORK_DIMENSION";
  case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
  case CL_INVALID_GLOBAL_OFFSET: return "CL_INVALID_GLOBAL_OFFSET";
  case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
  case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL driver installed)";
  default: return "unknown OpenCL error";
  }
}

bool ab__cl_is_oom(cl_int e) {
  return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY;
}

/* Turns an OpenCL error into a status with the native code in the message.
 * A device that ran out of memory anywhere but in clCreateBuffer (whose
 * failure the pool's OOM sequence handles) ran out at a buffer's first
 * use: noted for the conversion's retry (pool.h). */
ab_status ab__cl_fail_cl(cl_int e, int32_t id, const char *call) {
  const ab_status st = AB_FAIL(ab__cl_is_oom(e) ? AB_ERR_OUT_OF_MEMORY : AB_ERR_BACKEND,
                               "opencl:%" PRId32 ": %s failed: %s (%d)", id, call, ab__cl_err_name(e), (int)e);
  if ((e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES) && id >= 0 &&
      strcmp(call, "clCreateBuffer") != 0)
    ab__note_first_use_oom((DLDevice){kDLOpenCL, id}); /* after the failure: it forgets notes */
  return st;
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
  else {
    char q[AB__QUOTED]; /* the caller's text, cut and made printable */
    ab__quote(v, q, sizeof q);
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "AB_OPENCL_DEVICE_TYPE=\"%s\" is not one of all, gpu, cpu, accelerator", q);
  }
  return AB_OK;
}

static enum ab__cl_pinned_mode read_pinned_mode(void) {
  static const struct ab__env_choice modes[] = {{"auto", PINNED_AUTO}, {"1", PINNED_ALL}, {"on", PINNED_ALL},
                                                {"0", PINNED_NONE},   {"off", PINNED_NONE}, {NULL, 0}};
  return (enum ab__cl_pinned_mode)ab__env_choice("AB_OPENCL_PINNED", modes, PINNED_AUTO, "auto, 1 (on) or 0 (off)");
}

static ab_status cl_init(void) {
  cl_platform_id ids[MAX_PLATFORMS];
  cl_uint n = 0;
  cl_device_type type = CL_DEVICE_TYPE_ALL;
  const char *want = ab__env_str("AB_OPENCL_PLATFORM");

  ab__cl_nplatforms = ab__cl_ndevices = 0;
  ab__cl_pinned_mode = read_pinned_mode();
  AB_FORWARD(device_type_filter(&type));
  ab__opencl_preload_icds(); /* before the ICD loader opens any driver */
  AB_FORWARD(ab__opencl_preload_check());
  AB_FORWARD(ab__cl_load());
  cl_int e = clGetPlatformIDs(MAX_PLATFORMS, ids, &n);
  if (e != CL_SUCCESS || n == 0)
    return AB_FAIL(AB_ERR_NO_DEVICE, "no OpenCL platform: clGetPlatformIDs gave %s (%d), %u platforms", ab__cl_err_name(e),
                   (int)e, (unsigned)n);
  if (n > MAX_PLATFORMS) n = MAX_PLATFORMS;
  for (cl_uint p = 0; p < n; p++) {
    char name[256] = "";
    clGetPlatformInfo(ids[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (want != NULL && !contains_nocase(name, want)) continue;
    cl_device_id devs[MAX_DEVICES];
    cl_uint nd = 0;
    if (clGetDeviceIDs(ids[p], type, MAX_DEVICES, devs, &nd) != CL_SUCCESS || nd == 0) continue;
    struct platform *pl = &ab__cl_platforms[ab__cl_nplatforms];
    pl->id = ids[p];
    pl->ctx = NULL;
    pl->first = ab__cl_ndevices;
    pl->count = 0;
    pl->prog[0] = pl->prog[1] = NULL;
    pl->prog_failed[0] = pl->prog_failed[1] = false;
    for (int k = 0; k < NKERNELS; k++) pl->kernel[k] = NULL;
    if (nd > (cl_uint)(MAX_DEVICES - ab__cl_ndevices))
      AB_LOG(AB_LOG_WARN, "OpenCL platform \"%s\" has %u devices; arraybridge takes %d of them (it uses %d in all)", name,
             (unsigned)nd, MAX_DEVICES - ab__cl_ndevices, MAX_DEVICES);
    for (cl_uint d = 0; d < nd && ab__cl_ndevices < MAX_DEVICES; d++) {
      cl_bool unified = CL_FALSE;
      clGetDeviceInfo(devs[d], CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
      ab__cl_devices[ab__cl_ndevices] = (struct device){devs[d], ab__cl_nplatforms, NULL, unified == CL_TRUE};
      ab__cl_ndevices++;
      pl->count++;
    }
    ab__cl_nplatforms++;
  }
  if (ab__cl_ndevices == 0) {
    const char *type_env = ab__env_str("AB_OPENCL_DEVICE_TYPE");
    char qp[AB__QUOTED], qt[AB__QUOTED];
    ab__quote(want ? want : "(unset)", qp, sizeof qp);
    ab__quote(type_env ? type_env : "(unset)", qt, sizeof qt);
    return AB_FAIL(AB_ERR_NO_DEVICE, "%u OpenCL platform%s but no device matched (AB_OPENCL_PLATFORM=%s, AB_OPENCL_DEVICE_TYPE=%s)",
                   (unsigned)n, n == 1 ? "" : "s", qp, qt);
  }
  return AB_OK;
}

static void cl_shutdown(void) {
  pthread_mutex_lock(&ab__cl_lock);
  for (int p = 0; p < ab__cl_nplatforms; p++) {
    for (int k = 0; k < NKERNELS; k++)
      if (ab__cl_platforms[p].kernel[k]) clReleaseKernel(ab__cl_platforms[p].kernel[k]);
    for (int w = 0; w < 2; w++)
      if (ab__cl_platforms[p].prog[w]) clReleaseProgram(ab__cl_platforms[p].prog[w]);
  }
  for (int i = 0; i < ab__cl_ndevices; i++)
    if (ab__cl_devices[i].queue) clReleaseCommandQueue(ab__cl_devices[i].queue);
  for (int p = 0; p < ab__cl_nplatforms; p++)
    if (ab__cl_platforms[p].ctx) clReleaseContext(ab__cl_platforms[p].ctx);
  ab__cl_nplatforms = ab__cl_ndevices = 0;
  pthread_mutex_unlock(&ab__cl_lock);
}

static int32_t cl_count(void) { return ab__cl_ndevices; }

static uint32_t cl_device_caps(int32_t id) { return ab__cl_devices[id].unified ? AB_CAP_UNIFIED_MEMORY : 0; }

/* The context and queue of a device, created on first use. */
ab_status ab__cl_get_queue(int32_t id, cl_context *ctx, cl_command_queue *q) {
  cl_int e = CL_SUCCESS;
  struct device *d = &ab__cl_devices[id];
  struct platform *p = &ab__cl_platforms[d->platform];
  pthread_mutex_lock(&ab__cl_lock);
  if (p->ctx == NULL) {
    cl_device_id ids[MAX_DEVICES];
    for (int i = 0; i < p->count; i++) ids[i] = ab__cl_devices[p->first + i].id;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p->id, 0};
    /* threads a driver starts for its context leave the program's
     * signals to it (src/lifetime.c, "signals") */
    sigset_t mask;
    ab__block_async_signals(&mask);
    p->ctx = clCreateContext(props, (cl_uint)p->count, ids, NULL, NULL, &e);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    if (e != CL_SUCCESS) p->ctx = NULL;
  }
  if (e == CL_SUCCESS && d->queue == NULL) {
    d->queue = clCreateCommandQueue(p->ctx, d->id, 0, &e);
    if (e != CL_SUCCESS) d->queue = NULL;
  }
  *ctx = p->ctx;
  *q = d->queue;
  pthread_mutex_unlock(&ab__cl_lock);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, p->ctx ? "clCreateCommandQueue" : "clCreateContext");
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

ab_status ab__cl_info(int32_t id, struct ab_device_info *out) {
  cl_device_id d = ab__cl_devices[id].id;
  char name[128], vendor[64], version[64], driver[48];
  cl_ulong global = 0;
  cl_bool unified = CL_FALSE;
  info_str(d, CL_DEVICE_NAME, name, sizeof name);
  info_str(d, CL_DEVICE_VENDOR, vendor, sizeof vendor);
  info_str(d, CL_DEVICE_VERSION, version, sizeof version);
  info_str(d, CL_DRIVER_VERSION, driver, sizeof driver);
  /* "OpenCL <major.minor>" (the rest of CL_DEVICE_VERSION is the
   * vendor's, and PoCL's runs past the field), then the driver's version:
   * "OpenCL 3.0, driver 3.1+debian". */
  if (strncmp(version, "OpenCL ", 7) == 0) {
    const size_t at = 7 + strcspn(version + 7, " ");
    char kept[16];
    snprintf(kept, sizeof kept, "%.*s", (int)(at < sizeof kept ? at : sizeof kept - 1), version);
    char joined[sizeof kept + sizeof driver + 16];
    snprintf(joined, sizeof joined, "%s, driver %s", kept, driver);
    snprintf(version, sizeof version, "%.*s", (int)sizeof version - 1, joined);
  }
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

extern const struct ab_backend ab__backend_opencl;

const struct ab_backend ab__backend_opencl_host = {
  .device_type = AB_DEVICE_OPENCL_HOST,
  .name = "opencl",
  .caps = AB_CAP_HOST_ACCESSIBLE | AB_CAP_STAGING_ONLY,
  .family = &ab__backend_opencl,
  .type_name = "opencl_host",
  /* no init or shutdown: the OpenCL backend's, which runs before */
  .device_count = ab__cl_pinned_count,
  .device_info = ab__cl_pinned_info,
  .alloc = ab__cl_pinned_alloc,
  .free = ab__cl_pinned_free,
};

const struct ab_backend ab__backend_opencl = {
  .device_type = kDLOpenCL,
  .name = "opencl",
  .caps = 0,
  .staging = AB_DEVICE_OPENCL_HOST,
  .staging_id = ab__cl_staging_id,
  .preload = ab__opencl_preload_icds,
  .init = cl_init,
  .shutdown = cl_shutdown,
  .device_count = cl_count,
  .device_caps = cl_device_caps,
  .device_info = ab__cl_info,
  .alloc = ab__cl_alloc,
  .free = ab__cl_free,
  .copy = ab__cl_copy,
  .can_copy = ab__cl_can_copy,
  .write = ab__cl_write,
  .read = ab__cl_read,
  .read_rect = ab__cl_read_rect,
  .write_rect = ab__cl_write_rect,
  .check_range = ab__cl_check_range,
  .root = ab__cl_root,
  .synchronize = ab__cl_synchronize,
  .can_convert = ab__cl_can_convert,
  .convert = ab__cl_convert,
  .write_async = ab__cl_write_async,
  .read_async = ab__cl_read_async,
  .fence_new = ab__cl_fence_new,
  .fence_record = ab__cl_fence_record,
  .fence_wait = ab__cl_fence_wait,
  .fence_free = ab__cl_fence_free,
  .host_is_staged = ab__cl_host_is_staged,
  .stream_sync = ab__cl_stream_sync,
};
