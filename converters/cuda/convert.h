/* Conversions on a CUDA device (convert.cu), by the rules of
 * converters/host/convert.h, between every one-lane dtype but complex
 * (bool, 8- to 64-bit integers, float16, bfloat16, float32, float64), with
 * an optional affine map (per tensor, or per channel for at most 16
 * channels) and any axis order, in the arithmetic ab__cast_arith gives
 * the pair:
 *  - float32 (8- and 16-bit integer, bool and 16/32-bit float sources into
 *    float32, float16, bfloat16): __fmul_rn/__fadd_rn, then (float16,
 *    bfloat16) one rounding to nearest even;
 *  - integers exactly (integer and bool pairs without a map), saturating;
 *  - float64 (everything else): __dmul_rn/__dadd_rn, then the host's own
 *    roundings (converters/host/rounding.h: half to even, saturation,
 *    NaN -> 0 for integers; one rounding for float16 and bfloat16).
 * Multiply then add, never fused (tests/ptx_check.cmake checks the PTX):
 * bit-exact with the host; which NaN as docs/guide.md says (the host's
 * without a map, but between float32 and float64). A float16 or bfloat16
 * permutation without a map is left to the host's gather (it would quiet
 * signalling NaNs); a bool permutation copies the bytes, as the gather
 * does. The OpenCL kernels (converters/opencl/convert.cl) cover the same
 * pairs, the float64 ones only where the device has doubles. They take
 * the ab__convert_args the host converter takes. */
#ifndef AB_CONVERTERS_CUDA_CONVERT_H
#define AB_CONVERTERS_CUDA_CONVERT_H

#include <cuda_runtime_api.h>

/* A NULL stream is the legacy default stream here, as the header
 * promises; a per-thread default stream build (nvcc --default-stream
 * per-thread) would make it the calling thread's stream instead, with
 * other ordering (found in review). */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "arraybridge's CUDA code takes a NULL stream as the legacy default stream: build it without --default-stream per-thread or CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#include "converters/host/convert.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels take `a`. */
bool ab__cuda_convert_supported(const ab__convert_args *a);

/* Queues the conversion from the source elements at `src` (device memory
 * of the current device, laid out as a's element strides say) into the
 * compact result `dst` (of a->op.to elements) on `stream`; returns the launch's error
 * (cudaErrorInvalidValue when !ab__cuda_convert_supported). Does not wait. */
cudaError_t ab__cuda_convert(void *dst, const void *src, const ab__convert_args *a, cudaStream_t stream);

/* The kernel's per-element code run on the host over host memory: what
 * the tests check where there is no GPU. */
void ab__cuda_convert_emulate(void *dst, const void *src, const ab__convert_args *a);

#ifdef __cplusplus
}
#endif

#endif
