/* ab_convert_memory: validate -> plan -> allocate -> execute -> export. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "converters/host/gather.h"
#include "dlpack.h"
#include "parallel.h"
#include "route.h"

/* What a conversion does to the elements (none when !active): the result's
 * shape, dtype and size, the axis order and the element op. */
typedef struct conv {
  bool active;
  int32_t ndim;
  int32_t perm[AB_MAX_NDIM];
  int64_t out_shape[AB_MAX_NDIM];
  DLDataType out_dtype;
  size_t out_nbytes;
  ab__cast_op op;
} conv;

const char *ab_version_string(void) { return AB_VERSION_STRING; }
unsigned ab_version_number(void) { return AB_VERSION_NUMBER; }

/* The size of ab_convert_opts as version 0.1 defined it: what size == 0
 * stands for. Fields appended later are read only when size covers them. */
#define OPTS_V0_1_SIZE (offsetof(ab_convert_opts, stream) + sizeof(void *))
/* The size before `threads` was appended (the maps' layout). */
#define OPTS_MAPS_SIZE (offsetof(ab_convert_opts, channel_offset) + sizeof(const double *))

static ab_status read_opts(const ab_convert_opts *in, ab_convert_opts *o) {
  memset(o, 0, sizeof *o);
  if (in == NULL) return AB_OK;
  size_t size = in->size == 0 ? OPTS_V0_1_SIZE : in->size;
  /* The size of a version's struct, or more (a newer header): a size in
   * between would cut a field in two. */
  if (size != OPTS_V0_1_SIZE && size != OPTS_MAPS_SIZE && size < sizeof *o)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opts->size is %" PRIu32 "; must be 0, %zu (version 0.1), %zu (before `threads`) or >= %zu "
                   "(sizeof(ab_convert_opts))",
                   in->size, OPTS_V0_1_SIZE, OPTS_MAPS_SIZE, sizeof *o);
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
  memcpy(o, in, size);
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

/* A staging buffer for routes through host memory, from the pool of
 * `staging` (pinned memory when a backend asks for it), else from the
 * plain host pool: pageable staging is slower, not wrong. */
static ab_status stage_alloc(DLDevice staging, size_t bytes, ab__block **out) {
  const struct ab_backend *host = ab__backend_for(kDLCPU);
  if (staging.device_type != kDLCPU) {
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    if (ab__pool_alloc(ab__backend_for(staging.device_type), staging, bytes, out) == AB_OK) return AB_OK;
    AB_LOG(AB_LOG_DEBUG, "pinned staging of %zu bytes failed (%s); staging in pageable memory", bytes, ab_last_error());
    ab__restore_error(saved);
  }
  return ab__pool_alloc(host, (DLDevice){kDLCPU, 0}, bytes, out);
}

/* The compact tensor of t's shape and dtype at `data` on `dev`. */
static DLTensor compact_at(const DLTensor *t, DLDevice dev, void *data) {
  DLTensor c = *t;
  c.device = dev;
  c.data = data;
  c.byte_offset = 0;
  c.strides = NULL;
  return c;
}

/* Runs the copy steps of a plan from `src` into the compact tensor `dst`.
 * `cur` describes where the bytes are after each step. Staging blocks come
 * from the host pool and go back to it whatever happens. */
/* The CONVERT step: host bytes `cur` (any strides) into compact `out`,
 * permuted, cast and scaled as cv says. */
/* The conversion of `cur` (any strides; compact when NULL) as every
 * converter takes it: the result's shape, the source's element strides in
 * the result's axis order, and the op with its channel in those axes. */
static void convert_args(const DLTensor *cur, const conv *cv, ab__convert_args *a) {
  int64_t st[AB_MAX_NDIM];
  int64_t acc = 1;
  for (int32_t i = cur->ndim - 1; i >= 0; i--) {
    st[i] = cur->shape[i] == 1 ? 0 : cur->strides ? cur->strides[i] : acc;
    acc *= cur->shape[i];
  }
  a->ndim = cur->ndim;
  a->op = cv->op;
  a->op.channel_dim = -1;
  for (int32_t i = 0; i < cur->ndim; i++) {
    a->shape[i] = cur->shape[cv->perm[i]];
    a->stride[i] = st[cv->perm[i]];
    if (cv->op.channel_dim >= 0 && cv->perm[i] == cv->op.channel_dim) a->op.channel_dim = i;
  }
}

static void convert_host(const DLTensor *cur, const conv *cv, void *out) {
  const size_t es = ab__elsize(cur->dtype);
  int64_t pst[AB_MAX_NDIM];
  ab__convert_args a;
  convert_args(cur, cv, &a);
  for (int32_t i = 0; i < a.ndim; i++) pst[i] = a.stride[i] * (int64_t)es; /* validated: no overflow */
  const ab__cast_op *op = &a.op;
  const bool permutation_only =
      !op->affine && op->from.code == op->to.code && op->from.bits == op->to.bits && op->from.lanes == op->to.lanes;
  /* A pure permutation takes the fast gather; on all cores when large. */
  const ab__host_job job = {out, (const char *)cur->data + cur->byte_offset, a.ndim, a.shape, pst, es,
                            permutation_only ? NULL : op};
  ab__host_run(&job);
}

/* Whose opts.stream it is: a backend family and one of its devices. */
typedef struct stream_owner {
  const struct ab_backend *be;
  DLDevice dev;
  void *stream;
  bool async; /* AB_CONVERT_ASYNC */
} stream_owner;

static bool dev_eq(DLDevice a, DLDevice b) { return a.device_type == b.device_type && a.device_id == b.device_id; }

/* Whether a step runs on the caller's stream: a step of its backend family
 * that touches its device (a cl_command_queue means nothing to CUDA, and a
 * cudaStream_t of cuda:1 cannot order work on cuda:0); others use their
 * default and are complete when they return all the same. */
static bool on_stream(const ab__step *s, const stream_owner *owner) {
  return ab__same_family(ab__backend_for(s->via), owner->be) && (dev_eq(s->from, owner->dev) || dev_eq(s->to, owner->dev));
}

/* The caller's stream for a step, or NULL (the default). */
static void *stream_for(const ab__step *s, const stream_owner *owner) {
  return on_stream(s, owner) ? owner->stream : NULL;
}

static ab_status run_steps(const ab__plan *plan, const DLTensor *src, const ab__layout *lay,
                           const ab__rect *rect, const conv *cv, DLTensor *dst, DLDevice staging,
                           const stream_owner *owner) {
  const struct ab_backend *host = ab__backend_for(kDLCPU);
  ab__block *stage[AB_MAX_STEPS] = {NULL};
  int nstage = 0;
  DLTensor cur = *src;
  ab_status st = AB_OK;

  bool cur_compact = lay->compact;
  size_t cur_bytes = lay->nbytes; /* bytes of the compact tensor `cur` is, or will be once packed */

  for (int i = 0; i < plan->nsteps && st == AB_OK; i++) {
    const ab__step *s = &plan->steps[i];
    const bool last = i == plan->nsteps - 1;
    void *stream = stream_for(s, owner);
    /* An early return leaves the work queued on the caller's stream: only
     * for a route of one step on it, which needs no buffer of ours freed
     * below while the work may still read or write it. */
    const bool async = owner->async && plan->nsteps == 1 && on_stream(s, owner);
    /* Where a step that produces compact host bytes puts them. */
    void *out_bytes = NULL;
    if (s->kind == AB_STEP_PACK || s->kind == AB_STEP_UNPACK || (s->kind == AB_STEP_CONVERT && s->via == kDLCPU) ||
        (s->kind == AB_STEP_DOWNLOAD && (cur_compact || rect != NULL))) {
      if (last) {
        out_bytes = (char *)dst->data + dst->byte_offset;
      } else {
        st = stage_alloc(staging, s->kind == AB_STEP_CONVERT ? cv->out_nbytes : cur_bytes, &stage[nstage]);
        if (st != AB_OK) break;
        out_bytes = stage[nstage++]->ptr;
      }
    }
    switch (s->kind) {
    case AB_STEP_COPY: {
      const struct ab_backend *be = ab__backend_for(s->via);
      if (last) {
        st = ab__dev_copy(be, &cur, dst, stream, async);
        break;
      }
      /* A gather on the source's device into a staging buffer there. */
      st = ab__pool_alloc(be, s->to, lay->nbytes, &stage[nstage]);
      if (st != AB_OK) break;
      DLTensor to = compact_at(&cur, s->to, stage[nstage++]->ptr);
      st = ab__dev_copy(be, &cur, &to, stream, false);
      cur = to;
      cur_compact = true;
      break;
    }
    case AB_STEP_PACK:
    case AB_STEP_UNPACK: {
      DLTensor to = compact_at(&cur, (DLDevice){kDLCPU, 0}, out_bytes);
      st = ab__dev_copy(host, &cur, &to, NULL, false);
      cur = to;
      cur_compact = true;
      break;
    }
    case AB_STEP_DOWNLOAD: {
      const struct ab_backend *be = ab__backend_for(s->via);
      const int32_t id = cur.device.device_id;
      cur.device = (DLDevice){kDLCPU, 0};
      if (out_bytes == NULL) {
        /* Only the bytes the strides address, then a host gather (UNPACK). */
        uint64_t extent = (uint64_t)lay->max_off - (uint64_t)lay->min_off + lay->elsize;
        st = stage_alloc(staging, (size_t)extent, &stage[nstage]);
        if (st != AB_OK) break;
        void *buf = stage[nstage++]->ptr;
        st = ab__dev_read(be, id, cur.data, cur.byte_offset + (uint64_t)lay->min_off, buf, (size_t)extent, stream);
        cur.data = buf;
        cur.byte_offset = (uint64_t)0 - (uint64_t)lay->min_off;
        break;
      }
      /* Compact, or rows of contiguous bytes in one rectangle read. */
      st = cur_compact ? ab__staged_read(be, id, cur.data, cur.byte_offset, out_bytes, cur_bytes, stream, async)
                       : ab__dev_read_rect(be, id, cur.data, cur.byte_offset, rect, out_bytes, stream);
      cur = compact_at(&cur, cur.device, out_bytes);
      cur_compact = true;
      break;
    }
    case AB_STEP_CONVERT:
      if (s->via != kDLCPU) {
        /* On a device: the target's, from the source's bytes uploaded
         * there (into the result), or the source's (into the result, or
         * into a buffer there that is downloaded next). */
        const struct ab_backend *be = ab__backend_for(s->via);
        ab__convert_args a;
        convert_args(&cur, cv, &a);
        void *into = dst->data;
        uint64_t into_offset = dst->byte_offset;
        if (!last) {
          st = ab__pool_alloc(be, s->to, cv->out_nbytes, &stage[nstage]);
          if (st != AB_OK) break;
          into = stage[nstage++]->ptr;
          into_offset = 0;
        }
        st = ab__dev_convert(be, s->to.device_id, cur.data, cur.byte_offset, into, into_offset, &a, stream, async);
        cur = compact_at(dst, s->to, into);
        cur.byte_offset = into_offset;
        cur_compact = true;
        cur_bytes = cv->out_nbytes;
        break;
      }
      convert_host(&cur, cv, out_bytes);
      cur_bytes = cv->out_nbytes;
      cur = compact_at(dst, (DLDevice){kDLCPU, 0}, out_bytes); /* the result's shape and dtype from here */
      cur_compact = true;
      break;
    case AB_STEP_UPLOAD:
      if (!last) {
        /* The source's bytes, compact, into a buffer on the target for a
         * conversion there. */
        const struct ab_backend *be = ab__backend_for(s->via);
        st = ab__pool_alloc(be, s->to, lay->nbytes, &stage[nstage]);
        if (st != AB_OK) break;
        DLTensor to = compact_at(&cur, s->to, stage[nstage++]->ptr);
        st = ab__staged_write(be, s->to.device_id, to.data, 0, (const char *)cur.data + cur.byte_offset, lay->nbytes,
                              stream, false);
        cur = to;
        break;
      }
      if (cur_compact)
        st = ab__staged_write(ab__backend_for(s->via), dst->device.device_id, dst->data, dst->byte_offset,
                              (const char *)cur.data + cur.byte_offset, cur_bytes, stream, async);
      else /* a host crop, written as one rectangle */
        st = ab__dev_write_rect(ab__backend_for(s->via), dst->device.device_id, dst->data, dst->byte_offset, rect,
                                (const char *)cur.data + cur.byte_offset, stream);
      break;
    default:
      st = AB_FAIL(AB_ERR_INTERNAL, "plan step %d has unknown kind %d", i, (int)s->kind);
    }
  }
  while (nstage > 0) ab__pool_free(stage[--nstage]);
  return st;
}

/* A tensor in memory host code cannot address (an OpenCL buffer) must keep
 * its addressed bytes inside its buffer, which only the backend can see. */
static ab_status check_handle_range(const DLTensor *src, const ab__layout *lay, const struct ab_backend *be,
                                    DLDevice dev) {
  int64_t begin;
  if (lay->numel == 0 || (be->caps & AB_CAP_HOST_ACCESSIBLE)) return AB_OK;
  if (__builtin_add_overflow((int64_t)src->byte_offset, lay->min_off, &begin) || begin < 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "src addresses bytes before the start of its buffer (byte_offset %" PRIu64 ", extent from %" PRId64 ")",
                   src->byte_offset, lay->min_off);
  uint64_t end = src->byte_offset + (uint64_t)lay->max_off + lay->elsize;
  return ab__dev_check_range(be, dev.device_id, src->data, (uint64_t)begin, end);
}

/* Everything decided before a byte moves: the validated source, both
 * devices and backends, and the plan. */
struct prepared {
  ab_convert_opts o;
  ab__layout lay;
  const struct ab_backend *sbe, *tbe;
  DLDevice sdev, tdev;
  ab__route_query q;
  ab__plan plan;
  ab__rect rect;
  conv cv;
};

/* The conversion opts ask for, checked against the source. */
static ab_status read_conversion(const DLTensor *src, const ab__layout *lay, const ab_convert_opts *o, conv *cv) {
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
                       "opts->permute[%" PRId32 "] is %" PRId32 "; want each of 0..%" PRId32 " exactly once", i, p,
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
  uint32_t v;
  if (AB_LIKELY(ab__env_cached(&place_cache, &v))) return (ab__place)v;
  return (ab__place)ab__env_keep(&place_cache,
                                 (uint32_t)ab__env_choice("AB_CONVERT_PLACE", places, AB_PLACE_AUTO, "auto, host or device"));
}

/* into: the existing destination of ab_convert_into, else NULL. */
static ab_status prepare(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, const DLTensor *into,
                         struct prepared *p) {
  AB_FORWARD(read_opts(opts, &p->o));
  AB_FORWARD(ab__check_tensor(src, "src", &p->lay));
  AB_FORWARD(ab__check_tensor_device(src->device, "src device", false, &p->sdev, &p->sbe));
  AB_FORWARD(ab__check_tensor_device(target, "target device", true, &p->tdev, &p->tbe));
  AB_FORWARD(check_handle_range(src, &p->lay, p->sbe, p->sdev));
  AB_FORWARD(read_conversion(src, &p->lay, &p->o, &p->cv));

  const ab__layout *lay = &p->lay;
  const struct ab_backend *sbe = p->sbe, *tbe = p->tbe;
  /* A destination the target's backend cannot use in its own copies and
   * kernels (an OpenCL buffer of another context) takes its bytes through
   * host memory, written by a plain transfer. */
  const bool into_ok = into == NULL || (tbe->caps & AB_CAP_HOST_ACCESSIBLE) || ab__dev_can_copy(tbe, into, p->tdev, true);
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
    /* An empty tensor moves nothing, and its data need not be a buffer the
     * backend could inspect. */
    .direct = into_ok && sbe == tbe && (lay->numel == 0 || ab__dev_can_copy(sbe, src, p->tdev, lay->compact)),
    .src_rect = !lay->compact && lay->numel > 0 && ab__dev_has_read_rect(sbe) && ab__rect_of(src, lay->elsize, &p->rect),
    .dst_rect = !lay->compact && lay->numel > 0 && (sbe->caps & AB_CAP_HOST_ACCESSIBLE) && ab__dev_has_write_rect(tbe) &&
                ab__rect_of(src, lay->elsize, &p->rect),
    .nbytes = lay->nbytes,
    .extent = lay->numel > 0 ? (uint64_t)lay->max_off - (uint64_t)lay->min_off + lay->elsize : 0,
  };
  p->q.out_nbytes = p->cv.active ? p->cv.out_nbytes : lay->nbytes;
  p->q.place = convert_place();
  /* Asking whether a device can convert may build its kernels: only when
   * the planner would use the answer. */
  if (p->cv.active && lay->numel > 0 && ab__route_converts_on_source(&p->q)) {
    ab__convert_args a;
    convert_args(src, &p->cv, &a);
    p->q.src_convert = ab__dev_can_convert(sbe, p->sdev.device_id, src->data, src->byte_offset, &a);
  }
  if (into_ok && p->cv.active && lay->numel > 0 && ab__route_converts_on_target(&p->q)) {
    DLTensor compact = *src;
    compact.strides = NULL;
    ab__convert_args a;
    convert_args(&compact, &p->cv, &a);
    p->q.dst_convert = ab__dev_can_convert(tbe, p->tdev.device_id, NULL, 0, &a); /* the upload's buffer */
  }
  /* Asking a backend whether it can gather may build its kernels: ask only
   * when the plan could use a gather (strided, no rectangle, sparse). */
  if (!lay->compact && lay->numel > 0 && !p->q.src_rect && !(sbe->caps & AB_CAP_HOST_ACCESSIBLE) &&
      p->q.extent > p->q.nbytes)
    p->q.src_gather = ab__dev_can_copy(sbe, src, p->sdev, false);
  return ab__plan_route(&p->q, &p->plan);
}

/* Where bytes that cross through host memory wait: the target's preferred
 * staging memory (CUDA: pinned, so its DMA needs no driver bounce), else
 * the source's, else plain host memory. */
static DLDevice staging_device(const struct prepared *p) {
  DLDevice d;
  if (ab__staging_device(p->tbe, p->tdev.device_id, &d) || ab__staging_device(p->sbe, p->sdev.device_id, &d)) return d;
  return (DLDevice){kDLCPU, 0};
}

/* Runs a prepared copy plan from src into dst (compact, of the result's
 * shape and dtype, on p->tdev): first waiting for host-addressable source
 * memory a device may still be writing, then the plan's steps. */
static ab_status run_copy(const DLTensor *src, const struct prepared *p, DLTensor *dst) {
  if (p->lay.numel == 0) return AB_OK;
  /* opts.stream belongs to the target, or to the source when the target
   * is host memory (pageable, pinned or managed). */
  const bool to_host = (p->q.dst_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const stream_owner owner = {to_host ? p->sbe : p->tbe, to_host ? p->sdev : p->tdev, p->o.stream,
                              (p->o.flags & AB_CONVERT_ASYNC) != 0};
  /* Host-addressable memory a device may still be writing (CUDA pinned
   * or managed) is waited for before host code reads it; not when the
   * only reader is a transfer queued on the very stream waited for: a
   * stream the caller named, since the defaults (NULL, and DLPack's 1
   * and 2) are per device, and host_sync would wait on the caller's
   * current device's while the transfer goes on the target's. */
  const ab__step *first = &p->plan.steps[0];
  const bool named_stream = (uintptr_t)owner.stream > 2;
  const bool stream_ordered = named_stream && owner.async && p->plan.nsteps == 1 && first->kind == AB_STEP_UPLOAD &&
                              p->lay.compact && on_stream(first, &owner) && ab__same_family(p->sbe, owner.be) &&
                              ab__staged_queueable(ab__backend_for(first->via), (const char *)src->data + src->byte_offset,
                                                   true);
  if (ab__dev_needs_host_sync(p->sbe) && !stream_ordered) {
    void *s = owner.stream != NULL && ab__same_family(p->sbe, owner.be) ? owner.stream : NULL;
    AB_FORWARD(ab__dev_host_sync(p->sbe, p->sdev.device_id, s));
  }
  const uint32_t prev = ab__parallel_call_threads(p->o.threads);
  ab_status st = run_steps(&p->plan, src, &p->lay, p->q.src_rect || p->q.dst_rect ? &p->rect : NULL, &p->cv, dst,
                           staging_device(p), &owner);
  ab__parallel_call_threads(prev);
  return st;
}

ab_status ab_convert_memory(const DLTensor *src, DLDevice target, const ab_convert_opts *opts,
                            DLManagedTensorVersioned **out) {
  struct prepared p;
  struct ab__tensor *t = NULL;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(prepare(src, target, opts, NULL, &p));
  if (p.plan.steps[0].kind == AB_STEP_VIEW) {
    AB_FORWARD(export_view(src, &p.lay, p.tdev, &t));
  } else {
    const conv *cv = &p.cv;
    AB_FORWARD(ab__tensor_new(p.tdev, src->ndim, cv->active ? cv->out_shape : src->shape,
                              cv->active ? cv->out_dtype : src->dtype, &t));
    ab_status st = ab__tensor_alloc_data(t, p.tbe, cv->active ? cv->out_nbytes : p.lay.nbytes);
    if (st == AB_OK) st = run_copy(src, &p, &t->mt.dl_tensor);
    if (st != AB_OK) {
      ab__tensor_discard(t);
      return st;
    }
    t->mt.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  }
  if (p.o.flags & AB_CONVERT_READ_ONLY) t->mt.flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  *out = &t->mt;
  return AB_OK;
}

/* Whether two host byte ranges [a, a + n) and [b, b + m) share a byte. */
static bool overlap(uintptr_t a, uint64_t n, uintptr_t b, uint64_t m) { return n > 0 && m > 0 && a < b + m && b < a + n; }

ab_status ab_convert_into(const DLTensor *src, const DLTensor *dst, const ab_convert_opts *opts) {
  struct prepared p;
  ab__layout dlay;
  DLDevice ddev;
  const struct ab_backend *dbe;
  char a[48], b[48];

  if (src == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "src is NULL");
  AB_FORWARD(ab__check_tensor(dst, "dst", &dlay));
  AB_FORWARD(ab__check_tensor_device(dst->device, "dst device", false, &ddev, &dbe));
  AB_FORWARD(check_handle_range(dst, &dlay, dbe, ddev));
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
  AB_FORWARD(prepare(src, ddev, &o, dst, &p));
  const int64_t *shape = p.cv.active ? p.cv.out_shape : src->shape;
  bool same = dst->ndim == src->ndim;
  for (int32_t i = 0; same && i < dst->ndim; i++) same = dst->shape[i] == shape[i];
  if (!same)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "dst has %" PRId32 " dims and not the result's shape (src has %" PRId32
                   " dims%s)", dst->ndim, src->ndim, o.permute != NULL ? ", permuted by opts->permute" : "");
  if ((p.sbe->caps & AB_CAP_HOST_ACCESSIBLE) && (dbe->caps & AB_CAP_HOST_ACCESSIBLE) &&
      overlap((uintptr_t)src->data + src->byte_offset + (uintptr_t)p.lay.min_off,
              p.lay.numel > 0 ? (uint64_t)(p.lay.max_off - p.lay.min_off) + p.lay.elsize : 0,
              (uintptr_t)dst->data + dst->byte_offset, dlay.nbytes))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "src and dst share memory (ab_convert_into needs them apart)");
  DLTensor out = *dst;
  out.device = ddev;
  return run_copy(src, &p, &out);
}

/* ---- ab_explain_route ------------------------------------------------------ */

struct text {
  char *buf;
  size_t len, at; /* at may pass len: the text is then cut */
};

static void AB_PRINTF(2, 3) put(struct text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = t->at < t->len ? t->len - t->at : 0;
  int n = vsnprintf(room ? t->buf + t->at : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) t->at += (size_t)n;
}

static void put_dev(struct text *t, DLDevice d) {
  put(t, "%s:%" PRId32, ab_device_type_name(d.device_type), d.device_id);
}

static void explain_step(struct text *t, const struct prepared *p, const ab__step *s, DLDevice staging) {
  const bool first = s == &p->plan.steps[0], last = s == &p->plan.steps[p->plan.nsteps - 1];
  switch (s->kind) {
  case AB_STEP_VIEW:
    put(t, "view: no bytes move; the result aliases the source's memory%s",
        p->lay.compact ? "" : " with the source's strides");
    return;
  case AB_STEP_COPY:
    if (!last) {
      put(t, "gather on ");
      put_dev(t, s->from);
      put(t, " into a compact %" PRIu64 "-byte buffer there (the %" PRIu64 "-byte span need not cross the link)",
          p->q.nbytes, p->q.extent);
    } else if (s->via == kDLCPU && s->from.device_type != kDLCPU) {
      put(t, "host copy ");
      put_dev(t, s->from);
      put(t, " -> ");
      put_dev(t, s->to);
      put(t, " (both host-addressable)");
    } else {
      put(t, "%s copy ", ab__backend_for(s->via)->name);
      put_dev(t, s->from);
      put(t, " -> ");
      put_dev(t, s->to);
      put(t, "%s", p->lay.compact ? "" : " (strided source)");
    }
    return;
  case AB_STEP_PACK:
    put(t, "pack on the host: gather the strided source into compact ");
    put_dev(t, last ? p->tdev : staging);
    put(t, " memory");
    return;
  case AB_STEP_UNPACK:
    put(t, "unpack on the host: gather the downloaded span into compact bytes");
    return;
  case AB_STEP_CONVERT: {
    char a[48], b[48];
    if (s->via == kDLCPU) {
      put(t, "convert on the host: ");
    } else {
      put(t, "convert on ");
      put_dev(t, s->to);
      put(t, ": ");
    }
    put(t, "%s -> %s", ab_dtype_name(p->cv.op.from, a, sizeof a), ab_dtype_name(p->cv.op.to, b, sizeof b));
    if (p->cv.op.affine) put(t, p->cv.op.channel_dim >= 0 ? ", scaled per channel" : ", scaled");
    put(t, " into compact ");
    put_dev(t, last ? p->tdev : s->via != kDLCPU ? s->to : staging);
    put(t, " memory");
    bool moved = false;
    for (int32_t i = 0; i < p->cv.ndim; i++) moved = moved || p->cv.perm[i] != i;
    if (moved) { /* the axis order, as opts->permute gave it (the first 8 axes of more) */
      put(t, " in axis order (");
      for (int32_t i = 0; i < p->cv.ndim && i < 8; i++) put(t, i ? ", %" PRId32 : "%" PRId32, p->cv.perm[i]);
      put(t, p->cv.ndim > 8 ? ", ...)" : ")");
    }
    if (s->via != kDLCPU && !first) /* after the upload of the source's bytes */
      put(t, " (%" PRIu64 " bytes crossed the link instead of %" PRIu64 ")", p->q.nbytes, p->q.out_nbytes);
    else if (s->via != kDLCPU && !last) /* before the download of the result */
      put(t, " (%" PRIu64 " bytes cross the link instead of %" PRIu64 ")", p->q.out_nbytes, p->q.nbytes);
    return;
  }
  case AB_STEP_DOWNLOAD:
    put(t, "download ");
    put_dev(t, s->from);
    put(t, " -> ");
    put_dev(t, last ? p->tdev : staging);
    if (!first || p->lay.compact)
      put(t, ", %" PRIu64 " bytes", first || p->plan.steps[0].kind != AB_STEP_CONVERT ? p->q.nbytes : p->q.out_nbytes);
    else if (p->q.src_rect)
      put(t, ", %" PRIu64 " bytes as one rectangle of %zu-byte rows", p->q.nbytes, p->rect.region[0]);
    else
      put(t, ", the %" PRIu64 "-byte span the strides address", p->q.extent);
    return;
  case AB_STEP_UPLOAD:
    put(t, "upload ");
    put_dev(t, first ? p->sdev : staging);
    put(t, " -> ");
    put_dev(t, s->to);
    if (p->q.dst_rect && first)
      put(t, ", %" PRIu64 " bytes as one rectangle of %zu-byte rows", p->q.nbytes, p->rect.region[0]);
    else if (!last)
      put(t, ", %" PRIu64 " bytes as they are, for the conversion there", p->q.nbytes);
    else
      put(t, ", %" PRIu64 " bytes", first ? p->q.nbytes : p->q.out_nbytes);
    return;
  }
  put(t, "step of unknown kind %d", (int)s->kind);
}

ab_status ab_explain_route(const DLTensor *src, DLDevice target, char *buf, size_t len) {
  return ab_explain_convert(src, target, NULL, buf, len);
}

ab_status ab_explain_convert(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, char *buf,
                             size_t len) {
  struct prepared p;
  if (buf == NULL && len > 0) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "buf is NULL but len is %zu", len);
  AB_FORWARD(prepare(src, target, opts, NULL, &p));
  struct text t = {buf, len, 0};
  put_dev(&t, p.sdev);
  put(&t, " -> ");
  put_dev(&t, p.tdev);
  put(&t, ": %" PRIu64 " bytes, %s source, %d step%s\n", p.q.nbytes, p.lay.compact ? "compact" : "strided",
      p.plan.nsteps, p.plan.nsteps == 1 ? "" : "s");
  const DLDevice staging = staging_device(&p);
  for (int i = 0; i < p.plan.nsteps; i++) {
    put(&t, "  %d. ", i + 1);
    explain_step(&t, &p, &p.plan.steps[i], staging);
    put(&t, "\n");
  }
  return AB_OK;
}

ab_status ab_tensor_alloc(DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType dtype,
                          DLManagedTensorVersioned **out) {
  ab__layout lay;
  const struct ab_backend *be;
  struct ab__tensor *t;
  ab_status st;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(ab__check_shape(ndim, shape, dtype, "tensor", &lay));
  AB_FORWARD(ab__check_tensor_device(dev, "device", true, &dev, &be));
  AB_FORWARD(ab__tensor_new(dev, ndim, shape, dtype, &t));
  st = ab__tensor_alloc_data(t, be, lay.nbytes);
  if (st != AB_OK) {
    ab__tensor_discard(t);
    return st;
  }
  *out = &t->mt;
  return AB_OK;
}

ab_status ab_tensor_validate(const DLTensor *t) {
  ab__layout lay;
  const struct ab_backend *be;
  DLDevice dev;
  AB_FORWARD(ab__check_tensor(t, "tensor", &lay));
  AB_FORWARD(ab__check_tensor_device(t->device, "tensor device", false, &dev, &be));
  return check_handle_range(t, &lay, be, dev);
}
