/* ab_convert_memory and ab_convert_into: read the options, validate,
 * plan (ab__prepare), allocate, run the plan (steps.c), export. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "plan.h"

const char *ab_version_string(void) { return AB_VERSION_STRING; }
unsigned ab_version_number(void) { return AB_VERSION_NUMBER; }

/* The size of ab_convert_opts as version 0.1 defined it: what size == 0
 * stands for. Fields appended later are read only when size covers them. */
#define OPTS_V0_1_SIZE (offsetof(ab_convert_opts, stream) + sizeof(void *))
/* The size before `threads` was appended (the maps' layout). */
#define OPTS_MAPS_SIZE (offsetof(ab_convert_opts, channel_offset) + sizeof(const double *))

enum { AB_OPTS_MAX_SIZE = 4096 };

static ab_status read_opts(const ab_convert_opts *in, ab_convert_opts *o) {
  if (in == NULL) {
    memset(o, 0, sizeof *o);
    return AB_OK;
  }
  size_t size = in->size == 0 ? OPTS_V0_1_SIZE : in->size;
  /* The size of a version's struct, or more (a newer header): a size in
   * between would cut a field in two. */
  if (size != OPTS_V0_1_SIZE && size != OPTS_MAPS_SIZE && size < sizeof *o)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opts->size is %" PRIu32 "; must be 0, %zu (version 0.1), %zu (before `threads`) or >= %zu "
                   "(sizeof(ab_convert_opts))",
                   in->size, OPTS_V0_1_SIZE, OPTS_MAPS_SIZE, sizeof *o);
  /* No version's struct will reach 4 KiB: a larger size is garbage (an
   * uninitialised struct), not a newer header, and reading that far past
   * the caller's struct could fault. */
  if (size > AB_OPTS_MAX_SIZE)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opts->size is %" PRIu32 ", larger than any ab_convert_opts can be (%d); was the struct initialised "
                   "(AB_CONVERT_OPTS_INIT)?", in->size, AB_OPTS_MAX_SIZE);
  if (size > sizeof *o) {
    /* A caller built against a newer header: fine as long as it left every
     * field this version does not know at zero (the default). */
    const unsigned char *tail = (const unsigned char *)in + sizeof *o;
    for (size_t i = 0; i < size - sizeof *o; i++)
      if (tail[i] != 0)
        return AB_FAIL(AB_ERR_UNSUPPORTED,
                       "opts sets a field at byte %zu that this arraybridge (%s) does not know",
                       sizeof *o + i, AB_VERSION_STRING);
    size = sizeof *o;
  }
  if (size == sizeof *o) {
    /* The usual case (AB_CONVERT_OPTS_INIT, or a newer header's): a plain
     * struct copy. A memset and a memcpy of a variable size compile to
     * `rep movs`, whose start-up and failed store forwarding to the reads
     * that follow cost ~7% of a small conversion (perf). */
    *o = *in;
  } else {
    memset(o, 0, sizeof *o);
    memcpy(o, in, size);
  }
  if ((unsigned)o->copy > AB_COPY_NEVER)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opts->copy is %d; must be AB_COPY_IF_NEEDED (0), AB_COPY_ALWAYS (1) or AB_COPY_NEVER (2)",
                   (int)o->copy);
  if (o->flags & ~AB_CONVERT_KNOWN_FLAGS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opts->flags has unknown bits 0x%" PRIx32,
                   o->flags & ~AB_CONVERT_KNOWN_FLAGS);
  /* The maps' numbers sit past the 0.1 fields: with size 0 they would be
   * read as 0 (AB_CONVERT_AFFINE would scale every element to 0). */
  if (size == OPTS_V0_1_SIZE && (o->flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opts->flags asks for %s but opts->size is %" PRIu32
                   " (the version 0.1 layout, without the map's fields): set size = sizeof(ab_convert_opts), as "
                   "AB_CONVERT_OPTS_INIT does",
                   (o->flags & AB_CONVERT_AFFINE) ? "AB_CONVERT_AFFINE" : "AB_CONVERT_PER_CHANNEL", in->size);
  if (o->dtype.bits != 0) {
    size_t es;
    AB_FORWARD(ab__check_dtype(o->dtype, "opts->dtype", &es));
  }
  return AB_OK;
}

static bool dtype_eq(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static ab_status export_view(const DLTensor *src, const ab__layout *lay, DLDevice dev,
                             struct ab__tensor **out) {
  struct ab__tensor *t;
  AB_FORWARD(ab__tensor_new(dev, src->ndim, src->shape, src->dtype, &t));
  t->mt.dl_tensor.data = src->data;
  t->mt.dl_tensor.byte_offset = src->byte_offset;
  /* A compact source gets canonical strides (the same bytes); a strided
   * view keeps the source's own. */
  if (!lay->compact && src->ndim > 0)
    memcpy(t->mt.dl_tensor.strides, src->strides, (size_t)src->ndim * sizeof(int64_t));
  *out = t;
  return AB_OK;
}

/* The bytes a tensor's strides address, from the lowest to the highest
 * (0 for no elements); validated, so no overflow. */
static uint64_t extent_of(const ab__layout *lay) {
  return lay->numel > 0 ? (uint64_t)(lay->max_off - lay->min_off) + lay->elsize : 0;
}

/* Whether t's strides address bytes below data (byte_offset plus the
 * lowest offset negative); *begin is that sum where it is not. */
static bool below_data(const DLTensor *t, const ab__layout *lay, int64_t *begin) {
  return __builtin_add_overflow((int64_t)t->byte_offset, lay->min_off, begin) || *begin < 0;
}

/* A tensor in memory host code cannot address (an OpenCL buffer) must keep
 * its addressed bytes inside its buffer, which only the backend can see. */
static ab_status check_range_in(const DLTensor *src, const char *what, const ab__layout *lay,
                                const struct ab_backend *be, DLDevice dev) {
  int64_t begin;
  if (lay->numel == 0) return AB_OK;
  const bool below = below_data(src, lay, &begin);
  const uint64_t extent = extent_of(lay);
  /* The lowest addressed byte, where data is an address. */
  const uintptr_t first = (uintptr_t)src->data + (uintptr_t)src->byte_offset + (uintptr_t)lay->min_off;
  if (be->caps & AB_CAP_HOST_ACCESSIBLE) {
    /* A pointer, which strides may address below (no buffer start to
     * pass): the backend checks the addressed bytes' first and last, where
     * it can tell (CUDA's pinned and managed spaces: device memory
     * labelled as them would be read by host code, and fault). */
    if (be->check_range == NULL) return AB_OK;
    return ab__dev_check_range(be, dev.device_id, (const void *)first, 0, extent);
  }
  if (below && (be->caps & AB_CAP_ADDRESSED)) {
    /* An address (CuPy's reversed view: element 0's, the rest below it):
     * the backend checks the bytes from the lowest addressed one. */
    const ab_status st = ab__dev_check_range(be, dev.device_id, (const void *)first, 0, extent);
    if (st != AB_ERR_INVALID_ARGUMENT) return st;
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    /* Element 0 in the device's memory and the lowest addressed byte not:
     * strides that leave the allocation below it, said so (the backend's
     * words would be about an address the caller never gave). Where the
     * lowest byte is fine, the backend said what is wrong (the range runs
     * past the allocation's end). */
    const void *elem0 = (const void *)((uintptr_t)src->data + (uintptr_t)src->byte_offset);
    if (ab__dev_check_range(be, dev.device_id, (const void *)first, 0, 1) == AB_OK) return AB_FAIL(st, "%s", saved);
    if (ab__dev_check_range(be, dev.device_id, elem0, 0, lay->elsize) == AB_OK)
      return AB_FAIL(st,
                     "%s: element 0 (data + byte_offset, %p) is %s:%" PRId32 " memory, but the strides address from "
                     "%" PRIu64 " bytes below it, outside its allocation",
                     what, elem0, ab_device_type_name(dev.device_type), dev.device_id, (uint64_t)-lay->min_off);
    return AB_FAIL(st, "%s (%s's strides address from %" PRIu64 " bytes below data + byte_offset)", saved, what,
                   (uint64_t)-lay->min_off);
  }
  if (below)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "%s addresses bytes before the start of its buffer (byte_offset %" PRIu64 ", extent from %" PRId64 ")",
                   what, src->byte_offset, lay->min_off);
  return ab__dev_check_range(be, dev.device_id, src->data, (uint64_t)begin, (uint64_t)begin + extent);
}

/* src as the copies take it (a buffer and non-negative offsets into it):
 * src itself, or, where its strides address below data + byte_offset in
 * memory that is an address (AB_CAP_ADDRESSED: CuPy's reversed views),
 * the same elements described from the lowest addressed byte, in *tmp.
 * After check_request. */
static const DLTensor *from_lowest(const DLTensor *src, const ab__prepared *p, DLTensor *tmp) {
  int64_t begin;
  if (!(p->sbe->caps & AB_CAP_ADDRESSED) || p->lay.numel == 0 || !below_data(src, &p->lay, &begin)) return src;
  *tmp = *src;
  tmp->data = (void *)((uintptr_t)src->data + (uintptr_t)src->byte_offset + (uintptr_t)p->lay.min_off);
  tmp->byte_offset = (uint64_t)-p->lay.min_off;
  return tmp;
}

/* The backend's range check (its message says which bytes, not which
 * argument), its refusals prefixed with the argument it refused. */
static ab_status check_handle_range(const DLTensor *src, const char *what, const ab__layout *lay,
                                    const struct ab_backend *be, DLDevice dev) {
  const ab_status st = check_range_in(src, what, lay, be, dev);
  if (st != AB_ERR_INVALID_ARGUMENT || strncmp(ab_last_error(), what, strlen(what)) == 0) return st;
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  return AB_FAIL(st, "%s: %s", what, saved);
}

/* The conversion opts ask for, checked against the source. */
static ab_status read_conversion(const DLTensor *src, const ab__layout *lay, const ab_convert_opts *o, ab__conv *cv) {
  char a[48], b[48];
  const bool affine = (o->flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)) != 0;
  if (!affine && o->permute == NULL && (o->dtype.bits == 0 || dtype_eq(o->dtype, src->dtype))) {
    /* Nothing to convert (most calls): the result's shape, dtype and size
     * are the source's, already checked; the rest of cv is read only for
     * an active conversion. */
    cv->active = false;
    cv->ndim = src->ndim;
    cv->out_dtype = src->dtype;
    cv->out_nbytes = lay->nbytes;
    cv->op.channel_dim = -1;
    return AB_OK;
  }
  memset(cv, 0, sizeof *cv);
  cv->out_dtype = o->dtype.bits == 0 ? src->dtype : o->dtype;
  bool reorder = false;
  if (o->permute != NULL) {
    bool seen[AB_MAX_NDIM] = {false};
    for (int32_t i = 0; i < src->ndim; i++) {
      int32_t p = o->permute[i];
      if (p < 0 || p >= src->ndim || seen[p])
        return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                       "permute[%" PRId32 "] is %" PRId32 "; want each of 0..%" PRId32 " exactly once", i, p,
                       src->ndim - 1);
      seen[p] = true;
      reorder |= p != i; /* the result has the permuted shape, even when only size-1 dims move */
    }
  }
  cv->ndim = src->ndim;
  for (int32_t i = 0; i < src->ndim; i++) cv->perm[i] = o->permute ? o->permute[i] : i;
  cv->op.channel_dim = -1;
  if (o->flags & AB_CONVERT_PER_CHANNEL) {
    if (o->channel_axis < 0 || o->channel_axis >= src->ndim)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opts->channel_axis is %" PRId32 "; src has %" PRId32 " dims",
                     o->channel_axis, src->ndim);
    cv->op.channel_dim = o->channel_axis;
    cv->op.channel_scale = o->channel_scale;
    cv->op.channel_offset = o->channel_offset;
  }
  if (!dtype_eq(cv->out_dtype, src->dtype) || affine || reorder) {
    if (!ab__cast_supported(src->dtype, cv->out_dtype, affine))
      return AB_FAIL(AB_ERR_UNSUPPORTED, "cannot convert %s to %s%s", ab_dtype_name(src->dtype, a, sizeof a),
                     ab_dtype_name(cv->out_dtype, b, sizeof b),
                     affine ? " with scale/offset" : "");
    cv->active = true;
  }
  for (int32_t i = 0; i < src->ndim; i++) cv->out_shape[i] = src->shape[cv->perm[i]];
  ab__layout out;
  AB_FORWARD(ab__check_shape(src->ndim, cv->out_shape, cv->out_dtype, "result", &out));
  (void)lay;
  cv->out_nbytes = out.nbytes;
  cv->op.from = src->dtype;
  cv->op.to = cv->out_dtype;
  cv->op.affine = affine;
  cv->op.scale = o->scale;
  cv->op.offset = o->offset;
  return AB_OK;
}

/* Where conversions run when the route leaves a choice: AB_CONVERT_PLACE
 * (auto, host, device), read again after ab__env_reload (tests). */
static ab__env_cache place_cache;

static ab__place convert_place(void) {
  static const struct ab__env_choice places[] = {
    {"auto", AB_PLACE_AUTO}, {"host", AB_PLACE_HOST}, {"device", AB_PLACE_DEVICE}, {NULL, 0}};
  return (ab__place)ab__env_choice_cached(&place_cache, "AB_CONVERT_PLACE", places, AB_PLACE_AUTO,
                                          "auto, host or device", NULL);
}

/* The request's checks: the options, the source, both devices and the
 * conversion asked for (p's o, lay, devices, backends and cv). */
static ab_status check_request(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, ab__prepared *p) {
  AB_FORWARD(read_opts(opts, &p->o));
  AB_FORWARD(ab__check_tensor(src, "src", &p->lay));
  AB_FORWARD(ab__check_tensor_device(src->device, "src device", false, &p->sdev, &p->sbe));
  AB_FORWARD(ab__check_tensor_device(target, "target device", true, &p->tdev, &p->tbe));
  AB_FORWARD(check_handle_range(src, "src", &p->lay, p->sbe, p->sdev));
  return read_conversion(src, &p->lay, &p->o, &p->cv);
}

/* The route of a checked request (the rest of p). */
static ab_status plan_request(const DLTensor *src, const DLTensor *into, ab__prepared *p) {
  const ab__layout *lay = &p->lay;
  const struct ab_backend *sbe = p->sbe, *tbe = p->tbe;
  p->q = (ab__route_query){
    .src = p->sdev,
    .dst = p->tdev,
    .src_caps = ab__dev_caps(sbe, p->sdev.device_id),
    .dst_caps = ab__dev_caps(tbe, p->tdev.device_id),
    .same_dtype = p->o.dtype.bits == 0 || dtype_eq(p->o.dtype, src->dtype),
    .convert = p->cv.active,
    .src_compact = lay->compact,
    .copy = p->o.copy,
    .flags = p->o.flags,
    .nbytes = lay->nbytes,
    .extent = extent_of(lay),
    .out_nbytes = p->cv.active ? p->cv.out_nbytes : lay->nbytes,
  };
  /* A view asks the backends nothing more. */
  if (into == NULL && ab__route_is_view(&p->q)) return ab__plan_route(&p->q, &p->plan);
  /* A destination the target's backend cannot use in its own copies and
   * kernels (an OpenCL buffer of another context) takes its bytes through
   * host memory, written by a plain transfer. */
  const bool into_ok = into == NULL || (tbe->caps & AB_CAP_HOST_ACCESSIBLE) || ab__dev_can_copy(tbe, into, p->tdev, true);
  /* An empty tensor moves nothing, and its data need not be a buffer the
   * backend could inspect. */
  p->q.direct = into_ok && sbe == tbe && (lay->numel == 0 || ab__dev_can_copy(sbe, src, p->tdev, lay->compact));
  p->q.src_rect = !lay->compact && lay->numel > 0 && ab__dev_has_read_rect(sbe) && ab__rect_of(src, lay->elsize, &p->rect);
  p->q.dst_rect = !lay->compact && lay->numel > 0 && (sbe->caps & AB_CAP_HOST_ACCESSIBLE) && ab__dev_has_write_rect(tbe) &&
                  ab__rect_of(src, lay->elsize, &p->rect);
  /* The device kernels store whole elements: a destination whose start is
   * not a multiple of the result's element size (DLPack allows any
   * byte_offset) has its conversion on the host. On CUDA a misaligned
   * store is cudaErrorMisalignedAddress, which ends all CUDA work in the
   * process; OpenCL refused the step. */
  const size_t out_es = p->cv.active ? ab__elsize(p->cv.out_dtype) : 0;
  const bool into_aligned =
    into == NULL || out_es == 0 || ((uintptr_t)into->data + into->byte_offset) % out_es == 0;
  p->q.place = convert_place();
  /* Asking whether a device can convert may build its kernels: only when
   * the planner would use the answer. */
  if (into_aligned && p->cv.active && lay->numel > 0 && ab__route_converts_on_source(&p->q)) {
    ab__convert_args a;
    ab__conv_args(src, &p->cv, &a);
    p->q.src_convert = ab__dev_can_convert(sbe, p->sdev.device_id, src->data, src->byte_offset, &a);
  }
  if (into_ok && into_aligned && p->cv.active && lay->numel > 0 && ab__route_converts_on_target(&p->q)) {
    DLTensor compact = *src;
    compact.strides = NULL;
    ab__convert_args a;
    ab__conv_args(&compact, &p->cv, &a);
    p->q.dst_convert = ab__dev_can_convert(tbe, p->tdev.device_id, NULL, 0, &a); /* the upload's buffer */
  }
  /* Asking a backend whether it can gather may build its kernels: ask only
   * when the plan could use a gather (strided, no rectangle, sparse). */
  if (!lay->compact && lay->numel > 0 && !p->q.src_rect && !(sbe->caps & AB_CAP_HOST_ACCESSIBLE) &&
      p->q.extent > p->q.nbytes)
    p->q.src_gather = ab__dev_can_copy(sbe, src, p->sdev, false);
  return ab__plan_route(&p->q, &p->plan);
}

/* into: the existing destination of ab_convert_into, else NULL. */
ab_status ab__prepare(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, const DLTensor *into,
                      ab__prepared *p) {
  DLTensor tmp;
  AB_FORWARD(check_request(src, target, opts, p));
  return plan_request(from_lowest(src, p, &tmp), into, p);
}

/* The commonest copy (issue 18: a 4 KiB one cost 2.5x malloc + memcpy +
 * free, a third of it planning): compact bytes from host memory into new
 * host memory, nothing converted, too few for a second thread (fewer than
 * twice AB_PARALLEL_MIN: ab__host_run). Its plan
 * would be one host copy; it is made here without one. */
static bool plain_host_copy(const ab__prepared *p) {
  return p->sbe == p->tbe && p->sbe->device_type == kDLCPU && !p->cv.active && p->lay.compact &&
         p->o.copy == AB_COPY_ALWAYS && p->lay.nbytes / 2 < ab__parallel_min();
}

/* A new tensor on p's target holding the result of p's plan (or, for a
 * plain host copy, of one memcpy). */
static ab_status copy_to_new(const DLTensor *src, const ab__prepared *p, bool plain, struct ab__tensor **out) {
  const ab__conv *cv = &p->cv;
  struct ab__tensor *t;
  const size_t nbytes = cv->active ? cv->out_nbytes : p->lay.nbytes;
  AB_FORWARD(ab__tensor_create(p->tdev, src->ndim, cv->active ? cv->out_shape : src->shape,
                               cv->active ? cv->out_dtype : src->dtype, p->tbe, nbytes, &t));
  ab_status st = AB_OK;
  if (plain) {
    if (nbytes > 0) memcpy(t->mt.dl_tensor.data, (const char *)src->data + src->byte_offset, nbytes);
  } else {
    st = ab__run_copy(src, p, &t->mt.dl_tensor);
  }
  if (st != AB_OK) {
    ab__tensor_discard(t);
    return st;
  }
  t->mt.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  *out = t;
  return AB_OK;
}

/* One conversion's copy, for relieved(): into a new tensor (t, out) or
 * into the caller's dst (into). */
struct copy_job {
  const DLTensor *src;
  const ab__prepared *p;
  DLTensor *into;
  struct ab__tensor **out;
};

static ab_status run_job(const struct copy_job *j) {
  if (j->into != NULL) return ab__run_copy(j->src, j->p, j->into);
  return copy_to_new(j->src, j->p, false, j->out);
}

/* The job that failed with st, tried again where the device ran out of
 * memory at a buffer's first use (pool.h: OpenCL drivers may allocate there, so the pool's OOM
 * sequence never saw it): after the pool's cache was released, then after
 * each round of the OOM callbacks that freed something. A failed try left
 * nothing behind (the tensor's block went back to the pool, whose cache
 * the next relief releases). The final failure says where the memory ran
 * out. */
__attribute__((noinline, cold)) static ab_status relieved(const struct copy_job *j, ab_status st) {
  struct ab__relief r = {false, 0};
  const size_t bytes = j->p->cv.active ? j->p->cv.out_nbytes : j->p->lay.nbytes;
  DLDevice dev;
  bool at_first_use = false;
  int tries = 0;
  while (st == AB_ERR_OUT_OF_MEMORY && (at_first_use = ab__first_use_oom(&dev)) && ab__pool_relieve(dev, bytes, &r)) {
    tries++;
    st = run_job(j);
  }
  if (st != AB_ERR_OUT_OF_MEMORY || !at_first_use) return st;
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  ab__pool_count_oom_failure(dev);
  return AB_FAIL(st,
                 "%s (%s:%" PRId32 " ran out of memory at a buffer's first use, where its driver allocates; %d "
                 "retr%s after releasing the pool's cache and %d round%s of the OOM callbacks)",
                 saved, ab_device_type_name(dev.device_type), dev.device_id, tries, tries == 1 ? "y" : "ies", r.rounds,
                 r.rounds == 1 ? "" : "s");
}

/* The job, and relieved() only where it ran out of memory: the fast path
 * is the job alone. */
static inline ab_status run_relieved(const struct copy_job *j) {
  const ab_status st = run_job(j);
  return AB_UNLIKELY(st == AB_ERR_OUT_OF_MEMORY) ? relieved(j, st) : st;
}

ab_status ab_convert_memory(const DLTensor *src, DLDevice target, const ab_convert_opts *opts,
                            DLManagedTensorVersioned **out) {
  ab__prepared p;
  struct ab__tensor *t = NULL;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(check_request(src, target, opts, &p));
  /* A view (the commonest call: zero-copy) is known from the checks alone,
   * without the route query (issue 18: its fields and the planner's copy
   * of the plan were a sixth of a zero-copy call). */
  if (ab__route_view(p.sdev, p.tdev, p.cv.active, p.lay.compact, p.o.flags, p.o.copy)) {
    AB_FORWARD(export_view(src, &p.lay, p.tdev, &t));
  } else if (plain_host_copy(&p)) {
    AB_FORWARD(copy_to_new(src, &p, true, &t));
  } else {
    DLTensor tmp;
    src = from_lowest(src, &p, &tmp);
    AB_FORWARD(plan_request(src, NULL, &p)); /* a copy: the view was ruled out above */
    const struct copy_job job = {src, &p, NULL, &t};
    AB_FORWARD(run_relieved(&job));
  }
  if (p.o.flags & AB_CONVERT_READ_ONLY) t->mt.flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  *out = &t->mt;
  return AB_OK;
}

/* Whether two byte ranges [a, a + n) and [b, b + m) share a byte: host
 * addresses, or offsets into one buffer. */
static bool overlap(uint64_t a, uint64_t n, uint64_t b, uint64_t m) { return n > 0 && m > 0 && a < b + m && b < a + n; }

/* Whether bytes [a_off, a_off + n) of handle a and [b_off, b_off + m) of
 * handle b, both of backend be, share a byte: the same buffer, or parts
 * of one (OpenCL sub-buffers), by their offsets in it. */
static bool handles_overlap(const struct ab_backend *be, const void *a, uint64_t a_off, uint64_t n, const void *b,
                            uint64_t b_off, uint64_t m) {
  if (a != b && be->root != NULL) {
    const void *ra, *rb;
    uint64_t oa, ob;
    be->root(a, &ra, &oa);
    be->root(b, &rb, &ob);
    if (ra != rb) return false;
    a_off += oa;
    b_off += ob;
  } else if (a != b) {
    return false;
  }
  return overlap(a_off, n, b_off, m);
}

/* "(3, 4)" for a message, cut with "..." where buf is too short. */
static const char *shape_text(int32_t ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "(");
  for (int32_t i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (n < len) n += (size_t)snprintf(buf + n, len - n, ndim == 1 ? ",)" : ")");
  if (n >= len && len > 4) memcpy(buf + len - 4, "...", 4);
  return buf;
}

ab_status ab_convert_into(const DLTensor *src, const DLTensor *dst, const ab_convert_opts *opts) {
  ab__prepared p;
  ab__layout dlay;
  DLDevice ddev;
  const struct ab_backend *dbe;
  char a[48], b[48];

  if (src == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "src is NULL");
  AB_FORWARD(ab__check_tensor(dst, "dst", &dlay));
  AB_FORWARD(ab__check_tensor_device(dst->device, "dst device", false, &ddev, &dbe));
  AB_FORWARD(check_handle_range(dst, "dst", &dlay, dbe, ddev));
  if (!dlay.compact) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "dst is not compact row-major (ab_convert_into writes compact bytes)");
  /* The result's dtype is dst's: opts->dtype may name it, or nothing. */
  ab_convert_opts o;
  AB_FORWARD(read_opts(opts, &o));
  if (o.dtype.bits != 0 && !dtype_eq(o.dtype, dst->dtype))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opts->dtype is %s but dst is %s", ab_dtype_name(o.dtype, a, sizeof a),
                   ab_dtype_name(dst->dtype, b, sizeof b));
  if (o.copy == AB_COPY_NEVER)
    return AB_FAIL(AB_ERR_COPY_REQUIRED, "opts->copy is AB_COPY_NEVER, but ab_convert_into always copies");
  if (o.flags & AB_CONVERT_READ_ONLY)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "AB_CONVERT_READ_ONLY means nothing to ab_convert_into (dst is the caller's)");
  o.size = sizeof o; /* read_opts gave the whole struct, zero past what the caller's size covered */
  o.dtype = dst->dtype;
  o.copy = AB_COPY_ALWAYS;
  DLTensor tmp;
  AB_FORWARD(check_request(src, ddev, &o, &p));
  src = from_lowest(src, &p, &tmp);
  AB_FORWARD(plan_request(src, dst, &p));
  const int64_t *shape = p.cv.active ? p.cv.out_shape : src->shape;
  bool same = dst->ndim == src->ndim;
  for (int32_t i = 0; same && i < dst->ndim; i++) same = dst->shape[i] == shape[i];
  if (!same) {
    char ds[96], rs[96];
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "dst has shape %s, not the result's %s (src's%s)",
                   shape_text(dst->ndim, dst->shape, ds, sizeof ds), shape_text(src->ndim, shape, rs, sizeof rs),
                   o.permute != NULL ? ", permuted by opts->permute" : "");
  }
  /* The bytes src reads, from its first: validated, so no overflow. */
  const uint64_t from = src->byte_offset + (uint64_t)p.lay.min_off;
  const uint64_t span = extent_of(&p.lay);
  const uint32_t addressed = AB_CAP_HOST_ACCESSIBLE | AB_CAP_ADDRESSED;
  const bool host = (p.sbe->caps & addressed) && (dbe->caps & addressed);
  /* Addresses (host and CUDA memory, one address space) by address;
   * handles (OpenCL buffers) by offset when both are the same buffer of
   * one backend (a driver would refuse the copy, or run it over bytes it
   * is still reading). */
  if (host ? overlap((uintptr_t)src->data + from, span, (uintptr_t)dst->data + dst->byte_offset, dlay.nbytes)
           : p.sbe == dbe && handles_overlap(dbe, src->data, from, span, dst->data, dst->byte_offset, dlay.nbytes))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "src and dst share memory (ab_convert_into needs them apart)");
  DLTensor out = *dst;
  out.device = ddev;
  const struct copy_job job = {src, &p, &out, NULL};
  return run_relieved(&job);
}

ab_status ab_tensor_alloc(DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType dtype,
                          DLManagedTensorVersioned **out) {
  ab__layout lay;
  const struct ab_backend *be;
  struct ab__tensor *t;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(ab__check_shape(ndim, shape, dtype, "tensor", &lay));
  AB_FORWARD(ab__check_tensor_device(dev, "device", true, &dev, &be));
  AB_FORWARD(ab__tensor_create(dev, ndim, shape, dtype, be, lay.nbytes, &t));
  *out = &t->mt;
  return AB_OK;
}

ab_status ab_tensor_validate(const DLTensor *t) {
  ab__layout lay;
  const struct ab_backend *be;
  DLDevice dev;
  AB_FORWARD(ab__check_tensor(t, "tensor", &lay));
  AB_FORWARD(ab__check_tensor_device(t->device, "tensor device", false, &dev, &be));
  return check_handle_range(t, "tensor", &lay, be, dev);
}
