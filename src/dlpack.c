/* Validation of DLPack input, and the DLManagedTensorVersioned objects the
 * library hands out: their layout, their deleter, and the legacy wrappers.
 * Nothing here reads tensor data. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dlpack.h"

/* Whether (code, bits) names a DLPack type at all, sub-byte ones included. */
static bool bits_valid(uint8_t code, unsigned bits) {
  switch (code) {
  case AB__CODE_INT:
  case AB__CODE_UINT:
    return bits == 1 || bits == 2 || bits == 4 || bits == 8 || bits == 16 || bits == 32 || bits == 64;
  case AB__CODE_FLOAT: return bits == 16 || bits == 32 || bits == 64;
  case AB__CODE_BFLOAT: return bits == 16;
  case AB__CODE_COMPLEX: return bits == 32 || bits == 64 || bits == 128;
  case AB__CODE_BOOL: return bits == 8;
  case AB__CODE_FLOAT6_E2M3FN:
  case AB__CODE_FLOAT6_E3M2FN: return bits == 6;
  case AB__CODE_FLOAT4_E2M1FN: return bits == 4;
  default: return code >= AB__CODE_FLOAT8_FIRST && code <= AB__CODE_FLOAT8_LAST && bits == 8;
  }
}

/* The word after `what` in ab__check_dtype's messages: "src dtype int4
 * ...", but "opts->dtype int4 ...", not "opts->dtype dtype". Asked only
 * on the way to an error (every conversion checks its dtypes). */
static const char *dtype_word(const char *what) {
  const size_t wl = strlen(what);
  return wl >= 5 && strcmp(what + wl - 5, "dtype") == 0 ? "" : " dtype";
}

ab_status ab__check_dtype(DLDataType dt, const char *what, size_t *elsize) {
  char name[48];
  if (dt.code >= AB__CODE_COUNT)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "%s%s code %u is not a DLPack type code (known: 0..%d)",
                   what, dtype_word(what), (unsigned)dt.code, AB__CODE_COUNT - 1);
  if (dt.bits == 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s%s %s has bits == 0", what, dtype_word(what),
                   ab__dtype_code_name(dt.code));
  if (dt.lanes == 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s%s %s has lanes == 0", what, dtype_word(what),
                   ab_dtype_name(dt, name, sizeof name));
  if (dt.code == AB__CODE_OPAQUE)
    return AB_FAIL(AB_ERR_UNSUPPORTED,
                   "%s%s is an opaque handle, which has no meaning across memory spaces", what, dtype_word(what));
  if (dt.code == AB__CODE_BOOL && dt.bits != 8)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "%s%s bool has bits == %u; DLPack bool is 8 bits", what, dtype_word(what), (unsigned)dt.bits);
  if (!bits_valid(dt.code, dt.bits))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s%s %s does not exist (bad bits for code %s)",
                   what, dtype_word(what), ab_dtype_name(dt, name, sizeof name), ab__dtype_code_name(dt.code));
  /* Sub-byte elements (int4, float4_e2m1fn, float6) are real DLPack types
   * that this version cannot address element by element. */
  if (dt.bits % 8 != 0)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "%s%s %s is a sub-byte type, not supported", what, dtype_word(what),
                   ab_dtype_name(dt, name, sizeof name));
  *elsize = ab__elsize(dt);
  return AB_OK;
}

ab_status ab__check_shape(int32_t ndim, const int64_t *shape, DLDataType dtype,
                         const char *what, ab__layout *lay) {
  int64_t numel = 1, nbytes;
  size_t elsize;

  if (ndim < 0 || ndim > AB_MAX_NDIM)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s ndim is %" PRId32 "; must be in [0, %d]",
                   what, ndim, AB_MAX_NDIM);
  if (ndim > 0 && shape == NULL)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s shape is NULL with ndim %" PRId32, what, ndim);
  AB_FORWARD(ab__check_dtype(dtype, what, &elsize));
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s shape[%" PRId32 "] is %" PRId64 "; must be >= 0",
                     what, i, shape[i]);
    if (shape[i] == 0) numel = 0;
  }
  /* A zero-size tensor addresses no memory whatever its other dims are, so
   * the product (and its overflow check) is only taken when none is 0. */
  for (int32_t i = 0; numel != 0 && i < ndim; i++) {
    if (ab__mul_overflow_i64(numel, shape[i], &numel))
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s element count overflows int64 at shape[%" PRId32 "] = %" PRId64,
                     what, i, shape[i]);
  }
  if (ab__mul_overflow_i64(numel, (int64_t)elsize, &nbytes))
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s byte size (%" PRId64 " elements x %zu bytes) overflows",
                   what, numel, elsize);
  if ((uint64_t)nbytes > SIZE_MAX) /* a 32-bit target */
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "%s byte size (%" PRId64 " bytes) is more than a %zu-bit process can address", what, nbytes,
                   8 * sizeof(size_t));
  /* Field by field into *lay: a local struct copied out whole was read back
   * with wide loads right after its narrow stores, a store-forwarding stall
   * that cost ~10% of a small conversion (perf). */
  lay->elsize = elsize;
  lay->numel = numel;
  lay->nbytes = (size_t)nbytes;
  lay->compact = true;
  lay->min_off = 0;
  lay->max_off = numel > 0 ? nbytes - (int64_t)elsize : 0;
  return AB_OK;
}

ab_status ab__check_tensor(const DLTensor *t, const char *what, ab__layout *lay) {
  if (t == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  AB_FORWARD(ab__check_shape(t->ndim, t->shape, t->dtype, what, lay));
  const int64_t numel = lay->numel;
  const size_t elsize = lay->elsize;
  if (numel > 0) {
    if (t->data == NULL)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s->data is NULL but the tensor has %" PRId64 " elements",
                     what, numel);
    int64_t min_off = 0, max_off = lay->max_off;
    if (t->strides != NULL) {
      int64_t expect = 1;
      bool compact = true;
      max_off = 0;
      for (int32_t i = t->ndim - 1; i >= 0; i--) {
        int64_t n = t->shape[i], s = t->strides[i], span;
        if (n == 1) continue; /* a size-1 dim may carry any stride */
        if (s != expect) compact = false;
        if (ab__mul_overflow_i64(n - 1, s, &span) ||
            ab__mul_overflow_i64(span, (int64_t)elsize, &span) ||
            (span >= 0 ? ab__add_overflow_i64(max_off, span, &max_off)
                       : ab__add_overflow_i64(min_off, span, &min_off)))
          return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                         "%s byte extent overflows int64 at dim %" PRId32 " (shape %" PRId64 ", stride %" PRId64 ")",
                         what, i, n, s);
        expect *= n; /* cannot overflow: bounded by numel */
      }
      lay->compact = compact;
    }
    /* The addressed range must be one that an object can span (at most
     * PTRDIFF_MAX bytes, so the gather's pointer arithmetic is defined) and
     * must not wrap around the address space: the process's, which is
     * 2^32 bytes in a 32-bit build, where data + byte_offset is computed in
     * pointers, and whose top byte no object holds (its one-past-the-end
     * pointer would be 0), as 2^64's is refused below. The backends whose
     * data is a handle (OpenCL cl_mem) check offsets within the buffer
     * themselves; the bound applies to them too, which in a 32-bit process
     * refuses a handle plus an offset past 4 GiB. */
    uint64_t base = (uint64_t)(uintptr_t)t->data, start, end, span;
    /* max_off >= 0 >= min_off, so the difference fits in uint64 */
    if (__builtin_add_overflow((uint64_t)max_off - (uint64_t)min_off, (uint64_t)elsize, &span) ||
        span > (uint64_t)PTRDIFF_MAX || t->byte_offset > (uint64_t)INT64_MAX ||
        __builtin_add_overflow(base, t->byte_offset, &start) ||
        __builtin_add_overflow(start, (uint64_t)max_off + elsize, &end) ||
#if UINTPTR_MAX < UINT64_MAX
        end > (uint64_t)UINTPTR_MAX ||
#endif
        (uint64_t)0 - (uint64_t)min_off > start)
      return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                     "%s addresses bytes outside any possible buffer (data %p, byte_offset %" PRIu64
                     ", extent [%" PRId64 ", %" PRId64 "] + %zu)",
                     what, t->data, t->byte_offset, min_off, max_off, elsize);
    lay->min_off = min_off;
    lay->max_off = max_off;
  }
  return AB_OK;
}

/* ---- tensors the library owns ----------------------------------------- */

static void tensor_deleter(DLManagedTensorVersioned *self) {
  if (self != NULL) ab__tensor_discard((struct ab__tensor *)self);
}

void ab__tensor_discard(struct ab__tensor *t) {
  if (t == NULL) return;
  ab__block *b = t->block;
  const bool in_block = b != NULL && (void *)t == (void *)b->room; /* read before b goes back */
  if (b != NULL) ab__pool_free(b);
  if (!in_block) ab__free(t);
}

/* The most dims whose shape and strides fit in a block's room beside the
 * struct. */
#define ROOM_DIMS ((AB_BLOCK_ROOM - sizeof(struct ab__tensor)) / (2 * sizeof(int64_t)))
_Static_assert(sizeof(struct ab__tensor) + 4 * 2 * sizeof(int64_t) <= AB_BLOCK_ROOM,
               "a block's room holds a tensor of 4 dims");

/* The header of a tensor at t, which has room for ndim dims. */
static void init_header(struct ab__tensor *t, DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType dtype) {
  int64_t *sh = t->dims, *st = t->dims + ndim, stride = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    sh[i] = shape[i];
    st[i] = stride;
    /* Only an empty tensor can overflow here (validation skips the product
     * of its other dims); its strides address nothing, so saturate. */
    if (ab__mul_overflow_i64(stride, shape[i] > 1 ? shape[i] : 1, &stride)) stride = INT64_MAX;
  }
  /* Field by field: a memset of the struct first compiled to `rep stos`,
   * whose start-up was a tenth of a 4 KiB conversion (perf). */
  t->mt.version.major = DLPACK_MAJOR_VERSION;
  t->mt.version.minor = DLPACK_MINOR_VERSION;
  t->mt.manager_ctx = t;
  t->mt.deleter = tensor_deleter;
  t->mt.flags = 0;
  t->mt.dl_tensor = (DLTensor){.data = NULL, .device = dev, .ndim = ndim, .dtype = dtype,
                               .shape = ndim > 0 ? sh : NULL, .strides = ndim > 0 ? st : NULL, .byte_offset = 0};
  t->block = NULL;
}

ab_status ab__tensor_new(DLDevice dev, int32_t ndim, const int64_t *shape,
                         DLDataType dtype, struct ab__tensor **out) {
  size_t extra = 2 * (size_t)ndim * sizeof(int64_t);
  struct ab__tensor *t = ab__malloc(sizeof *t + extra);
  if (t == NULL)
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory for a tensor header",
                   sizeof *t + extra);
  init_header(t, dev, ndim, shape, dtype);
  *out = t;
  return AB_OK;
}

ab_status ab__tensor_create(DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType dtype,
                            const struct ab_backend *be, size_t nbytes, struct ab__tensor **out) {
  struct ab__tensor *t = NULL;
  ab__block *b = NULL;
  if (nbytes > 0 && ndim >= 0 && (size_t)ndim <= ROOM_DIMS) {
    AB_FORWARD(ab__pool_alloc(be, dev, nbytes, &b));
    t = (struct ab__tensor *)(void *)b->room;
    init_header(t, dev, ndim, shape, dtype);
  } else {
    AB_FORWARD(ab__tensor_new(dev, ndim, shape, dtype, &t));
    if (nbytes == 0) {
      *out = t;
      return AB_OK;
    }
    ab_status st = ab__pool_alloc(be, dev, nbytes, &b);
    if (st != AB_OK) {
      ab__free(t);
      return st;
    }
  }
  t->block = b;
  t->mt.dl_tensor.data = b->ptr;
  *out = t;
  return AB_OK;
}

/* ---- legacy wrappers --------------------------------------------------- */

/* A versioned tensor that owns a legacy one, and the reverse. Each deleter
 * runs the wrapped tensor's deleter once and frees the wrapper. */
struct from_legacy {
  DLManagedTensorVersioned v;
  DLManagedTensor *orig;
};
struct to_legacy {
  DLManagedTensor l;
  DLManagedTensorVersioned *orig;
};

static void from_legacy_deleter(DLManagedTensorVersioned *self) {
  struct from_legacy *w = (struct from_legacy *)self;
  if (w->orig->deleter != NULL) w->orig->deleter(w->orig);
  ab__free(w);
}

static void to_legacy_deleter(DLManagedTensor *self) {
  struct to_legacy *w = (struct to_legacy *)self;
  if (w->orig->deleter != NULL) w->orig->deleter(w->orig);
  ab__free(w);
}

ab_status ab_from_legacy(DLManagedTensor *legacy, DLManagedTensorVersioned **out) {
  if (legacy == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "legacy is NULL");
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  /* Undo our own to_legacy wrapper instead of stacking a second one, so
   * tensors that ping-pong between old and new consumers stay one level. */
  if (legacy->deleter == to_legacy_deleter) {
    struct to_legacy *w = (struct to_legacy *)legacy;
    DLManagedTensorVersioned *orig = w->orig;
    orig->dl_tensor = w->l.dl_tensor;
    ab__free(w);
    *out = orig;
    return AB_OK;
  }
  struct from_legacy *w = ab__malloc(sizeof *w);
  if (w == NULL) return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a versioned wrapper", sizeof *w);
  memset(w, 0, sizeof *w);
  w->v.version.major = DLPACK_MAJOR_VERSION;
  w->v.version.minor = DLPACK_MINOR_VERSION;
  w->v.manager_ctx = w;
  w->v.deleter = from_legacy_deleter;
  w->v.flags = 0;
  w->v.dl_tensor = legacy->dl_tensor;
  w->orig = legacy;
  *out = &w->v;
  return AB_OK;
}

ab_status ab_to_legacy(DLManagedTensorVersioned *versioned, DLManagedTensor **out) {
  if (versioned == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "versioned is NULL");
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  if (versioned->version.major != 1)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "versioned tensor has DLPack major version %u; only 1 is understood",
                   (unsigned)versioned->version.major);
  if (versioned->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "versioned tensor is read-only, which a legacy DLManagedTensor cannot express");
  /* DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (DLPack 1.1; by value, as
   * the 1.0 header lacks the name): the layout legacy readers would misread. */
  if (versioned->flags & (UINT64_C(1) << 2))
    return AB_FAIL(AB_ERR_UNSUPPORTED, "versioned tensor has padded sub-byte elements (IS_SUBBYTE_TYPE_PADDED), which a legacy DLManagedTensor cannot express");
  if (versioned->deleter == from_legacy_deleter) {
    struct from_legacy *w = (struct from_legacy *)versioned;
    DLManagedTensor *orig = w->orig;
    orig->dl_tensor = w->v.dl_tensor;
    ab__free(w);
    *out = orig;
    return AB_OK;
  }
  struct to_legacy *w = ab__malloc(sizeof *w);
  if (w == NULL) return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a legacy wrapper", sizeof *w);
  memset(w, 0, sizeof *w);
  w->l.dl_tensor = versioned->dl_tensor;
  w->l.manager_ctx = w;
  w->l.deleter = to_legacy_deleter;
  w->orig = versioned;
  *out = &w->l;
  return AB_OK;
}
