/* Element facts that hold on every device, written once (element.c): the
 * size of an element, compactness, the merging of dims into the fewest
 * strided runs, rectangle transfers, and dtype names (public:
 * ab_dtype_name, ab_parse_dtype). Used by the core, every backend and the
 * host converters; the cast rules are converters/host/convert.h. */
#ifndef AB_ELEMENT_H
#define AB_ELEMENT_H

#include "internal.h"

/* DLPack type codes by number: the values are part of the DLPack ABI, and
 * naming them here lets a 1.0 header (which lacks the float8 names) still
 * accept tensors from 1.1+ producers. */
enum {
  AB__CODE_INT = 0, AB__CODE_UINT = 1, AB__CODE_FLOAT = 2, AB__CODE_OPAQUE = 3, AB__CODE_BFLOAT = 4,
  AB__CODE_COMPLEX = 5, AB__CODE_BOOL = 6,
  AB__CODE_FLOAT8_FIRST = 7, /* e3m4, e4m3, e4m3b11fnuz, e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu */
  AB__CODE_FLOAT8_LAST = 14,
  AB__CODE_FLOAT6_E2M3FN = 15, AB__CODE_FLOAT6_E3M2FN = 16, AB__CODE_FLOAT4_E2M1FN = 17,
  AB__CODE_COUNT = 18
};

/* DLPack's name of a type code ("int", "bfloat", "float8_e4m3fn"), NULL
 * for a code it does not define. */
const char *ab__dtype_code_name(uint8_t code);

/* Bytes per element: bits / 8 per lane (the validated dtypes are whole
 * bytes). */
static inline size_t ab__elsize(DLDataType dt) { return (size_t)(dt.bits / 8u) * dt.lanes; }

/* 0-4 for element widths of 1, 2, 4, 8 and 16 bytes (the widths that
 * kernels specialise for), -1 for any other. */
static inline int ab__width_index(size_t w) {
  switch (w) {
  case 1: return 0;
  case 2: return 1;
  case 4: return 2;
  case 8: return 3;
  case 16: return 4;
  default: return -1;
  }
}

/* Whether t is row-major compact: no strides, or strides equal to the
 * compact ones on every dim longer than 1 (a size-1 dim's stride says
 * nothing). Shape and strides must be valid. */
static inline bool ab__is_compact(const DLTensor *t) {
  int64_t expect = 1;
  for (int32_t i = t->ndim; i-- > 0;) {
    if (t->strides != NULL && t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

/* The number of elements of a valid tensor. */
static inline int64_t ab__numel(const DLTensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* Drops size-1 dims and merges each dim into its outer neighbour when the
 * two are contiguous (outer stride == inner stride * inner size, checked
 * for overflow), in whatever unit the strides are given. Writes the dims
 * left, outermost first, and returns how many. Every layout-specialised
 * path (the host gather, rectangle transfers, the device kernels) starts
 * here. */
int ab__merge_dims(int32_t ndim, const int64_t *shape, const int64_t *strides, int64_t *out_shape,
                   int64_t *out_strides);
/* The same for two arrays of strides over one shape (a source and an
 * output): dims merge where both are contiguous. strides2 NULL: as
 * ab__merge_dims (out_strides2 is then not written). */
int ab__merge_dims2(int32_t ndim, const int64_t *shape, const int64_t *strides, const int64_t *strides2,
                    int64_t *out_shape, int64_t *out_strides, int64_t *out_strides2);

/* Whether this tensor's layout is one rectangle transfer: rows of
 * contiguous bytes (up to 3-D after merging dims, positive strides, rows
 * and slices not overlapping, the slice pitch a multiple of the row pitch),
 * starting at data + byte_offset. Fills rect when it is. Whether a backend
 * can do rectangles is its read_rect / write_rect. */
typedef struct ab__rect {
  size_t region[3];
  size_t row_pitch, slice_pitch;
} ab__rect;
bool ab__rect_of(const DLTensor *t, size_t elsize, ab__rect *rect);

#endif /* AB_ELEMENT_H */
