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

static ab_status export_copy(const DLTensor *src, const ab__layout *lay, DLDevice dev,
                             const struct ab_backend *be, void *stream, struct ab__tensor **out) {
  struct ab__tensor *t;
  ab_status st;
  AB_FORWARD(ab__tensor_new(dev, src->ndim, src->shape, src->dtype, &t));
  st = ab__tensor_alloc_data(t, be, lay->nbytes);
  if (st == AB_OK && lay->numel > 0) st = ab__dev_copy(be, src, &t->mt.dl_tensor, stream);
  if (st != AB_OK) {
    ab__tensor_discard(t);
    return st;
  }
  t->mt.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  *out = t;
  return AB_OK;
}

ab_status ab_convert_memory(const DLTensor *src, DLDevice target, const ab_convert_opts *opts,
                            DLManagedTensorVersioned **out) {
  ab_convert_opts o;
  ab__layout lay;
  const struct ab_backend *sbe, *tbe;
  DLDevice sdev, tdev;
  ab__plan plan;
  struct ab__tensor *t = NULL;

  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  AB_FORWARD(read_opts(opts, &o));
  AB_FORWARD(ab__check_tensor(src, "src", &lay));
  AB_FORWARD(ab__check_device(src->device, "src device", false, &sdev, &sbe));
  AB_FORWARD(ab__check_device(target, "target device", true, &tdev, &tbe));

  ab__route_query q = {
    .src = sdev,
    .dst = tdev,
    .src_caps = sbe->caps,
    .dst_caps = tbe->caps,
    .same_dtype = o.dtype.bits == 0 || dtype_eq(o.dtype, src->dtype),
    .src_compact = lay.compact,
    .copy = o.copy,
    .flags = o.flags,
  };
  AB_FORWARD(ab__plan_route(&q, &plan));

  /* Single-step plans only, until staged routes exist. */
  const ab__step *s = &plan.steps[0];
  if (plan.nsteps != 1) return AB_FAIL(AB_ERR_INTERNAL, "plan has %d steps; expected 1", plan.nsteps);
  if (s->kind == AB_STEP_VIEW) {
    AB_FORWARD(export_view(src, &lay, tdev, &t));
  } else {
    AB_FORWARD(export_copy(src, &lay, tdev, ab__backend_for(s->via), o.stream, &t));
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
  AB_FORWARD(ab__check_tensor(t, "tensor", &lay));
  return ab__check_device(t->device, "tensor device", false, NULL, NULL);
}
