/* Conversions on an OpenCL device, by the rules of
 * converters/host/convert.h, between every one-lane dtype but complex,
 * with an optional affine map y = x * a + b (per tensor, or per channel
 * along one result axis, at most 16 channels) and any axis order. Element
 * i of the compact result comes from the source element at the row-major
 * decomposition of i over the result's shape, dotted with the source's
 * strides in the result's axis order (in elements): the ab__convert_args
 * the host converter takes too. Three parts, by the arithmetic
 * ab__cast_arith gives a pair:
 *  - float32: uint8, int8, uint16, int16, bool, float16, bfloat16 and
 *    float32 sources into float32, float16 or bfloat16, one kernel per
 *    pair;
 *  - float64: the narrowing kernels (those sources into 8- and 16-bit
 *    integers, one per pair), and ab_convert_wide for every other pair,
 *    with the kinds as arguments (doubles only: cl_khr_fp64);
 *  - integers exactly (integer and bool pairs without a map):
 *    ab_convert_int, the kinds as arguments.
 *
 * Bit-exact with the host: the loads are exact, and the multiply and the
 * add are two correctly rounded operations, never fused (the pragma below
 * forbids contraction into an fma). The backend uses the float kernels
 * only on devices with round-to-nearest and denormals in
 * CL_DEVICE_SINGLE_FP_CONFIG (and DOUBLE_FP_CONFIG for the float64 ones).
 * Which NaN: the host's, for the loads and stores themselves: a float16
 * or bfloat16 NaN widened here keeps its sign and payload, quieted; a NaN
 * narrowed into float16 or bfloat16 keeps its sign and its payload's top
 * bits, quieted. (What the multiply and add of a map make of a NaN is the
 * device's arithmetic.)
 *
 * Built once per context, as a program of its own (gather.cl is another). */
#pragma OPENCL FP_CONTRACT OFF

/* Test builds only (AB_TEST_OPENCL_CONVERT_OPTIONS): a compiler without
 * doubles, one that refuses the generic kernels below, and one that
 * refuses the whole file. */
#ifdef AB_TEST_REFUSE_ALL
#error "this compiler refuses convert.cl (a test)"
#endif
#ifdef AB_TEST_NO_FP64
#undef cl_khr_fp64
#endif
#if defined(AB_TEST_REFUSE_GENERIC) && !defined(AB_NO_GENERIC_KERNELS)
#error "this compiler refuses the generic kernels (a test)"
#endif

#define AB_LOAD_U8(p, i) ((float)(p)[i])
#define AB_LOAD_I8(p, i) ((float)(p)[i])
#define AB_LOAD_U16(p, i) ((float)(p)[i])
#define AB_LOAD_I16(p, i) ((float)(p)[i])
#define AB_LOAD_BOOL(p, i) ((p)[i] != 0 ? 1.0f : 0.0f)
#define AB_LOAD_F16(p, i) ab_f16_widen((p), (size_t)(i))
#define AB_LOAD_BF16(p, i) ab_bf16_widen((p)[i])
#define AB_LOAD_F32(p, i) ((p)[i])

/* float16 through vload_half, but a NaN from its own bits: quiet, its
 * sign and payload kept, as the host widens it. vload_half leaves which
 * NaN to the implementation (as vstore_half does, below). */
float ab_f16_widen(__global const ushort *p, size_t i) {
  const uint h = p[i];
  if ((h & 0x7fffu) > 0x7c00u) return as_float(((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13));
  return vload_half(i, (__global const half *)p);
}

/* bfloat16 is float32's top half; a signalling NaN comes out quiet, its
 * payload kept, as the host widens it. */
float ab_bf16_widen(ushort h) {
  uint u = (uint)h << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
  return as_float(u);
}

/* The source element of result element gid: its row-major index over
 * `shape`, dotted with `stride` (elements); *c gets its index along the
 * result axis `chan` (0 when chan is -1). Every kernel below maps this way. */
long ab_source_offset(size_t gid, int ndim, long8 shape8, long8 stride8, int chan, long *c) {
  long shape[8] = {shape8.s0, shape8.s1, shape8.s2, shape8.s3, shape8.s4, shape8.s5, shape8.s6, shape8.s7};
  long stride[8] = {stride8.s0, stride8.s1, stride8.s2, stride8.s3, stride8.s4, stride8.s5, stride8.s6, stride8.s7};
  long rem = (long)gid, off = 0;
  *c = 0;
  for (int i = ndim - 1; i >= 0; i--) {
    long q = rem / shape[i];
    long k = rem - q * shape[i];
    off += k * stride[i];
    if (i == chan) *c = k;
    rem = q;
  }
  return off;
}

/* Float32 into the result types of float32 arithmetic: float32 as it is;
 * float16 and bfloat16 rounded once, to nearest even (overflow to
 * infinity, NaN stays NaN): vstore_half_rte, and for bfloat16 the same
 * rounding on the top 16 bits. A NaN into float16 is the host's (and the
 * CUDA kernels') too: quiet, with its payload's top bits. vstore_half
 * leaves which NaN to the implementation; PoCL stored 0x7fff or 0xffff
 * for every one (a randomized soak through it, tests/stress/soak.c). */
#define AB_STORE_F32(p, i, y) ((p)[i] = (y))
#define AB_STORE_F16(p, i, y) ab_store_f16((p), (size_t)(i), (y))
#define AB_STORE_BF16(p, i, y) ((p)[i] = ab_bf16_rne(y))

void ab_store_f16(__global ushort *p, size_t i, float y) {
  const uint u = as_uint(y);
  if ((u & 0x7fffffffu) > 0x7f800000u) p[i] = (ushort)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
  else vstore_half_rte(y, i, (__global half *)p);
}

ushort ab_bf16_rne(float y) {
  uint u = as_uint(y);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); /* NaN: kept, quiet */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* mode: 0 no arithmetic, 1 affine. chan: the result axis the per-channel
 * a and b run along, -1 for a[0] and b[0] everywhere. */
#define AB_DEFINE_FLOAT32_MATH(NAME, T, LOAD, TD, STORE)                                        \
  __kernel void NAME(__global const T *src, ulong src_off, __global TD *dst, ulong dst_off,        \
                     int ndim, long8 shape8, long8 stride8, ulong n, int mode, int chan,           \
                     float16 a16, float16 b16) {                                                  \
    size_t gid = get_global_id(0);                                                              \
    if (gid >= n) return;                                                                       \
    long c;                                                                                     \
    const long off = ab_source_offset(gid, ndim, shape8, stride8, chan, &c);                    \
    float y = LOAD(src, (long)src_off + off);                                                   \
    if (mode) {                                                                                 \
      float av[16], bv[16];                                                                     \
      vstore16(a16, 0, av);                                                                     \
      vstore16(b16, 0, bv);                                                                     \
      float a = av[c], b = bv[c];                                                               \
      y = y * a;                                                                                \
      y = y + b;                                                                                \
    }                                                                                           \
    STORE(dst, dst_off + gid, y);                                                               \
  }

#include "kernels.def"

/* One kernel per result type and source kind (kernels.def):
 * ab_to_<result>_<source>. */
#define AB_FLOAT32_MATH_FROM(SUFFIX, TS, LOAD, KIND, RSUFFIX, TD, STORE) \
  AB_DEFINE_FLOAT32_MATH(ab_to_##RSUFFIX##_##SUFFIX, TS, LOAD, TD, STORE)
#define AB_FLOAT32_MATH_INTO(RSUFFIX, TD, STORE, KIND) AB_CL_SOURCES(AB_FLOAT32_MATH_FROM, RSUFFIX, TD, STORE)

AB_CL_FLOAT_RESULTS(AB_FLOAT32_MATH_INTO)

/* The way back: every source kind above into uint8, int8, uint16 and
 * int16, narrowing on the device before the download (a float32 frame to
 * uint8, a 16-bit depth image to 8 bits). Every source value is exact in
 * float, hence in double. The host's rule for
 * these is float64 arithmetic (y = x * a + b, two roundings), then round
 * half to even and saturate, NaN -> 0: exactly OpenCL's convert_T_sat_rte
 * of a double. So these exist only where the compiler has doubles. */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

#define AB_DEFINE_NARROW(NAME, TS, LOAD, TD, CONV)                                                \
  __kernel void NAME(__global const TS *src, ulong src_off, __global TD *dst, ulong dst_off,        \
                     int ndim, long8 shape8, long8 stride8, ulong n, int mode, int chan,            \
                     double16 a16, double16 b16) {                                                 \
    size_t gid = get_global_id(0);                                                               \
    if (gid >= n) return;                                                                        \
    long c;                                                                                      \
    const long off = ab_source_offset(gid, ndim, shape8, stride8, chan, &c);                     \
    double y = (double)LOAD(src, (long)src_off + off);                                           \
    if (mode) {                                                                                  \
      double av[16], bv[16];                                                                     \
      vstore16(a16, 0, av);                                                                      \
      vstore16(b16, 0, bv);                                                                      \
      y = y * av[c];                                                                             \
      y = y + bv[c];                                                                             \
    }                                                                                            \
    dst[dst_off + gid] = CONV(y);                                                                \
  }

/* ab_<source>_to_<result> for the four integer results (kernels.def). */
#define AB_NARROW_INTO(RSUFFIX, TD, CONV, KIND, SUFFIX, TS, LOAD) \
  AB_DEFINE_NARROW(ab_##SUFFIX##_to_##RSUFFIX, TS, LOAD, TD, CONV)
#define AB_NARROW_FROM(SUFFIX, TS, LOAD, KIND, A, B, C) AB_CL_NARROW_RESULTS(AB_NARROW_INTO, SUFFIX, TS, LOAD)

AB_CL_SOURCES(AB_NARROW_FROM, , , )

#endif

#ifndef AB_NO_GENERIC_KERNELS /* the backend builds again with this when a compiler refuses them */
/* ---- every other pair ------------------------------------------------
 * Two kernels take the element kinds as arguments (uniform branches): one
 * for integer and bool pairs without a map (exact, saturating), one for
 * float64 arithmetic (32- and 64-bit integers, float64, results in
 * float64, bool and the integers from any source). Both read and write
 * through byte pointers cast to the element type, indexing whole elements
 * (the backend checks the offsets), so they need the buffers aligned as
 * the elements are, which the backend's allocations and checks give.
 * The kind codes: AB_CL_KINDS (kernels.def), as the backend numbers them. */
#define AB_KIND_CODE(KIND) AB_##KIND,
enum { AB_CL_KINDS(AB_KIND_CODE) };

/* Source element i of integer or bool kind k as a long; a uint64 past
 * LONG_MAX sets *big and comes back as its bits. */
long ab_load_int(__global const uchar *s, long i, int k, int *big) {
  *big = 0;
  switch (k) {
  case AB_BOOL: return s[i] != 0 ? 1 : 0;
  case AB_I8: return ((__global const char *)s)[i];
  case AB_I16: return ((__global const short *)s)[i];
  case AB_I32: return ((__global const int *)s)[i];
  case AB_I64: return ((__global const long *)s)[i];
  case AB_U8: return s[i];
  case AB_U16: return ((__global const ushort *)s)[i];
  case AB_U32: return ((__global const uint *)s)[i];
  default: {
    const ulong u = ((__global const ulong *)s)[i];
    *big = u > (ulong)LONG_MAX;
    return (long)u;
  }
  }
}

/* Saturating, as the host's integer path: a value past LONG_MAX (big) is
 * above every bound but uint64's. */
void ab_store_int(__global uchar *d, ulong i, int k, long v, int big) {
  switch (k) {
  case AB_BOOL: d[i] = (big || v != 0) ? 1 : 0; break;
  case AB_I8: ((__global char *)d)[i] = big ? CHAR_MAX : convert_char_sat(v); break;
  case AB_I16: ((__global short *)d)[i] = big ? SHRT_MAX : convert_short_sat(v); break;
  case AB_I32: ((__global int *)d)[i] = big ? INT_MAX : convert_int_sat(v); break;
  case AB_I64: ((__global long *)d)[i] = big ? LONG_MAX : v; break;
  case AB_U8: d[i] = big ? UCHAR_MAX : convert_uchar_sat(v); break;
  case AB_U16: ((__global ushort *)d)[i] = big ? USHRT_MAX : convert_ushort_sat(v); break;
  case AB_U32: ((__global uint *)d)[i] = big ? UINT_MAX : convert_uint_sat(v); break;
  default: ((__global ulong *)d)[i] = big ? (ulong)v : convert_ulong_sat(v); break;
  }
}

__kernel void ab_convert_int(__global const uchar *src, ulong src_off, __global uchar *dst, ulong dst_off, int ndim,
                             long8 shape8, long8 stride8, ulong n, int from, int to) {
  size_t gid = get_global_id(0);
  if (gid >= n) return;
  long c;
  int big;
  const long off = ab_source_offset(gid, ndim, shape8, stride8, -1, &c);
  if (from == AB_BOOL && to == AB_BOOL) { /* a permutation: the byte as it is, like the host's gather */
    dst[dst_off + gid] = src[(long)src_off + off];
    return;
  }
  const long v = ab_load_int(src, (long)src_off + off, from, &big);
  ab_store_int(dst, dst_off + gid, to, v, big);
}

#ifdef cl_khr_fp64
/* (v >> shift) rounded to nearest, ties to even; shift in 1..63. */
ulong ab_rne_shift(ulong v, int shift) {
  const ulong q = v >> shift, rem = v & ((1UL << shift) - 1), mid = 1UL << (shift - 1);
  return q + ((rem > mid || (rem == mid && (q & 1UL))) ? 1UL : 0UL);
}

/* A double to float16 (10, 15, 31) or bfloat16 (7, 127, 255) in one
 * rounding to nearest even; the steps of ab__narrow_from_double in
 * converters/host/rounding.h. */
ushort ab_narrow_from_double(double x, int mbits, int bias, uint emax) {
  const ulong b = as_ulong(x);
  const uint sign = (uint)(b >> 63) << 15;
  const int exp = (int)((b >> 52) & 0x7ffUL);
  const ulong man = b & ((1UL << 52) - 1);
  /* NaN: quiet, with the top bits of its payload (the host's rule) */
  if (exp == 0x7ff) return (ushort)(sign | (emax << mbits) | (man ? (1u << (mbits - 1)) | (uint)(man >> (52 - mbits)) : 0u));
  if (exp == 0) return (ushort)sign;
  const int e = exp - 1023 + bias;
  if (e >= 1) {
    const ulong r = ab_rne_shift(((ulong)e << 52) | man, 52 - mbits), inf = (ulong)emax << mbits;
    return (ushort)(sign | (uint)(r >= inf ? inf : r));
  }
  const int shift = 52 - mbits + 1 - e;
  if (shift > 63) return (ushort)sign;
  return (ushort)(sign | (uint)ab_rne_shift(man | (1UL << 52), shift));
}

/* A uint64 as a double rounded to odd (ab__u64_to_double_odd in
 * converters/host/rounding.h): exact below 2^53, else cut to 53 bits with
 * the last set when anything was cut, so that one more rounding into
 * float32, float16 or bfloat16 is the integer's own. */
double ab_u64_odd(ulong u) {
  if (u < (1UL << 53)) return convert_double(u);
  const int drop = 11 - (int)clz(u); /* bits below the top 53 */
  const ulong mask = (1UL << drop) - 1;
  return convert_double((u & ~mask) | ((u & mask) != 0 ? 1UL << drop : 0UL));
}

double ab_i64_odd(long x) {
  const double d = ab_u64_odd(x < 0 ? 0UL - (ulong)x : (ulong)x);
  return x < 0 ? -d : d;
}

/* A float16 or bfloat16 NaN (h, its payload below bit `mbits`) as a
 * double, quiet with its sign and payload, built from its bits as the
 * host builds it (converters/host/rounding.h): through a float the
 * device's conversion to double would decide which NaN. */
double ab_nan16_double(ulong h, int mbits) {
  return as_double((h & 0x8000UL) << 48 | 0x7ff8000000000000UL | (h & ((1UL << mbits) - 1)) << (52 - mbits));
}

/* Source element i of any kind as a double: exact (float16 and bfloat16
 * NaNs as the host widens them), but for 64-bit
 * integers past 2^53: rounded to nearest even, as the host's cast, or with
 * `odd` rounded to odd (a cast into float32, float16 or bfloat16, no map). */
double ab_load_double(__global const uchar *s, long i, int k, int odd) {
  if (odd && k == AB_I64) return ab_i64_odd(((__global const long *)s)[i]);
  if (odd && k == AB_U64) return ab_u64_odd(((__global const ulong *)s)[i]);
  switch (k) {
  case AB_BOOL: return s[i] != 0 ? 1.0 : 0.0;
  case AB_I8: return (double)((__global const char *)s)[i];
  case AB_I16: return (double)((__global const short *)s)[i];
  case AB_I32: return (double)((__global const int *)s)[i];
  case AB_I64: return convert_double_rte(((__global const long *)s)[i]);
  case AB_U8: return (double)s[i];
  case AB_U16: return (double)((__global const ushort *)s)[i];
  case AB_U32: return (double)((__global const uint *)s)[i];
  case AB_U64: return convert_double_rte(((__global const ulong *)s)[i]);
  case AB_F16: {
    const ushort h = ((__global const ushort *)s)[i];
    return (h & 0x7fffu) > 0x7c00u ? ab_nan16_double(h, 10) : (double)vload_half((size_t)i, (__global const half *)s);
  }
  case AB_BF16: {
    const ushort h = ((__global const ushort *)s)[i];
    return (h & 0x7fffu) > 0x7f80u ? ab_nan16_double(h, 7) : (double)as_float((uint)h << 16);
  }
  case AB_F32: return (double)((__global const float *)s)[i];
  default: return ((__global const double *)s)[i];
  }
}

/* The host's store_d: integers round half to even and saturate, NaN -> 0;
 * bool is nonzero (NaN too); float16 and bfloat16 round once. */
void ab_store_double(__global uchar *d, ulong i, int k, double y) {
  switch (k) {
  case AB_BOOL: d[i] = y != 0.0 ? 1 : 0; break;
  case AB_I8: ((__global char *)d)[i] = convert_char_sat_rte(y); break;
  case AB_I16: ((__global short *)d)[i] = convert_short_sat_rte(y); break;
  case AB_I32: ((__global int *)d)[i] = convert_int_sat_rte(y); break;
  case AB_I64: ((__global long *)d)[i] = convert_long_sat_rte(y); break;
  case AB_U8: d[i] = convert_uchar_sat_rte(y); break;
  case AB_U16: ((__global ushort *)d)[i] = convert_ushort_sat_rte(y); break;
  case AB_U32: ((__global uint *)d)[i] = convert_uint_sat_rte(y); break;
  case AB_U64: ((__global ulong *)d)[i] = convert_ulong_sat_rte(y); break;
  case AB_F16: ((__global ushort *)d)[i] = ab_narrow_from_double(y, 10, 15, 31); break;
  case AB_BF16: ((__global ushort *)d)[i] = ab_narrow_from_double(y, 7, 127, 255); break;
  case AB_F32: ((__global float *)d)[i] = convert_float_rte(y); break;
  default: ((__global double *)d)[i] = y; break;
  }
}

/* mode and chan as in the kernels above; a and b are float64. */
__kernel void ab_convert_wide(__global const uchar *src, ulong src_off, __global uchar *dst, ulong dst_off, int ndim,
                              long8 shape8, long8 stride8, ulong n, int mode, int chan, double16 a16, double16 b16,
                              int from, int to) {
  size_t gid = get_global_id(0);
  if (gid >= n) return;
  long c;
  const long off = ab_source_offset(gid, ndim, shape8, stride8, chan, &c);
  /* the host's rule: a 64-bit integer into a narrower float without a map is rounded once */
  const int odd = !mode && (to == AB_F32 || to == AB_F16 || to == AB_BF16);
  double y = ab_load_double(src, (long)src_off + off, from, odd);
  if (mode) {
    double av[16], bv[16];
    vstore16(a16, 0, av);
    vstore16(b16, 0, bv);
    y = y * av[c];
    y = y + bv[c];
  }
  ab_store_double(dst, dst_off + gid, to, y);
}
#endif
#endif /* AB_NO_GENERIC_KERNELS */
