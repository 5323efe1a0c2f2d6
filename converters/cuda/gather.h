/* Strided gather on a CUDA device (gather.cu): any-strided N-d array ->
 * compact row-major copy, one thread per element. Called by the CUDA
 * backend for device-side packing, so that padding never crosses PCIe. */
#ifndef AB_CONVERTERS_CUDA_GATHER_H
#define AB_CONVERTERS_CUDA_GATHER_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

/* A NULL stream is the legacy default stream here, as the header
 * promises; a per-thread default stream build (nvcc --default-stream
 * per-thread) would make it the calling thread's stream instead, with
 * other ordering (found in review). */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "arraybridge's CUDA code takes a NULL stream as the legacy default stream: build it without --default-stream per-thread or CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Dimensions the kernel takes, after the caller merged contiguous ones
 * (ab__merge_dims); AB_MAX_NDIM, so every valid tensor fits. */
#define AB_CUDA_GATHER_MAX_DIMS 64

/* Queues the gather of the array at `src` (device memory of the current
 * device) into the compact `dst` on `stream`, and returns the launch's
 * error. shape[i] > 0 and byte_strides[i] as ab__host_gather takes them
 * (any sign, 0 for broadcast), ndim <= AB_CUDA_GATHER_MAX_DIMS. Moves in
 * the widest word (8, 4, 2 or 1 bytes) that divides the element size,
 * both addresses and every stride, so the copy is bit-exact for every
 * dtype. Does not wait for the stream. */
cudaError_t ab__cuda_gather(void *dst, const void *src, int ndim, const int64_t *shape, const int64_t *byte_strides,
                            size_t elsize, cudaStream_t stream);

/* cudaSuccess when the current device can run the kernel (there is code
 * for its architecture), else the reason (cudaErrorNoKernelImageForDevice). */
cudaError_t ab__cuda_gather_available(void);

/* The kernel's per-element mapping and word choice run on the host, over
 * host memory: what the tests check where there is no GPU. */
void ab__cuda_gather_emulate(void *dst, const void *src, int ndim, const int64_t *shape,
                             const int64_t *byte_strides, size_t elsize);

#ifdef __cplusplus
}
#endif

#endif
