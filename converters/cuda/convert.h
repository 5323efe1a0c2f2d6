/* Conversions on a CUDA device (convert.cu), by the rules of
 * converters/host/convert.h, from uint8, int8, uint16, int16, bool,
 * float16, bfloat16 and float32 sources, with an optional affine map (per
 * tensor, or per channel for at most 16 channels) and any axis order:
 *  - into float32 (the widening way in), float16 and bfloat16, in float32
 *    arithmetic with __fmul_rn/__fadd_rn, then (float16, bfloat16) one
 *    rounding to nearest even;
 *  - into uint8, int8, uint16 and int16 (the narrowing way out), in
 *    float64 arithmetic with __dmul_rn/__dadd_rn, then round half to even,
 *    saturate, NaN -> 0.
 * Multiply then add, never fused: bit-exact with the host, NaN payloads
 * aside. A float16 or bfloat16 permutation without a map is left to the
 * host's gather (it would quiet signalling NaNs). The OpenCL kernels
 * (converters/opencl/convert.cl) cover the same cases, the narrowing ones
 * only where the device has doubles. They take the ab__convert_args the
 * host converter takes. */
#ifndef AB_CONVERTERS_CUDA_CONVERT_H
#define AB_CONVERTERS_CUDA_CONVERT_H

#include <cuda_runtime_api.h>

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
