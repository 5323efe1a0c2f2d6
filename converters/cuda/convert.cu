/* Conversion kernels for CUDA devices; see convert.h. Element e of the
 * compact result comes from the source element at e's row-major
 * decomposition over the result's shape, dotted with the source's element
 * strides (already in the result's axis order): the same mapping as the
 * host converter and converters/opencl/convert.cl. */
#include <stdint.h>
#include <string.h>

#include "convert.h"
#include "converters/host/rounding.h"

namespace {

/* Element kinds, of sources and results alike. */
enum kind { K_BOOL, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_F16, K_BF16, K_F32, K_F64, K_NONE };

/* The three element loops, by the arithmetic the rules give a pair
 * (ab__cast_arith): float32 for narrow sources into float32, float16 and
 * bfloat16 (then one rounding to nearest even); integers exactly for
 * integer and bool pairs without a map; float64 for everything else
 * (integer results: round half to even, saturate, NaN -> 0). */
enum family { FAM_FLOAT32, FAM_INT, FAM_FLOAT64 };

constexpr int kMaxChannels = 16;

struct desc {
  int ndim, kind, out, family, affine, chan; /* chan: result axis of the per-channel map, -1 for a[0], b[0] */
  int odd; /* into float32, float16 or bfloat16 without a map: 64-bit integers rounded once */
  int64_t shape[AB_MAX_NDIM];
  int64_t stride[AB_MAX_NDIM]; /* elements */
  float a[kMaxChannels], b[kMaxChannels];      /* FAM_FLOAT32 */
  double ad[kMaxChannels], bd[kMaxChannels];   /* FAM_FLOAT64 */
};

int kind_of(DLDataType d) {
  if (d.lanes != 1) return K_NONE;
  switch (d.code) {
  case kDLBool: return d.bits == 8 ? K_BOOL : K_NONE;
  case kDLInt: return d.bits == 8 ? K_I8 : d.bits == 16 ? K_I16 : d.bits == 32 ? K_I32 : d.bits == 64 ? K_I64 : K_NONE;
  case kDLUInt: return d.bits == 8 ? K_U8 : d.bits == 16 ? K_U16 : d.bits == 32 ? K_U32 : d.bits == 64 ? K_U64 : K_NONE;
  case kDLFloat: return d.bits == 16 ? K_F16 : d.bits == 32 ? K_F32 : d.bits == 64 ? K_F64 : K_NONE;
  case kDLBfloat: return d.bits == 16 ? K_BF16 : K_NONE;
  default: return K_NONE;
  }
}

__host__ __device__ inline float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* IEEE half to float: exact (every half is a float); a NaN keeps its
 * sign and payload and comes out quiet, as the host widens it
 * (docs/guide.md). */
__host__ __device__ inline float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return from_bits(s | 0x7f800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u));
  if (e != 0) return from_bits(s | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return from_bits(s);
  uint32_t sh = 0; /* a subnormal half m * 2^-24 is a normal float */
  while (!(m & 0x400u)) {
    m <<= 1;
    sh++;
  }
  return from_bits(s | ((113u - sh) << 23) | ((m & 0x3ffu) << 13));
}

/* bfloat16 to float: its top half; a NaN comes out quiet, as above. */
__host__ __device__ inline float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
  return from_bits(u);
}

/* A source element of a float32-arithmetic kind (8- and 16-bit integers,
 * bool, float16, bfloat16, float32): exact in float. */
__host__ __device__ inline float load(int kind, const void *src, int64_t i) {
  switch (kind) {
  case K_U8: return (float)static_cast<const uint8_t *>(src)[i];
  case K_I8: return (float)static_cast<const int8_t *>(src)[i];
  case K_U16: return (float)static_cast<const uint16_t *>(src)[i];
  case K_I16: return (float)static_cast<const int16_t *>(src)[i];
  case K_BOOL: return static_cast<const uint8_t *>(src)[i] != 0 ? 1.0f : 0.0f;
  case K_F16: return half_to_float(static_cast<const uint16_t *>(src)[i]);
  case K_BF16: return bf16_to_float(static_cast<const uint16_t *>(src)[i]);
  default: return static_cast<const float *>(src)[i];
  }
}

/* Any source element as a double: exact (float16 and bfloat16 NaNs as
 * the host widens them), but for 64-bit integers past
 * 2^53 rounded, to nearest even as the host's cast is, or with `odd` to
 * odd (rounding.h), so that one later rounding into a narrower float is
 * the only one. */
__host__ __device__ inline double load_double(int kind, const void *src, int64_t i, bool odd) {
  switch (kind) {
  case K_I32: return (double)static_cast<const int32_t *>(src)[i];
  case K_I64: {
    const int64_t v = static_cast<const int64_t *>(src)[i];
    return odd ? ab__i64_to_double_odd(v) : (double)v;
  }
  case K_U32: return (double)static_cast<const uint32_t *>(src)[i];
  case K_U64: {
    const uint64_t v = static_cast<const uint64_t *>(src)[i];
    return odd ? ab__u64_to_double_odd(v) : (double)v;
  }
  case K_F64: return static_cast<const double *>(src)[i];
  /* from the bits, as the host: a GPU's float -> double may not keep a NaN's payload */
  case K_F16: return ab__widen_to_double(static_cast<const uint16_t *>(src)[i], 10, 15, 31);
  case K_BF16: return ab__widen_to_double(static_cast<const uint16_t *>(src)[i], 7, 127, 255);
  default: return (double)load(kind, src, i);
  }
}

/* An integer or bool element: its value, or for a uint64 past INT64_MAX
 * its bits with `big` set (above every bound but uint64's). */
struct ival {
  int64_t v;
  bool big;
};

__host__ __device__ inline ival load_int(int kind, const void *src, int64_t i) {
  switch (kind) {
  case K_BOOL: return {static_cast<const uint8_t *>(src)[i] != 0 ? 1 : 0, false};
  case K_I8: return {static_cast<const int8_t *>(src)[i], false};
  case K_I16: return {static_cast<const int16_t *>(src)[i], false};
  case K_I32: return {static_cast<const int32_t *>(src)[i], false};
  case K_I64: return {static_cast<const int64_t *>(src)[i], false};
  case K_U8: return {static_cast<const uint8_t *>(src)[i], false};
  case K_U16: return {static_cast<const uint16_t *>(src)[i], false};
  case K_U32: return {static_cast<const uint32_t *>(src)[i], false};
  default: {
    const uint64_t u = static_cast<const uint64_t *>(src)[i];
    return {(int64_t)u, u > (uint64_t)INT64_MAX};
  }
  }
}

__host__ __device__ inline int64_t clamp(ival x, int64_t lo, int64_t hi) {
  return x.big || x.v > hi ? hi : x.v < lo ? lo : x.v;
}

template <typename T> __host__ __device__ inline void put(void *dst, int64_t e, T v) { static_cast<T *>(dst)[e] = v; }

/* Integers exactly, saturating (the host's integer path). */
__host__ __device__ inline void store_int(int out, void *dst, int64_t e, ival x) {
  switch (out) {
  case K_BOOL: put<uint8_t>(dst, e, x.big || x.v != 0); break;
  case K_I8: put<int8_t>(dst, e, (int8_t)clamp(x, INT8_MIN, INT8_MAX)); break;
  case K_I16: put<int16_t>(dst, e, (int16_t)clamp(x, INT16_MIN, INT16_MAX)); break;
  case K_I32: put<int32_t>(dst, e, (int32_t)clamp(x, INT32_MIN, INT32_MAX)); break;
  case K_I64: put<int64_t>(dst, e, clamp(x, INT64_MIN, INT64_MAX)); break;
  case K_U8: put<uint8_t>(dst, e, (uint8_t)clamp(x, 0, UINT8_MAX)); break;
  case K_U16: put<uint16_t>(dst, e, (uint16_t)clamp(x, 0, UINT16_MAX)); break;
  case K_U32: put<uint32_t>(dst, e, (uint32_t)clamp(x, 0, UINT32_MAX)); break;
  default: put<uint64_t>(dst, e, x.big ? (uint64_t)x.v : x.v < 0 ? 0 : (uint64_t)x.v); break;
  }
}

/* The host's store_d, through the same rounding functions
 * (converters/host/rounding.h). */
__host__ __device__ inline void store_double(int out, void *dst, int64_t e, double y) {
  switch (out) {
  case K_BOOL: put<uint8_t>(dst, e, y != 0); break; /* NaN != 0 */
  case K_I8: put<int8_t>(dst, e, (int8_t)ab__to_signed(y, 8)); break;
  case K_I16: put<int16_t>(dst, e, (int16_t)ab__to_signed(y, 16)); break;
  case K_I32: put<int32_t>(dst, e, (int32_t)ab__to_signed(y, 32)); break;
  case K_I64: put<int64_t>(dst, e, ab__to_signed(y, 64)); break;
  case K_U8: put<uint8_t>(dst, e, (uint8_t)ab__to_unsigned(y, 8)); break;
  case K_U16: put<uint16_t>(dst, e, (uint16_t)ab__to_unsigned(y, 16)); break;
  case K_U32: put<uint32_t>(dst, e, (uint32_t)ab__to_unsigned(y, 32)); break;
  case K_U64: put<uint64_t>(dst, e, ab__to_unsigned(y, 64)); break;
  case K_F16: put<uint16_t>(dst, e, ab__narrow_from_double(y, 10, 15, 31)); break;
  case K_BF16: put<uint16_t>(dst, e, ab__narrow_from_double(y, 7, 127, 255)); break;
  case K_F32: put<float>(dst, e, (float)y); break; /* round to nearest even, subnormals kept (no ftz) */
  default: put<double>(dst, e, y); break;
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

/* Result element e, in the family's arithmetic. */
template <int F> __host__ __device__ inline void element(void *dst, const void *src, const desc &d, int64_t e) {
  int64_t c;
  const int64_t at = source_offset(d, e, &c);
  if (F == FAM_FLOAT32) {
    float y = load(d.kind, src, at);
    if (d.affine) y = affine(y, d.a[c], d.b[c]);
    /* one rounding to nearest even, by the host's own function */
    if (d.out == K_F16) put<uint16_t>(dst, e, ab__narrow_from_float(y, 10, 15, 31));
    else if (d.out == K_BF16) put<uint16_t>(dst, e, ab__narrow_from_float(y, 7, 127, 255));
    else put<float>(dst, e, y);
  } else if (F == FAM_INT) {
    if (d.kind == K_BOOL && d.out == K_BOOL) /* a permutation: the byte as it is, like the host's gather */
      put<uint8_t>(dst, e, static_cast<const uint8_t *>(src)[at]);
    else
      store_int(d.out, dst, e, load_int(d.kind, src, at));
  } else {
    double y = load_double(d.kind, src, at, d.odd); /* odd: into a narrower float without a map */
    if (d.affine) y = affine(y, d.ad[c], d.bd[c]);
    store_double(d.out, dst, e, y);
  }
}

template <int F> __global__ void convert_kernel(void *dst, const void *src, desc d, int64_t n) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) element<F>(dst, src, d, e);
}

/* Fills d from a; false when the kernels do not take it. */
bool describe(const ab__convert_args *a, desc &d, int64_t &n) {
  const ab__cast_op &op = a->op;
  if (a->ndim < 0 || a->ndim > AB_MAX_NDIM) return false;
  d.out = kind_of(op.to);
  d.kind = kind_of(op.from);
  if (d.out == K_NONE || d.kind == K_NONE) return false;
  switch (ab__cast_arith(op.from, op.to, op.affine)) {
  case AB_ARITH_FLOAT32: d.family = FAM_FLOAT32; break;
  case AB_ARITH_INT: d.family = FAM_INT; break;
  case AB_ARITH_FLOAT64: d.family = FAM_FLOAT64; break;
  default: return false;
  }
  /* A permutation of float16 or bfloat16 goes through float and back,
   * which would quiet a signalling NaN the host's gather keeps as it is. */
  if ((d.out == K_F16 || d.out == K_BF16) && !op.affine && op.from.code == op.to.code && op.from.bits == op.to.bits)
    return false;
  const bool per_channel = op.affine && op.channel_dim >= 0;
  if (per_channel && (op.channel_dim >= a->ndim || a->shape[op.channel_dim] > kMaxChannels)) return false;
  d.ndim = a->ndim;
  d.affine = op.affine ? 1 : 0;
  d.odd = !op.affine && (d.out == K_F32 || d.out == K_F16 || d.out == K_BF16);
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

unsigned grid_for(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return (unsigned)(want < 65535 * 16 ? want : 65535 * 16); /* grid-stride beyond */
}

/* The family's kernel on `stream`, or with no stream its element code on
 * the host (the emulation the tests check): one dispatch for both. */
template <int F> cudaError_t run(void *dst, const void *src, const desc &d, int64_t n, const cudaStream_t *stream) {
  if (stream == nullptr) {
    for (int64_t e = 0; e < n; e++) element<F>(dst, src, d, e);
    return cudaSuccess;
  }
  /* cudaLaunchKernel returns this launch's own error; after <<<>>>,
   * cudaGetLastError would also report one the application left pending in
   * a runtime it shares with us (cudart_static), as if it were ours. */
  const void *from = src;
  desc dd = d;
  int64_t count = n;
  void *args[] = {&dst, &from, &dd, &count};
  return cudaLaunchKernel(reinterpret_cast<const void *>(&convert_kernel<F>), dim3(grid_for(n, 256)), dim3(256), args,
                          0, *stream);
}

cudaError_t dispatch(void *dst, const void *src, const desc &d, int64_t n, const cudaStream_t *stream) {
  switch (d.family) {
  case FAM_FLOAT32: return run<FAM_FLOAT32>(dst, src, d, n, stream);
  case FAM_INT: return run<FAM_INT>(dst, src, d, n, stream);
  default: return run<FAM_FLOAT64>(dst, src, d, n, stream);
  }
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
  return dispatch(dst, src, d, n, &stream);
}

extern "C" void ab__cuda_convert_emulate(void *dst, const void *src, const ab__convert_args *a) {
  desc d;
  int64_t n;
  if (!describe(a, d, n)) return;
  (void)dispatch(dst, src, d, n, nullptr);
}
