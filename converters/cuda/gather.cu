/* Strided gather kernel for CUDA devices; see gather.h. Element e of the
 * compact destination comes from the source element whose index is e's
 * row-major decomposition, the same mapping as the host gather and the
 * OpenCL kernel (converters/opencl/gather.cl). */
#include "gather.h"

namespace {

struct desc {
  int ndim;
  int words; /* words of `word` bytes per element */
  int64_t shape[AB_CUDA_GATHER_MAX_DIMS];
  int64_t stride[AB_CUDA_GATHER_MAX_DIMS]; /* bytes */
};

__host__ __device__ inline int64_t source_offset(const desc &d, int64_t e) {
  int64_t off = 0;
  for (int k = d.ndim - 1; k >= 0; k--) {
    int64_t q = e / d.shape[k];
    off += (e - q * d.shape[k]) * d.stride[k];
    e = q;
  }
  return off;
}

template <typename W>
__host__ __device__ inline void move_element(W *dst, const char *src, const desc &d, int64_t e) {
  const W *s = reinterpret_cast<const W *>(src + source_offset(d, e));
  W *o = dst + e * d.words;
  for (int w = 0; w < d.words; w++) o[w] = s[w];
}

template <typename W>
__global__ void gather_kernel(W *dst, const char *src, desc d, int64_t n) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) move_element(dst, src, d, e);
}

/* Fills d and returns the word size, or 0 when the arguments are out of
 * range; *n gets the element count. */
size_t describe(desc &d, int64_t &n, const void *dst, const void *src, int ndim, const int64_t *shape,
                const int64_t *byte_strides, size_t elsize) {
  if (ndim < 0 || ndim > AB_CUDA_GATHER_MAX_DIMS || elsize == 0) return 0;
  uint64_t bits = elsize | (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src;
  d.ndim = ndim;
  n = 1;
  for (int k = 0; k < ndim; k++) {
    d.shape[k] = shape[k];
    d.stride[k] = byte_strides[k];
    bits |= (uint64_t)byte_strides[k];
    n *= shape[k];
  }
  size_t word = (bits & 7) == 0 ? 8 : (bits & 3) == 0 ? 4 : (bits & 1) == 0 ? 2 : 1;
  d.words = (int)(elsize / word);
  return word;
}

template <typename W>
cudaError_t launch(void *dst, const void *src, const desc &d, int64_t n, cudaStream_t stream) {
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const unsigned blocks = (unsigned)(want < 65535 * 16 ? want : 65535 * 16); /* grid-stride beyond */
  /* cudaLaunchKernel returns this launch's own error; after <<<>>>,
   * cudaGetLastError would also report one the application left pending in
   * a runtime it shares with us (cudart_static), as if it were ours. */
  W *to = static_cast<W *>(dst);
  const char *from = static_cast<const char *>(src);
  desc dd = d;
  int64_t count = n;
  void *args[] = {&to, &from, &dd, &count};
  return cudaLaunchKernel(reinterpret_cast<const void *>(&gather_kernel<W>), dim3(blocks), dim3(threads), args, 0,
                          stream);
}

template <typename W>
void emulate(void *dst, const void *src, const desc &d, int64_t n) {
  for (int64_t e = 0; e < n; e++) move_element(static_cast<W *>(dst), static_cast<const char *>(src), d, e);
}

} // namespace

extern "C" cudaError_t ab__cuda_gather(void *dst, const void *src, int ndim, const int64_t *shape,
                                       const int64_t *byte_strides, size_t elsize, cudaStream_t stream) {
  desc d;
  int64_t n;
  switch (describe(d, n, dst, src, ndim, shape, byte_strides, elsize)) {
  case 0: return cudaErrorInvalidValue;
  case 8: return n ? launch<uint64_t>(dst, src, d, n, stream) : cudaSuccess;
  case 4: return n ? launch<uint32_t>(dst, src, d, n, stream) : cudaSuccess;
  case 2: return n ? launch<uint16_t>(dst, src, d, n, stream) : cudaSuccess;
  default: return n ? launch<uint8_t>(dst, src, d, n, stream) : cudaSuccess;
  }
}

extern "C" void ab__cuda_gather_emulate(void *dst, const void *src, int ndim, const int64_t *shape,
                                        const int64_t *byte_strides, size_t elsize) {
  desc d;
  int64_t n;
  switch (describe(d, n, dst, src, ndim, shape, byte_strides, elsize)) {
  case 0: return;
  case 8: emulate<uint64_t>(dst, src, d, n); return;
  case 4: emulate<uint32_t>(dst, src, d, n); return;
  case 2: emulate<uint16_t>(dst, src, d, n); return;
  default: emulate<uint8_t>(dst, src, d, n); return;
  }
}

extern "C" cudaError_t ab__cuda_gather_available(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, gather_kernel<uint8_t>);
}
