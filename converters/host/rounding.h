/* The roundings of converters/host/convert.h written once, as inline
 * functions that the host converter and the CUDA kernels (converters/cuda,
 * compiled for the host and for the device) both call: a double to
 * float16 or bfloat16 and back, a double to an integer (round half to
 * even, saturate, NaN -> 0), and a 64-bit integer to a double that rounds
 * correctly once more. The OpenCL kernels spell the same steps in OpenCL C
 * (converters/opencl/convert.cl); the tests hold all three to the host's
 * bits. */
#ifndef AB_CONVERTERS_HOST_ROUNDING_H
#define AB_CONVERTERS_HOST_ROUNDING_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define AB_HD __host__ __device__
#else
#define AB_HD
#endif

/* (v >> shift) rounded to nearest, ties to even; shift in 1..63. */
static inline AB_HD uint64_t ab__rne_shift(uint64_t v, int shift) {
  const uint64_t q = v >> shift, rem = v & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  return q + (rem > half || (rem == half && (q & 1)));
}

/* A double to a narrow binary float with `mbits` mantissa bits, exponent
 * bias `bias` and all-ones exponent field `emax`, in one rounding to
 * nearest even: overflow to infinity, NaN kept quiet with the top of its
 * payload. float16 is (10, 15, 31), bfloat16 (7, 127, 255). */
static inline AB_HD uint16_t ab__narrow_from_double(double x, int mbits, int bias, unsigned emax) {
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  const uint16_t sign = (uint16_t)((b >> 63) << 15);
  const int exp = (int)((b >> 52) & 0x7ff);
  const uint64_t man = b & ((1ull << 52) - 1);
  /* A NaN stays quiet with the top bits of its payload, as IEEE 754's
   * narrowing conversions (and x86's VCVTPS2PH, NumPy) do: a float32 quiet
   * NaN 0x7fc00000 becomes float16 0x7e00, bfloat16 0x7fc0. */
  if (exp == 0x7ff)
    return (uint16_t)(sign | (emax << mbits) | (man ? (1u << (mbits - 1)) | (unsigned)(man >> (52 - mbits)) : 0));
  if (exp == 0) return sign; /* zero, or a double subnormal: far below the narrow type's range */
  const int e = exp - 1023 + bias;
  if (e >= 1) {
    const uint64_t r = ab__rne_shift(((uint64_t)e << 52) | man, 52 - mbits);
    return (uint16_t)(sign | (r >= ((uint64_t)emax << mbits) ? (uint64_t)emax << mbits : r));
  }
  const int shift = 52 - mbits + 1 - e; /* to the subnormal's unit */
  if (shift > 63) return sign;
  return (uint16_t)(sign | ab__rne_shift(man | (1ull << 52), shift));
}

/* The same from a float32 (exact as a double), a NaN taken from its own
 * bits rather than through the conversion to double, whose NaN the
 * platform decides (x86 and Arm keep the payload; a GPU's was never
 * checked): the host's element loop and the CUDA kernels both narrow
 * float32 through this. */
static inline AB_HD uint16_t ab__narrow_from_float(float x, int mbits, int bias, unsigned emax) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(((u >> 16) & 0x8000u) | (emax << mbits) | (1u << (mbits - 1)) | ((u & 0x7fffffu) >> (23 - mbits)));
  return ab__narrow_from_double((double)x, mbits, bias, emax);
}

/* A float16 or bfloat16 ((mbits, bias, emax) as above) as a double,
 * exactly, built from its fields (a loop of halvings instead ran the
 * element loop of float16 sources at 0.5 GB/s). A NaN comes out quiet
 * with its sign and payload, as IEEE 754's widening conversions (and
 * x86's VCVTPH2PS) make it, float16 0x7c01 as 0x7ff8040000000000: from
 * its bits, not through a conversion of float to double, whose NaN the
 * processor decides. The host's element loop and the CUDA kernels both
 * widen to float64 through this. */
static inline AB_HD double ab__widen_to_double(uint16_t h, int mbits, int bias, unsigned emax) {
  const unsigned e = (h >> mbits) & emax, m = h & ((1u << mbits) - 1);
  const uint64_t sign = (uint64_t)(h >> 15) << 63;
  uint64_t b;
  if (e == emax) /* infinity, or a NaN made quiet */
    b = sign | 0x7ff0000000000000ull | (m != 0 ? 1ull << 51 : 0) | (uint64_t)m << (52 - mbits);
  else if (e != 0) /* (2^mbits + m) * 2^(e - bias - mbits) */
    b = sign | (uint64_t)((int)e - bias + 1023) << 52 | (uint64_t)m << (52 - mbits);
  else if (m == 0)
    b = sign;
  else { /* m * 2^(1 - bias - mbits), m's top bit p: a normal double, built
          * from bits too (tests/ptx_check.cmake refuses a bare multiply) */
    int p = mbits - 1;
    while (!((m >> p) & 1u)) p--;
    b = sign | (uint64_t)(p + 1 - bias - mbits + 1023) << 52 | (uint64_t)(m & ((1u << p) - 1)) << (52 - p);
  }
  double v;
  memcpy(&v, &b, sizeof v);
  return v;
}

/* A 64-bit integer as a double rounded to odd: exact below 2^53; above,
 * cut to 53 significant bits with the last one set when anything was cut.
 * Rounding that once more, to nearest even at 24 bits or fewer (float32,
 * float16, bfloat16), gives the integer's own nearest value: the one
 * rounding of a C cast from the integer, where going through the nearest
 * double would round twice (2^60 + 2^36 + 1 would become 2^60 in float32,
 * not 2^60 + 2^37). */
static inline AB_HD double ab__u64_to_double_odd(uint64_t u) {
  int drop = 0;
  while ((u >> drop) >= (1ull << 53)) drop++;
  if (drop == 0) return (double)u;
  const uint64_t mask = (1ull << drop) - 1;
  return (double)((u & ~mask) | ((u & mask) != 0 ? 1ull << drop : 0)); /* 53 bits at most: exact */
}

static inline AB_HD double ab__i64_to_double_odd(int64_t x) {
  const double d = ab__u64_to_double_odd(x < 0 ? 0 - (uint64_t)x : (uint64_t)x);
  return x < 0 ? -d : d;
}

/* Round half to even without libm: adding 2^52 to a magnitude below 2^52
 * lands where the spacing of doubles is exactly 1, so the default rounding
 * mode leaves the nearest integer (ties to even); subtracting it back is
 * exact. Magnitudes of 2^52 and more are integers already. (1.5 * 2^52,
 * the usual constant, is only exact below 2^51.) Needs IEEE double
 * arithmetic as written: no -ffast-math. */
static inline AB_HD double ab__round_even(double v) {
  const double two52 = 4503599627370496.0;
  if (!(v < two52 && v > -two52)) return v;
  if (v >= 0) {
    const double t = v + two52;
    return t - two52;
  }
  const double t = v - two52;
  return t + two52;
}

/* A double to a signed integer of `bits` (8..64) bits. */
static inline AB_HD int64_t ab__to_signed(double v, int bits) {
  if (v != v) return 0;
  const double lim = (double)(1ull << (bits - 1)); /* 2^(bits-1), exact */
  v = ab__round_even(v);
  if (v >= lim) return (int64_t)((1ull << (bits - 1)) - 1);
  if (v < -lim) return bits == 64 ? INT64_MIN : -(int64_t)(1ull << (bits - 1));
  return (int64_t)v;
}

/* A double to an unsigned integer of `bits` (8..64) bits. */
static inline AB_HD uint64_t ab__to_unsigned(double v, int bits) {
  if (v != v) return 0;
  const double lim = bits == 64 ? 18446744073709551616.0 : (double)(1ull << bits);
  v = ab__round_even(v);
  if (v <= 0) return 0;
  if (v >= lim) return bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
  return (uint64_t)v;
}

#endif
