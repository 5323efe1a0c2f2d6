/* The OpenCL backend's kernels (converters/opencl/): the gathers behind
 * copies of strided buffers, and conversions on the device. */
#include "backends/opencl/opencl.h"

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

/* The gather's layout of source t, moved in units of its element size
 * where both ends allow it, else bytes: dst_offset is the destination's
 * byte offset (an ab_convert_into destination may sit at any byte), which
 * the kernel indexes in the same units. */
static bool kernel_layout(const DLTensor *t, uint64_t dst_offset, struct klayout *kl) {
  size_t es = ab__elsize(t->dtype), w = es;
  int64_t shape[AB_MAX_NDIM + 1], stride[AB_MAX_NDIM + 1];
  int n = 0;
  if (ab__width_index(es) < 0 || t->byte_offset % es != 0 || dst_offset % es != 0) w = 1;
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
  kl->k = ab__width_index(w);
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

/* For a failed build, "; the compiler said: ..." with the start of the
 * build log of dev (blanks for its line breaks and other control bytes),
 * else "": some drivers print nothing of their own, and the log is the
 * only clue to what their compiler refused. */
static void build_log(cl_program prog, cl_int e, cl_device_id dev, char *out, size_t len) {
  out[0] = '\0';
  if (prog == NULL || (e != CL_BUILD_PROGRAM_FAILURE && e != CL_INVALID_BUILD_OPTIONS)) return;
  size_t n = 0;
  if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || n == 0) return;
  char *all = malloc(n);
  if (all == NULL) return;
  if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, all, NULL) != CL_SUCCESS) {
    free(all);
    return;
  }
  all[n - 1] = '\0';
  char text[300];
  size_t k = 0;
  const char *c = all;
  for (; *c != '\0' && k + 1 < sizeof text; c++) /* printable bytes; each run of others one blank */
    if ((unsigned char)*c > ' ' && (unsigned char)*c < 0x7f) text[k++] = *c;
    else if (k > 0 && text[k - 1] != ' ') text[k++] = ' ';
  const bool cut = *c != '\0';
  free(all);
  while (k > 0 && text[k - 1] == ' ') k--;
  text[k] = '\0';
  if (k > 0) snprintf(out, len, "; the compiler said: %s%s", text, cut ? " ..." : "");
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
    char log[400];
    build_log(prog, e, ab__cl_devices[p->first].id, log, sizeof log);
    AB_LOG(AB_LOG_WARN, "OpenCL %s kernels unavailable (%s, %d): %s go through the host%s",
           which == 0 ? "gather" : "conversion", ab__cl_err_name(e), (int)e,
           which == 0 ? "strided copies" : "conversions", log);
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
 * strided one (up to 8 dims after merging) with the gather kernel, in
 * element units or, for a destination at an unaligned byte offset, in
 * bytes: both layouts must fit. */
bool ab__cl_can_copy(const DLTensor *from, DLDevice to, bool from_compact) {
  cl_context theirs = NULL;
  struct klayout kl;
  if (clGetMemObjectInfo((cl_mem)from->data, CL_MEM_CONTEXT, sizeof theirs, &theirs, NULL) != CL_SUCCESS)
    return false;
  struct platform *p = &ab__cl_platforms[ab__cl_devices[to.device_id].platform];
  pthread_mutex_lock(&ab__cl_lock);
  bool ok = p->ctx != NULL && theirs == p->ctx && (from_compact || (kernel_layout(from, 0, &kl) && kernel_layout(from, 1, &kl) && kernels_ready(p)));
  pthread_mutex_unlock(&ab__cl_lock);
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

/* One work item per element, in launches of at most MAX_ITEMS items:
 * past 2^31 and 2^32 items some drivers refuse a launch (AMD's:
 * CL_INVALID_GLOBAL_WORK_SIZE) or are reported to repeat or skip ids
 * (NVIDIA's), and PoCL, the only driver these kernels have run on, shows
 * neither. Each piece starts at its global offset: the kernels take
 * get_global_id (the offset included) as the element and stop at n. */
#define MAX_ITEMS ((cl_ulong)1 << 30)
static cl_int enqueue_items(cl_command_queue q, cl_kernel k, cl_ulong n) {
  cl_ulong most = MAX_ITEMS;
  int fail_piece = 0; /* none */
#ifdef AB_FAULT_INJECTION
  /* test_opencl cuts small launches into pieces, and fails the launch of
   * one of them (1 the first): test builds only */
  const char *test_most = ab__env_str("AB_TEST_OPENCL_MAX_ITEMS"), *fail = ab__env_str("AB_TEST_OPENCL_FAIL_PIECE");
  const cl_ulong m = test_most != NULL ? strtoull(test_most, NULL, 10) : 0;
  if (m > 0) most = m;
  if (fail != NULL) fail_piece = atoi(fail);
#endif
  cl_int e = CL_SUCCESS;
  cl_ulong at = 0; /* items whose pieces started */
  for (int piece = 1; at < n; piece++) {
    const size_t offset = (size_t)at, global = (size_t)(n - at < most ? n - at : most);
    e = piece == fail_piece ? CL_OUT_OF_RESOURCES
                            : clEnqueueNDRangeKernel(q, k, 1, &offset, &global, NULL, 0, NULL, NULL);
    if (e != CL_SUCCESS) break;
    at += global;
  }
  /* A piece that did not start leaves those before it running on buffers
   * the caller is about to give back: wait for them (done_or_started is
   * not called after a failure). */
  if (e != CL_SUCCESS && at > 0) clFinish(q);
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
  struct platform *p = &ab__cl_platforms[ab__cl_devices[id].platform];
  if (!kernel_layout(from, to->byte_offset, &kl))
    return AB_FAIL(AB_ERR_INTERNAL, "opencl:%" PRId32 ": gather asked for a layout the kernel cannot take", id);
  size_t w = (size_t)1 << kl.k; /* kernels 0..4 move 1, 2, 4, 8, 16 bytes */
  cl_ulong src_off = kl.offset, dst_off = to->byte_offset / w, n = kl.count;
  cl_int ndim = kl.n;
  cl_mem src = (cl_mem)from->data, dst = (cl_mem)to->data;
  cl_int e;
  /* Arguments are captured at enqueue: the lock keeps two threads from
   * interleaving their clSetKernelArg calls on the shared kernel. */
  pthread_mutex_lock(&ab__cl_lock);
  if (!kernels_ready(p)) {
    pthread_mutex_unlock(&ab__cl_lock);
    return AB_FAIL(AB_ERR_BACKEND, "opencl:%" PRId32 ": the gather kernels could not be built", id);
  }
  cl_kernel k = p->kernel[kl.k];
  e = set_layout_args(k, src, src_off, dst, dst_off, ndim, &kl.shape, &kl.stride, n);
  if (e == CL_SUCCESS) e = enqueue_items(q, k, n);
  pthread_mutex_unlock(&ab__cl_lock);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "the gather kernel");
}

ab_status ab__cl_copy(const DLTensor *from, DLTensor *to, void *stream, bool async) {
  cl_context ctx;
  cl_command_queue q;
  int32_t id = to->device.device_id;
  AB_FORWARD(ab__cl_get_queue(id, &ctx, &q));
  if (stream != NULL) AB_FORWARD(ab__cl_use_stream(id, ctx, stream, &q));
  if (!ab__is_compact(from)) return gather(id, from, to, q, stream, async);
  const size_t bytes = ab__elsize(from->dtype) * (size_t)ab__numel(from);
  cl_int e = clEnqueueCopyBuffer(q, (cl_mem)from->data, (cl_mem)to->data, (size_t)from->byte_offset,
                                 (size_t)to->byte_offset, bytes, 0, NULL, NULL);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "clEnqueueCopyBuffer");
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
 * of one result type: AB_CL_SOURCES's order in kernels.def), -1 when
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
  return clGetDeviceInfo(ab__cl_devices[id].id, which, sizeof fp, &fp, NULL) == CL_SUCCESS &&
         (fp & (CL_FP_ROUND_TO_NEAREST | CL_FP_DENORM)) == (CL_FP_ROUND_TO_NEAREST | CL_FP_DENORM);
}

bool ab__cl_can_convert(int32_t id, const void *src, uint64_t src_offset, const ab__convert_args *args) {
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
  const bool have_ctx = ab__cl_get_queue(id, &ctx, &q) == AB_OK;
  ab__restore_error(saved);
  if (!have_ctx) return false;
  struct platform *p = &ab__cl_platforms[ab__cl_devices[id].platform];
  if (src != NULL && theirs != ctx) return false;
  pthread_mutex_lock(&ab__cl_lock);
  const bool ok = program_ready(p, 1) && p->kernel[kc.k] != NULL;
  pthread_mutex_unlock(&ab__cl_lock);
  return ok;
}

ab_status ab__cl_convert(int32_t id, const void *src, uint64_t src_offset, void *dst, uint64_t dst_offset,
                            const ab__convert_args *args, void *stream, bool async) {
  struct kconv kc;
  cl_context ctx;
  cl_command_queue q;
  const size_t es = ab__elsize(args->op.from), os = ab__elsize(args->op.to);
  if (!conv_layout(args, &kc) || src_offset % es != 0 || dst_offset % os != 0)
    return AB_FAIL(AB_ERR_INTERNAL, "opencl:%" PRId32 ": convert asked for a conversion the kernels cannot take", id);
  AB_FORWARD(ab__cl_get_queue(id, &ctx, &q));
  if (stream != NULL) AB_FORWARD(ab__cl_use_stream(id, ctx, stream, &q));
  cl_ulong n = 1, src_off = src_offset / es, dst_off = dst_offset / os;
  for (int32_t i = 0; i < args->ndim; i++) n *= (cl_ulong)args->shape[i];
  if (n == 0) return AB_OK;
  cl_mem s = (cl_mem)src, d = (cl_mem)dst;
  cl_int ndim = kc.n, mode = kc.mode, chan = kc.chan;
  struct platform *p = &ab__cl_platforms[ab__cl_devices[id].platform];
  cl_int e;
  /* As for the gathers: the lock keeps two threads' arguments apart. */
  pthread_mutex_lock(&ab__cl_lock);
  if (!program_ready(p, 1) || p->kernel[kc.k] == NULL) {
    pthread_mutex_unlock(&ab__cl_lock);
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
  if (e == CL_SUCCESS) e = enqueue_items(q, k, n);
  pthread_mutex_unlock(&ab__cl_lock);
  if (e == CL_SUCCESS) e = done_or_started(q, stream, async);
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "the conversion kernel");
}
