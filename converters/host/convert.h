/* Host element conversion: dtype cast, affine map and (through the strides
 * the caller passes) axis permutation, in one pass from any strided source
 * into a compact destination.
 *
 * The rules, shared by every device's implementation (docs/guide.md,
 * "Converting on the way"):
 *  - arithmetic: y = x * scale + offset, per tensor or per channel, as a
 *    multiply then an add (never fused). In float32 when the result is
 *    float32, float16 or bfloat16 and the source is none of float64,
 *    int32/64, uint32/64; in float64 otherwise.
 *  - float -> integer: round half to even, saturate to the type's range,
 *    NaN -> 0. integer -> integer (no affine): exact, saturating.
 *  - integer -> float (no affine): one rounding to nearest even from the
 *    integer itself, as a C cast (64-bit integers into float32, float16
 *    or bfloat16 are not rounded to a double first).
 *  - -> bool: nonzero (NaN included) is true. bool -> any: 0 or 1.
 *  - -> float16 / bfloat16: round to nearest even from the computed value,
 *    overflow to infinity, NaN stays NaN.
 *  - complex -> complex: each part cast as a float; no affine. Complex to
 *    or from anything else is not supported, nor are lanes > 1 unless
 *    nothing changes. */
#ifndef AB_CONVERTERS_HOST_CONVERT_H
#define AB_CONVERTERS_HOST_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arraybridge/arraybridge.h" /* AB_MAX_NDIM, DLPack */

#ifdef __cplusplus
extern "C" { /* converters/cuda includes this */
#endif

typedef struct ab__cast_op {
  DLDataType from, to;
  bool affine;           /* apply scale/offset (per tensor or per channel) */
  double scale, offset;  /* per tensor */
  int channel_dim;       /* dimension (of the shape passed) along which the
                            per-channel arrays run, -1 for none */
  const double *channel_scale, *channel_offset; /* NULL: 1 and 0 */
} ab__cast_op;

/* One conversion as every converter takes it (the host loop here, the
 * OpenCL kernels in converters/opencl/convert.cl): the result's shape, the
 * source's strides in elements listed in the result's axis order (the
 * permutation already applied), and the element op with channel_dim
 * counted in the result's axes. Built by the core (src/convert.c), so the
 * host and the devices read one description. */
typedef struct ab__convert_args {
  int32_t ndim;
  int64_t shape[AB_MAX_NDIM];
  int64_t stride[AB_MAX_NDIM];
  ab__cast_op op;
} ab__convert_args;

/* Whether the cast from -> to (with an affine map when `affine`) is one
 * the converters perform. */
bool ab__cast_supported(DLDataType from, DLDataType to, bool affine);
/* Whether float32 -> float16 runs the F16C loop (x86 with F16C, and
 * AB_HOST_F16C not 0). */
bool ab__host_f16c(void);

/* The arithmetic the rules above give a supported conversion: integers
 * exactly (no affine map, integer or bool both ways), float32, float64, or
 * complex parts; AB_ARITH_NONE for an unsupported pair. Every converter
 * (host loop, OpenCL and CUDA kernels) chooses its loop by this. */
typedef enum ab__arith { AB_ARITH_INT, AB_ARITH_FLOAT32, AB_ARITH_FLOAT64, AB_ARITH_COMPLEX, AB_ARITH_NONE } ab__arith;
ab__arith ab__cast_arith(DLDataType from, DLDataType to, bool affine);

/* Converts the ndim-dimensional array at `src` (byte strides, any sign)
 * into the row-major array `dst` of op->to elements, whose indices of
 * dim 0 are dst0 bytes apart (0: compact), every other dim compact within
 * (a band of rows of every plane of a larger output). The caller
 * validated the source, the op (ab__cast_supported) and the sizes.
 * ndim >= 2 where dst0 is not 0; dst0 a multiple of op->to's size. whole: the bytes the whole conversion this
 * call does a part of reads and writes, source and result (0: this
 * call's own), which decide how it writes (ab__host_cast_streams). */
void ab__host_convert_into(void *dst, int64_t dst0, const void *src, int32_t ndim, const int64_t *shape,
                           const int64_t *byte_strides, const ab__cast_op *op, size_t whole);

/* Whether a cast from -> to that reads and writes `whole` bytes in all
 * writes its result with streaming stores: from
 * ab__host_cast_stream_min() bytes, where a result element is more than
 * a quarter of a source element, or as AB_HOST_CAST_STREAMING (0 or 1)
 * says. Same bytes either way. */
bool ab__host_cast_streams(DLDataType from, DLDataType to, size_t whole);
/* That bound: the last-level cache's bytes (sysfs), 4 MiB at least and
 * 24 MiB at most (24 MiB where unknown); SIZE_MAX where the host has no
 * streaming stores (off x86-64). */
size_t ab__host_cast_stream_min(void);
/* How many calls of ab__host_convert_into (a conversion, or a thread's
 * band of one) have streamed rows out in this process (for the tests). */
uint64_t ab__host_cast_streamed_calls(void);

/* float16 / bfloat16 <-> wider floats, round to nearest even (exposed for
 * the tests' reference). */
uint16_t ab__half_from_double(double x);
uint16_t ab__half_from_float(float x);
double ab__half_to_double(uint16_t h);
uint16_t ab__bf16_from_double(double x);
uint16_t ab__bf16_from_float(float x);
double ab__bf16_to_double(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
