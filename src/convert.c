/* ab_convert_memory: validate -> plan -> allocate -> execute -> export. */
#include <inttypes.h>
#include <string.h>

#include "backend.h"
#include "dlpack.h"
#include "route.h"

const char *ab_version_string(void) { return AB_VERSION_STRING; }
unsigned ab_version_number(void) { return AB_VERSION_NUMBER; }

/* The size of ab_convert_opts as version 0.1 defined it: what size == 0
 * stands for. Fields appended later are read only when size covers them. */
#define OPTS_V0_1_SIZE (offsetof(ab_convert_opts, stream) + sizeof(void *))

static ab_status read_opts(const ab_convert_opts *in, ab_convert_opts *o) {
  memset(o, 0, sizeof *o);
  if (in == NULL) return AB_OK;
  size_t size = in->size == 0 ? OPTS_V0_1_SIZE : in->size;
  if (size < OPTS_V0_1_SIZE)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opts->size is %" PRIu32 "; must be 0 or >= %zu",
                   in->size, OPTS_V0_1_SIZE);
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

/* A staging buffer of the host pool, for routes through host memory. */
static ab_status stage_alloc(size_t bytes, ab__block **out) {
  return ab__pool_alloc(ab__backend_for(kDLCPU), (DLDevice){kDLCPU, 0}, bytes, out);
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
static ab_status run_steps(const ab__plan *plan, const DLTensor *src, const ab__layout *lay,
                           const ab__rect *rect, DLTensor *dst, void *stream) {
  const struct ab_backend *host = ab__backend_for(kDLCPU);
  ab__block *stage[AB_MAX_STEPS] = {NULL};
  int nstage = 0;
  DLTensor cur = *src;
  ab_status st = AB_OK;

  bool cur_compact = lay->compact;

  for (int i = 0; i < plan->nsteps && st == AB_OK; i++) {
    const ab__step *s = &plan->steps[i];
    const bool last = i == plan->nsteps - 1;
    /* Where a step that produces compact host bytes puts them. */
    void *out_bytes = NULL;
    if (s->kind == AB_STEP_PACK || s->kind == AB_STEP_UNPACK ||
        (s->kind == AB_STEP_DOWNLOAD && (cur_compact || rect != NULL))) {
      if (last) {
        out_bytes = (char *)dst->data + dst->byte_offset;
      } else {
        st = stage_alloc(lay->nbytes, &stage[nstage]);
        if (st != AB_OK) break;
        out_bytes = stage[nstage++]->ptr;
      }
    }
    switch (s->kind) {
    case AB_STEP_COPY: {
      const struct ab_backend *be = ab__backend_for(s->via);
      if (last) {
        st = ab__dev_copy(be, &cur, dst, stream);
        break;
      }
      /* A gather on the source's device into a staging buffer there. */
      st = ab__pool_alloc(be, s->to, lay->nbytes, &stage[nstage]);
      if (st != AB_OK) break;
      DLTensor to = compact_at(&cur, s->to, stage[nstage++]->ptr);
      st = ab__dev_copy(be, &cur, &to, stream);
      cur = to;
      cur_compact = true;
      break;
    }
    case AB_STEP_PACK:
    case AB_STEP_UNPACK: {
      DLTensor to = compact_at(&cur, (DLDevice){kDLCPU, 0}, out_bytes);
      st = ab__dev_copy(host, &cur, &to, NULL);
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
        st = stage_alloc((size_t)extent, &stage[nstage]);
        if (st != AB_OK) break;
        void *buf = stage[nstage++]->ptr;
        st = ab__dev_read(be, id, cur.data, cur.byte_offset + (uint64_t)lay->min_off, buf, (size_t)extent, stream);
        cur.data = buf;
        cur.byte_offset = (uint64_t)0 - (uint64_t)lay->min_off;
        break;
      }
      /* Compact, or rows of contiguous bytes in one rectangle read. */
      st = cur_compact ? ab__dev_read(be, id, cur.data, cur.byte_offset, out_bytes, lay->nbytes, stream)
                       : ab__dev_read_rect(be, id, cur.data, cur.byte_offset, rect, out_bytes, stream);
      cur = compact_at(&cur, cur.device, out_bytes);
      cur_compact = true;
      break;
    }
    case AB_STEP_UPLOAD:
      if (cur_compact)
        st = ab__dev_write(ab__backend_for(s->via), dst->device.device_id, dst->data, dst->byte_offset,
                           (const char *)cur.data + cur.byte_offset, lay->nbytes, stream);
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

static ab_status export_copy(const DLTensor *src, const ab__layout *lay, const ab__rect *rect, DLDevice dev,
                             const struct ab_backend *be, const ab__plan *plan, void *stream,
                             struct ab__tensor **out) {
  struct ab__tensor *t;
  ab_status st;
  AB_FORWARD(ab__tensor_new(dev, src->ndim, src->shape, src->dtype, &t));
  st = ab__tensor_alloc_data(t, be, lay->nbytes);
  if (st == AB_OK && lay->numel > 0) st = run_steps(plan, src, lay, rect, &t->mt.dl_tensor, stream);
  if (st != AB_OK) {
    ab__tensor_discard(t);
    return st;
  }
  t->mt.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  *out = t;
  return AB_OK;
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

ab_status ab_convert_memory(const DLTensor *src, DLDevice target, const ab_convert_opts *opts,
                            DLManagedTensorVersioned **out) {
  ab_convert_opts o;
  ab__layout lay;
  const struct ab_backend *sbe, *tbe;
  DLDevice sdev, tdev;
  ab__plan plan;
  ab__rect rect;
  struct ab__tensor *t = NULL;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(read_opts(opts, &o));
  AB_FORWARD(ab__check_tensor(src, "src", &lay));
  AB_FORWARD(ab__check_device(src->device, "src device", false, &sdev, &sbe));
  AB_FORWARD(ab__check_device(target, "target device", true, &tdev, &tbe));
  AB_FORWARD(check_handle_range(src, &lay, sbe, sdev));

  ab__route_query q = {
    .src = sdev,
    .dst = tdev,
    .src_caps = ab__dev_caps(sbe, sdev.device_id),
    .dst_caps = ab__dev_caps(tbe, tdev.device_id),
    .same_dtype = o.dtype.bits == 0 || dtype_eq(o.dtype, src->dtype),
    .src_compact = lay.compact,
    .copy = o.copy,
    .flags = o.flags,
    /* An empty tensor moves nothing, and its data need not be a buffer the
     * backend could inspect. */
    .direct = sbe == tbe && (lay.numel == 0 || ab__dev_can_copy(sbe, src, tdev, lay.compact)),
    .src_rect = !lay.compact && lay.numel > 0 && ab__dev_has_read_rect(sbe) && ab__rect_of(src, lay.elsize, &rect),
    .dst_rect = !lay.compact && lay.numel > 0 && (sbe->caps & AB_CAP_HOST_ACCESSIBLE) && ab__dev_has_write_rect(tbe) &&
                ab__rect_of(src, lay.elsize, &rect),
    .nbytes = lay.nbytes,
    .extent = lay.numel > 0 ? (uint64_t)lay.max_off - (uint64_t)lay.min_off + lay.elsize : 0,
  };
  /* Asking a backend whether it can gather may build its kernels: ask only
   * when the plan could use a gather (strided, no rectangle, sparse). */
  if (!lay.compact && lay.numel > 0 && !q.src_rect && !(sbe->caps & AB_CAP_HOST_ACCESSIBLE) && q.extent > q.nbytes)
    q.src_gather = ab__dev_can_copy(sbe, src, sdev, false);
  AB_FORWARD(ab__plan_route(&q, &plan));

  if (plan.steps[0].kind == AB_STEP_VIEW) {
    AB_FORWARD(export_view(src, &lay, tdev, &t));
  } else {
    AB_FORWARD(export_copy(src, &lay, q.src_rect || q.dst_rect ? &rect : NULL, tdev, tbe, &plan, o.stream, &t));
  }
  if (o.flags & AB_CONVERT_READ_ONLY) t->mt.flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  *out = &t->mt;
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
  AB_FORWARD(ab__check_device(dev, "device", true, &dev, &be));
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
  AB_FORWARD(ab__check_device(t->device, "tensor device", false, &dev, &be));
  return check_handle_range(t, &lay, be, dev);
}
