/* Conversion kernels for CUDA devices; see convert.h. Element e of the
 * compact result comes from the source element at e's row-major
 * decomposition over the result's shape, dotted with the source's element
 * strides (already in the result's axis order): the same mapping as the
 * host converter and converters/opencl/convert.cl. */
#include <math.h>
#include <string.h>

#include "convert.h"

namespace {

enum kind { K_U8, K_I8, K_U16, K_I16, K_BOOL, K_F16, K_BF16, K_F32, K_NONE };

/* Result types: float32, float16 or bfloat16 (float32 arithmetic, then
 * one rounding to nearest even), or an integer of at most 16 bits (float64
 * arithmetic, round half to even, saturate, NaN -> 0). */
enum out { O_F32, O_F16, O_BF16, O_U8, O_I8, O_U16, O_I16, O_NONE };

constexpr int kMaxChannels = 16;

struct desc {
  int ndim, kind, out, affine, chan; /* chan: result axis of the per-channel map, -1 for a[0], b[0] */
  int64_t shape[AB_MAX_NDIM];
  int64_t stride[AB_MAX_NDIM]; /* elements */
  float a[kMaxChannels], b[kMaxChannels];      /* O_F32 */
  double ad[kMaxChannels], bd[kMaxChannels];   /* integer results */
};

int out_of(DLDataType d) {
  if (d.lanes != 1) return O_NONE;
  if (d.code == kDLFloat && d.bits == 32) return O_F32;
  if (d.code == kDLFloat && d.bits == 16) return O_F16;
  if (d.code == kDLBfloat && d.bits == 16) return O_BF16;
  if (d.code == kDLUInt) return d.bits == 8 ? O_U8 : d.bits == 16 ? O_U16 : O_NONE;
  if (d.code == kDLInt) return d.bits == 8 ? O_I8 : d.bits == 16 ? O_I16 : O_NONE;
  return O_NONE;
}

int kind_of(DLDataType d) {
  if (d.lanes != 1) return K_NONE;
  switch (d.code) {
  case kDLUInt: return d.bits == 8 ? K_U8 : d.bits == 16 ? K_U16 : K_NONE;
  case kDLInt: return d.bits == 8 ? K_I8 : d.bits == 16 ? K_I16 : K_NONE;
  case kDLBool: return d.bits == 8 ? K_BOOL : K_NONE;
  case kDLFloat: return d.bits == 16 ? K_F16 : d.bits == 32 ? K_F32 : K_NONE;
  case kDLBfloat: return d.bits == 16 ? K_BF16 : K_NONE;
  default: return K_NONE;
  }
}

__host__ __device__ inline float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* IEEE half to float: exact (every half is a float); NaN keeps its payload. */
__host__ __device__ inline float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return from_bits(s | 0x7f800000u | (m << 13));
  if (e != 0) return from_bits(s | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return from_bits(s);
  uint32_t sh = 0; /* a subnormal half m * 2^-24 is a normal float */
  while (!(m & 0x400u)) {
    m <<= 1;
    sh++;
  }
  return from_bits(s | ((113u - sh) << 23) | ((m & 0x3ffu) << 13));
}

__host__ __device__ inline uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* float to IEEE half, rounding to nearest even: overflow to infinity,
 * halves' subnormals kept, NaN kept (quiet). */
__host__ __device__ inline uint16_t half_from_float(float f) {
  const uint32_t u = to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to infinity */
  if (a >= 0x38800000u) {                                  /* a normal half: rebias, round at bit 13 */
    const uint32_t r = a - 0x38000000u;
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return (uint16_t)sign; /* up to 2^-25, the tie, rounds to zero */
  /* a subnormal half: k units of 2^-24, k = m * 2^(e - 126) */
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
  uint32_t k = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u))) k++;
  return (uint16_t)(sign | k); /* k may reach 0x400: the smallest normal */
}

/* float to bfloat16, rounding to nearest even on the top 16 bits. */
__host__ __device__ inline uint16_t bf16_from_float(float f) {
  uint32_t u = to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__host__ __device__ inline float load(int kind, const void *src, int64_t i) {
  switch (kind) {
  case K_U8: return (float)static_cast<const uint8_t *>(src)[i];
  case K_I8: return (float)static_cast<const int8_t *>(src)[i];
  case K_U16: return (float)static_cast<const uint16_t *>(src)[i];
  case K_I16: return (float)static_cast<const int16_t *>(src)[i];
  case K_BOOL: return static_cast<const uint8_t *>(src)[i] != 0 ? 1.0f : 0.0f;
  case K_F16: return half_to_float(static_cast<const uint16_t *>(src)[i]);
  case K_BF16: return from_bits((uint32_t)static_cast<const uint16_t *>(src)[i] << 16);
  default: return static_cast<const float *>(src)[i];
  }
}

__host__ __device__ inline float affine(float y, float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(y, a), b); /* two roundings: never an fma */
#else
  volatile float t = y * a; /* the emulation: no contraction either */
  return t + b;
#endif
}

__host__ __device__ inline double affine(double y, double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(__dmul_rn(y, a), b);
#else
  volatile double t = y * a;
  return t + b;
#endif
}

/* Where result element e comes from: its row-major decomposition over the
 * result's shape, dotted with the source's element strides; *c is its
 * index along the per-channel axis. */
__host__ __device__ inline int64_t source_offset(const desc &d, int64_t e, int64_t *c) {
  int64_t rem = e, off = 0;
  *c = 0;
  for (int k = d.ndim - 1; k >= 0; k--) {
    int64_t q = rem / d.shape[k], i = rem - q * d.shape[k];
    off += i * d.stride[k];
    if (k == d.chan) *c = i;
    rem = q;
  }
  return off;
}

/* The results of float32 arithmetic: float32, float16, bfloat16. */
__host__ __device__ inline void float32_element(void *dst, const void *src, const desc &d, int64_t e) {
  int64_t c;
  float y = load(d.kind, src, source_offset(d, e, &c));
  if (d.affine) y = affine(y, d.a[c], d.b[c]);
  if (d.out == O_F16) static_cast<uint16_t *>(dst)[e] = half_from_float(y);
  else if (d.out == O_BF16) static_cast<uint16_t *>(dst)[e] = bf16_from_float(y);
  else static_cast<float *>(dst)[e] = y;
}

/* The host's float -> integer rule. Every source value is exact as a
 * double; clamping before rounding gives the same result as after, since
 * the bounds are integers. */
template <typename T>
__host__ __device__ inline void narrow_element(T *dst, const void *src, const desc &d, int64_t e, double lo, double hi) {
  int64_t c;
  double y = (double)load(d.kind, src, source_offset(d, e, &c));
  if (d.affine) y = affine(y, d.ad[c], d.bd[c]);
  dst[e] = y != y ? (T)0 : y <= lo ? (T)lo : y >= hi ? (T)hi : (T)rint(y); /* rint: half to even */
}

__global__ void float32_kernel(void *dst, const void *src, desc d, int64_t n) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) float32_element(dst, src, d, e);
}

template <typename T>
__global__ void narrow_kernel(T *dst, const void *src, desc d, int64_t n, double lo, double hi) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step)
    narrow_element(dst, src, d, e, lo, hi);
}

/* Fills d from a; false when the kernels do not take it. */
bool describe(const ab__convert_args *a, desc &d, int64_t &n) {
  const ab__cast_op &op = a->op;
  if (a->ndim < 0 || a->ndim > AB_MAX_NDIM) return false;
  d.out = out_of(op.to);
  d.kind = kind_of(op.from);
  if (d.out == O_NONE || d.kind == K_NONE) return false;
  /* A permutation of float16 or bfloat16 goes through float and back,
   * which would quiet a signalling NaN the host's gather keeps as it is. */
  if ((d.out == O_F16 || d.out == O_BF16) && !op.affine && op.from.code == op.to.code && op.from.bits == op.to.bits)
    return false;
  const bool per_channel = op.affine && op.channel_dim >= 0;
  if (per_channel && (op.channel_dim >= a->ndim || a->shape[op.channel_dim] > kMaxChannels)) return false;
  d.ndim = a->ndim;
  d.affine = op.affine ? 1 : 0;
  d.chan = per_channel ? op.channel_dim : -1;
  n = 1;
  for (int k = 0; k < a->ndim; k++) {
    d.shape[k] = a->shape[k];
    d.stride[k] = a->stride[k];
    n *= a->shape[k];
  }
  for (int c = 0; c < kMaxChannels; c++) {
    d.ad[c] = 1.0;
    d.bd[c] = 0.0;
  }
  if (per_channel) {
    for (int64_t c = 0; c < a->shape[op.channel_dim]; c++) {
      d.ad[c] = op.channel_scale ? op.channel_scale[c] : 1.0;
      d.bd[c] = op.channel_offset ? op.channel_offset[c] : 0.0;
    }
  } else {
    d.ad[0] = op.scale;
    d.bd[0] = op.offset;
  }
  for (int c = 0; c < kMaxChannels; c++) { /* the float32 arithmetic's coefficients */
    d.a[c] = (float)d.ad[c];
    d.b[c] = (float)d.bd[c];
  }
  return true;
}

/* An integer result type's range. */
template <typename T> struct range;
template <> struct range<uint8_t> { static constexpr double lo = 0, hi = 255; };
template <> struct range<int8_t> { static constexpr double lo = -128, hi = 127; };
template <> struct range<uint16_t> { static constexpr double lo = 0, hi = 65535; };
template <> struct range<int16_t> { static constexpr double lo = -32768, hi = 32767; };

unsigned grid_for(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return (unsigned)(want < 65535 * 16 ? want : 65535 * 16); /* grid-stride beyond */
}

template <typename T> void launch_narrow(void *dst, const void *src, const desc &d, int64_t n, cudaStream_t stream) {
  narrow_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<T *>(dst), src, d, n, range<T>::lo, range<T>::hi);
}

template <typename T> void emulate_narrow(void *dst, const void *src, const desc &d, int64_t n) {
  for (int64_t e = 0; e < n; e++) narrow_element(static_cast<T *>(dst), src, d, e, range<T>::lo, range<T>::hi);
}

} // namespace

extern "C" bool ab__cuda_convert_supported(const ab__convert_args *a) {
  desc d;
  int64_t n;
  return describe(a, d, n);
}

extern "C" cudaError_t ab__cuda_convert(void *dst, const void *src, const ab__convert_args *a, cudaStream_t stream) {
  desc d;
  int64_t n;
  if (!describe(a, d, n)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (d.out) {
  case O_U8: launch_narrow<uint8_t>(dst, src, d, n, stream); break;
  case O_I8: launch_narrow<int8_t>(dst, src, d, n, stream); break;
  case O_U16: launch_narrow<uint16_t>(dst, src, d, n, stream); break;
  case O_I16: launch_narrow<int16_t>(dst, src, d, n, stream); break;
  default: float32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, src, d, n);
  }
  return cudaGetLastError();
}

extern "C" void ab__cuda_convert_emulate(void *dst, const void *src, const ab__convert_args *a) {
  desc d;
  int64_t n;
  if (!describe(a, d, n)) return;
  switch (d.out) {
  case O_U8: emulate_narrow<uint8_t>(dst, src, d, n); break;
  case O_I8: emulate_narrow<int8_t>(dst, src, d, n); break;
  case O_U16: emulate_narrow<uint16_t>(dst, src, d, n); break;
  case O_I16: emulate_narrow<int16_t>(dst, src, d, n); break;
  default:
    for (int64_t e = 0; e < n; e++) float32_element(dst, src, d, e);
  }
}
