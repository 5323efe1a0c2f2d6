/* Converting on the way: ab_convert_memory with opts.dtype, opts.permute,
 * AB_CONVERT_AFFINE and AB_CONVERT_PER_CHANNEL. Every cast between the 13
 * real dtypes, affine maps per tensor and per channel, permutations of
 * strided sources, empty and 0-d tensors, the pairs that are refused, and
 * the same conversions through OpenCL.
 *
 * Results are compared element by element with a scalar reference written
 * here and independent of the library's code: the compiler's _Float16 for
 * float16 (where it has none, as clang before 15 on x86, the bit-level
 * conversions below, which the tests check against _Float16 where it is),
 * libm's nearbyint (round half to even in the default mode) for integers,
 * and an exact bracketing of the value between its two neighbouring
 * bfloat16 values for bfloat16. Floats are compared as bit patterns; where
 * the reference gives a NaN, any NaN is accepted. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converters/host/convert.h"
#include "converters/host/gather.h" /* ab__host_llc_bytes, ab__host_ran_count */
#include "internal.h" /* ab__env_reload */
#include "support.h"

#define CL0 ((DLDevice){kDLOpenCL, 0})

/* ---- the 13 real dtypes ------------------------------------------------- */

enum rk { R_BOOL, R_I8, R_I16, R_I32, R_I64, R_U8, R_U16, R_U32, R_U64, R_F16, R_BF16, R_F32, R_F64, R_COUNT };

static const struct {
  const char *name;
  DLDataType dt;
  size_t size;
} KD[R_COUNT] = {
  [R_BOOL] = {"bool", {kDLBool, 8, 1}, 1},      [R_I8] = {"int8", {kDLInt, 8, 1}, 1},
  [R_I16] = {"int16", {kDLInt, 16, 1}, 2},      [R_I32] = {"int32", {kDLInt, 32, 1}, 4},
  [R_I64] = {"int64", {kDLInt, 64, 1}, 8},      [R_U8] = {"uint8", {kDLUInt, 8, 1}, 1},
  [R_U16] = {"uint16", {kDLUInt, 16, 1}, 2},    [R_U32] = {"uint32", {kDLUInt, 32, 1}, 4},
  [R_U64] = {"uint64", {kDLUInt, 64, 1}, 8},    [R_F16] = {"float16", {kDLFloat, 16, 1}, 2},
  [R_BF16] = {"bfloat16", {kDLBfloat, 16, 1}, 2}, [R_F32] = {"float32", {kDLFloat, 32, 1}, 4},
  [R_F64] = {"float64", {kDLFloat, 64, 1}, 8},
};

static bool dtype_eq(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

static int kind_of(DLDataType t) {
  for (int k = 0; k < R_COUNT; k++)
    if (dtype_eq(KD[k].dt, t)) return k;
  return -1;
}

static bool is_intlike(int k) { return k <= R_U64; } /* bool included */
static bool is_floatk(int k) { return k >= R_F16; }
/* Sources whose values float32 cannot hold exactly: arithmetic in float64. */
static bool wide_source(int k) { return k == R_F64 || k == R_I32 || k == R_I64 || k == R_U32 || k == R_U64; }
static bool narrow_float(int k) { return k == R_F16 || k == R_BF16 || k == R_F32; }

/* Any int64 or uint64 value: a sign and a magnitude (at most 2^63 when
 * negative), so the reference needs no wider type than 64 bits and runs on
 * 32-bit targets, which have no __int128. */
typedef struct {
  bool neg;
  uint64_t mag;
} wint;

static wint w_s(int64_t v) { return v < 0 ? (wint){true, 0 - (uint64_t)v} : (wint){false, (uint64_t)v}; }
static wint w_u(uint64_t v) { return (wint){false, v}; }
static int w_cmp(wint a, wint b) { /* neither is a negative zero */
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  const int c = a.mag < b.mag ? -1 : a.mag > b.mag;
  return a.neg ? -c : c;
}
/* a + d for |d| small. */
static wint w_add(wint a, int d) {
  const uint64_t m = d < 0 ? (uint64_t)-(int64_t)d : (uint64_t)d;
  if (a.neg == (d < 0)) return (wint){a.neg, a.mag + m}; /* away from zero */
  if (a.mag >= m) return (wint){a.neg && a.mag != m, a.mag - m};
  return (wint){!a.neg, m - a.mag};
}
/* Rounded once: rounding to nearest is the same for a value and its negative. */
static double w_double(wint a) { return a.neg ? -(double)a.mag : (double)a.mag; }
/* Bits of a value within the kind's range (two's complement for signed ones). */
static uint64_t w_bits(wint a) { return a.neg ? 0 - a.mag : a.mag; }

static wint kmin(int k) {
  switch (k) {
  case R_I8: return w_s(INT8_MIN);
  case R_I16: return w_s(INT16_MIN);
  case R_I32: return w_s(INT32_MIN);
  case R_I64: return w_s(INT64_MIN);
  default: return w_u(0);
  }
}

static wint kmax(int k) {
  switch (k) {
  case R_BOOL: return w_u(1);
  case R_I8: return w_u(INT8_MAX);
  case R_I16: return w_u(INT16_MAX);
  case R_I32: return w_u(INT32_MAX);
  case R_I64: return w_u(INT64_MAX);
  case R_U8: return w_u(UINT8_MAX);
  case R_U16: return w_u(UINT16_MAX);
  case R_U32: return w_u(UINT32_MAX);
  default: return w_u(UINT64_MAX);
  }
}

/* ---- the scalar reference ------------------------------------------------ */

/* float16 by hand: the value of bits b (any NaN for a NaN), and the
 * float16 nearest to d, ties to even, in one rounding (a NaN of d's
 * sign for a NaN). Scaling by powers of two is exact, and nearbyint rounds
 * half to even in the default mode. */
static double soft_f16_value(uint16_t b) {
  const int e = (b >> 10) & 31, m = b & 1023;
  const double v = e == 31 ? (m != 0 ? (double)NAN : (double)INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(m + 1024, e - 25);
  return b & 0x8000 ? -v : v;
}
static uint16_t soft_f16_bits(double d) {
  const uint16_t sign = signbit(d) ? 0x8000 : 0;
  const double a = fabs(d);
  if (a != a) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00; /* 65504 plus half its unit rounds up, to infinity */
  if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* subnormal; 1024 is the least normal's bits */
  int e;
  (void)frexp(a, &e);                                 /* a = f * 2^e, f in [0.5, 1): exponent e - 1 */
  const uint16_t q = (uint16_t)nearbyint(ldexp(a, 11 - e)); /* 11 significant bits: 1024 .. 2048 */
  return sign | (uint16_t)(((e - 1 + 15) << 10) + (q - 1024)); /* 2048 carries into the exponent */
}
#ifdef __FLT16_MAX__
#define HAVE_FLOAT16 1
static double f16_value(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, sizeof h);
  return (double)h;
}
static uint16_t f16_bits(double d) {
  const _Float16 h = (_Float16)d;
  uint16_t b;
  memcpy(&b, &h, sizeof b);
  return b;
}
#else
static double f16_value(uint16_t b) { return soft_f16_value(b); }
static uint16_t f16_bits(double d) { return soft_f16_bits(d); }
#endif

static double bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The bfloat16 nearest to x, ties to even, by bracketing: lo is the
 * largest bfloat16 <= |x| (the top half of the largest float <= |x|), hi
 * the next one up (infinity standing for 2^128, where rounding overflows),
 * and |x| is compared with their midpoint, which is exact in double. */
static uint16_t ref_bf16(double x) {
  if (x != x) return 0x7fc0;
  const uint16_t sign = signbit(x) ? 0x8000 : 0;
  const double a = sign ? -x : x;
  if (a == (double)INFINITY) return sign | 0x7f80;
  float f = (float)a;
  if ((double)f > a) { /* one float down: f > a >= 0, so f > 0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u -= 1;
    memcpy(&f, &u, sizeof f);
  }
  uint32_t fb;
  memcpy(&fb, &f, sizeof fb);
  const uint16_t lo = (uint16_t)(fb >> 16), hi = (uint16_t)(lo + 1);
  const double lov = bf16_value(lo), hiv = hi == 0x7f80 ? 0x1p128 : bf16_value(hi);
  const double mid = (lov + hiv) / 2;
  const uint16_t r = a < mid ? lo : a > mid ? hi : (lo & 1) ? hi : lo;
  return sign | r;
}

typedef struct {
  bool is_int;
  wint i;
  double d;
} rval;

static rval ref_load(int k, const unsigned char *p) {
  rval v = {true, {false, 0}, 0};
  switch (k) {
  case R_BOOL: v.i = w_u(p[0] != 0); break;
  case R_I8: v.i = w_s((int8_t)p[0]); break;
  case R_U8: v.i = w_u(p[0]); break;
  case R_I16: { int16_t x; memcpy(&x, p, 2); v.i = w_s(x); break; }
  case R_U16: { uint16_t x; memcpy(&x, p, 2); v.i = w_u(x); break; }
  case R_I32: { int32_t x; memcpy(&x, p, 4); v.i = w_s(x); break; }
  case R_U32: { uint32_t x; memcpy(&x, p, 4); v.i = w_u(x); break; }
  case R_I64: { int64_t x; memcpy(&x, p, 8); v.i = w_s(x); break; }
  case R_U64: { uint64_t x; memcpy(&x, p, 8); v.i = w_u(x); break; }
  case R_F16: { uint16_t x; memcpy(&x, p, 2); v.is_int = false; v.d = f16_value(x); break; }
  case R_BF16: { uint16_t x; memcpy(&x, p, 2); v.is_int = false; v.d = bf16_value(x); break; }
  case R_F32: { float x; memcpy(&x, p, 4); v.is_int = false; v.d = x; break; }
  default: { double x; memcpy(&x, p, 8); v.is_int = false; v.d = x; break; }
  }
  return v;
}

/* An integer, saturated to k's range (bool: nonzero is 1). */
static void put_int(int k, unsigned char *p, wint v) {
  if (k == R_BOOL) {
    p[0] = v.mag != 0;
    return;
  }
  if (w_cmp(v, kmin(k)) < 0) v = kmin(k);
  if (w_cmp(v, kmax(k)) > 0) v = kmax(k);
  put_low_bytes(p, w_bits(v), KD[k].size);
}

/* A value computed in float64, stored as k. */
static void put_double(int k, unsigned char *p, double d) {
  switch (k) {
  case R_BOOL: p[0] = !(d == 0); break; /* NaN is nonzero */
  case R_F16: { uint16_t b = f16_bits(d); memcpy(p, &b, 2); break; }
  case R_BF16: { uint16_t b = ref_bf16(d); memcpy(p, &b, 2); break; }
  case R_F32: { float f = (float)d; memcpy(p, &f, 4); break; }
  case R_F64: memcpy(p, &d, 8); break;
  default: {
    wint r;
    if (d != d) {
      r = w_u(0);
    } else {
      const double n = nearbyint(d);
      /* both powers of two or 0 (w_double rounds 2^63 - 1 and 2^64 - 1 up) */
      const double lo = w_double(kmin(k)), hi_excl = w_double(kmax(k)) + 1;
      r = n >= hi_excl ? kmax(k) : n <= lo ? kmin(k) : n < 0 ? (wint){true, (uint64_t)-n} : w_u((uint64_t)n);
    }
    put_int(k, p, r);
  }
  }
}

/* A value computed in float32, stored as a float32, float16 or bfloat16. */
static void put_float(int k, unsigned char *p, float f) {
  switch (k) {
  case R_F16: { uint16_t b = f16_bits((double)f); memcpy(p, &b, 2); break; }
  case R_BF16: { uint16_t b = ref_bf16((double)f); memcpy(p, &b, 2); break; }
  default: memcpy(p, &f, 4); break;
  }
}

struct affine {
  double scale, offset;
};

/* The integer v rounded once, to nearest even at `bits` significant bits
 * (24 float32, 11 float16, 8 bfloat16): exact in a double. */
static double round_int(wint v, int bits) {
  const uint64_t m = v.mag;
  int msb = -1;
  for (uint64_t t = m; t != 0; t >>= 1) msb++;
  double d = (double)m; /* exact when it has at most `bits` significant bits */
  if (msb >= bits) {
    const int sh = msb - bits + 1;
    const uint64_t rem = m & ((UINT64_C(1) << sh) - 1), half = UINT64_C(1) << (sh - 1);
    uint64_t q = m >> sh;
    q += rem > half || (rem == half && (q & 1));
    d = ldexp((double)q, sh); /* q <= 2^bits: exact, and 2^64 too */
  }
  return v.neg ? -d : d;
}

/* One element from -> to, with y = x * scale + offset when a != NULL. */
static void ref_convert(int from, const unsigned char *src, int to, unsigned char *dst, const struct affine *a) {
  const rval v = ref_load(from, src);
  if (a == NULL && is_intlike(from) && is_intlike(to)) {
    put_int(to, dst, v.i); /* exact, saturating */
    return;
  }
  if (narrow_float(to) && !wide_source(from)) {
    float x = v.is_int ? (float)w_double(v.i) : (float)v.d; /* exact for these sources */
    if (a != NULL) {
      volatile float m = x * (float)a->scale; /* a multiply, then an add: never fused */
      x = m + (float)a->offset;
    }
    put_float(to, dst, x);
    return;
  }
  if (a == NULL && v.is_int && narrow_float(to)) { /* one rounding, from the integer itself */
    put_double(to, dst, round_int(v.i, to == R_F32 ? 24 : to == R_F16 ? 11 : 8));
    return;
  }
  double x = !v.is_int ? v.d : w_double(v.i);
  if (a != NULL) {
    volatile double m = x * a->scale;
    x = m + a->offset;
  }
  put_double(to, dst, x);
}

static bool bits_isnan(int k, const unsigned char *p) {
  switch (k) {
  case R_F16: { uint16_t b; memcpy(&b, p, 2); return (b & 0x7c00) == 0x7c00 && (b & 0x03ff) != 0; }
  case R_BF16: { uint16_t b; memcpy(&b, p, 2); return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }
  case R_F32: { float f; memcpy(&f, p, 4); return f != f; }
  case R_F64: { double d; memcpy(&d, p, 8); return d != d; }
  default: return false;
  }
}

static bool same_result(int k, const unsigned char *want, const unsigned char *got) {
  if (is_floatk(k) && bits_isnan(k, want)) return bits_isnan(k, got);
  return memcmp(want, got, KD[k].size) == 0;
}

/* "value (bits)" of one element, for failure messages. */
static const char *describe(int k, const unsigned char *p, char *buf, size_t len) {
  const uint64_t bits = get_low_bytes(p, KD[k].size);
  const rval v = ref_load(k, p);
  if (!v.is_int)
    snprintf(buf, len, "%s %.17g (0x%0*llx)", KD[k].name, v.d, (int)(2 * KD[k].size), (unsigned long long)bits);
  else if (k == R_U64)
    snprintf(buf, len, "%s %llu", KD[k].name, (unsigned long long)v.i.mag);
  else
    snprintf(buf, len, "%s %s%llu", KD[k].name, v.i.neg ? "-" : "", (unsigned long long)v.i.mag);
  return buf;
}

/* ---- library helpers --------------------------------------------------- */

/* Converts and checks the result's contract: success, a copy (IS_COPIED),
 * the requested dtype, the permuted shape, compact strides, the target's
 * device type, data NULL exactly when there are no elements. */
static DLManagedTensorVersioned *convert_contract(const DLTensor *src, DLDevice to, const ab_convert_opts *o,
                                            const char *what) {
  DLManagedTensorVersioned *r = NULL;
  ab_status st = ab_convert_memory(src, to, o, &r);
  cr_assert_eq(st, AB_OK, "%s: %s (%s)", what, ab_status_name(st), ab_last_error());
  const DLTensor *t = &r->dl_tensor;
  const DLDataType want = o != NULL && o->dtype.bits != 0 ? o->dtype : src->dtype;
  cr_assert(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, "%s: result not flagged IS_COPIED (flags 0x%llx)", what,
            (unsigned long long)r->flags);
  cr_assert(dtype_eq(t->dtype, want), "%s: result dtype (%u,%u,%u), want (%u,%u,%u)", what, t->dtype.code,
            t->dtype.bits, t->dtype.lanes, want.code, want.bits, want.lanes);
  cr_assert_eq(t->ndim, src->ndim, "%s: ndim", what);
  cr_assert_eq(t->device.device_type, to.device_type, "%s: result device type", what);
  cr_assert_eq(t->byte_offset, 0, "%s: byte_offset", what);
  const int64_t numel = numel_of(t->ndim, t->shape);
  int64_t acc = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    const int32_t p = o != NULL && o->permute != NULL ? o->permute[i] : i;
    cr_assert_eq(t->shape[i], src->shape[p], "%s: result shape[%d] = %lld, want source shape[%d] = %lld", what, i,
                 (long long)t->shape[i], p, (long long)src->shape[p]);
    cr_assert_not_null(t->strides, "%s: NULL strides", what);
    if (t->shape[i] != 1 && numel > 0) /* an empty tensor is compact whatever its strides */
      cr_assert_eq(t->strides[i], acc, "%s: strides[%d] = %lld, want %lld (compact)", what, i,
                   (long long)t->strides[i], (long long)acc);
    acc *= t->shape[i];
  }
  if (numel == 0)
    cr_assert_null(t->data, "%s: an empty result has data", what);
  else
    cr_assert_not_null(t->data, "%s: no data", what);
  return r;
}

/* Bytes of a compact result, brought to the host (a plain download for a
 * device result). The caller frees them. */
static unsigned char *result_bytes(const DLManagedTensorVersioned *r, size_t nbytes, const char *what) {
  unsigned char *b = malloc(nbytes ? nbytes : 1);
  cr_assert_not_null(b);
  if (nbytes == 0) return b;
  if (r->dl_tensor.device.device_type == kDLCPU) {
    memcpy(b, r->dl_tensor.data, nbytes);
  } else {
    DLManagedTensorVersioned *h = convert_contract(&r->dl_tensor, CPU0, NULL, what);
    memcpy(b, h->dl_tensor.data, nbytes);
    h->deleter(h);
  }
  return b;
}

/* Converts src to `target` with o and compares every element of the
 * result with the reference applied to host_src (src itself when it is on
 * the host, else a host tensor with the same bytes and layout): result
 * element e (row-major over the permuted shape) is the source element at
 * the permuted index, scaled per tensor or per channel (channel = index
 * along SOURCE axis channel_axis). Returns the result's bytes (malloc'd,
 * *nbytes set) for further comparisons; logs the first mismatches. */
static unsigned char *check_conversion(const DLTensor *src, const DLTensor *host_src, DLDevice target,
                                       const ab_convert_opts *o, const char *what, size_t *nbytes) {
  const int from = kind_of(src->dtype);
  const int to = o->dtype.bits != 0 ? kind_of(o->dtype) : from;
  cr_assert(from >= 0 && to >= 0, "%s: not one of the 13 dtypes", what);
  const int32_t nd = src->ndim;
  const int64_t n = numel_of(nd, src->shape);
  const size_t fs = KD[from].size, ts = KD[to].size;
  DLManagedTensorVersioned *r = convert_contract(src, target, o, what);
  *nbytes = (size_t)n * ts;
  unsigned char *got = result_bytes(r, *nbytes, what);
  r->deleter(r);

  int64_t st[AB_MAX_NDIM], rshape[AB_MAX_NDIM], idx[AB_MAX_NDIM] = {0};
  int32_t perm[AB_MAX_NDIM];
  int64_t acc = 1;
  for (int32_t i = nd - 1; i >= 0; i--) {
    st[i] = host_src->strides ? host_src->strides[i] : acc;
    acc *= src->shape[i];
  }
  for (int32_t i = 0; i < nd; i++) {
    perm[i] = o->permute ? o->permute[i] : i;
    rshape[i] = src->shape[perm[i]];
  }
  const unsigned char *base = (const unsigned char *)host_src->data + host_src->byte_offset;
  unsigned char want[8];
  int64_t bad = 0;
  char a[96], b[96], c[96];
  for (int64_t e = 0; e < n; e++) {
    int64_t off = 0, ch = 0;
    for (int32_t i = 0; i < nd; i++) {
      off += idx[i] * st[perm[i]];
      if (perm[i] == o->channel_axis) ch = idx[i];
    }
    struct affine af, *ap = NULL;
    if (o->flags & AB_CONVERT_PER_CHANNEL) {
      af.scale = o->channel_scale ? o->channel_scale[ch] : 1.0;
      af.offset = o->channel_offset ? o->channel_offset[ch] : 0.0;
      ap = &af;
    } else if (o->flags & AB_CONVERT_AFFINE) {
      af.scale = o->scale;
      af.offset = o->offset;
      ap = &af;
    }
    const unsigned char *s = base + off * (int64_t)fs;
    ref_convert(from, s, to, want, ap);
    if (!same_result(to, want, got + (size_t)e * ts)) {
      if (bad < 4)
        cr_log_error("%s: element %lld: source %s, want %s, got %s", what, (long long)e, describe(from, s, a, sizeof a),
                     describe(to, want, b, sizeof b), describe(to, got + (size_t)e * ts, c, sizeof c));
      bad++;
    }
    for (int32_t i = nd - 1; i >= 0; i--) {
      if (++idx[i] < rshape[i]) break;
      idx[i] = 0;
    }
  }
  cr_expect_eq(bad, 0, "%s: %lld of %lld elements differ from the reference", what, (long long)bad, (long long)n);
  return got;
}

/* ---- source values --------------------------------------------------------- */

/* Values around every boundary the rules have: zeros, ties, the integer
 * ranges, float16/bfloat16 rounding and range, subnormals, infinities and
 * NaNs, and the 2^51..2^52 band where a double holds halves but adding
 * 1.5 * 2^52 no longer keeps them. */
static const double DVALS[] = {
  0.0, -0.0, 1, -1, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 0.49999999999999994, -0.49999999999999994, -0.75,
  126.5, 127, 127.5, 128, -127.5, -128, -128.5, -129, 254.5, 255, 255.5, 256, -255.5,
  32766.5, 32767, 32767.5, 32768, -32768, -32768.5, -32769, 65534.5, 65535, 65535.5, 65536,
  2147483646.5, 2147483647, 2147483647.5, 2147483648, -2147483648, -2147483648.5, -2147483649,
  4294967294.5, 4294967295, 4294967295.5, 4294967296,
  0x1p51, 0x1p51 + 0.5, 0x1p51 + 1, 0x1p51 + 1.5, 0x1p51 + 3, 0x1p52 - 1.5, 0x1p52 - 1, 0x1p52 - 0.5, 0x1p52, 0x1p52 + 1,
  -(0x1p51 + 0.5), -(0x1p51 + 1), -(0x1p51 + 1.5), -(0x1p52 - 0.5), -(0x1p52 - 1), 0x1p53, 0x1p53 + 2, 3e15 + 1,
  0x1p63, 0x1p63 - 1024, -0x1p63, -0x1p63 - 2048, 0x1p64, 0x1p64 - 2048, -0x1p64, 1e20, -1e20, 1e300, -1e300, DBL_MAX,
  -DBL_MAX,
  65504, 65519, 65519.99, 65520, -65520, 65536, -65504, 2049, 2051, 4097,
  1 + 0x1p-11, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11 - 0x1p-40, 1 + 3 * 0x1p-11, 1 - 0x1p-12, 1 + 0x1p-8,
  1 + 3 * 0x1p-8, 1 + 0x1p-8 + 0x1p-30, 1 + 0x1p-8 - 0x1p-30, 257, 259, 16777217, 16777219,
  0x1p-24, -0x1p-24, 0x1p-25, -0x1p-25, 3 * 0x1p-25, 0x1p-25 + 0x1p-50, 0x1p-26, 0x1p-14, 0x1p-14 - 0x1p-25,
  0x1p-14 - 0x1p-24, 6e-8, -6e-8,
  0x1.fep127, 0x1.ffp127, 0x1.ff01p127, 0x1.fefffp127, 0x1.fffffep127, 0x1p128, 1e39, -1e39,
  0x1p-126, 0x1p-133, 0x1p-134, 3 * 0x1p-134, 0x1p-134 + 0x1p-160, 0x1p-149, 0x1p-150, 0x1.8p-149, 1e-310, -1e-310,
  1.0 / 3, 0.1, 3.141592653589793, -3141.592653589793, 12345.678,
  (double)INFINITY, -(double)INFINITY, (double)NAN, -(double)NAN,
};

static const uint32_t F32BITS[] = {
  0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x7f800001 /* signalling NaN */,
  0xff800001, 0x7fc00000, 0xffc00001, 0x7fbfffff, 0x3f808000 /* bfloat16 tie, to even below */,
  0x3f818000 /* tie, to even above */, 0x3f808001, 0x3f807fff, 0x7f7f8000 /* tie to infinity */, 0x7f7f7fff,
  0xff7f8000, 0x3f801000 /* float16 tie */, 0x3f803000, 0x3f801001, 0x477fe000 /* 65504 */, 0x477ff000 /* 65520 */,
  0x477fefff, 0x33800000, 0x33000000, 0x33000001, 0x33400000, 0x38800000, 0x387fc000, 0x00010000, 0x00008000,
  0x00018000, 0x00008001, 0x80008000,
};

static const uint64_t F64BITS[] = {
  0x7ff0000000000001ull /* signalling NaN */, 0xfff8000000000000ull, 0x7ff0000000000400ull, 0x0000000000000001ull,
  0x000fffffffffffffull, 0x0010000000000000ull, 0x7fefffffffffffffull, 0x8000000000000001ull,
};

static const int64_t IVALS[] = {
  0, 1, -1, 2, -2, 3, 100, -100, 127, 128, -128, -129, 255, 256, -255, -256, 257, 259, 2049, 2051, 4097,
  32767, 32768, -32768, -32769, 65504, 65519, 65520, 65535, 65536, 16777217, 16777219, -16777217,
  2147483647, 2147483648, -2147483647 - 1, -2147483649, 4294967295, 4294967296,
  (int64_t)1 << 53, ((int64_t)1 << 53) + 1, -(((int64_t)1 << 53) + 1), ((int64_t)1 << 60) + ((int64_t)1 << 36) + 1,
  ((int64_t)1 << 51) + 1, INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1,
};

static const uint64_t UVALS[] = {UINT64_MAX, UINT64_MAX - 1, 1ull << 63, (1ull << 63) + 1, (1ull << 63) - 1,
                                 (1ull << 63) + (1ull << 40) + 1};

struct vals {
  int k;
  unsigned char *b;
  size_t n, cap;
};

static void push_raw(struct vals *v, const void *p) {
  if (v->n == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 1024;
    v->b = realloc(v->b, v->cap * KD[v->k].size);
    cr_assert_not_null(v->b);
  }
  memcpy(v->b + v->n * KD[v->k].size, p, KD[v->k].size);
  v->n++;
}

static void push_int(struct vals *v, wint i) {
  if (w_cmp(i, kmin(v->k)) < 0 || w_cmp(i, kmax(v->k)) > 0) return;
  unsigned char e[8];
  put_int(v->k, e, i);
  push_raw(v, e);
}

/* A double rounded into a float kind (the generator, not the reference
 * under test: any rounding of it is a valid source value). */
static void push_double(struct vals *v, double d) {
  unsigned char e[8];
  put_double(v->k, e, d);
  push_raw(v, e);
}

static void push_bits(struct vals *v, uint64_t bits) {
  unsigned char e[8];
  put_low_bytes(e, bits, KD[v->k].size);
  push_raw(v, e);
}

static struct vals make_values(int k) {
  struct vals v = {k, NULL, 0, 0};
  test_rng g = {0x5eed0000u + (uint64_t)k};
  switch (k) {
  case R_BOOL:
    push_int(&v, w_u(0));
    push_int(&v, w_u(1));
    break;
  case R_I8:
  case R_U8:
  case R_I16:
  case R_U16:
  case R_F16:
  case R_BF16: /* every bit pattern */
    for (uint64_t b = 0; b < (1ull << (8 * KD[k].size)); b++) push_bits(&v, b);
    break;
  case R_I32:
  case R_U32:
  case R_I64:
  case R_U64:
    for (size_t i = 0; i < sizeof IVALS / sizeof IVALS[0]; i++) push_int(&v, w_s(IVALS[i]));
    for (size_t i = 0; i < sizeof UVALS / sizeof UVALS[0]; i++) push_int(&v, w_u(UVALS[i]));
    push_int(&v, kmin(k));
    push_int(&v, w_add(kmin(k), 1));
    push_int(&v, kmax(k));
    push_int(&v, w_add(kmax(k), -1));
    for (int i = 0; i < 3000; i++) push_bits(&v, rng_next(&g));
    for (int i = 0; i < 1000; i++) push_int(&v, w_s(rng_between(&g, -70000, 70000)));
    break;
  case R_F32:
    for (size_t i = 0; i < sizeof DVALS / sizeof DVALS[0]; i++) push_double(&v, DVALS[i]);
    for (size_t i = 0; i < sizeof F32BITS / sizeof F32BITS[0]; i++) push_bits(&v, F32BITS[i]);
    for (int i = 0; i < 3000; i++) push_bits(&v, (uint32_t)rng_next(&g));
    for (int i = 0; i < 3000; i++) { /* exponents around the float16 and integer ranges */
      uint32_t r = (uint32_t)rng_next(&g), e = (uint32_t)rng_between(&g, 95, 192);
      push_bits(&v, (r & 0x807fffffu) | (e << 23));
    }
    for (int i = 0; i < 500; i++) { /* exact float16 ties */
      uint32_t r = (uint32_t)rng_next(&g), e = (uint32_t)rng_between(&g, 100, 142);
      push_bits(&v, (r & 0x807fe000u) | 0x1000u | (e << 23));
    }
    for (int i = 0; i < 500; i++) { /* exact bfloat16 ties */
      uint32_t r = (uint32_t)rng_next(&g), e = (uint32_t)rng_between(&g, 0, 254);
      push_bits(&v, (r & 0x807f0000u) | 0x8000u | (e << 23));
    }
    break;
  case R_F64:
    for (size_t i = 0; i < sizeof DVALS / sizeof DVALS[0]; i++) push_double(&v, DVALS[i]);
    for (size_t i = 0; i < sizeof F64BITS / sizeof F64BITS[0]; i++) push_bits(&v, F64BITS[i]);
    for (int i = 0; i < 3000; i++) push_bits(&v, rng_next(&g));
    for (int i = 0; i < 3000; i++) { /* exponents around the float16 and integer ranges */
      uint64_t r = rng_next(&g), e = (uint64_t)rng_between(&g, 1023 - 30, 1023 + 66);
      push_bits(&v, (r & 0x800fffffffffffffull) | (e << 52));
    }
    for (int i = 0; i < 300; i++) { /* exact float16, bfloat16 and float32 ties */
      uint64_t r = rng_next(&g), e = (uint64_t)rng_between(&g, 1023 - 24, 1023 + 15);
      push_bits(&v, (r & 0x800ffc0000000000ull) | (1ull << 41) | (e << 52));
      e = (uint64_t)rng_between(&g, 1023 - 133, 1023 + 127);
      push_bits(&v, (r & 0x800fe00000000000ull) | (1ull << 44) | (e << 52));
      push_bits(&v, (r & 0x800fffffe0000000ull) | (1ull << 28) | (e << 52));
    }
    for (int i = 0; i < 300; i++) { /* integers and halves in [2^51, 2^52) */
      double d = 0x1p51 + (double)(rng_next(&g) >> 13) + ((rng_next(&g) & 1) ? 0.5 : 0.0);
      push_double(&v, (rng_next(&g) & 1) ? -d : d);
    }
    for (int i = 0; i < 300; i++) /* halves in the int32 range */
      push_double(&v, (double)rng_between(&g, INT32_MIN, INT32_MAX) + 0.5);
    break;
  default: cr_assert_fail("no such kind %d", k);
  }
  return v;
}

/* ---- 1. every pair of the 13 dtypes ------------------------------------------ */

static void check_every_target_from(int from) {
  struct vals v = make_values(from);
  int64_t shape[1] = {(int64_t)v.n};
  DLTensor src = {v.b, CPU0, 1, KD[from].dt, shape, NULL, 0};
  const uint64_t sum = checksum(v.b, v.n * KD[from].size);
  const uint64_t in_use = pool_in_use(CPU0);
  for (int to = 0; to < R_COUNT; to++) {
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.copy = AB_COPY_ALWAYS; /* the same dtype too: a copy, compared as well */
    char what[64];
    snprintf(what, sizeof what, "%s -> %s", KD[from].name, KD[to].name);
    size_t nb;
    free(check_conversion(&src, &src, CPU0, &o, what, &nb));
  }
  cr_assert_eq(checksum(v.b, v.n * KD[from].size), sum, "%s source modified", KD[from].name);
  cr_assert_eq(pool_in_use(CPU0), in_use, "host pool in_use_bytes did not return to its start");
  free(v.b);
}

#define EVERY_TARGET_FROM(K, NAME) \
  Test(cast, from_##NAME##_to_each_of_the_13_dtypes_matches_the_scalar_reference) { check_every_target_from(K); }
EVERY_TARGET_FROM(R_BOOL, bool)
EVERY_TARGET_FROM(R_I8, int8)
EVERY_TARGET_FROM(R_I16, int16)
EVERY_TARGET_FROM(R_I32, int32)
EVERY_TARGET_FROM(R_I64, int64)
EVERY_TARGET_FROM(R_U8, uint8)
EVERY_TARGET_FROM(R_U16, uint16)
EVERY_TARGET_FROM(R_U32, uint32)
EVERY_TARGET_FROM(R_U64, uint64)
EVERY_TARGET_FROM(R_F16, float16)
EVERY_TARGET_FROM(R_BF16, bfloat16)
EVERY_TARGET_FROM(R_F32, float32)
EVERY_TARGET_FROM(R_F64, float64)

/* A few results written out by hand, so that the reference itself is
 * pinned to the rules and not only to the library. */
static void convert_one(int from, const void *x, int to, void *y, const ab_convert_opts *base) {
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  if (base != NULL) o = *base;
  o.dtype = KD[to].dt;
  int64_t shape[1] = {1};
  DLTensor t = {(void *)x, CPU0, 1, KD[from].dt, shape, NULL, 0};
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "one element");
  memcpy(y, r->dl_tensor.data, KD[to].size);
  r->deleter(r);
}

static double d_to(int to, double x) {
  uint64_t y = 0;
  convert_one(R_F64, &x, to, &y, NULL);
  const rval v = ref_load(to, (const unsigned char *)&y);
  return v.is_int ? w_double(v.i) : v.d;
}

static uint16_t d_to_bits16(int to, double x) {
  uint16_t y = 0;
  convert_one(R_F64, &x, to, &y, NULL);
  return y;
}

/* The float16 reference by hand (soft_f16_value, soft_f16_bits), which
 * stands in where the compiler has no _Float16: values checked by hand on
 * every compiler, and where _Float16 is, every float16 value, every
 * midpoint between neighbours (ties), the doubles either side of each,
 * and random doubles from below the subnormals to past the largest,
 * against it. */
Test(cast, the_float16_reference_by_hand_agrees_with_float16) {
  static const struct { double d; uint16_t b; } hand[] = {
      {1 + 0x1p-11, 0x3c00}, {1 + 3 * 0x1p-11, 0x3c02}, {1 + 0x1p-11 + 0x1p-40, 0x3c01}, {65504, 0x7bff},
      {65519.99, 0x7bff},    {65520, 0x7c00},          {0x1p-24, 0x0001},                 {0x1p-25, 0x0000},
      {3 * 0x1p-25, 0x0002}, {-0.0, 0x8000},           {0x1p-14, 0x0400},                 {1023.5 * 0x1p-24, 0x0400},
      {1022.5 * 0x1p-24, 0x03fe}, {-2.0, 0xc000},      {1e300, 0x7c00},                   {-1e-300, 0x8000},
      {-65520, 0xfc00},      {0x1.ffdffffffffffp+15, 0x7bff}, {-0x1.ffdffffffffffp+15, 0xfbff}}; /* 65520 - an ulp */
  for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++)
    cr_expect_eq(soft_f16_bits(hand[i].d), hand[i].b, "%a: 0x%04x, want 0x%04x", hand[i].d, soft_f16_bits(hand[i].d),
                 hand[i].b);
  cr_expect_eq(soft_f16_bits((double)INFINITY), 0x7c00);
  cr_expect_eq(soft_f16_bits(-(double)INFINITY), 0xfc00);
  const uint16_t qnan = soft_f16_bits((double)NAN);
  cr_expect((qnan & 0x7c00) == 0x7c00 && (qnan & 0x03ff) != 0, "NaN: 0x%04x", qnan);
  cr_expect(soft_f16_value(0x3c00) == 1.0 && soft_f16_value(0x0001) == 0x1p-24 && soft_f16_value(0x7bff) == 65504);
  cr_expect(soft_f16_value(0x03ff) == 1023 * 0x1p-24 && soft_f16_value(0xfc00) == -(double)INFINITY);
  cr_expect(isnan(soft_f16_value(0x7e00)) && isnan(soft_f16_value(0xfc01)) && signbit(soft_f16_value(0x8000)));
#ifdef HAVE_FLOAT16
  for (uint32_t b = 0; b <= 0xffff; b++) {
    const double want = f16_value((uint16_t)b), got = soft_f16_value((uint16_t)b);
    cr_assert(isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want), "0x%04x: %a, want %a", b, got,
              want);
    if (isnan(want) || (b & 0x7fff) > 0x7bff) continue;
    /* the tie between b and its neighbour away from zero (past the largest
     * finite, 65536), and either side of it */
    const double next = (b & 0x7fff) == 0x7bff ? copysign(65536.0, want) : f16_value((uint16_t)(b + 1));
    const double mid = (want + next) / 2;
    const double probes[3] = {mid, nextafter(mid, 0.0), nextafter(mid, b & 0x8000 ? -(double)INFINITY : (double)INFINITY)};
    for (int k = 0; k < 3; k++)
      cr_assert_eq(soft_f16_bits(probes[k]), f16_bits(probes[k]), "%a: 0x%04x, want 0x%04x", probes[k],
                   soft_f16_bits(probes[k]), f16_bits(probes[k]));
  }
  test_rng g = {7};
  for (int i = 0; i < 200000; i++) {
    const double d = ldexp((double)rng_between(&g, 1, 1 << 30), rng_between(&g, -60, -10)) * (i & 1 ? -1 : 1);
    cr_assert_eq(soft_f16_bits(d), f16_bits(d), "%a: 0x%04x, want 0x%04x", d, soft_f16_bits(d), f16_bits(d));
  }
#endif
}

Test(cast, hand_checked_values_follow_the_rules) {
  /* round half to even, saturation, NaN -> 0 */
  cr_expect_eq(d_to(R_I32, 2.5), 2);
  cr_expect_eq(d_to(R_I32, -2.5), -2);
  cr_expect_eq(d_to(R_I32, 3.5), 4);
  cr_expect_eq(d_to(R_I8, -0.5), 0);
  cr_expect_eq(d_to(R_U8, 255.5), 255);
  cr_expect_eq(d_to(R_U8, 254.5), 254);
  cr_expect_eq(d_to(R_U8, -3.0), 0);
  cr_expect_eq(d_to(R_I16, 1e9), 32767);
  cr_expect_eq(d_to(R_I16, (double)NAN), 0);
  cr_expect_eq(d_to(R_I64, (double)INFINITY), (double)INT64_MAX);
  cr_expect_eq(d_to(R_I64, 0x1p51 + 1), 0x1p51 + 1, "float64 2^51+1 -> int64 must be exact");
  cr_expect_eq(d_to(R_I64, 0x1p52 - 1), 0x1p52 - 1, "float64 2^52-1 -> int64 must be exact");
  cr_expect_eq(d_to(R_I64, -(0x1p52 - 0.5)), -0x1p52, "float64 -(2^52-0.5) -> int64: tie to even");
  cr_expect_eq(d_to(R_BOOL, (double)NAN), 1);
  cr_expect_eq(d_to(R_BOOL, -0.0), 0);
  /* float16: ties to even, overflow to infinity, one rounding from the double */
  cr_expect_eq(d_to_bits16(R_F16, 1 + 0x1p-11), 0x3c00);
  cr_expect_eq(d_to_bits16(R_F16, 1 + 3 * 0x1p-11), 0x3c02);
  cr_expect_eq(d_to_bits16(R_F16, 1 + 0x1p-11 + 0x1p-40), 0x3c01, "rounded twice (through float32)?");
  cr_expect_eq(d_to_bits16(R_F16, 65504), 0x7bff);
  cr_expect_eq(d_to_bits16(R_F16, 65519.99), 0x7bff);
  cr_expect_eq(d_to_bits16(R_F16, 65520), 0x7c00);
  cr_expect_eq(d_to_bits16(R_F16, 0x1p-24), 0x0001);
  cr_expect_eq(d_to_bits16(R_F16, 0x1p-25), 0x0000);
  cr_expect_eq(d_to_bits16(R_F16, 3 * 0x1p-25), 0x0002);
  cr_expect_eq(d_to_bits16(R_F16, -0.0), 0x8000);
  /* bfloat16 */
  cr_expect_eq(d_to_bits16(R_BF16, 1 + 0x1p-8), 0x3f80);
  cr_expect_eq(d_to_bits16(R_BF16, 1 + 3 * 0x1p-8), 0x3f82);
  cr_expect_eq(d_to_bits16(R_BF16, 1 + 0x1p-8 + 0x1p-30), 0x3f81, "rounded twice (through float32)?");
  cr_expect_eq(d_to_bits16(R_BF16, 0x1.ffp127), 0x7f80);
  cr_expect_eq(d_to_bits16(R_BF16, 0x1.fefffp127), 0x7f7f);
  uint16_t nan16 = d_to_bits16(R_BF16, (double)NAN);
  cr_expect((nan16 & 0x7f80) == 0x7f80 && (nan16 & 0x7f), "bfloat16 NaN became 0x%04x", nan16);
  /* a float32 signalling NaN stays a NaN (truncating its bits would give infinity) */
  uint32_t snan = 0x7f800001u;
  uint16_t b = 0;
  convert_one(R_F32, &snan, R_BF16, &b, NULL);
  cr_expect((b & 0x7f80) == 0x7f80 && (b & 0x7f), "float32 sNaN -> bfloat16 0x%04x", b);
  /* integer -> integer: exact, saturating */
  int16_t i16 = -300;
  uint8_t u8 = 77;
  convert_one(R_I16, &i16, R_U8, &u8, NULL);
  cr_expect_eq(u8, 0);
  int32_t i32 = 70000;
  convert_one(R_I32, &i32, R_I16, &i16, NULL);
  cr_expect_eq(i16, 32767);
  uint64_t u64 = UINT64_MAX;
  int64_t i64 = 0;
  convert_one(R_U64, &u64, R_I64, &i64, NULL);
  cr_expect_eq(i64, INT64_MAX);
  i64 = INT64_MAX - 1; /* exact, not through a double */
  u64 = 0;
  convert_one(R_I64, &i64, R_U64, &u64, NULL);
  cr_expect_eq(u64, (uint64_t)INT64_MAX - 1);
  /* bool -> 0 or 1 */
  uint8_t t = 1;
  float f = 0;
  convert_one(R_BOOL, &t, R_F32, &f, NULL);
  cr_expect_eq(f, 1.0f);
}

/* ---- 2. affine per tensor --------------------------------------------------- */

Test(cast, uint8_to_float32_affine_is_a_float32_multiply_then_add) {
  uint8_t x[256];
  for (int i = 0; i < 256; i++) x[i] = (uint8_t)i;
  int64_t shape[1] = {256};
  DLTensor t = {x, CPU0, 1, KD[R_U8].dt, shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 1.0 / 255;
  o.offset = -0.5;
  const uint64_t in_use = pool_in_use(CPU0);
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "uint8 -> float32 affine");
  const float *y = r->dl_tensor.data;
  int differs_from_double = 0;
  for (int i = 0; i < 256; i++) {
    volatile float m = (float)x[i] * (float)o.scale;
    const float want = m + (float)o.offset;
    cr_expect(memcmp(&want, &y[i], 4) == 0, "x = %d: want %a, got %a", i, (double)want, (double)y[i]);
    differs_from_double += want != (float)((double)x[i] * o.scale + o.offset);
  }
  /* the case distinguishes the float32 path from a float64 one */
  cr_assert_gt(differs_from_double, 0);
  r->deleter(r);
  cr_assert_eq(pool_in_use(CPU0), in_use);
  cr_assert_eq(x[200], 200, "source modified");
}

Test(cast, float32_to_uint8_with_scale_255_rounds_half_to_even_and_saturates) {
  float x[1800];
  size_t n = 0;
  for (int k = -300; k <= 1400; k++) x[n++] = (float)k / 1024;
  const float extra[] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, 1e30f, -1e30f, FLT_MAX, 0.5f, 1.5f};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) x[n++] = extra[i];
  int64_t shape[1] = {(int64_t)n};
  DLTensor t = {x, CPU0, 1, KD[R_F32].dt, shape, NULL, 0};
  const uint64_t sum = checksum(x, sizeof x);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_U8].dt;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 255;
  size_t nb;
  free(check_conversion(&t, &t, CPU0, &o, "float32 -> uint8, scale 255", &nb));
  o.dtype = KD[R_I8].dt;
  free(check_conversion(&t, &t, CPU0, &o, "float32 -> int8, scale 255", &nb));
  /* by hand: 0.5 * 255 = 127.5 -> 128, 1.5 * 255 -> 255, NaN -> 0, -inf -> 0 */
  uint8_t y = 7;
  float v = 0.5f;
  convert_one(R_F32, &v, R_U8, &y, &o);
  cr_expect_eq(y, 128);
  v = 1.5f;
  convert_one(R_F32, &v, R_U8, &y, &o);
  cr_expect_eq(y, 255);
  v = NAN;
  convert_one(R_F32, &v, R_U8, &y, &o);
  cr_expect_eq(y, 0);
  v = -INFINITY;
  convert_one(R_F32, &v, R_U8, &y, &o);
  cr_expect_eq(y, 0);
  /* ties after a scale of 2: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 */
  o.scale = 2;
  const float ties[3] = {0.25f, 0.75f, 1.25f};
  const uint8_t want[3] = {0, 2, 2};
  for (int i = 0; i < 3; i++) {
    convert_one(R_F32, &ties[i], R_U8, &y, &o);
    cr_expect_eq(y, want[i], "%g * 2 -> %u, want %u", (double)ties[i], y, want[i]);
  }
  cr_assert_eq(checksum(x, sizeof x), sum, "source modified");
}

Test(cast, wide_sources_use_float64_arithmetic_narrow_ones_float32) {
  /* int32 -> float64: a double multiply then add */
  int32_t x[] = {0, 1, -1, 7, 1000003, INT32_MAX, INT32_MIN, 16777217, -16777219, 123456789};
  int64_t shape[1] = {sizeof x / sizeof x[0]};
  DLTensor t = {x, CPU0, 1, KD[R_I32].dt, shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F64].dt;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 1.0 / 3;
  o.offset = 0.1;
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "int32 -> float64 affine");
  for (int64_t i = 0; i < shape[0]; i++) {
    volatile double m = (double)x[i] * o.scale;
    const double want = m + o.offset;
    const double got = ((const double *)r->dl_tensor.data)[i];
    cr_expect(memcmp(&want, &got, 8) == 0, "int32 %d: want %a, got %a", x[i], want, got);
  }
  r->deleter(r);
  size_t nb;
  /* int32 -> float32: float64 arithmetic too (int32 is a wide source) */
  o.dtype = KD[R_F32].dt;
  o.scale = 1;
  o.offset = 1;
  free(check_conversion(&t, &t, CPU0, &o, "int32 -> float32 affine", &nb));
  int32_t big = 16777217;
  float f = 0;
  convert_one(R_I32, &big, R_F32, &f, &o);
  cr_expect_eq(f, 16777218.0f, "16777217 * 1 + 1 in float64 is 16777218 (in float32 it would be 16777216), got %.1f",
               (double)f);
  /* int32 -> float16: float64 arithmetic, one rounding: 2049 + 2^-20 -> 2050 */
  o.offset = 0x1p-20;
  int32_t i2049 = 2049;
  uint16_t h = 0;
  convert_one(R_I32, &i2049, R_F16, &h, &o);
  cr_expect_eq(h, 0x6801, "int32 2049 * 1 + 2^-20 -> float16 0x%04x, want 0x6801 (2050)", h);
  /* uint8 -> float16: float32 arithmetic: 1 + (float)(2048 + 2^-20) = 2049 -> tie -> 2048 */
  o.offset = 2048 + 0x1p-20;
  uint8_t one = 1;
  convert_one(R_U8, &one, R_F16, &h, &o);
  cr_expect_eq(h, 0x6800, "uint8 1 * 1 + (2048 + 2^-20) -> float16 0x%04x, want 0x6800 (2048, float32 path)", h);
  /* float64 -> float16 affine: one rounding from the double */
  double d = 1;
  o.scale = 1;
  o.offset = 0x1p-11 + 0x1p-40;
  convert_one(R_F64, &d, R_F16, &h, &o);
  cr_expect_eq(h, 0x3c01, "float64 1 + 2^-11 + 2^-40 -> float16 0x%04x, want 0x3c01", h);
  /* every source kind with an affine map into a few targets, against the reference */
  const int targets[] = {R_F32, R_F16, R_BF16, R_F64, R_I16, R_U8, R_BOOL};
  for (int from = 0; from < R_COUNT; from++) {
    struct vals v = make_values(from);
    if (v.n > 4096) v.n = 4096;
    int64_t sh[1] = {(int64_t)v.n};
    DLTensor s = {v.b, CPU0, 1, KD[from].dt, sh, NULL, 0};
    for (size_t j = 0; j < sizeof targets / sizeof targets[0]; j++) {
      ab_convert_opts a = AB_CONVERT_OPTS_INIT;
      a.dtype = KD[targets[j]].dt;
      a.flags = AB_CONVERT_AFFINE;
      a.scale = -0.3;
      a.offset = 7.25;
      char what[80];
      snprintf(what, sizeof what, "%s -> %s, x * -0.3 + 7.25", KD[from].name, KD[targets[j]].name);
      free(check_conversion(&s, &s, CPU0, &a, what, &nb));
    }
    free(v.b);
  }
}

/* ---- 3. per-channel normalisation ------------------------------------------------ */

static const double MEAN[4] = {0.485, 0.456, 0.406, 0.5}, STD[4] = {0.229, 0.224, 0.225, 0.25};

/* An H x W x C uint8 image to a C x H x W float32 tensor, normalised per
 * channel, against a reference loop. */
static void normalise_image(int64_t H, int64_t W, int64_t C, bool null_scale, bool null_offset, bool per_tensor) {
  char what[96];
  snprintf(what, sizeof what, "HWC %lldx%lldx%lld%s%s%s", (long long)H, (long long)W, (long long)C,
           null_scale ? ", NULL scale" : "", null_offset ? ", NULL offset" : "", per_tensor ? ", per tensor" : "");
  const size_t n = (size_t)(H * W * C);
  uint8_t *img = malloc(n);
  cr_assert_not_null(img);
  fill_pattern(img, n, (uint32_t)n);
  const uint64_t sum = checksum(img, n);
  const uint64_t in_use = pool_in_use(CPU0);
  double cs[4], co[4];
  for (int c = 0; c < 4; c++) {
    cs[c] = 1.0 / (255 * STD[c]);
    co[c] = -MEAN[c] / STD[c];
  }
  int64_t shape[3] = {H, W, C};
  DLTensor t = {img, CPU0, 3, KD[R_U8].dt, shape, NULL, 0};
  static const int32_t perm[3] = {2, 0, 1};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.permute = perm;
  if (per_tensor) {
    o.flags = AB_CONVERT_AFFINE;
    o.scale = 1.0 / 255;
    o.offset = -0.5;
  } else {
    o.flags = AB_CONVERT_PER_CHANNEL;
    o.channel_axis = 2;
    o.channel_scale = null_scale ? NULL : cs;
    o.channel_offset = null_offset ? NULL : co;
  }
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, what);
  const float *y = r->dl_tensor.data;
  int64_t bad = 0;
  for (int64_t c = 0; c < C; c++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++) {
        const float a = per_tensor ? (float)o.scale : null_scale ? 1.0f : (float)cs[c];
        const float b = per_tensor ? (float)o.offset : null_offset ? 0.0f : (float)co[c];
        volatile float m = (float)img[(h * W + w) * C + c] * a;
        const float want = m + b;
        const float got = y[(c * H + h) * W + w];
        if (memcmp(&want, &got, 4) != 0 && bad++ < 4)
          cr_log_error("%s: c %lld h %lld w %lld: want %a, got %a", what, (long long)c, (long long)h, (long long)w,
                       (double)want, (double)got);
      }
  cr_expect_eq(bad, 0, "%s: %lld elements differ", what, (long long)bad);
  r->deleter(r);
  cr_assert_eq(checksum(img, n), sum, "%s: source modified", what);
  cr_assert_eq(pool_in_use(CPU0), in_use, "%s: host pool in_use did not return", what);
  free(img);
}

Test(cast, hwc_uint8_image_normalised_per_channel_into_chw_float32) {
  normalise_image(7, 5, 3, false, false, false);
  normalise_image(6, 40, 3, false, false, false); /* 16-pixel blocks and a tail */
  normalise_image(4, 33, 4, false, false, false); /* RGBA */
  normalise_image(5, 9, 2, false, false, false);
  if (!AB_TEST_SANITIZED) normalise_image(520, 700, 3, false, false, false); /* >= 4 MiB of output */
}

Test(cast, null_channel_offset_means_zero_and_null_scale_means_one) {
  normalise_image(7, 5, 3, false, true, false);
  normalise_image(7, 5, 3, true, false, false);
  normalise_image(6, 40, 3, false, true, false);
  normalise_image(6, 40, 3, true, true, false);
  normalise_image(3, 21, 4, false, true, false);
}

Test(cast, hwc_uint8_image_with_a_per_tensor_affine_into_chw_float32) {
  normalise_image(7, 5, 3, false, false, true);
  normalise_image(6, 40, 3, false, false, true);
  normalise_image(4, 17, 4, false, false, true);
}

/* The SSSE3 image loop (three channels) is capped by AB_HOST_TILES as the
 * other kernels are: it ran under AB_HOST_TILES=sse2 before. */
Test(cast, the_ssse3_image_loop_follows_ab_host_tiles) {
  ab__host_count_choices(true);
  setenv("AB_HOST_TILES", "sse2", 1);
  ab__env_reload();
  unsigned long before = ab__host_ran_count(AB_RAN_PLANES_RGB_SSSE3);
  normalise_image(6, 40, 3, false, false, false);
  cr_assert_eq(ab__host_ran_count(AB_RAN_PLANES_RGB_SSSE3), before, "the SSSE3 image loop ran with AB_HOST_TILES=sse2");
  unsetenv("AB_HOST_TILES");
  ab__env_reload();
  before = ab__host_ran_count(AB_RAN_PLANES_RGB_SSSE3);
  normalise_image(6, 40, 3, false, false, false);
  cr_assert_eq(ab__host_ran_count(AB_RAN_PLANES_RGB_SSSE3) > before, ab__host_tiles_level() >= AB_TILES_SSSE3,
               "the SSSE3 image loop ran (%d) where the kernels' level is %d", ab__host_ran_count(AB_RAN_PLANES_RGB_SSSE3) > before,
               ab__host_tiles_level());
  ab__host_count_choices(false);
}

Test(cast, channel_axis_names_a_source_axis_not_a_result_axis) {
  int16_t x[4 * 3];
  for (int i = 0; i < 12; i++) x[i] = (int16_t)(i * 37 - 200);
  int64_t shape[2] = {4, 3};
  DLTensor t = {x, CPU0, 2, KD[R_I16].dt, shape, NULL, 0};
  static const int32_t perm[2] = {1, 0};
  const double cs[4] = {1, 10, 100, 1000}, co[4] = {0.5, -0.25, 3, -7};
  size_t nb;
  for (int axis = 0; axis < 2; axis++) {
    const int targets[3] = {R_F32, R_F64, R_I32};
    for (int j = 0; j < 3; j++) {
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = KD[targets[j]].dt;
      o.permute = perm;
      o.flags = AB_CONVERT_PER_CHANNEL;
      o.channel_axis = axis;
      o.channel_scale = cs;
      o.channel_offset = co;
      char what[80];
      snprintf(what, sizeof what, "int16 4x3 -> %s 3x4, channel axis %d", KD[targets[j]].name, axis);
      free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    }
  }
  /* by hand: result[j][i] = x[i][j] * cs[i] + co[i] along source axis 0 */
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F64].dt;
  o.permute = perm;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 0;
  o.channel_scale = cs;
  o.channel_offset = co;
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "by hand");
  const double *y = r->dl_tensor.data;
  cr_expect_eq(y[0 * 4 + 3], (double)x[3 * 3 + 0] * 1000 - 7); /* result (0, 3) = source (3, 0) */
  cr_expect_eq(y[2 * 4 + 1], (double)x[1 * 3 + 2] * 10 - 0.25);
  r->deleter(r);
}

Test(cast, per_channel_along_any_axis_with_and_without_permutation) {
  size_t nb;
  /* a channel along the innermost axis (it changes within a row), no permutation, same dtype */
  float f[5 * 4];
  for (int i = 0; i < 20; i++) f[i] = (float)i * 0.75f - 6;
  int64_t s2[2] = {5, 4};
  DLTensor t2 = {f, CPU0, 2, KD[R_F32].dt, s2, NULL, 0};
  const double cs[5] = {2, -1, 0.5, 3, 7}, co[5] = {1, 2, 3, 4, 5};
  for (int variant = 0; variant < 4; variant++) {
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.flags = AB_CONVERT_PER_CHANNEL;
    o.channel_axis = 1;
    o.channel_scale = variant & 1 ? NULL : cs;
    o.channel_offset = variant & 2 ? NULL : co;
    char what[80];
    snprintf(what, sizeof what, "float32 5x4, channel axis 1, variant %d", variant);
    free(check_conversion(&t2, &t2, CPU0, &o, what, &nb));
    o.dtype = KD[R_F16].dt;
    free(check_conversion(&t2, &t2, CPU0, &o, what, &nb));
    o.channel_axis = 0;
    o.dtype = KD[R_I8].dt;
    free(check_conversion(&t2, &t2, CPU0, &o, what, &nb));
  }
  /* a middle axis of a 3-D source under a permutation */
  uint16_t u[3 * 4 * 5];
  fill_pattern(u, sizeof u, 99);
  int64_t s3[3] = {3, 4, 5};
  DLTensor t3 = {u, CPU0, 3, KD[R_U16].dt, s3, NULL, 0};
  const int32_t perms[3][3] = {{2, 1, 0}, {1, 2, 0}, {0, 1, 2}};
  for (int p = 0; p < 3; p++) {
    for (int axis = 0; axis < 3; axis++) {
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = KD[p == 1 ? R_F64 : R_F16].dt;
      o.permute = perms[p];
      o.flags = AB_CONVERT_PER_CHANNEL;
      o.channel_axis = axis;
      o.channel_scale = cs;
      o.channel_offset = axis == 1 ? NULL : co;
      char what[80];
      snprintf(what, sizeof what, "uint16 3x4x5, permutation %d, channel axis %d", p, axis);
      free(check_conversion(&t3, &t3, CPU0, &o, what, &nb));
    }
  }
  /* int32 (a wide source) per channel into float32: float64 arithmetic */
  int32_t w[2 * 3] = {16777217, 1, -16777217, 5, 100000001, -3};
  int64_t sw[2] = {2, 3};
  DLTensor tw = {w, CPU0, 2, KD[R_I32].dt, sw, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 0;
  const double one[2] = {1, 1}, plus1[2] = {1, 1};
  o.channel_scale = one;
  o.channel_offset = plus1;
  free(check_conversion(&tw, &tw, CPU0, &o, "int32 per channel -> float32", &nb));
}

/* A host tensor of `kind` and `shape` (with `strides`, or compact; either
 * way it holds the elements of the shape, no more), filled with that
 * kind's edge values; the caller frees its data. */
static DLTensor probe_tensor(int kind, int32_t ndim, int64_t *shape, int64_t *strides, test_rng *g) {
  const int64_t n = numel_of(ndim, shape);
  void *p = malloc((size_t)n * KD[kind].size);
  cr_assert_not_null(p);
  fill_cast_probes(p, n, KD[kind].dt, g);
  return (DLTensor){p, CPU0, ndim, KD[kind].dt, shape, strides, 0};
}

/* Casts of sources whose rows are not contiguous, large enough that the
 * host converter cuts them into chunks (256 KiB of source each, gathered
 * then cast as contiguous rows): several chunks along one dim, a ragged
 * last chunk, chunks under outer dims, channels riding in every chunk,
 * per-channel maps along a dim before the chunks, along a riding one,
 * along the cut dim and along the innermost one (which takes the element
 * loop), every arithmetic path, on edge values. */
Test(cast, large_permuted_and_transposed_casts_match_the_reference) {
  test_rng g = {0xc4a5700du};
  size_t nb;
  double cs[700], co[700];
  for (int i = 0; i < 700; i++) {
    cs[i] = (i % 7) * 0.25 - 0.5;
    co[i] = (i % 5) * 3.0 - 1.5;
  }
  /* an HWC float32 image (301 x 300 x 3) as CHW uint8, per channel */
  int64_t hwc[3] = {301, 300, 3};
  DLTensor ti = probe_tensor(R_F32, 3, hwc, NULL, &g);
  const int32_t to_chw[3] = {2, 0, 1};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_U8].dt;
  o.permute = to_chw;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = cs;
  o.channel_offset = co;
  free(check_conversion(&ti, &ti, CPU0, &o, "float32 HWC -> uint8 CHW per channel", &nb));
  free(ti.data);
  /* transposed views (650 x 700 sources read as 700 x 650) of each kind */
  static const struct { int from, to; int map; } tr[] = {
    {R_F32, R_F16, 0}, {R_F32, R_I8, 1}, {R_I16, R_I8, 0},  {R_F64, R_I32, 1}, {R_U8, R_F32, 1},
    {R_U16, R_F64, 0}, {R_I32, R_F32, 1}, {R_F32, R_F32, 2}, {R_F32, R_U16, 3}, {R_U8, R_F32, 2},
    {R_F64, R_F32, 4},
  };
  for (size_t k = 0; k < sizeof tr / sizeof tr[0]; k++) {
    int64_t shape[2] = {700, 650}, st[2] = {1, 700};
    DLTensor t = probe_tensor(tr[k].from, 2, shape, st, &g);
    ab_convert_opts q = AB_CONVERT_OPTS_INIT;
    q.dtype = KD[tr[k].to].dt;
    if (tr[k].map == 1) {
      q.flags = AB_CONVERT_AFFINE;
      q.scale = 0.75;
      q.offset = -3.5;
    } else if (tr[k].map >= 2) { /* per row of the result (the cut dim; 4: no scale), 3: per column (innermost) */
      q.flags = AB_CONVERT_PER_CHANNEL;
      q.channel_axis = tr[k].map == 3 ? 1 : 0;
      q.channel_scale = tr[k].map == 4 ? NULL : cs;
      q.channel_offset = tr[k].map == 3 ? NULL : co;
    }
    char what[96];
    snprintf(what, sizeof what, "transposed %s -> %s, map %d", KD[tr[k].from].name, KD[tr[k].to].name, tr[k].map);
    free(check_conversion(&t, &t, CPU0, &q, what, &nb));
    free(t.data);
  }
  /* batched transposes: a float32 source (2, 3, 260, 300) as (2, 3, 300,
   * 260) int16, cut at its third dim (chunks of 240 rows and a ragged
   * 60) under the first two, with a channel along the second */
  int64_t s4[4] = {2, 3, 260, 300};
  DLTensor t4 = probe_tensor(R_F32, 4, s4, NULL, &g);
  const int32_t p4[4] = {0, 1, 3, 2};
  ab_convert_opts q = AB_CONVERT_OPTS_INIT;
  q.dtype = KD[R_I16].dt;
  q.permute = p4;
  q.flags = AB_CONVERT_AFFINE;
  q.scale = 300.0;
  q.offset = -0.5;
  free(check_conversion(&t4, &t4, CPU0, &q, "float32 (2,3,260,300) -> int16 (2,3,300,260)", &nb));
  q.flags = AB_CONVERT_PER_CHANNEL;
  q.channel_axis = 1; /* result dim 1, before the chunks */
  q.channel_scale = cs;
  q.channel_offset = co;
  free(check_conversion(&t4, &t4, CPU0, &q, "float32 4-D per channel -> int16", &nb));
  free(t4.data);
  /* a batch of two uint16 HWC images (300 x 450 x 4) as CHW float32: the
   * four channels ride in every chunk (pixels to planes), chunks of 64
   * rows and a ragged 44, per channel with a scale and no offset */
  int64_t sb[4] = {2, 300, 450, 4};
  DLTensor tb = probe_tensor(R_U16, 4, sb, NULL, &g);
  const int32_t pb[4] = {0, 3, 1, 2};
  ab_convert_opts r = AB_CONVERT_OPTS_INIT;
  r.dtype = KD[R_F32].dt;
  r.permute = pb;
  r.flags = AB_CONVERT_PER_CHANNEL;
  r.channel_axis = 3;
  r.channel_scale = cs;
  free(check_conversion(&tb, &tb, CPU0, &r, "uint16 NHWC -> float32 NCHW per channel", &nb));
  r.dtype = KD[R_U8].dt;
  r.flags = AB_CONVERT_AFFINE;
  r.scale = 1.0 / 256;
  free(check_conversion(&tb, &tb, CPU0, &r, "uint16 NHWC -> uint8 NCHW", &nb));
  free(tb.data);
}

/* Narrowing casts of 2-D transposed sources with one map for all (cast
 * row by row in the source's order into bands, then transposed into the
 * result: convert.c, cast_then_transpose): source rows longer than the
 * converter's pieces (4096 elements: 4173 is a piece and 77), bands whole
 * and ragged (256 float16 rows a band; 70 and 600 result columns), a
 * source that is a transposed block of a wider array (its rows 5000
 * elements apart), one large enough for two threads' bands, and batches
 * of such planes (3, and 1). */
Test(cast, narrowing_casts_of_transposed_sources_match_the_reference) {
  test_rng g = {0x7ca57u};
  size_t nb;
  static const struct { int from, to; bool affine; int64_t n0, n1, pitch; int threads; } cases[] = {
    {R_F32, R_F16, false, 4173, 70, 4173, 1},  {R_F32, R_U8, true, 4173, 70, 4173, 1},
    {R_F64, R_F32, false, 300, 600, 5000, 1},  {R_F32, R_BF16, true, 300, 512, 300, 1},
    {R_I32, R_I16, true, 130, 1030, 130, 1},   {R_F64, R_I8, false, 64, 64, 64, 1},
    {R_F32, R_F16, true, 1500, 1100, 1600, 2}, {R_U16, R_U8, false, 700, 650, 700, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0] + 2; k++) {
    /* and two batches: 3 planes of the first case's, and 1 of the third's */
    const size_t c = k < sizeof cases / sizeof cases[0] ? k : k == sizeof cases / sizeof cases[0] ? 0 : 2;
    const int64_t batch = k == c ? 0 : k == sizeof cases / sizeof cases[0] ? 3 : 1;
    const int64_t n0 = cases[c].n0, n1 = cases[c].n1, pitch = cases[c].pitch, planes = batch > 0 ? batch : 1;
    /* n1 source rows of `pitch` elements (a plane), the first n0 of each read */
    void *p = malloc((size_t)(planes * n1 * pitch) * KD[cases[c].from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, planes * n1 * pitch, KD[cases[c].from].dt, &g);
    int64_t shape[3] = {batch, n0, n1}, st[3] = {n1 * pitch, 1, pitch};
    DLTensor t = {p, CPU0, batch > 0 ? 3 : 2, KD[cases[c].from].dt, batch > 0 ? shape : shape + 1,
                  batch > 0 ? st : st + 1, 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[cases[c].to].dt;
    o.threads = cases[c].threads;
    if (cases[c].affine) {
      o.flags = AB_CONVERT_AFFINE;
      o.scale = 0.75;
      o.offset = -3.5;
    }
    char what[128];
    snprintf(what, sizeof what, "%lld x transposed %s (%lld x %lld, rows %lld apart) -> %s%s, %d threads",
             (long long)batch, KD[cases[c].from].name, (long long)n0, (long long)n1, (long long)pitch,
             KD[cases[c].to].name, cases[c].affine ? " with a map" : "", cases[c].threads);
    free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    free(p);
  }
}

/* Narrowing casts whose source runs along a whole dim of every chunk
 * (planes to pixels): cast in the source's order, then gathered (convert.c,
 * narrow_chunk). CHW float32 (3, 301, 300) as HWC uint8 in chunks of 64
 * rows and a ragged 45: a map per tensor and per channel along the rows
 * (the cut dim: the chunk's channels start at its first row); per channel
 * along the pixel channel and along the columns, which take the element
 * loop instead (a channel after the cut dim), against the same reference;
 * a batch of NCHW float64 as NHWC float32 per channel along the batch (a
 * dim before the chunks); int16 planes as int8 pixels; float32 as float16
 * pixels with no map. */
Test(cast, narrowing_casts_of_planes_into_pixels_match_the_reference) {
  test_rng g = {0x9a77e5edu};
  size_t nb;
  double cs[400], co[400];
  for (int i = 0; i < 400; i++) {
    cs[i] = (i % 9) * 0.5 - 1.25;
    co[i] = (i % 4) * 7.0 - 3.5;
  }
  int64_t chw[3] = {3, 301, 300};
  const int32_t to_hwc[3] = {1, 2, 0};
  static const struct { int from, to; int axis; } cases[] = {
    {R_F32, R_U8, -2}, {R_F32, R_U8, 2}, {R_F32, R_U8, 0}, {R_F32, R_U8, 1}, {R_I16, R_I8, 2}, {R_F32, R_F16, -1},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    DLTensor t = probe_tensor(cases[k].from, 3, chw, NULL, &g);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[cases[k].to].dt;
    o.permute = to_hwc;
    o.threads = 1;
    if (cases[k].axis == -2) {
      o.flags = AB_CONVERT_AFFINE;
      o.scale = 255.0;
      o.offset = 0.5;
    } else if (cases[k].axis >= 0) {
      o.flags = AB_CONVERT_PER_CHANNEL;
      o.channel_axis = cases[k].axis;
      o.channel_scale = cs;
      o.channel_offset = cases[k].axis == 1 ? NULL : co;
    }
    char what[96];
    snprintf(what, sizeof what, "%s CHW -> %s HWC, map on axis %d", KD[cases[k].from].name, KD[cases[k].to].name,
             cases[k].axis);
    free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    free(t.data);
  }
  int64_t nchw[4] = {2, 3, 130, 200};
  const int32_t to_nhwc[4] = {0, 2, 3, 1};
  DLTensor t = probe_tensor(R_F64, 4, nchw, NULL, &g);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.permute = to_nhwc;
  o.threads = 1;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 0;
  o.channel_scale = cs + 3;
  o.channel_offset = co + 1;
  free(check_conversion(&t, &t, CPU0, &o, "float64 NCHW -> float32 NHWC per channel along the batch", &nb));
  free(t.data);
}

/* Every pair with an affine map (and, when `plain`, without), on each
 * pair's edge values: the contiguous loops (and the element loop where a
 * pair has none) against the reference. */
static void every_pair_matches(bool plain) {
  for (int from = 0; from < R_COUNT; from++) {
    if (plain) check_every_target_from(from);
    struct vals v = make_values(from);
    int64_t shape[1] = {(int64_t)v.n};
    DLTensor src = {v.b, CPU0, 1, KD[from].dt, shape, NULL, 0};
    for (int to = 0; to < R_COUNT; to++) {
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = KD[to].dt;
      o.flags = AB_CONVERT_AFFINE;
      o.scale = to == R_BOOL ? 1.0 : -0.75;
      o.offset = 2.5;
      char what[64];
      snprintf(what, sizeof what, "%s -> %s, affine", KD[from].name, KD[to].name);
      size_t nb;
      free(check_conversion(&src, &src, CPU0, &o, what, &nb));
    }
    free(v.b);
  }
}

/* Which builds of the contiguous loops fn's casts took. */
static void loops_ran(void (*fn)(bool), bool plain, const char *what, bool base, bool avx2, bool avx512) {
  ab__host_count_choices(true);
  const unsigned long b0 = ab__host_ran_count(AB_RAN_CAST_BASE), a20 = ab__host_ran_count(AB_RAN_CAST_AVX2),
                      a50 = ab__host_ran_count(AB_RAN_CAST_AVX512);
  fn(plain);
  const unsigned long b = ab__host_ran_count(AB_RAN_CAST_BASE) - b0, a2 = ab__host_ran_count(AB_RAN_CAST_AVX2) - a20,
                      a5 = ab__host_ran_count(AB_RAN_CAST_AVX512) - a50;
  cr_assert(base == (b > 0) && avx2 == (a2 > 0) && avx512 == (a5 > 0),
            "%s: the baseline loops ran %lu times, AVX2's %lu, AVX-512's %lu", what, b, a2, a5);
}
/* The widest build this CPU runs: AVX-512 (with VL), AVX2 or the baseline. */
static int widest_loops(void) {
#if defined(__x86_64__)
  if (ab__host_tiles_level() >= AB_TILES_AVX512 && __builtin_cpu_supports("avx512vl")) return 2;
  if (ab__host_tiles_level() >= AB_TILES_AVX2) return 1;
#endif
  return 0;
}

Test(cast, every_pair_with_an_affine_map_matches_the_reference) {
  unsetenv("AB_HOST_TILES");
  ab__env_reload();
  const int w = widest_loops(); /* AB_HOST_TILES unset: the widest */
  loops_ran(every_pair_matches, false, "the widest loops", w == 0, w == 1, w == 2);
}

/* Rows of every length up to two vectors and around the float16 loops'
 * 512-element blocks, of each kind's edge values picked at random (so the
 * last elements of a row, which the loops' tails take, are of every
 * sort), to every result, with and without a map, in each instruction
 * set's loops. */
static void ragged_rows_match(void) {
  static const size_t lengths[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 511, 513, 1023, 1025};
  test_rng g = {0x7a99edu};
  for (int from = 0; from < R_COUNT; from++) {
    struct vals v = make_values(from);
    const size_t es = KD[from].size;
    unsigned char *row = malloc(1025 * es);
    cr_assert_not_null(row);
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
      const size_t n = lengths[l];
      for (size_t i = 0; i < n; i++) memcpy(row + i * es, v.b + (size_t)rng_between(&g, 0, (int64_t)v.n - 1) * es, es);
      int64_t shape[1] = {(int64_t)n};
      DLTensor src = {row, CPU0, 1, KD[from].dt, shape, NULL, 0};
      for (int to = 0; to < R_COUNT; to++)
        for (int map = 0; map < 2; map++) {
          ab_convert_opts o = AB_CONVERT_OPTS_INIT;
          o.dtype = KD[to].dt;
          o.copy = AB_COPY_ALWAYS;
          if (map) {
            o.flags = AB_CONVERT_AFFINE;
            o.scale = 1.5;
            o.offset = -0.25;
          }
          char what[80];
          snprintf(what, sizeof what, "%zu of %s -> %s%s", n, KD[from].name, KD[to].name, map ? ", affine" : "");
          size_t nb;
          free(check_conversion(&src, &src, CPU0, &o, what, &nb));
        }
    }
    free(row);
    free(v.b);
  }
}

Test(cast, ragged_rows_match_the_reference) { ragged_rows_match(); }

/* A map is a multiply, then an add, each rounded, never one fused
 * multiply-add: 10005 * 0.1 rounds to 1000.5, and 1000.5 - 1000 = 0.5
 * rounds (half to even) to 0, where a fused one would keep 0.5 + 5.6e-14
 * and give 1. Rows of 64, so the vector loops take them, into every
 * integer result, from integer, float32 and float64 sources. */
static void map_is_a_multiply_then_an_add(void) {
  int16_t i16[64];
  float f32[64];
  double f64[64];
  for (int i = 0; i < 64; i++) {
    i16[i] = 10005;
    f32[i] = 10005.0f;
    f64[i] = 10005.0;
  }
  static const int from[] = {R_I16, R_F32, R_F64}, to[] = {R_I8, R_U8, R_I16, R_U16, R_I32};
  const void *src[] = {i16, f32, f64};
  for (size_t f = 0; f < 3; f++)
    for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
      int64_t shape[1] = {64};
      DLTensor t = {(void *)src[f], CPU0, 1, KD[from[f]].dt, shape, NULL, 0};
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = KD[to[k]].dt;
      o.flags = AB_CONVERT_AFFINE;
      o.scale = 0.1;
      o.offset = -1000.0;
      DLManagedTensorVersioned *r;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      const unsigned char *y = r->dl_tensor.data;
      for (size_t b = 0; b < 64 * KD[to[k]].size; b++)
        cr_assert_eq(y[b], 0, "%s 10005 * 0.1 - 1000 as %s: element %zu is not 0 (a fused multiply-add?)",
                     KD[from[f]].name, KD[to[k]].name, b / KD[to[k]].size);
      r->deleter(r);
    }
}

Test(cast, a_map_is_a_multiply_then_an_add_in_the_widest_loops) { map_is_a_multiply_then_an_add(); }

Test(cast, a_map_is_a_multiply_then_an_add_in_the_avx2_loops) {
  setenv("AB_HOST_TILES", "avx2", 1);
  map_is_a_multiply_then_an_add();
}

Test(cast, a_map_is_a_multiply_then_an_add_in_the_baseline_loops) {
  setenv("AB_HOST_TILES", "sse2", 1);
  map_is_a_multiply_then_an_add();
}

/* Rows of 1 KiB or more are read in 512-byte chunks with the next lines
 * asked for ahead (AB_HOST_CAST_PREFETCH, on unless 0): the 1025-element
 * rows above take chunks and a tail; here the same rows whole. */
Test(cast, ragged_rows_without_the_prefetch_chunks_match_the_reference) {
  setenv("AB_HOST_CAST_PREFETCH", "0", 1);
  ragged_rows_match();
}

Test(cast, ragged_rows_in_baseline_loops_match_the_reference) {
  setenv("AB_HOST_TILES", "sse2", 1);
  ragged_rows_match();
}

Test(cast, ragged_rows_in_avx2_loops_match_the_reference) {
  setenv("AB_HOST_TILES", "avx2", 1);
  ragged_rows_match();
}

/* A float16 or bfloat16 NaN widens quiet with its sign and payload
 * (IEEE 754's rule, as VCVTPH2PS and the OpenCL and CUDA kernels widen
 * it), signalling or not, into float32 and float64, whether the row is
 * contiguous (the vector loops, with F16C and without, at every tile
 * level) or strided (the element loop): the same bits on every path.
 * Float16 0x7d01 (signalling, payload 0x101) is float32 0x7fa02000 made
 * quiet, 0x7fe02000. */
Test(cast, half_nans_widen_quiet_with_their_sign_and_payload_on_every_path) {
  static const uint16_t f16[] = {0x7d01, 0xfd01, 0x7e00, 0xfe00, 0x7fff, 0x3c00, 0x7c00, 0xfc00, 0x7c01};
  static const uint16_t bf16[] = {0x7f81, 0xff81, 0x7fc0, 0xffc0, 0x7fff, 0x3f80, 0x7f80, 0xff80, 0x7fa5};
  static const uint32_t want_f16[] = {0x7fe02000u, 0xffe02000u, 0x7fc00000u, 0xffc00000u, 0x7fffe000u,
                                      0x3f800000u, 0x7f800000u, 0xff800000u, 0x7fc02000u};
  static const uint32_t want_bf16[] = {0x7fc10000u, 0xffc10000u, 0x7fc00000u, 0xffc00000u, 0x7fff0000u,
                                       0x3f800000u, 0x7f800000u, 0xff800000u, 0x7fe50000u};
  static const char *const tiles[] = {"sse2", "avx2", "auto"}, *const f16c[] = {"0", "1"};
  for (int setting = 0; setting < 6; setting++) {
    setenv("AB_HOST_TILES", tiles[setting / 2], 1);
    setenv("AB_HOST_F16C", f16c[setting % 2], 1);
    ab__env_reload();
    for (int half = 0; half < 2; half++)
      for (int wide = 0; wide < 2; wide++) /* into float32, into float64 */
        for (int stride = 1; stride <= 2; stride++) {
          uint16_t src[2 * 36]; /* 9 values, repeated so vector loops take them: 36 */
          for (int i = 0; i < 36; i++) src[i * stride] = (half ? bf16 : f16)[i % 9];
          int64_t shape[1] = {36}, st[1] = {stride};
          DLTensor t = {src, CPU0, 1, {half ? kDLBfloat : kDLFloat, 16, 1}, shape, st, 0};
          ab_convert_opts o = AB_CONVERT_OPTS_INIT;
          o.dtype = (DLDataType){kDLFloat, wide ? 64 : 32, 1};
          DLManagedTensorVersioned *r;
          cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
          for (int i = 0; i < 36; i++) {
            const uint32_t w32 = (half ? want_bf16 : want_f16)[i % 9];
            float f;
            memcpy(&f, &w32, 4);
            /* float64: float32's bits widened (a NaN's payload 29 bits further up) */
            const uint64_t w64 = f != f ? (uint64_t)(w32 >> 31) << 63 | 0x7ff8000000000000ull |
                                              (uint64_t)(w32 & 0x3fffffu) << 29
                                        : 0;
            uint64_t want = wide ? w64 : w32;
            const uint64_t got = get_low_bytes((const char *)r->dl_tensor.data + (wide ? 8 : 4) * i, wide ? 8 : 4);
            if (wide && f == f) { /* the finite and infinite ones as a double */
              const double d = (double)f;
              memcpy(&want, &d, 8);
            }
            cr_assert_eq(got, want,
                         "%s -> float%d, AB_HOST_TILES=%s AB_HOST_F16C=%s, stride %d, element %d: %llx, want %llx",
                         half ? "bfloat16" : "float16", wide ? 64 : 32, tiles[setting / 2], f16c[setting % 2],
                         stride, i, (unsigned long long)got, (unsigned long long)want);
          }
          r->deleter(r);
        }
  }
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
}
/* The contiguous loops are compiled for the baseline, AVX2 and AVX-512;
 * AB_HOST_TILES caps which runs (the tests above run the widest). */
Test(cast, every_pair_in_baseline_loops_matches_the_reference) {
  setenv("AB_HOST_TILES", "sse2", 1);
  ab__env_reload();
  loops_ran(every_pair_matches, true, "AB_HOST_TILES=sse2", true, false, false);
}

Test(cast, every_pair_in_avx2_loops_matches_the_reference) {
  setenv("AB_HOST_TILES", "avx2", 1);
  ab__env_reload();
  const int w = widest_loops();
  loops_ran(every_pair_matches, true, "AB_HOST_TILES=avx2", w == 0, w >= 1, false);
  if (w == 0) cr_skip_test("this CPU has no AVX2: the AVX2 loops did not run (the baseline loops did, and matched)");
}

/* ---- 4. permutations of strided sources ------------------------------------------- */

enum layout { L_COMPACT, L_CROP, L_NEGATIVE, L_BROADCAST, L_COUNT };
static const char *const LAYOUT_NAME[L_COUNT] = {"compact", "crop", "negative strides", "broadcast"};

struct strided {
  unsigned char *buf;
  size_t bytes;
  int64_t shape[AB_MAX_NDIM], strides[AB_MAX_NDIM];
  DLTensor t;
};

/* Values that survive most casts distinctly: small multiples of 0.25 for
 * floats, random bytes for integers, 0/1 for bool. */
static void fill_values(int k, unsigned char *p, size_t count, uint32_t seed) {
  test_rng g = {seed};
  if (is_intlike(k)) {
    fill_pattern(p, count * KD[k].size, seed);
    if (k == R_BOOL)
      for (size_t i = 0; i < count; i++) p[i] &= 1;
    return;
  }
  for (size_t i = 0; i < count; i++) put_double(k, p + i * KD[k].size, (double)rng_between(&g, -300, 300) * 0.25);
}

/* shape in a layout: compact; a crop of a larger array with a byte_offset;
 * every other axis reversed (negative strides, byte_offset at the first
 * element); axis 1 (or 0) broadcast with stride 0. */
static void make_layout(struct strided *s, int k, int32_t nd, const int64_t *shape, enum layout L, uint32_t seed) {
  const size_t es = KD[k].size;
  int64_t numel = numel_of(nd, shape), cs[AB_MAX_NDIM], acc = 1;
  for (int32_t i = 0; i < nd; i++) s->shape[i] = shape[i];
  for (int32_t i = nd - 1; i >= 0; i--) {
    cs[i] = acc;
    acc *= shape[i];
  }
  uint64_t off = 0;
  size_t count = (size_t)numel;
  bool strided = true;
  switch (L) {
  case L_COMPACT: strided = false; break;
  case L_CROP: {
    int64_t pacc = 1, start = 0;
    for (int32_t i = nd - 1; i >= 0; i--) {
      s->strides[i] = pacc;
      start += (i % 2 ? 1 : 2) * pacc;
      pacc *= shape[i] + 1 + (i % 2 ? 1 : 2);
    }
    count = (size_t)pacc;
    off = (uint64_t)start * es;
    break;
  }
  case L_NEGATIVE:
    for (int32_t i = 0; i < nd; i++) {
      s->strides[i] = i % 2 == 0 ? -cs[i] : cs[i];
      if (i % 2 == 0) off += (uint64_t)((shape[i] - 1) * cs[i]) * es;
    }
    break;
  case L_BROADCAST: {
    const int32_t b = nd > 1 ? 1 : 0;
    int64_t bacc = 1;
    for (int32_t i = nd - 1; i >= 0; i--) {
      s->strides[i] = i == b ? 0 : bacc;
      if (i != b) bacc *= shape[i];
    }
    count = (size_t)bacc;
    break;
  }
  default: break;
  }
  s->bytes = count * es;
  s->buf = malloc(s->bytes ? s->bytes : 1);
  cr_assert_not_null(s->buf);
  fill_values(k, s->buf, count, seed);
  s->t = (DLTensor){s->buf, CPU0, nd, KD[k].dt, s->shape, strided ? s->strides : NULL, off};
}

/* src in every layout, converted with `perm` to `to` (-1: keep the dtype),
 * compared with the reference. */
static void check_permutation(int from, int to, int32_t nd, const int64_t *shape, const int32_t *perm,
                              const struct affine *a) {
  for (int L = 0; L < L_COUNT; L++) {
    struct strided s;
    make_layout(&s, from, nd, shape, (enum layout)L, (uint32_t)(L * 131 + nd * 7 + from));
    const uint64_t sum = checksum(s.buf, s.bytes);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    if (to >= 0) o.dtype = KD[to].dt;
    o.permute = perm;
    if (a != NULL) {
      o.flags = AB_CONVERT_AFFINE;
      o.scale = a->scale;
      o.offset = a->offset;
    }
    bool identity = true;
    for (int32_t i = 0; i < nd; i++) identity &= perm[i] == i;
    /* nothing to do on a compact source would be a view: ask for a copy */
    if (identity && (to < 0 || to == from) && a == NULL && L == L_COMPACT) o.copy = AB_COPY_ALWAYS;
    char what[160];
    int w = snprintf(what, sizeof what, "%s -> %s%s, %s, permute {", KD[from].name, to >= 0 ? KD[to].name : "same",
                     a ? " affine" : "", LAYOUT_NAME[L]);
    for (int32_t i = 0; i < nd && w < (int)sizeof what; i++)
      w += snprintf(what + w, sizeof what - (size_t)w, "%s%d", i ? "," : "", perm[i]);
    if (w < (int)sizeof what) snprintf(what + w, sizeof what - (size_t)w, "}");
    size_t nb;
    free(check_conversion(&s.t, &s.t, CPU0, &o, what, &nb));
    cr_assert_eq(checksum(s.buf, s.bytes), sum, "%s: source modified", what);
    free(s.buf);
  }
}

/* All permutations of 0..n-1 in lexicographic order, written to out
 * (n! rows of n). */
static int all_permutations(int32_t n, int32_t (*out)[8]) {
  int32_t p[8];
  for (int32_t i = 0; i < n; i++) p[i] = i;
  int count = 0;
  for (;;) {
    memcpy(out[count++], p, sizeof p);
    int32_t i = n - 2;
    while (i >= 0 && p[i] > p[i + 1]) i--;
    if (i < 0) return count;
    int32_t j = n - 1;
    while (p[j] < p[i]) j--;
    int32_t tmp = p[i];
    p[i] = p[j];
    p[j] = tmp;
    for (int32_t a = i + 1, b = n - 1; a < b; a++, b--) {
      tmp = p[a];
      p[a] = p[b];
      p[b] = tmp;
    }
  }
}

Test(cast, every_permutation_of_a_4d_tensor_in_every_layout_matches_the_reference) {
  const int64_t shape[4] = {2, 3, 4, 5};
  int32_t perms[24][8];
  cr_assert_eq(all_permutations(4, perms), 24);
  const uint64_t in_use = pool_in_use(CPU0);
  for (int p = 0; p < 24; p++) {
    check_permutation(R_I16, -1, 4, shape, perms[p], NULL);
    check_permutation(R_I16, R_F32, 4, shape, perms[p], NULL);
    check_permutation(R_F32, R_I8, 4, shape, perms[p], NULL);
    check_permutation(R_U8, R_BF16, 4, shape, perms[p], NULL);
  }
  cr_assert_eq(pool_in_use(CPU0), in_use, "host pool in_use did not return");
}

Test(cast, permutations_of_5d_tensors_in_every_layout_match_the_reference) {
  const int64_t shape[5] = {2, 3, 1, 4, 3};
  int32_t perms[120][8];
  cr_assert_eq(all_permutations(5, perms), 120);
  test_rng g = {55};
  const struct affine a = {0.5, -3};
  for (int i = 0; i < 14; i++) {
    const int32_t *p = perms[i == 0 ? 0 : i == 1 ? 119 : rng_between(&g, 1, 118)];
    check_permutation(R_F64, -1, 5, shape, p, NULL);
    check_permutation(R_F64, R_F16, 5, shape, p, NULL);
    check_permutation(R_I32, R_U8, 5, shape, p, &a);
  }
}

Test(cast, permutations_of_2d_and_3d_tensors_with_and_without_a_cast_match_the_reference) {
  const int64_t s2[2] = {7, 9}, s3[3] = {4, 5, 6};
  const int32_t p2[2][2] = {{0, 1}, {1, 0}};
  int32_t p3[6][8];
  cr_assert_eq(all_permutations(3, p3), 6);
  const struct affine a = {-2, 0.5};
  for (int i = 0; i < 2; i++) {
    check_permutation(R_U8, -1, 2, s2, p2[i], NULL);
    check_permutation(R_BOOL, R_F32, 2, s2, p2[i], NULL);
    check_permutation(R_F16, R_I64, 2, s2, p2[i], &a);
  }
  for (int i = 0; i < 6; i++) {
    check_permutation(R_U8, -1, 3, s3, p3[i], NULL);
    check_permutation(R_BF16, R_F64, 3, s3, p3[i], NULL);
    check_permutation(R_U8, R_F32, 3, s3, p3[i], &a);
    check_permutation(R_U64, R_I16, 3, s3, p3[i], NULL);
  }
}

/* ---- 5. empty and 0-d tensors ---------------------------------------------------- */

Test(cast, a_0d_tensor_converts_its_one_element) {
  double x = 2.5;
  DLTensor t = {&x, CPU0, 0, KD[R_F64].dt, NULL, NULL, 0};
  const uint64_t in_use = pool_in_use(CPU0);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_I32].dt;
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "0-d float64 -> int32");
  cr_assert_eq(r->dl_tensor.ndim, 0);
  cr_expect_eq(*(const int32_t *)r->dl_tensor.data, 2);
  r->deleter(r);
  o.dtype = KD[R_F16].dt;
  r = convert_contract(&t, CPU0, &o, "0-d float64 -> float16");
  cr_expect_eq(*(const uint16_t *)r->dl_tensor.data, 0x4100);
  r->deleter(r);
  o.dtype = KD[R_I32].dt;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 2;
  o.offset = 1;
  r = convert_contract(&t, CPU0, &o, "0-d float64 -> int32, x * 2 + 1");
  cr_expect_eq(*(const int32_t *)r->dl_tensor.data, 6);
  r->deleter(r);
  uint8_t u = 200;
  DLTensor tu = {&u, CPU0, 0, KD[R_U8].dt, NULL, NULL, 0};
  ab_convert_opts o2 = AB_CONVERT_OPTS_INIT;
  o2.dtype = KD[R_I8].dt;
  r = convert_contract(&tu, CPU0, &o2, "0-d uint8 -> int8");
  cr_expect_eq(*(const int8_t *)r->dl_tensor.data, 127);
  r->deleter(r);
  cr_assert_eq(x, 2.5);
  cr_assert_eq(pool_in_use(CPU0), in_use);
}

Test(cast, a_zero_size_tensor_gets_the_permuted_shape_and_no_data) {
  float dummy[1] = {1};
  int64_t shape[3] = {3, 0, 4};
  DLTensor t = {dummy, CPU0, 3, KD[R_F32].dt, shape, NULL, 0};
  static const int32_t perm[3] = {2, 0, 1};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_I16].dt;
  o.permute = perm;
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "zero-size float32 -> int16, permuted");
  cr_expect_eq(r->dl_tensor.shape[0], 4);
  cr_expect_eq(r->dl_tensor.shape[1], 3);
  cr_expect_eq(r->dl_tensor.shape[2], 0);
  cr_expect_null(r->dl_tensor.data);
  r->deleter(r);
  /* per channel along a zero-size axis, NULL arrays */
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 1;
  r = convert_contract(&t, CPU0, &o, "zero-size, per channel along the empty axis");
  cr_expect_eq(r->dl_tensor.shape[0], 4);
  r->deleter(r);
  /* a permutation alone, same dtype */
  ab_convert_opts o3 = AB_CONVERT_OPTS_INIT;
  o3.permute = perm;
  r = convert_contract(&t, CPU0, &o3, "zero-size, permuted only");
  cr_expect_eq(r->dl_tensor.shape[0], 4);
  cr_expect_eq(r->dl_tensor.shape[2], 0);
  r->deleter(r);
  cr_assert_eq(dummy[0], 1.0f);
}

/* ---- 6. what is refused -------------------------------------------------------- */

static void expect_unsupported(const DLTensor *src, const ab_convert_opts *o, const char *a, const char *b,
                               const char *what) {
  for (int mode = 0; mode < 2; mode++) {
    ab_convert_opts oo = *o;
    oo.copy = mode ? AB_COPY_NEVER : AB_COPY_IF_NEEDED;
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    ab_status st = ab_convert_memory(src, CPU0, &oo, &r);
    cr_expect_eq(st, AB_ERR_UNSUPPORTED, "%s%s: got %s (%s)", what, mode ? " (AB_COPY_NEVER)" : "",
                 ab_status_name(st), ab_last_error());
    cr_assert_eq(r, SENTINEL_OUT, "%s: *out written on failure", what);
    const char *msg = ab_last_error();
    cr_expect(strstr(msg, a) != NULL && strstr(msg, b) != NULL, "%s: message \"%s\" does not name both %s and %s",
              what, msg, a, b);
  }
}

Test(cast, complex_with_real_complex_affine_and_lanes_are_unsupported_naming_both_dtypes) {
  float buf[2 * 6 * 4] = {1, 2, 3};
  int64_t shape[2] = {2, 3};
  DLTensor c64 = {buf, CPU0, 2, dt(kDLComplex, 64, 1), shape, NULL, 0};
  DLTensor f32 = {buf, CPU0, 2, KD[R_F32].dt, shape, NULL, 0};
  DLTensor f32x4 = {buf, CPU0, 2, dt(kDLFloat, 32, 4), shape, NULL, 0};
  const uint64_t sum = checksum(buf, sizeof buf);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  expect_unsupported(&c64, &o, "complex64", "float32", "complex64 -> float32");
  o.dtype = dt(kDLComplex, 64, 1);
  expect_unsupported(&f32, &o, "float32", "complex64", "float32 -> complex64");
  o.dtype = dt(kDLComplex, 128, 1);
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 2;
  expect_unsupported(&c64, &o, "complex64", "complex128", "complex64 -> complex128 with an affine map");
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 0;
  expect_unsupported(&c64, &o, "complex64", "complex128", "complex64 -> complex128 per channel");
  ab_convert_opts o2 = AB_CONVERT_OPTS_INIT;
  o2.dtype = KD[R_F64].dt;
  expect_unsupported(&f32x4, &o2, "float32x4", "float64", "float32x4 -> float64");
  o2.dtype = dt(kDLFloat, 32, 4);
  expect_unsupported(&f32, &o2, "float32", "float32x4", "float32 -> float32x4");
  o2.dtype = dt(kDLFloat, 64, 4);
  expect_unsupported(&f32x4, &o2, "float32x4", "float64x4", "float32x4 -> float64x4");
  ab_convert_opts o3 = AB_CONVERT_OPTS_INIT;
  o3.flags = AB_CONVERT_AFFINE;
  o3.scale = 2;
  expect_unsupported(&f32x4, &o3, "float32x4", "float32x4", "float32x4 with an affine map");
  cr_assert_eq(checksum(buf, sizeof buf), sum, "source modified by a refused conversion");
}

Test(cast, a_conversion_with_copy_never_is_copy_required) {
  int16_t x[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  DLTensor t = {x, CPU0, 2, KD[R_I16].dt, shape, NULL, 0};
  static const int32_t perm[2] = {1, 0};
  ab_convert_opts cases[3] = {AB_CONVERT_OPTS_INIT, AB_CONVERT_OPTS_INIT, AB_CONVERT_OPTS_INIT};
  cases[0].dtype = KD[R_F32].dt;
  cases[1].permute = perm;
  cases[2].flags = AB_CONVERT_AFFINE;
  cases[2].scale = 2;
  const char *names[3] = {"a dtype change", "a permutation", "an affine map"};
  for (int i = 0; i < 3; i++) {
    cases[i].copy = AB_COPY_NEVER;
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    ab_status st = ab_convert_memory(&t, CPU0, &cases[i], &r);
    cr_expect_eq(st, AB_ERR_COPY_REQUIRED, "%s with AB_COPY_NEVER: %s (%s)", names[i], ab_status_name(st),
                 ab_last_error());
    cr_assert_eq(r, SENTINEL_OUT);
  }
}

Test(cast, complex64_to_complex128_and_back_cast_each_part) {
  const float parts[] = {1.5f, -2.25f, 0.0f, -0.0f, INFINITY, NAN, 1e-45f, FLT_MAX, -3.0f, 0.1f, 7.0f, -1e30f};
  const size_t n = sizeof parts / sizeof parts[0] / 2;
  int64_t shape[2] = {2, 3};
  DLTensor t = {(void *)parts, CPU0, 2, dt(kDLComplex, 64, 1), shape, NULL, 0};
  static const int32_t perm[2] = {1, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLComplex, 128, 1);
  DLManagedTensorVersioned *r = convert_contract(&t, CPU0, &o, "complex64 -> complex128");
  const double *d = r->dl_tensor.data;
  for (size_t i = 0; i < 2 * n; i++) {
    const double want = parts[i];
    cr_expect(want != want ? d[i] != d[i] : memcmp(&want, &d[i], 8) == 0, "part %zu: want %a, got %a", i, want, d[i]);
  }
  /* and back, permuted: each part rounded to float */
  double dd[12] = {1.0 + 0x1p-30, -0x1p-200, 1e300, -1e300, (double)NAN, 0.1, -0.0, 3.0, 0x1p-149 * 0.75, 5, 6, 7};
  DLTensor t2 = {dd, CPU0, 2, dt(kDLComplex, 128, 1), shape, NULL, 0};
  ab_convert_opts o2 = AB_CONVERT_OPTS_INIT;
  o2.dtype = dt(kDLComplex, 64, 1);
  o2.permute = perm;
  DLManagedTensorVersioned *r2 = convert_contract(&t2, CPU0, &o2, "complex128 -> complex64, permuted");
  const float *f = r2->dl_tensor.data;
  for (int64_t j = 0; j < 3; j++)
    for (int64_t i = 0; i < 2; i++)
      for (int part = 0; part < 2; part++) {
        const float want = (float)dd[(i * 3 + j) * 2 + part], got = f[(j * 2 + i) * 2 + part];
        cr_expect(want != want ? got != got : memcmp(&want, &got, 4) == 0, "(%lld,%lld) part %d: want %a, got %a",
                  (long long)j, (long long)i, part, (double)want, (double)got);
      }
  r2->deleter(r2);
  r->deleter(r);
}

/* ---- 7. through OpenCL --------------------------------------------------------- */

static void need_opencl(void) {
  if (ab_device_count(kDLOpenCL) < 1)
    cr_skip_test("no OpenCL device: ab_device_count(kDLOpenCL) == 0 (no ICD or no platform; PoCL with "
                 "POCL_DEVICES=\"pthread pthread\" provides two)");
}

/* src (host) -> opencl:0 with o, then opencl:0 -> cpu plain: bit for bit
 * the host-only conversion, which matches the reference. */
static void check_upload_conversion(const DLTensor *src, const ab_convert_opts *o, const char *what) {
  char w[160];
  snprintf(w, sizeof w, "%s (host only)", what);
  size_t nb_host, nb_dev;
  unsigned char *host = check_conversion(src, src, CPU0, o, w, &nb_host);
  snprintf(w, sizeof w, "%s (cpu -> opencl:0 -> cpu)", what);
  unsigned char *dev = check_conversion(src, src, CL0, o, w, &nb_dev);
  cr_assert_eq(nb_dev, nb_host);
  cr_expect(memcmp(dev, host, nb_host) == 0, "%s: the OpenCL round trip differs from the host-only result", what);
  free(dev);
  free(host);
}

Test(cast, opencl_upload_with_a_conversion_then_plain_download_equals_the_host_result) {
  need_opencl();
  const uint64_t in_use = pool_in_use(CPU0), cl_in_use = pool_in_use(CL0);
  /* an image, normalised per channel into CHW */
  uint8_t img[9 * 40 * 3];
  fill_pattern(img, sizeof img, 3);
  const uint64_t sum = checksum(img, sizeof img);
  int64_t si[3] = {9, 40, 3};
  DLTensor ti = {img, CPU0, 3, KD[R_U8].dt, si, NULL, 0};
  static const int32_t chw[3] = {2, 0, 1};
  double cs[3], co[3];
  for (int c = 0; c < 3; c++) {
    cs[c] = 1.0 / (255 * STD[c]);
    co[c] = -MEAN[c] / STD[c];
  }
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.permute = chw;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = cs;
  o.channel_offset = co;
  check_upload_conversion(&ti, &o, "uint8 HWC -> float32 CHW per channel");
  cr_assert_eq(checksum(img, sizeof img), sum, "source modified");
  /* every int16 bit pattern into float16, permuted */
  uint16_t *all = malloc(65536 * 2);
  cr_assert_not_null(all);
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  int64_t sa[3] = {16, 64, 64};
  DLTensor ta = {all, CPU0, 3, KD[R_I16].dt, sa, NULL, 0};
  ab_convert_opts o2 = AB_CONVERT_OPTS_INIT;
  o2.dtype = KD[R_F16].dt;
  o2.permute = chw;
  check_upload_conversion(&ta, &o2, "int16 -> float16, permuted");
  /* float64 specials into int8 with an affine map */
  struct vals v = make_values(R_F64);
  int64_t sv[1] = {(int64_t)v.n};
  DLTensor tv = {v.b, CPU0, 1, KD[R_F64].dt, sv, NULL, 0};
  ab_convert_opts o3 = AB_CONVERT_OPTS_INIT;
  o3.dtype = KD[R_I8].dt;
  o3.flags = AB_CONVERT_AFFINE;
  o3.scale = 2.5;
  o3.offset = -1;
  check_upload_conversion(&tv, &o3, "float64 -> int8, x * 2.5 - 1");
  o3.dtype = KD[R_BF16].dt;
  check_upload_conversion(&tv, &o3, "float64 -> bfloat16, x * 2.5 - 1");
  /* a strided host crop into bfloat16, transposed */
  struct strided s;
  const int64_t shape[2] = {6, 7};
  static const int32_t tr[2] = {1, 0};
  make_layout(&s, R_F32, 2, shape, L_CROP, 5);
  ab_convert_opts o4 = AB_CONVERT_OPTS_INIT;
  o4.dtype = KD[R_BF16].dt;
  o4.permute = tr;
  check_upload_conversion(&s.t, &o4, "float32 crop -> bfloat16, transposed");
  free(s.buf);
  free(v.b);
  free(all);
  cr_assert_eq(pool_in_use(CPU0), in_use, "host pool in_use did not return to its start");
  cr_assert_eq(pool_in_use(CL0), cl_in_use, "opencl:0 pool in_use did not return to its start");
}

Test(cast, opencl_strided_view_of_a_device_tensor_converts_on_the_way_to_the_host) {
  need_opencl();
  const uint64_t in_use = pool_in_use(CPU0), cl_in_use = pool_in_use(CL0);
  int16_t host[10 * 12];
  fill_pattern(host, sizeof host, 17);
  const uint64_t sum = checksum(host, sizeof host);
  int64_t whole_shape[2] = {10, 12};
  DLTensor whole = {host, CPU0, 2, KD[R_I16].dt, whole_shape, NULL, 0};
  DLManagedTensorVersioned *dev = convert_contract(&whole, CL0, NULL, "upload");
  const struct {
    const char *name;
    int64_t shape[2], strides[2], offset;
  } views[] = {
    {"crop", {4, 5}, {12, 1}, 2 * 12 + 3},
    {"transposed crop", {5, 4}, {1, 12}, 2 * 12 + 3},
    {"reversed", {10, 12}, {-12, -1}, 119},
    {"every other column, rows reversed", {5, 6}, {-24, 2}, 9 * 12 + 1},
    {"broadcast row", {3, 12}, {0, 1}, 4 * 12},
  };
  static const int32_t tr[2] = {1, 0};
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
    for (int variant = 0; variant < 3; variant++) {
      int64_t shape[2] = {views[i].shape[0], views[i].shape[1]};
      int64_t strides[2] = {views[i].strides[0], views[i].strides[1]};
      DLTensor v = dev->dl_tensor; /* data: the cl_mem */
      v.shape = shape;
      v.strides = strides;
      v.byte_offset = (uint64_t)views[i].offset * 2;
      DLTensor h = v;
      h.device = CPU0;
      h.data = host;
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      if (variant == 0) {
        o.dtype = KD[R_F32].dt;
        o.permute = tr;
        o.flags = AB_CONVERT_AFFINE;
        o.scale = 0.5;
        o.offset = 1;
      } else if (variant == 1) {
        o.dtype = KD[R_U8].dt;
      } else {
        o.dtype = KD[R_F16].dt;
        o.flags = AB_CONVERT_PER_CHANNEL;
        o.channel_axis = 1;
        static const double cs[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
        o.channel_scale = cs;
      }
      char what[128];
      snprintf(what, sizeof what, "opencl:0 %s, variant %d", views[i].name, variant);
      size_t nb_dev, nb_host;
      unsigned char *got = check_conversion(&v, &h, CPU0, &o, what, &nb_dev);
      snprintf(what, sizeof what, "host %s, variant %d", views[i].name, variant);
      unsigned char *want = check_conversion(&h, &h, CPU0, &o, what, &nb_host);
      cr_assert_eq(nb_dev, nb_host);
      cr_expect(memcmp(got, want, nb_host) == 0, "%s, variant %d: the OpenCL view differs from the host view",
                views[i].name, variant);
      free(want);
      free(got);
    }
  }
  dev->deleter(dev);
  cr_assert_eq(checksum(host, sizeof host), sum, "source modified");

  /* an image crop on the device, normalised per channel into CHW */
  uint8_t img[6 * 20 * 3];
  fill_pattern(img, sizeof img, 23);
  int64_t si[3] = {6, 20, 3};
  DLTensor ti = {img, CPU0, 3, KD[R_U8].dt, si, NULL, 0};
  DLManagedTensorVersioned *dimg = convert_contract(&ti, CL0, NULL, "upload image");
  int64_t cshape[3] = {4, 16, 3}, cstrides[3] = {60, 3, 1};
  DLTensor v = dimg->dl_tensor;
  v.shape = cshape;
  v.strides = cstrides;
  v.byte_offset = 60 + 2 * 3;
  DLTensor h = v;
  h.device = CPU0;
  h.data = img;
  static const int32_t chw[3] = {2, 0, 1};
  double cs[3], co[3];
  for (int c = 0; c < 3; c++) {
    cs[c] = 1.0 / (255 * STD[c]);
    co[c] = -MEAN[c] / STD[c];
  }
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F32].dt;
  o.permute = chw;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = cs;
  o.channel_offset = co;
  size_t nb1, nb2;
  unsigned char *got = check_conversion(&v, &h, CPU0, &o, "opencl:0 image crop -> CHW", &nb1);
  unsigned char *want = check_conversion(&h, &h, CPU0, &o, "host image crop -> CHW", &nb2);
  cr_assert_eq(nb1, nb2);
  cr_expect(memcmp(got, want, nb1) == 0, "image crop: the OpenCL view differs from the host view");
  free(got);
  free(want);
  dimg->deleter(dimg);
  cr_assert_eq(pool_in_use(CPU0), in_use, "host pool in_use did not return to its start");
  cr_assert_eq(pool_in_use(CL0), cl_in_use, "opencl:0 pool in_use did not return to its start");
}

/* ---- float16 on a side: the F16C loop and the portable one ----------------
 * Both against the element loop's roundings (ab__half_from_float,
 * ab__half_to_double). AB_HOST_F16C=0 forces the portable loop; on a CPU
 * without F16C both runs are the portable loop. */

/* float32 bits around every float16 value, from bits[n] on: each float16
 * as float32 (rebiased), with random bits below its last one, and its
 * halfway point to the next; and the halfway points between float16's
 * subnormals (odd multiples of 2^-25) and their neighbours. Returns the
 * new count (n + 3 * 65536 + 3 * 1024). */
static int64_t f16_neighbourhoods(uint32_t *bits, int64_t n, test_rng *g) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    const uint32_t f = (h & 0x8000u) << 16 | (((h & 0x7fffu) << 13) + (112u << 23));
    bits[n++] = f;
    bits[n++] = f | 0x1000u;
    bits[n++] = f | (uint32_t)(rng_next(g) & 0x1fffu);
  }
  for (int j = 0; j < 1024; j++) {
    const float mid = (float)(2 * j + 1) * 0x1p-25f;
    uint32_t b;
    memcpy(&b, &mid, sizeof b);
    bits[n++] = b;
    bits[n++] = b + 1;
    bits[n++] = b - 1;
  }
  return n;
}

/* One thread: the caller's rounding mode (the test below) is its own. */
static void f32_bits_to_f16(const uint32_t *bits, int64_t n, uint16_t *out) {
  int64_t shape[1] = {n};
  DLTensor t = {(void *)bits, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.threads = 1;
  o.dtype = dt(kDLFloat, 16, 1);
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  memcpy(out, r->dl_tensor.data, (size_t)n * 2);
  r->deleter(r);
}

Test(cast, float16_from_float32_is_the_same_with_and_without_f16c) {
  enum { N = 1 << 20 };
  uint32_t *bits = malloc(N * sizeof *bits);
  uint16_t *a = malloc(N * 2), *b = malloc(N * 2);
  test_rng g = {0xf16c};
  int64_t n = 0;
  /* every exponent with random mantissas and both signs, then any bits */
  for (uint32_t e = 0; e < 256; e++)
    for (int k = 0; k < 64; k++) bits[n++] = (uint32_t)(rng_next(&g) & 0x807fffffu) | e << 23;
  n = f16_neighbourhoods(bits, n, &g);
  while (n < N) bits[n++] = (uint32_t)rng_next(&g);
  setenv("AB_HOST_F16C", "1", 1);
  ab__env_reload();
  /* the counts are kept only when asked for */
  const unsigned long off = ab__host_ran_count(AB_RAN_CAST_F16C);
  f32_bits_to_f16(bits, 1024, a);
  cr_assert_eq(ab__host_ran_count(AB_RAN_CAST_F16C), off, "counted while counting was off");
  ab__host_count_choices(true);
  const unsigned long f16c = ab__host_ran_count(AB_RAN_CAST_F16C);
  f32_bits_to_f16(bits, n, a);
  /* the library's own answer to whether this CPU runs F16C (with AVX), asked with AB_HOST_F16C=1 */
  cr_assert_eq(ab__host_ran_count(AB_RAN_CAST_F16C) > f16c, ab__host_f16c(), "F16C's loop ran where the CPU has it");
  setenv("AB_HOST_F16C", "0", 1);
  ab__env_reload();
  const unsigned long f16c_off = ab__host_ran_count(AB_RAN_CAST_F16C);
  f32_bits_to_f16(bits, n, b);
  cr_assert_eq(ab__host_ran_count(AB_RAN_CAST_F16C), f16c_off, "F16C's loop ran with AB_HOST_F16C=0");
  for (int64_t i = 0; i < n; i++) {
    float f;
    memcpy(&f, &bits[i], sizeof f);
    const uint16_t want = ab__half_from_float(f); /* the element loop's rounding */
    cr_assert_eq(b[i], want, "float32 0x%08x: 0x%04x without F16C, want 0x%04x", bits[i], b[i], want);
    cr_assert_eq(a[i], want, "float32 0x%08x: 0x%04x with F16C, want 0x%04x", bits[i], a[i], want);
  }
  /* NaNs stay quiet with the top of their payload (IEEE 754, NumPy), both ways */
  static const uint32_t nan_in[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0x7fa00000u};
  static const uint16_t nan_out[] = {0x7e00, 0xfe00, 0x7e00, 0x7fff, 0x7f00};
  uint16_t got[8];
  uint32_t in[8] = {0};
  memcpy(in, nan_in, sizeof nan_in);
  for (int v = 0; v < 2; v++) {
    setenv("AB_HOST_F16C", v ? "1" : "0", 1);
    ab__env_reload();
    f32_bits_to_f16(in, 8, got);
    for (int i = 0; i < 5; i++)
      cr_assert_eq(got[i], nan_out[i], "F16C %d: float32 0x%08x -> 0x%04x, want 0x%04x", v, in[i], got[i], nan_out[i]);
  }
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
  free(bits);
  free(a);
  free(b);
}

/* The roundings to float16 are the library's (nearest, ties to even),
 * whatever rounding mode the caller's thread is in: the portable loop
 * rounds float16's subnormals through a float addition, which followed
 * the mode at first (FE_UPWARD: float32 0x00000001 became 0x0001). */
Test(cast, float16_results_ignore_the_callers_rounding_mode) {
  enum { N = 3 * 65536 + 3 * 1024 + 4096 };
  uint32_t *bits = malloc(N * sizeof *bits);
  uint16_t *got = malloc(N * 2);
  test_rng g = {0xfe};
  int64_t n = f16_neighbourhoods(bits, 0, &g);
  while (n < N) bits[n++] = (uint32_t)rng_next(&g) >> (rng_next(&g) & 7); /* small ones more often */
  static const int modes[3] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
  for (int v = 0; v < 2; v++) {
    setenv("AB_HOST_F16C", v ? "1" : "0", 1);
    ab__env_reload();
    for (int m = 0; m < 3; m++) {
      cr_assert_eq(fesetround(modes[m]), 0);
      f32_bits_to_f16(bits, n, got);
      fesetround(FE_TONEAREST);
      for (int64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, &bits[i], sizeof f);
        const uint16_t want = ab__half_from_float(f);
        cr_assert_eq(got[i], want, "F16C %d, rounding mode %d: float32 0x%08x -> 0x%04x, want 0x%04x", v, m, bits[i],
                     got[i], want);
      }
    }
  }
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
  free(bits);
  free(got);
}

/* Every float16 into float32 (widened alone) and into uint8 (x * 255 + 0.5,
 * the float32 loop after widening), both ways, with a byte of offset so
 * that nothing is aligned. */
Test(cast, every_float16_widens_alike_with_and_without_f16c) {
  enum { N = 1 << 16 };
  char *src = malloc(2 * N + 1), *f32 = malloc(4 * N + 1), *u8 = malloc(N);
  for (uint32_t h = 0; h < N; h++) memcpy(src + 1 + 2 * h, &(uint16_t){(uint16_t)h}, 2);
  int64_t shape[1] = {N};
  DLTensor t = {src, CPU0, 1, dt(kDLFloat, 16, 1), shape, NULL, 1};
  ab__host_count_choices(true);
  for (int v = 0; v < 2; v++) {
    setenv("AB_HOST_F16C", v ? "1" : "0", 1);
    ab__env_reload();
    const unsigned long bits_ran = ab__host_ran_count(AB_RAN_CAST_F16_BITS);
    DLTensor d = {f32, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 1};
    cr_assert_eq(ab_convert_into(&t, &d, NULL), AB_OK, "%s", ab_last_error());
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.flags = AB_CONVERT_AFFINE;
    o.scale = 255;
    o.offset = 0.5;
    DLTensor e = {u8, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
    cr_assert_eq(ab_convert_into(&t, &e, &o), AB_OK, "%s", ab_last_error());
    if (!v || !ab__host_f16c())
      cr_assert_geq(ab__host_ran_count(AB_RAN_CAST_F16_BITS), bits_ran + 2, "F16C %d: the portable block loop did not run", v);
    for (uint32_t h = 0; h < N; h++) {
      const double x = ab__half_to_double((uint16_t)h);
      const float want = (float)x;
      float got;
      memcpy(&got, f32 + 1 + 4 * h, sizeof got);
      cr_assert(memcmp(&got, &want, sizeof got) == 0, "F16C %d: float16 0x%04x -> float32 %a, want %a", v, h, got, want);
      unsigned char wu;
      ref_convert(R_F16, (const unsigned char *)src + 1 + 2 * h, R_U8, &wu, &(struct affine){255, 0.5});
      cr_assert_eq((uint8_t)u8[h], wu, "F16C %d: float16 0x%04x * 255 + 0.5 -> uint8 %u, want %u", v, h, (uint8_t)u8[h], wu);
    }
  }
  ab__host_count_choices(false);
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
  free(src);
  free(f32);
  free(u8);
}

/* ---- casts whose rows go out with streaming stores --------------------------
 * (AB_HOST_CAST_STREAMING=1 streams every result; 0 none.) Both ways
 * run the same row loops, which the tests above check against the
 * element loop, so here the streamed bytes must equal the ordinary ones:
 * every pair with a row loop, rows that start at every kind of offset in
 * a cache line (off the element's alignment too, which DLPack allows),
 * lengths around the lines and the 8 KiB buffer, and the bytes around the
 * result untouched. */

static void cast_streamed_or_not(const char *streaming, char *dst, const void *src, int32_t ndim, const int64_t *shape,
                                 const int64_t *st, const ab__cast_op *op) {
  setenv("AB_HOST_CAST_STREAMING", streaming, 1);
  ab__env_reload();
  ab__host_convert_into(dst, 0, src, ndim, shape, st, op, 0);
}

Test(cast, streamed_results_equal_ordinary_ones_for_every_row_loop) {
  static const DLDataType kinds[] = {{kDLInt, 8, 1},   {kDLUInt, 8, 1},  {kDLInt, 16, 1},   {kDLUInt, 16, 1},
                                     {kDLInt, 32, 1},  {kDLUInt, 32, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1},
                                     {kDLBfloat, 16, 1}, {kDLFloat, 16, 1}};
  enum { K = sizeof kinds / sizeof kinds[0] };
  /* (rows, columns): one row around the buffer's 8 KiB, lines and the
   * 256-byte least row; several rows whose ends share lines */
  static const int64_t shapes[][2] = {{1, 1},    {1, 15},   {1, 64},   {1, 100},  {1, 255},   {1, 2047},
                                      {1, 2048}, {1, 2049}, {1, 4095}, {1, 4097}, {1, 9000},  {5, 97},
                                      {3, 300},  {4, 1000}, {2, 8191}, {7, 65},   {2, 16385}};
  enum { MOST = 16385 * 2, GUARD = 128 };
  test_rng g = {0x57ea};
  char *src = malloc((size_t)MOST * 8);
  char *a = malloc((size_t)MOST * 8 + 2 * GUARD), *b = malloc((size_t)MOST * 8 + 2 * GUARD);
  cr_assert(src != NULL && a != NULL && b != NULL);
  for (size_t i = 0; i < (size_t)MOST * 8; i++) src[i] = (char)rng_next(&g);
  int streamed = 0; /* pairs (with and without a map) whose rows went out streamed */
  bool u8_f32 = false;
  for (int f = 0; f < K; f++)
    for (int t = 0; t < K; t++)
      for (int affine = 0; affine < 2; affine++) {
        if ((f == t && !affine) || !ab__cast_supported(kinds[f], kinds[t], affine)) continue;
        ab__cast_op op = {kinds[f], kinds[t], affine, 0.5, 3.0, -1, NULL, NULL};
        const size_t os = kinds[t].bits / 8;
        const uint64_t calls0 = ab__host_cast_streamed_calls();
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
          const int64_t shape[2] = {shapes[s][0], shapes[s][1]};
          const int64_t st[2] = {shape[1] * (int64_t)(kinds[f].bits / 8), kinds[f].bits / 8};
          const size_t bytes = (size_t)(shape[0] * shape[1]) * os;
          /* the result at a line's start, an element in, an element before
           * the next line, 40 bytes in, and off the element's alignment
           * (GUARD is a whole number of lines) */
          const size_t offs[] = {0, os, 64 - os, 40, 1, 3};
          for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
            memset(a, 0xa5, bytes + 2 * GUARD);
            memset(b, 0xa5, bytes + 2 * GUARD);
            cast_streamed_or_not("1", a + GUARD + offs[o], src, 2, shape, st, &op);
            cast_streamed_or_not("0", b + GUARD + offs[o], src, 2, shape, st, &op);
            for (size_t i = 0; i < bytes + 2 * GUARD; i++)
              cr_assert_eq(a[i], b[i],
                           "%d-bit code %d -> %d-bit code %d%s, %lld x %lld at +%zu: byte %zd of the result is 0x%02x "
                           "streamed, 0x%02x with ordinary stores",
                           kinds[f].bits, kinds[f].code, kinds[t].bits, kinds[t].code, affine ? " (affine)" : "",
                           (long long)shape[0], (long long)shape[1], offs[o], (ssize_t)i - GUARD - (ssize_t)offs[o],
                           (unsigned char)a[i], (unsigned char)b[i]);
            for (size_t i = 0; i < GUARD + offs[o]; i++)
              cr_assert_eq((unsigned char)a[i], 0xa5, "a byte before the result was written");
            for (size_t i = GUARD + offs[o] + bytes; i < bytes + 2 * GUARD; i++)
              cr_assert_eq((unsigned char)a[i], 0xa5, "a byte after the result was written");
          }
        }
        const bool went = ab__host_cast_streamed_calls() > calls0;
        streamed += went;
        if (kinds[f].code == kDLUInt && kinds[f].bits == 8 && kinds[t].code == kDLFloat && kinds[t].bits == 32)
          u8_f32 = u8_f32 || went;
      }
  /* the row loops: 9 sources x 8 results less those through float64
   * arithmetic into bfloat16, with and without a map, float16 on either
   * side where F16C runs */
  cr_assert(u8_f32, "uint8 -> float32 never streamed with AB_HOST_CAST_STREAMING=1");
  cr_assert_geq(streamed, 100, "only %d pairs streamed with AB_HOST_CAST_STREAMING=1", streamed);
  unsetenv("AB_HOST_CAST_STREAMING");
  ab__env_reload();
  free(src);
  free(a);
  free(b);
}

/* Through the public call on two threads, streaming forced and not: the
 * caller reads every byte right after the workers' streamed bands.
 * uint8 -> float32 flat, and HWC -> CHW with a map (the image loop, which
 * streams only rows of whole lines: 1920 pixels wide, not 1001). */
Test(cast, large_casts_on_two_threads_give_the_same_bytes_streamed_or_not) {
  static const int64_t widths[] = {1920, 1001};
  const int64_t H = 1080, C = 3;
  for (int w = 0; w < 2; w++) {
    const int64_t W = widths[w], n = H * W * C;
    unsigned char *img = malloc((size_t)n);
    cr_assert(img != NULL);
    test_rng g = {0x1080};
    for (int64_t i = 0; i < n; i++) img[i] = (unsigned char)rng_next(&g);
    float *got[2][2];
    for (int v = 0; v < 2; v++) {
      setenv("AB_HOST_CAST_STREAMING", v ? "1" : "0", 1);
      ab__env_reload();
      for (int layout = 0; layout < 2; layout++) {
        int64_t shape[3] = {H, W, C}, flat[1] = {n};
        int32_t perm[3] = {2, 0, 1};
        DLTensor t = {img, CPU0, layout ? 3 : 1, dt(kDLUInt, 8, 1), layout ? shape : flat, NULL, 0};
        ab_convert_opts o = AB_CONVERT_OPTS_INIT;
        o.dtype = dt(kDLFloat, 32, 1);
        o.threads = 2;
        if (layout) {
          o.permute = perm;
          o.flags = AB_CONVERT_AFFINE;
          o.scale = 1.0 / 255;
          o.offset = -0.5;
        }
        DLManagedTensorVersioned *r;
        cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
        got[v][layout] = malloc((size_t)n * sizeof(float));
        cr_assert(got[v][layout] != NULL);
        memcpy(got[v][layout], r->dl_tensor.data, (size_t)n * sizeof(float));
        r->deleter(r);
      }
    }
    unsetenv("AB_HOST_CAST_STREAMING");
    ab__env_reload();
    for (int layout = 0; layout < 2; layout++) {
      for (int64_t i = 0; i < n; i++) {
        /* the element loop's arithmetic: (float)x, or (float)x * a + b */
        const int64_t c = i / (H * W), y = i % (H * W) / W, x = i % W;
        const unsigned char v = layout ? img[(y * W + x) * C + c] : img[i];
        /* rounded to float after the product too, as the library does,
         * where FLT_EVAL_METHOD is 1 (s390x) and one expression would not */
        const float scaled = (float)v * (float)(1.0 / 255);
        const float want = layout ? scaled + (float)-0.5 : (float)v;
        cr_assert_eq(got[1][layout][i], want, "%lld wide, layout %d, element %lld: %g streamed, want %g",
                     (long long)W, layout, (long long)i, (double)got[1][layout][i], (double)want);
        cr_assert_eq(got[0][layout][i], want, "%lld wide, layout %d, element %lld: %g with ordinary stores, want %g",
                     (long long)W, layout, (long long)i, (double)got[0][layout][i], (double)want);
      }
      free(got[0][layout]);
      free(got[1][layout]);
    }
    free(img);
  }
}

/* By the rule (variable unset): a cast whose whole conversion reaches the
 * bound streams, even cut into two bands that each fall below it (the
 * bands are told the whole's bytes); one below the bound and a float32 ->
 * uint8 above it do not. */
static uint64_t streamed_by(DLDataType from, DLDataType to, size_t whole) {
  const size_t es = from.bits / 8 + to.bits / 8;
  int64_t shape[1] = {(int64_t)(whole / es + 63) / 64 * 64};
  void *src = calloc((size_t)shape[0], from.bits / 8);
  cr_assert(src != NULL);
  DLTensor t = {src, CPU0, 1, from, shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = to;
  o.threads = 2;
  const uint64_t calls0 = ab__host_cast_streamed_calls();
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  const uint64_t calls = ab__host_cast_streamed_calls() - calls0;
  r->deleter(r);
  free(src);
  return calls;
}

Test(cast, the_rule_streams_every_band_of_a_cast_above_the_bound) {
  const DLDataType u8 = dt(kDLUInt, 8, 1), f32 = dt(kDLFloat, 32, 1);
  setenv("AB_NUM_THREADS", "2", 1); /* two bands, whatever the cores */
  unsetenv("AB_HOST_CAST_STREAMING");
  ab__env_reload();
  const size_t bound = ab__host_cast_stream_min();
  if (bound == SIZE_MAX) { /* no streaming stores here: nothing streams */
    cr_assert_eq(streamed_by(u8, f32, (size_t)32 << 20), 0, "a cast streamed without streaming stores");
  } else {
    const uint64_t above = streamed_by(u8, f32, bound + bound / 2);
    cr_assert_geq(above, 2, "a cast of 1.5x the bound on two threads streamed in %llu bands, want both",
                  (unsigned long long)above);
    cr_assert_eq(streamed_by(u8, f32, bound / 2), 0, "a cast of half the bound streamed");
    cr_assert_eq(streamed_by(f32, u8, bound * 2), 0, "float32 -> uint8 streamed");
  }
  unsetenv("AB_NUM_THREADS");
  ab__env_reload();
}

Test(cast, the_streaming_rule_follows_the_cache_and_the_variable) {
  const DLDataType u8 = dt(kDLUInt, 8, 1), f32 = dt(kDLFloat, 32, 1), f64 = dt(kDLFloat, 64, 1);
  unsetenv("AB_HOST_CAST_STREAMING");
  ab__env_reload();
  const size_t bound = ab__host_cast_stream_min();
#if defined(__x86_64__) && defined(__GNUC__)
  const size_t llc = ab__host_llc_bytes(), cap = (size_t)24 << 20, lo = (size_t)4 << 20;
  size_t want = llc == 0 || llc > cap ? cap : llc;
  if (want < lo) want = lo;
  cr_assert_eq(bound, want, "bound %zu bytes with a %zu-byte last-level cache, want %zu", bound, llc, want);
  cr_assert(!ab__host_cast_streams(u8, f32, bound - 1), "a cast below the bound streams");
  cr_assert(ab__host_cast_streams(u8, f32, bound), "a cast at the bound does not stream");
  cr_assert(ab__host_cast_streams(f64, f32, bound), "a halving cast at the bound does not stream");
  cr_assert(!ab__host_cast_streams(f32, u8, SIZE_MAX - 1), "float32 -> uint8 streams");
  cr_assert(!ab__host_cast_streams(f64, u8, SIZE_MAX - 1), "float64 -> uint8 streams");
#else
  cr_assert_eq(bound, SIZE_MAX, "no streaming stores here, yet a bound of %zu", bound);
  cr_assert(!ab__host_cast_streams(u8, f32, SIZE_MAX - 1), "a cast streams without streaming stores");
  cr_assert(!ab__host_cast_streams(f64, f32, SIZE_MAX - 1), "a halving cast streams without streaming stores");
#endif
  setenv("AB_HOST_CAST_STREAMING", "0", 1);
  ab__env_reload();
  cr_assert(!ab__host_cast_streams(u8, f32, SIZE_MAX - 1), "AB_HOST_CAST_STREAMING=0 still streams");
  setenv("AB_HOST_CAST_STREAMING", "1", 1);
  ab__env_reload();
  cr_assert(ab__host_cast_streams(u8, f32, 1), "AB_HOST_CAST_STREAMING=1 does not stream a small cast");
  cr_assert(ab__host_cast_streams(f32, u8, 1), "AB_HOST_CAST_STREAMING=1 does not stream float32 -> uint8");
  setenv("AB_HOST_CAST_STREAMING", "sometimes", 1); /* logged, and the rule as unset */
  ab__env_reload();
  cr_assert_eq(ab__host_cast_streams(u8, f32, 1), false, "a malformed value forced streaming");
  cr_assert_eq(ab__host_cast_streams(u8, f32, SIZE_MAX - 1), bound != SIZE_MAX,
               "a malformed value did not leave the rule");
  unsetenv("AB_HOST_CAST_STREAMING");
  ab__env_reload();
}

/* Transposed planes cast in one pass where the CPU has AVX-512
 * (convert.c, transposed_in_one_pass; gather.c, ab__host_widen_8 for
 * uint8 and int8 -> float32, float16 and bfloat16 in 64 x 64 tiles,
 * ab__host_narrow_f32_16 for float32 -> float16 and bfloat16 and
 * ab__host_widen_16_f32 for uint16, int16, float16 and bfloat16 ->
 * float32 in 32 x 32 ones), where the result streams, and for uint8 and
 * int8 -> float16
 * also where it does not (the probes hold NaNs, infinities, subnormals
 * and ties): whole tiles and ragged right and bottom edges (176 = 2 tiles
 * of 64 and 48 columns, 160 = 2 and 32; 200 = 3 tiles of 64 and 8 rows, 6
 * of 32 and 8; 16-bit rows on lines are whole multiples of 32 wide), one
 * tile's edge exactly, sources that are transposed blocks of wider arrays
 * (rows 300 and 4099 elements apart), a map and none, int8's sign, a
 * batch of 3 planes, two threads' bands, and cases that must not take the
 * one pass: result rows off cache lines (72 floats or float16, 40
 * float16), a side under the tile, AVX2 kernels (AB_HOST_TILES),
 * ordinary stores (streaming off) but for uint8 and int8 -> float16, the
 * one pass switched off (AB_HOST_CAST_TILES=0), float16 without F16C's
 * loop (AB_HOST_F16C=0, which bfloat16 does not heed). Each against the
 * reference, and the planes the one pass counted. */
Test(cast, transposed_casts_in_one_pass_match_the_reference) {
  test_rng g = {0x31de5u};
  size_t nb;
  static const struct {
    int from, to;
    bool affine;
    int64_t batch, n0, n1, pitch; /* result n0 x n1; source rows (n1 of them) pitch elements apart */
    int threads;
    const char *tiles, *streaming, *one_pass_env, *f16c;
    bool one_pass; /* where the CPU has AVX-512 */
  } cases[] = {
      {R_U8, R_F32, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_U8, R_F32, true, 0, 200, 176, 200, 1, "auto", "1", "1", "1", true},
      {R_I8, R_F32, true, 0, 200, 176, 300, 1, "auto", "1", "1", "1", true},
      {R_I8, R_F32, false, 0, 64, 64, 64, 1, "auto", "1", "1", "1", true},
      {R_U8, R_F32, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "1", true},
      {R_U8, R_F32, true, 0, 1500, 1104, 1500, 2, "auto", "1", "1", "1", true},
      {R_F32, R_F16, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_F32, R_F16, true, 0, 200, 192, 300, 1, "auto", "1", "1", "1", true},
      {R_F32, R_F16, false, 0, 32, 32, 32, 1, "auto", "1", "1", "1", true},
      {R_F32, R_F16, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "1", true},
      {R_F32, R_F16, true, 0, 1500, 1120, 1500, 2, "auto", "1", "1", "1", true},
      {R_U8, R_F32, false, 0, 200, 72, 200, 1, "auto", "1", "1", "1", false},
      {R_U8, R_F32, false, 0, 63, 256, 63, 1, "auto", "1", "1", "1", false},
      {R_U8, R_F32, true, 0, 200, 176, 200, 1, "avx2", "1", "1", "1", false},
      {R_I8, R_F32, true, 0, 200, 176, 200, 1, "auto", "0", "1", "1", false},
      {R_U8, R_F32, true, 3, 130, 320, 4099, 1, "auto", "1", "0", "1", false},
      {R_F32, R_F16, false, 0, 200, 40, 200, 1, "auto", "1", "1", "1", false},
      {R_F32, R_F16, false, 0, 31, 256, 31, 1, "auto", "1", "1", "1", false},
      {R_F32, R_F16, true, 0, 200, 192, 200, 1, "avx2", "1", "1", "1", false},
      {R_F32, R_F16, true, 0, 200, 192, 200, 1, "auto", "0", "1", "1", false},
      {R_F32, R_F16, true, 0, 200, 192, 200, 1, "auto", "1", "0", "1", false},
      {R_F32, R_F16, false, 0, 200, 192, 200, 1, "auto", "1", "1", "0", false},
      {R_F32, R_BF16, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_F32, R_BF16, true, 0, 200, 192, 300, 1, "auto", "1", "1", "1", true},
      {R_F32, R_BF16, false, 0, 32, 32, 32, 1, "auto", "1", "1", "1", true},
      {R_F32, R_BF16, false, 0, 31, 256, 31, 1, "auto", "1", "1", "1", false},
      {R_F32, R_BF16, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "1", true},
      {R_F32, R_BF16, true, 0, 1500, 1120, 1500, 2, "auto", "1", "1", "1", true},
      {R_F32, R_BF16, false, 0, 200, 192, 200, 1, "auto", "1", "1", "0", true}, /* F16C is float16's alone */
      {R_F32, R_BF16, false, 0, 200, 40, 200, 1, "auto", "1", "1", "1", false},
      {R_F32, R_BF16, true, 0, 200, 192, 200, 1, "avx2", "1", "1", "1", false},
      {R_F32, R_BF16, true, 0, 200, 192, 200, 1, "auto", "0", "1", "1", false},
      {R_F32, R_BF16, true, 0, 200, 192, 200, 1, "auto", "1", "0", "1", false},
      {R_U8, R_F16, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_U8, R_F16, true, 0, 200, 160, 200, 1, "auto", "1", "1", "1", true},
      {R_I8, R_F16, true, 0, 200, 160, 300, 1, "auto", "0", "1", "1", true}, /* ordinary stores too */
      {R_U8, R_F16, false, 0, 64, 64, 64, 1, "auto", "0", "1", "1", true},
      {R_U8, R_F16, true, 3, 130, 320, 4099, 1, "auto", "0", "1", "1", true},
      {R_U8, R_F16, true, 0, 1500, 1120, 1500, 2, "auto", "0", "1", "1", true},
      {R_U8, R_F16, false, 0, 200, 72, 200, 1, "auto", "1", "1", "1", false},
      {R_U8, R_F16, false, 0, 63, 256, 63, 1, "auto", "0", "1", "1", false},
      {R_U8, R_F16, true, 0, 200, 192, 200, 1, "avx2", "0", "1", "1", false},
      {R_U8, R_F16, true, 0, 200, 192, 200, 1, "auto", "0", "0", "1", false},
      {R_U8, R_F16, true, 0, 200, 192, 200, 1, "auto", "1", "1", "0", false},
      {R_U8, R_BF16, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_I8, R_BF16, true, 0, 200, 160, 300, 1, "auto", "1", "1", "1", true},
      {R_U8, R_BF16, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "0", true},
      {R_U8, R_BF16, true, 0, 200, 192, 200, 1, "auto", "0", "1", "1", false}, /* ordinary: float16's alone */
      {R_U8, R_BF16, true, 0, 200, 192, 200, 1, "auto", "1", "0", "1", false},
      {R_U16, R_F32, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_I16, R_F32, true, 0, 200, 176, 300, 1, "auto", "1", "1", "1", true},
      {R_U16, R_F32, false, 0, 32, 32, 32, 1, "auto", "1", "1", "1", true},
      {R_U16, R_F32, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "1", true},
      {R_I16, R_F32, true, 0, 1500, 1104, 1500, 2, "auto", "1", "1", "1", true},
      {R_U16, R_F32, true, 0, 200, 176, 200, 1, "auto", "0", "1", "1", false}, /* ordinary: float16's alone */
      {R_U16, R_F32, false, 0, 200, 72, 200, 1, "auto", "1", "1", "1", false},
      {R_U16, R_F32, false, 0, 31, 256, 31, 1, "auto", "1", "1", "1", false},
      {R_U16, R_F32, true, 0, 200, 176, 200, 1, "avx2", "1", "1", "1", false},
      {R_I16, R_F32, true, 0, 200, 176, 200, 1, "auto", "1", "0", "1", false},
      {R_F16, R_F32, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_F16, R_F32, true, 0, 200, 176, 300, 1, "auto", "1", "1", "1", true},
      {R_F16, R_F32, true, 3, 130, 320, 4099, 1, "auto", "1", "1", "1", true},
      {R_F16, R_F32, true, 0, 200, 176, 200, 1, "auto", "1", "1", "0", false}, /* F16C's loop off */
      {R_F16, R_F32, true, 0, 200, 176, 200, 1, "auto", "0", "1", "1", false},
      {R_BF16, R_F32, false, 0, 256, 192, 256, 1, "auto", "1", "1", "1", true},
      {R_BF16, R_F32, true, 0, 1500, 1104, 1500, 2, "auto", "1", "1", "1", true},
      {R_BF16, R_F32, true, 0, 200, 176, 200, 1, "auto", "1", "1", "0", true},
      {R_BF16, R_F32, false, 0, 200, 72, 200, 1, "auto", "1", "1", "1", false},
      {R_BF16, R_F32, true, 0, 200, 176, 200, 1, "auto", "0", "1", "1", false}, /* ordinary: float16's alone */
      {R_I16, R_F32, true, 0, 200, 176, 200, 1, "auto", "0", "1", "1", false},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    setenv("AB_HOST_TILES", "auto", 1);
    ab__env_reload();
    const bool avx512 = ab__host_tiles_level() >= AB_TILES_AVX512; /* the CPU's, whatever the caller's setting */
    setenv("AB_HOST_TILES", cases[k].tiles, 1);
    setenv("AB_HOST_CAST_STREAMING", cases[k].streaming, 1);
    setenv("AB_HOST_CAST_TILES", cases[k].one_pass_env, 1);
    setenv("AB_HOST_F16C", cases[k].f16c, 1);
    ab__env_reload();
    const int from = cases[k].from, to = cases[k].to;
    const int64_t n0 = cases[k].n0, n1 = cases[k].n1, pitch = cases[k].pitch, batch = cases[k].batch;
    const int64_t planes = batch > 0 ? batch : 1;
    void *p = malloc((size_t)(planes * n1 * pitch) * KD[from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, planes * n1 * pitch, KD[from].dt, &g);
    int64_t shape[3] = {batch, n0, n1}, st[3] = {n1 * pitch, 1, pitch};
    DLTensor t = {p, CPU0, batch > 0 ? 3 : 2, KD[from].dt, batch > 0 ? shape : shape + 1, batch > 0 ? st : st + 1, 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.threads = cases[k].threads;
    if (cases[k].affine) {
      o.flags = AB_CONVERT_AFFINE;
      o.scale = from == R_F32 ? 3.0 : 1.0 / 255;
      o.offset = -0.5;
    }
    char what[192];
    snprintf(what, sizeof what,
             "%lld x transposed %s (%lld x %lld, rows %lld apart) -> %s%s, %d threads, %s, streaming %s, "
             "one pass %s, F16C %s",
             (long long)batch, KD[from].name, (long long)n0, (long long)n1, (long long)pitch, KD[to].name,
             cases[k].affine ? " with a map" : "", cases[k].threads, cases[k].tiles, cases[k].streaming,
             cases[k].one_pass_env, cases[k].f16c);
    const unsigned long before = ab__host_one_pass_planes();
    const uint64_t streamed0 = ab__host_cast_streamed_calls();
    free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    const unsigned long done = ab__host_one_pass_planes() - before;
    /* streaming off: nothing streamed, the one pass's edges neither (they are not fenced) */
    if (strcmp(cases[k].streaming, "0") == 0)
      cr_assert_eq(ab__host_cast_streamed_calls(), streamed0, "%s: rows streamed with streaming off", what);
    /* two threads: more pieces than planes, each band of a plane a piece */
    const unsigned long want = (unsigned long)planes * (cases[k].threads > 1 ? 2 : 1);
    if (cases[k].one_pass && avx512)
      cr_assert_geq(done, want, "%s: %lu planes or bands in one pass, want %lu or more", what, done, want);
    else
      cr_assert_eq(done, 0, "%s: %lu planes took the one pass", what, done);
    free(p);
  }
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_CAST_STREAMING");
  unsetenv("AB_HOST_CAST_TILES");
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
}

/* The one pass (above) where the layout differs: a 2-D result banded
 * along its columns (dim 1: each band's rows a whole row apart, dst0;
 * bands of 16-bit results rounded to whole lines, 48 float16 to 64, so
 * that every band takes the one pass; uint8 into float16 also in bands 96
 * wide, a tile and a ragged right edge each), a
 * 4-D batch banded along dim 1 (two planes of dim 1 in each band, dst0
 * between dim 0's), a source whose rows run backwards (a negative stride
 * from a byte_offset), for each result type and uint8 and int8 into
 * float16 and bfloat16 and uint16 and int16 into float32 too; and
 * ab_convert_into into a
 * caller's buffer on a cache line and off one (where the one pass must
 * not run), for each, the bytes around the result untouched. Streamed,
 * and for uint8 and int8 into float16 also with ordinary stores (where
 * nothing may be streamed: the edges neither). Each against the
 * reference, or against a result checked against it. */
Test(cast, transposed_casts_in_one_pass_in_bands_and_caller_buffers_match_the_reference) {
  test_rng g = {0x5a1ad5u};
  size_t nb;
  setenv("AB_HOST_TILES", "auto", 1);
  setenv("AB_HOST_CAST_STREAMING", "1", 1);
  setenv("AB_HOST_CAST_TILES", "1", 1);
  setenv("AB_HOST_F16C", "1", 1);
  setenv("AB_PARALLEL_MIN", "16KiB", 1); /* bands even for these small results */
  ab__env_reload();
  const bool avx512 = ab__host_tiles_level() >= AB_TILES_AVX512;
  static const struct {
    int from, to;
    int32_t nd;
    int64_t shape[4]; /* the result's */
    int threads;
    bool reverse;
    unsigned long pieces; /* planes, or bands of planes, the one pass must do at least */
    const char *streaming;
  } cases[] = {
      {R_I8, R_F32, 2, {69, 4096}, 20, false, 2, "1"},      /* 69 rows < 4 x 20 bands: cut along the columns */
      {R_U8, R_F32, 4, {2, 32, 64, 80}, 4, false, 64, "1"}, /* dim 0 (2) < 4 threads: cut along dim 1, 2 a band */
      {R_U8, R_F32, 2, {200, 176}, 1, true, 1, "1"},        /* rows backwards */
      {R_F32, R_F16, 2, {69, 4096}, 20, false, 2, "1"},
      /* bands 48 wide rounded to 64, a line of float16: all 47 start on lines and take the one pass
       * (when 48 wide, every other one started mid-line: 32 did) */
      {R_F32, R_F16, 2, {69, 3008}, 20, false, 47, "1"},
      {R_F32, R_F16, 4, {2, 32, 64, 96}, 4, false, 64, "1"},
      {R_F32, R_F16, 2, {200, 192}, 1, true, 1, "1"},
      {R_F32, R_BF16, 2, {69, 3008}, 20, false, 47, "1"},
      {R_F32, R_BF16, 4, {2, 32, 64, 96}, 4, false, 64, "1"},
      {R_F32, R_BF16, 2, {200, 192}, 1, true, 1, "1"},
      {R_U8, R_F16, 2, {69, 4096}, 20, false, 64, "1"},
      {R_U8, R_F16, 2, {69, 7680}, 20, false, 80, "1"}, /* bands 96 wide: a tile and a ragged right edge each */
      {R_I8, R_BF16, 4, {2, 64, 64, 128}, 4, false, 128, "1"},
      {R_U8, R_F16, 2, {200, 192}, 1, true, 1, "1"},
      {R_U16, R_F32, 2, {69, 4096}, 20, false, 64, "1"},
      {R_I16, R_F32, 4, {2, 32, 64, 80}, 4, false, 64, "1"},
      {R_U16, R_F32, 2, {200, 176}, 1, true, 1, "1"},
      {R_F16, R_F32, 2, {69, 4096}, 20, false, 64, "1"},
      {R_BF16, R_F32, 4, {2, 32, 64, 80}, 4, false, 64, "1"},
      /* ordinary stores: uint8 and int8 into float16 take the one pass there too */
      {R_U8, R_F16, 2, {69, 4096}, 20, false, 64, "0"},
      {R_I8, R_F16, 4, {2, 64, 64, 128}, 4, false, 128, "0"},
      {R_U8, R_F16, 2, {200, 192}, 1, true, 1, "0"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int from = cases[k].from, to = cases[k].to;
    const int32_t nd = cases[k].nd;
    const int64_t *sh = cases[k].shape, n0 = sh[nd - 2], n1 = sh[nd - 1];
    int64_t planes = 1;
    for (int32_t i = 0; i < nd - 2; i++) planes *= sh[i];
    void *p = malloc((size_t)(planes * n0 * n1) * KD[from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, planes * n0 * n1, KD[from].dt, &g);
    /* compact planes of n1 source rows of n0 elements, read transposed */
    int64_t st[4];
    st[nd - 2] = 1;
    st[nd - 1] = cases[k].reverse ? -n0 : n0;
    for (int32_t i = nd - 3; i >= 0; i--) st[i] = (i == nd - 3 ? n0 * n1 : st[i + 1] * sh[i + 1]);
    DLTensor t = {p, CPU0, nd, KD[from].dt, (int64_t *)sh, st,
                  cases[k].reverse ? (uint64_t)((n1 - 1) * n0) * KD[from].size : 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.threads = cases[k].threads;
    o.flags = AB_CONVERT_AFFINE;
    o.scale = from == R_F32 ? 3.0 : 1.0 / 255;
    o.offset = 0.25;
    setenv("AB_HOST_CAST_STREAMING", cases[k].streaming, 1);
    ab__env_reload();
    char what[128];
    snprintf(what, sizeof what, "%d-d transposed %s -> %s, last dims %lld x %lld, %d threads%s, streaming %s",
             (int)nd, KD[from].name, KD[to].name, (long long)n0, (long long)n1, cases[k].threads,
             cases[k].reverse ? ", rows backwards" : "", cases[k].streaming);
    const unsigned long before = ab__host_one_pass_planes();
    const uint64_t streamed0 = ab__host_cast_streamed_calls();
    free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    const unsigned long done = ab__host_one_pass_planes() - before;
    if (strcmp(cases[k].streaming, "0") == 0)
      cr_assert_eq(ab__host_cast_streamed_calls(), streamed0, "%s: rows streamed with streaming off", what);
    const unsigned long want = avx512 ? cases[k].pieces : 0;
    cr_assert_geq(done, want, "%s: %lu planes or bands in one pass, want %lu or more", what, done, want);
    if (!avx512) cr_assert_eq(done, 0, "%s: %lu planes in one pass without AVX-512", what, done);
    free(p);
  }

  /* ab_convert_into: the checked result, then the same into a caller's
   * buffer on a line (one pass) and off one (the buffered way) */
  static const struct {
    int from, to;
    int64_t n0, n1;
    int off; /* bytes off a line */
    const char *streaming;
  } into[] = {{R_U8, R_F32, 200, 176, 16, "1"},
               {R_F32, R_F16, 200, 192, 32, "1"},
               {R_F32, R_BF16, 200, 192, 32, "1"},
               {R_I8, R_F16, 200, 192, 32, "1"},
               {R_U8, R_F16, 200, 192, 32, "0"},
               {R_U16, R_F32, 200, 176, 16, "1"},
               {R_U8, R_BF16, 200, 192, 32, "1"},
               {R_I16, R_F32, 200, 176, 16, "1"},
               {R_F16, R_F32, 200, 176, 16, "1"},
               {R_BF16, R_F32, 200, 176, 16, "1"}};
  for (size_t k = 0; k < sizeof into / sizeof into[0]; k++) {
    setenv("AB_HOST_CAST_STREAMING", into[k].streaming, 1);
    ab__env_reload();
    const int from = into[k].from, to = into[k].to;
    const int64_t n0 = into[k].n0, n1 = into[k].n1;
    int64_t shape[2] = {n0, n1}, st[2] = {1, n0};
    void *p = malloc((size_t)(n0 * n1) * KD[from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, n0 * n1, KD[from].dt, &g);
    DLTensor t = {p, CPU0, 2, KD[from].dt, shape, st, 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.flags = AB_CONVERT_AFFINE;
    o.scale = -2.5;
    o.offset = 7.0;
    char what[96];
    snprintf(what, sizeof what, "%lld x %lld transposed %s -> %s for ab_convert_into, streaming %s", (long long)n0,
             (long long)n1, KD[from].name, KD[to].name, into[k].streaming);
    unsigned char *want = check_conversion(&t, &t, CPU0, &o, what, &nb);
    char *buf = aligned_alloc(64, nb + 128);
    cr_assert_not_null(buf);
    for (int off = 0; off <= into[k].off; off += into[k].off) {
      memset(buf, 0xa5, nb + 128);
      int64_t dshape[2] = {n0, n1};
      DLTensor d = {buf + 64 + off, CPU0, 2, KD[to].dt, dshape, NULL, 0};
      const unsigned long before = ab__host_one_pass_planes();
      const uint64_t streamed0 = ab__host_cast_streamed_calls();
      cr_assert_eq(ab_convert_into(&t, &d, &o), AB_OK, "%s at %d bytes off a line: %s", what, off, ab_last_error());
      const unsigned long done = ab__host_one_pass_planes() - before;
      if (strcmp(into[k].streaming, "0") == 0)
        cr_assert_eq(ab__host_cast_streamed_calls(), streamed0, "%s: rows streamed with streaming off", what);
      cr_assert(memcmp(buf + 64 + off, want, nb) == 0, "%s at %d bytes off a line: other bytes", what, off);
      for (size_t i = 0; i < 64 + (size_t)off; i++)
        cr_assert_eq((unsigned char)buf[i], 0xa5, "%s: byte %zu before the result written", what, i);
      for (size_t i = 64 + (size_t)off + nb; i < nb + 128; i++)
        cr_assert_eq((unsigned char)buf[i], 0xa5, "%s: byte %zu after the result written", what, i);
      if (off == 0 && avx512) cr_assert_geq(done, 1, "%s into a buffer on a line: no plane in one pass", what);
      if (off != 0) cr_assert_eq(done, 0, "%s into a buffer off a line: %lu planes in one pass", what, done);
    }
    free(buf);
    free(want);
    free(p);
  }
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_CAST_STREAMING");
  unsetenv("AB_HOST_CAST_TILES");
  unsetenv("AB_HOST_F16C");
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
}

/* The one pass's map into float16 is a multiply, then an add, each
 * rounded to float32: (1 + 2^-14)^2 = 1 + 2^-13 + 2^-28 rounds to
 * 1 + 2^-13, and adding b = 2^-11 - 2^-13 + 2^-24 - 2^-29 gives a float32
 * just below the midpoint above 1 + 2^-11, so 1 + 2^-11, which float16
 * rounds to even: 1.0 (0x3c00). A fused multiply-add keeps the 2^-28 and
 * lands above the midpoint: 1 + 2^-11 + 2^-23, float16 1 + 2^-10
 * (0x3c01). A 64 x 64 transposed plane, streamed, so the one pass runs
 * where the CPU has AVX-512 (the chunked way otherwise, which must agree). */
Test(cast, a_map_into_float16_in_one_pass_is_a_multiply_then_an_add) {
  setenv("AB_HOST_CAST_STREAMING", "1", 1);
  setenv("AB_HOST_TILES", "auto", 1);
  setenv("AB_HOST_CAST_TILES", "1", 1);
  setenv("AB_HOST_F16C", "1", 1);
  ab__env_reload();
  enum { N = 64 };
  static float x[N * N];
  for (int i = 0; i < N * N; i++) x[i] = 1.0f + 0x1p-14f;
  int64_t shape[2] = {N, N}, st[2] = {1, N};
  DLTensor t = {x, CPU0, 2, KD[R_F32].dt, shape, st, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = KD[R_F16].dt;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 1.0 + 0x1p-14;
  o.offset = 0x1p-11 - 0x1p-13 + 0x1p-24 - 0x1p-29;
  const unsigned long before = ab__host_one_pass_planes();
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  const unsigned long done = ab__host_one_pass_planes() - before;
  const uint16_t *y = r->dl_tensor.data;
  for (int i = 0; i < N * N; i++)
    cr_assert_eq(y[i], 0x3c00, "element %d is 0x%04x, not 0x3c00 (a fused multiply-add?)", i, (unsigned)y[i]);
  r->deleter(r);
  if (ab__host_tiles_level() >= AB_TILES_AVX512) cr_assert_eq(done, 1, "the one pass did %lu planes", done);
  unsetenv("AB_HOST_CAST_STREAMING");
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_CAST_TILES");
  unsetenv("AB_HOST_F16C");
  ab__env_reload();
}

/* The one pass and the buffered way give the same bits, NaN payloads
 * included (the reference above takes any NaN for a NaN): planes whose
 * values include signalling and quiet NaNs with payloads in their low and
 * high bits, infinities, zeros, subnormals, the largest finite values and
 * values a half-unit from the next (float16 and bfloat16 planes with
 * their own NaNs, infinities and subnormals; uint8, int8, uint16 and
 * int16 planes, mapped so that their values round), cast with streaming forced (or, uint8 into
 * float16, off) both with the one pass and with AB_HOST_CAST_TILES=0,
 * with a map and without. */
Test(cast, transposed_casts_give_the_same_bits_in_one_pass_and_through_a_buffer) {
  static const uint32_t specials[] = {0x7f800001u, 0xffa00001u, 0x7fc00000u, 0xff812345u, 0x7fbfffffu, 0x7fe00f00u,
                                      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                      0x7f7fffffu, 0xff7fffffu, 0x3f808000u, 0x3f818000u, 0x477ff000u, 0x33000000u,
                                      0xffffffffu, 0xffff8001u}; /* the last two: where bits + 0x8000 wraps */
  test_rng g = {0xb175u};
  static const struct {
    int from, to;
    bool affine;
    int64_t n0, n1;
    const char *streaming;
  } cases[] = {{R_F32, R_BF16, false, 200, 192, "1"}, {R_F32, R_BF16, true, 200, 192, "1"},
               {R_F32, R_F16, false, 200, 192, "1"},  {R_F32, R_F16, true, 200, 192, "1"},
               {R_U8, R_F32, true, 200, 176, "1"},    {R_I8, R_F32, false, 200, 176, "1"},
               {R_U8, R_F16, true, 200, 192, "1"},    {R_I8, R_F16, true, 200, 160, "0"},
               {R_U8, R_BF16, true, 200, 192, "1"},   {R_I8, R_BF16, true, 200, 160, "1"},
               {R_U16, R_F32, true, 200, 176, "1"},   {R_I16, R_F32, false, 200, 176, "1"},
               {R_F16, R_F32, true, 200, 176, "1"},   {R_F16, R_F32, false, 200, 176, "1"},
               {R_BF16, R_F32, true, 200, 176, "1"},  {R_BF16, R_F32, false, 200, 176, "1"}};
  /* float16 and bfloat16: NaNs (signalling, quiet, payloads, both signs), infinities, zeros,
   * subnormals, the largest finite values */
  static const uint16_t specials16[2][12] = {
      {0x7c01, 0xfe00, 0x7fff, 0xfc3f, 0x7e01, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff},
      {0x7f81, 0xffc0, 0x7fff, 0xff8f, 0x7fc1, 0x7f80, 0xff80, 0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f}};
  setenv("AB_HOST_TILES", "auto", 1);
  setenv("AB_HOST_F16C", "1", 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    setenv("AB_HOST_CAST_STREAMING", cases[k].streaming, 1);
    const int from = cases[k].from, to = cases[k].to;
    const int64_t n0 = cases[k].n0, n1 = cases[k].n1;
    unsigned char *p = malloc((size_t)(n0 * n1) * KD[from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, n0 * n1, KD[from].dt, &g);
    if (from == R_F32) /* every 7th element a special value */
      for (int64_t i = 0; i < n0 * n1; i += 7)
        memcpy(p + i * 4, &specials[(i / 7) % (sizeof specials / sizeof specials[0])], 4);
    if (from == R_F16 || from == R_BF16)
      for (int64_t i = 0; i < n0 * n1; i += 7)
        memcpy(p + i * 2, &specials16[from == R_BF16][(i / 7) % 12], 2);
    int64_t shape[2] = {n0, n1}, st[2] = {1, n0};
    DLTensor t = {p, CPU0, 2, KD[from].dt, shape, st, 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.threads = 1;
    if (cases[k].affine) { /* uint8 into float16 and uint16 into float32: values that round */
      o.flags = AB_CONVERT_AFFINE;
      o.scale = (from != R_F32 && to == R_F16) || from == R_U16 ? 1.0 / 255 : 0.75;
      o.offset = -1.5;
    }
    unsigned char *got[2];
    unsigned long done[2];
    for (int way = 0; way < 2; way++) {
      setenv("AB_HOST_CAST_TILES", way == 0 ? "1" : "0", 1);
      ab__env_reload();
      const unsigned long before = ab__host_one_pass_planes();
      DLManagedTensorVersioned *r;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      done[way] = ab__host_one_pass_planes() - before;
      got[way] = malloc((size_t)(n0 * n1) * KD[to].size);
      cr_assert_not_null(got[way]);
      memcpy(got[way], r->dl_tensor.data, (size_t)(n0 * n1) * KD[to].size);
      r->deleter(r);
    }
    for (int64_t i = 0; i < n0 * n1; i++)
      cr_assert(memcmp(got[0] + i * KD[to].size, got[1] + i * KD[to].size, KD[to].size) == 0,
                "transposed %s -> %s%s, streaming %s: element %lld differs between the one pass and the buffer",
                KD[from].name, KD[to].name, cases[k].affine ? " with a map" : "", cases[k].streaming, (long long)i);
    cr_assert_eq(done[1], 0, "the one pass ran with AB_HOST_CAST_TILES=0");
    if (ab__host_tiles_level() >= AB_TILES_AVX512) cr_assert_eq(done[0], 1, "the one pass did %lu planes", done[0]);
    free(got[0]);
    free(got[1]);
    free(p);
  }
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_F16C");
  unsetenv("AB_HOST_CAST_STREAMING");
  unsetenv("AB_HOST_CAST_TILES");
  ab__env_reload();
}

/* Random transposed casts against the reference: planes (or a batch of
 * 2) read transposed from rows a random pitch apart, of random sizes
 * around the one-pass tiles (1-300 each side; a third of the sides a
 * multiple of 32, so that result rows of 16-bit and float32 results fall
 * on lines, and some of 64), for the one pass's pairs and a few others,
 * with a map or none, streaming forced on, off or by the rule, on 1-3
 * threads with bands down to 4 KiB; every fourth draw of each pair is
 * one the one pass can take, at least on one thread (both sides 64 or
 * more, result rows on lines, streaming on; bands on more threads may
 * fall under a tile). Over the run (300 draws) the one pass must have
 * taken some of them where the CPU has AVX-512, with streaming forced on
 * and forced off, and some of each of its pairs, so that the draw
 * reaches every kernel. */
Test(cast, random_transposed_casts_match_the_reference) {
  test_rng g = {0x7a5e0u};
  size_t nb;
  static const struct {
    int from, to;
    bool one_pass; /* a pair the one pass takes */
  } pairs[] = {{R_U8, R_F32, true},   {R_I8, R_F32, true},   {R_U8, R_F16, true},    {R_I8, R_F16, true},
               {R_U8, R_BF16, true},  {R_I8, R_BF16, true},  {R_F32, R_F16, true},   {R_F32, R_BF16, true},
               {R_U8, R_F64, false},  {R_F32, R_U8, false},  {R_U16, R_F32, true},   {R_F64, R_F32, false},
               {R_I16, R_F32, true},  {R_F16, R_F32, true},  {R_BF16, R_F32, true}};
  enum { NPAIRS = sizeof pairs / sizeof pairs[0] };
  static const char *const streaming[] = {"0", "1", "auto"};
  setenv("AB_HOST_TILES", "auto", 1);
  setenv("AB_HOST_CAST_TILES", "1", 1);
  setenv("AB_HOST_F16C", "1", 1);
  setenv("AB_PARALLEL_MIN", "4KiB", 1);
  ab__env_reload();
  const bool avx512 = ab__host_tiles_level() >= AB_TILES_AVX512;
  /* planes in one pass with streaming forced off and on, and of each pair with streaming forced */
  unsigned long one_pass[2] = {0, 0}, of_pair[NPAIRS] = {0};
  for (int k = 0; k < 300; k++) {
    const int from = pairs[k % NPAIRS].from, to = pairs[k % NPAIRS].to;
    int64_t side[2];
    for (int i = 0; i < 2; i++) {
      const int64_t pick = rng_between(&g, 0, 2);
      side[i] = pick == 0 ? 32 * rng_between(&g, 1, 9) : pick == 1 ? rng_between(&g, 1, 300) : rng_between(&g, 60, 140);
    }
    /* every pair's every fourth draw one the one pass can take on one thread: sides of a 64-tile or
     * more, result rows on lines, streaming forced on (on more threads a band may fall under a tile) */
    const bool eligible = (k / NPAIRS) % 4 == 0;
    if (eligible) side[0] = rng_between(&g, 64, 300), side[1] = 64 * rng_between(&g, 1, 4);
    const int64_t n0 = side[0], n1 = side[1], pitch = n0 + (rng_between(&g, 0, 1) ? 0 : rng_between(&g, 1, 70));
    const int64_t batch = rng_between(&g, 0, 3) == 0 ? 2 : 0, planes = batch > 0 ? batch : 1;
    const char *st_env = eligible ? "1" : streaming[rng_between(&g, 0, 2)];
    setenv("AB_HOST_CAST_STREAMING", st_env, 1);
    ab__env_reload();
    void *p = malloc((size_t)(planes * n1 * pitch) * KD[from].size);
    cr_assert_not_null(p);
    fill_cast_probes(p, planes * n1 * pitch, KD[from].dt, &g);
    int64_t shape[3] = {batch, n0, n1}, st[3] = {n1 * pitch, 1, pitch};
    DLTensor t = {p, CPU0, batch > 0 ? 3 : 2, KD[from].dt, batch > 0 ? shape : shape + 1, batch > 0 ? st : st + 1, 0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = KD[to].dt;
    o.threads = (uint32_t)rng_between(&g, 1, 3);
    if (rng_between(&g, 0, 1)) {
      o.flags = AB_CONVERT_AFFINE;
      o.scale = to == R_U8 ? 255.0 : from == R_F32 || from == R_F64 ? 0.75 : 1.0 / 255;
      o.offset = -0.5;
    }
    char what[192];
    snprintf(what, sizeof what, "case %d: %lld x transposed %s (%lld x %lld, rows %lld apart) -> %s%s, %u threads, "
             "streaming %s", k, (long long)batch, KD[from].name, (long long)n0, (long long)n1, (long long)pitch,
             KD[to].name, (o.flags & AB_CONVERT_AFFINE) ? " with a map" : "", (unsigned)o.threads, st_env);
    const unsigned long before = ab__host_one_pass_planes();
    free(check_conversion(&t, &t, CPU0, &o, what, &nb));
    const unsigned long done = ab__host_one_pass_planes() - before;
    if (strcmp(st_env, "auto") != 0) one_pass[strcmp(st_env, "1") == 0] += done; /* auto: by the machine's cache */
    if (strcmp(st_env, "auto") != 0) of_pair[k % NPAIRS] += done;
    free(p);
  }
  if (avx512) {
    cr_assert_gt(one_pass[0], 0, "no random case took the one pass with ordinary stores");
    cr_assert_gt(one_pass[1], 0, "no random case took the one pass streamed");
    for (int i = 0; i < NPAIRS; i++)
      if (pairs[i].one_pass)
        cr_assert_gt(of_pair[i], 0, "no random %s -> %s took the one pass", KD[pairs[i].from].name,
                     KD[pairs[i].to].name);
  }
  unsetenv("AB_HOST_TILES");
  unsetenv("AB_HOST_CAST_TILES");
  unsetenv("AB_HOST_F16C");
  unsetenv("AB_HOST_CAST_STREAMING");
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
}
