/* Randomized host conversions against an independent reference, a plain
 * program:
 *
 *   stress_soak SEED [CASES=40] [MAX_MIB=40] [ONLY_CASE]
 *
 * Each case draws a layout (2-D transposes of pitched sources, batched
 * (N, H, W) transposes, HWC <-> CHW images of 1-4 channels, random
 * permutations of up to 5 dims, plain strided copies; now and then a
 * dim reversed or broadcast), a size from 256
 * bytes to MAX_MIB of result (log-uniform, so the streaming bound at
 * 4 MiB, the thread splits and the plain tiles are all crossed), sizes
 * that are and are not multiples of 64 and powers of two, sources off
 * lines and on them, a thread count, and either the source's dtype or a
 * cast with or without an affine or per-channel map. The result is
 * compared element by element with a reference computed here from
 * docs/guide.md's rules ("Converting on the way"), not by the library.
 * About a third of the cases convert into a buffer of the harness's
 * (ab_convert_into) that starts on a line, off lines by whole elements,
 * or off by any byte count, and check that no byte around the result
 * changed.
 *
 * With SOAK_DEVICE set (opencl:0, cuda:1, ...), every case goes through
 * that device instead: converted on the way there and copied back, or
 * copied there and converted on the way back, so that the device's
 * kernels (or whichever side the route picks: ab_explain_convert says,
 * and the summary counts the cases the device converted) give the bytes
 * compared. SOAK_EXPECT_ON_DEVICE=1 fails a run where it converted none.
 * A device that does not exist skips the program (exit 77), or fails it
 * where AB_TEST_EXPECT_OPENCL or AB_TEST_EXPECT_CUDA says it should.
 *
 * The kernels a process takes are set by the AB_HOST_* variables, which
 * the library reads once per process: tools/soak.sh runs this program
 * under random settings of all of them. Case K of seed S is the same
 * case under any settings, so a failure replays with the same variables
 * and `stress_soak S 1 MAX_MIB K`.
 *
 * Prints each failure (case, layout, first differing element) and a
 * summary; exits 1 on any failure (the harness running out of memory
 * counts as one), 2 on bad arguments, 77 on a skip (below). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arraybridge/arraybridge.h"

typedef struct {
  uint64_t s;
} rng;

static uint64_t next(rng *g) { /* splitmix64 */
  uint64_t z = (g->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* uniform in [lo, hi] */
static int64_t between(rng *g, int64_t lo, int64_t hi) { return lo + (int64_t)(next(g) % (uint64_t)(hi - lo + 1)); }
static bool chance(rng *g, int percent) { return between(g, 0, 99) < percent; }

/* ---- dtypes ---- */

enum kind { U8, I8, U16, I16, I32, I64, F16, BF16, F32, F64, C64, C128, KINDS };
static const struct {
  const char *name;
  DLDataType dt;
  size_t size;
  bool is_float, is_int;
} K[KINDS] = {
    [U8] = {"uint8", {kDLUInt, 8, 1}, 1, false, true},
    [I8] = {"int8", {kDLInt, 8, 1}, 1, false, true},
    [U16] = {"uint16", {kDLUInt, 16, 1}, 2, false, true},
    [I16] = {"int16", {kDLInt, 16, 1}, 2, false, true},
    [I32] = {"int32", {kDLInt, 32, 1}, 4, false, true},
    [I64] = {"int64", {kDLInt, 64, 1}, 8, false, true},
    [F16] = {"float16", {kDLFloat, 16, 1}, 2, true, false},
    [BF16] = {"bfloat16", {kDLBfloat, 16, 1}, 2, true, false},
    [F32] = {"float32", {kDLFloat, 32, 1}, 4, true, false},
    [F64] = {"float64", {kDLFloat, 64, 1}, 8, true, false},
    [C64] = {"complex64", {kDLComplex, 64, 1}, 8, false, false},
    [C128] = {"complex128", {kDLComplex, 128, 1}, 16, false, false},
};

/* The casts drawn: the one-pass transposed casts' pairs (docs/guide.md,
 * AB_HOST_CAST_TILES), the common image casts, and a few whose integers
 * are too wide for float32 to hold exactly. Not drawn: bool, uint32,
 * uint64, complex64 <-> complex128, and int64 into float16 or bfloat16
 * (the reference's double would round first). */
static const struct {
  enum kind from, to;
} CASTS[] = {{U8, F32}, {U8, F16}, {U8, BF16}, {I8, F32},  {I8, F16},   {U16, F32}, {I16, F32},
             {F16, F32}, {BF16, F32}, {F32, F16}, {F32, BF16}, {F32, U8},  {F64, F32}, {U8, F64},
             {I16, U8},  {F32, I16},  {U16, U8},  {F32, F64}, {F16, U8},  {I32, F32},
             {I8, BF16}, {I32, BF16}, {I64, F32}, {I64, F64}, {F64, BF16}, {F16, F64}, {BF16, F64}};

/* float16 and bfloat16 by their bits, so that no compiler support for
 * _Float16 is needed: widening is exact, narrowing rounds once to nearest
 * even (overflow to infinity). Which NaN: expected_nan below. */
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float half_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)m, -24);
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}
/* one rounding of a double to float16 (a float32 is exactly a double) */
static uint16_t double_to_half(double x) {
  const uint16_t sign = signbit(x) ? 0x8000 : 0;
  if (isnan(x)) return 0x7e00 | sign;
  double a = fabs(x);
  if (a >= 65520.0) return sign | 0x7c00; /* 65504 + half an ulp rounds up */
  if (a < ldexp(1.0, -14)) {              /* subnormal: steps of 2^-24 */
    double q = nearbyint(a * ldexp(1.0, 24));
    return sign | (uint16_t)q; /* q == 1024 is the smallest normal's bits */
  }
  int e;
  double f = frexp(a, &e);             /* a = f * 2^e, f in [0.5, 1) */
  double q = nearbyint(ldexp(f, 11)); /* 11 significant bits */
  if (q == 2048.0) {
    q = 1024.0;
    e++;
  }
  const int be = e - 1 + 15;
  if (be >= 31) return sign | 0x7c00;
  return sign | (uint16_t)(be << 10) | (uint16_t)((uint32_t)q - 1024);
}
static uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
/* one rounding of a double to bfloat16: 8 significant bits, float32's
 * exponent range (subnormals in steps of 2^-133) */
static uint16_t double_to_bf16(double x) {
  const uint16_t sign = signbit(x) ? 0x8000 : 0;
  if (isnan(x)) return 0x7fc0 | sign;
  const double a = fabs(x);
  if (a < ldexp(1.0, -126)) return sign | (uint16_t)nearbyint(a * ldexp(1.0, 133)); /* 128: the smallest normal */
  int e;
  const double f = frexp(a, &e);
  double q = nearbyint(ldexp(f, 8));
  if (q == 256.0) {
    q = 128.0;
    e++;
  }
  const int be = e - 1 + 127;
  if (be >= 255 || isinf(a)) return sign | 0x7f80;
  return sign | (uint16_t)(be << 7) | (uint16_t)((uint32_t)q - 128);
}

/* A source element as the arithmetic sees it. */
typedef struct {
  bool is_int;
  int64_t i;
  double f;
} value;

static value load(enum kind k, const char *p) {
  value v = {true, 0, 0};
  switch (k) {
  case U8: v.i = *(const uint8_t *)p; break;
  case I8: v.i = *(const int8_t *)p; break;
  case U16: { uint16_t x; memcpy(&x, p, 2); v.i = x; } break;
  case I16: { int16_t x; memcpy(&x, p, 2); v.i = x; } break;
  case I32: { int32_t x; memcpy(&x, p, 4); v.i = x; } break;
  case I64: { int64_t x; memcpy(&x, p, 8); v.i = x; } break;
  case F16: { uint16_t x; memcpy(&x, p, 2); v.is_int = false; v.f = half_to_f32(x); } break;
  case BF16: { uint16_t x; memcpy(&x, p, 2); v.is_int = false; v.f = bits_f32((uint32_t)x << 16); } break;
  case F32: { float x; memcpy(&x, p, 4); v.is_int = false; v.f = x; } break;
  case F64: { double x; memcpy(&x, p, 8); v.is_int = false; v.f = x; } break;
  default: abort();
  }
  return v;
}

/* An integer kind's range. */
static void int_range(enum kind k, int64_t *lo, int64_t *hi) {
  *lo = k == U8 || k == U16 ? 0 : k == I8 ? -128 : k == I16 ? -32768 : k == I32 ? INT32_MIN : INT64_MIN;
  *hi = k == U8 ? 255 : k == U16 ? 65535 : k == I8 ? 127 : k == I16 ? 32767 : k == I32 ? INT32_MAX : INT64_MAX;
}

/* An integral double saturated to k's range, NaN -> 0 (INT64_MAX as a
 * double is 2^63, which is past it). */
static int64_t saturate(double r, enum kind k) {
  int64_t lo, hi;
  int_range(k, &lo, &hi);
  if (isnan(r)) return 0;
  if (r <= (double)lo) return lo;
  if (r >= (double)hi) return hi;
  return (int64_t)r;
}

/* The low n bytes of v as an n-byte integer at p, in the host's byte
 * order, and back: memcpy of v's first bytes takes its high ones on a
 * big-endian host (s390x). */
static void put_low(char *p, uint64_t v, size_t n) {
  const uint8_t b = (uint8_t)v;
  const uint16_t h = (uint16_t)v;
  const uint32_t w = (uint32_t)v;
  memcpy(p, n == 1 ? (const void *)&b : n == 2 ? (const void *)&h : n == 4 ? (const void *)&w : (const void *)&v, n);
}

static uint64_t get_low(const char *p, size_t n) {
  uint8_t b;
  uint16_t h;
  uint32_t w;
  uint64_t v;
  memcpy(n == 1 ? (void *)&b : n == 2 ? (void *)&h : n == 4 ? (void *)&w : (void *)&v, p, n);
  return n == 1 ? b : n == 2 ? h : n == 4 ? w : v;
}

/* Writes element `v` converted to k at p: docs/guide.md's rules. */
static void store(enum kind k, char *p, value v) {
  if (K[k].is_int) {
    int64_t r;
    if (v.is_int) {
      int64_t lo, hi;
      int_range(k, &lo, &hi);
      r = v.i < lo ? lo : v.i > hi ? hi : v.i;
    } else {
      r = saturate(nearbyint(v.f), k);
    }
    put_low(p, (uint64_t)r, K[k].size);
    return;
  }
  /* float results: from an integer, one rounding from the integer itself */
  switch (k) {
  case F16: {
    uint16_t h = double_to_half(v.is_int ? (double)v.i : v.f); /* ints drawn here are exact in a double */
    memcpy(p, &h, 2);
  } break;
  case BF16: {
    uint16_t b = double_to_bf16(v.is_int ? (double)v.i : v.f);
    memcpy(p, &b, 2);
  } break;
  case F32: {
    float f = v.is_int ? (float)v.i : (float)v.f;
    memcpy(p, &f, 4);
  } break;
  case F64: {
    double d = v.is_int ? (double)v.i : v.f;
    memcpy(p, &d, 8);
  } break;
  default: abort();
  }
}

/* y = x * s + o, a multiply then an add, in float32 or float64 by the rule:
 * float32 where the result is float32, float16 or bfloat16 and the source
 * is none of float64, (u)int32, (u)int64. */
static value affine(value x, double s, double o, enum kind from, enum kind to) {
  const bool in_f32 = (to == F32 || to == F16 || to == BF16) && from != F64 && from != I32 && from != I64;
  value y = {false, 0, 0};
  if (in_f32) {
    volatile float xf = x.is_int ? (float)x.i : (float)x.f, sf = (float)s, of = (float)o;
    volatile float t = xf * sf;
    volatile float r = t + of;
    y.f = r;
  } else {
    volatile double xd = x.is_int ? (double)x.i : x.f;
    volatile double t = xd * s;
    volatile double r = t + o;
    y.f = r;
  }
  /* a float16 result from float32 arithmetic rounds the float32 once more,
   * which y.f (exactly that float32) does */
  return y;
}

/* ---- cases ---- */

#define MAXD 5

typedef struct {
  enum kind from, to;
  int ndim;
  int64_t shape[MAXD], st[MAXD]; /* source, in elements */
  int32_t perm[MAXD];
  bool permute; /* opts.permute, else the strides alone reorder */
  int map;      /* 0 none, 1 affine, 2 per channel */
  double scale, offset;
  int32_t axis;
  double cs[8], co[8];
  uint32_t threads;
  bool into;       /* ab_convert_into a buffer of the harness's, else ab_convert_memory */
  bool back;       /* SOAK_DEVICE: converted on the way back to the host, else on the way there */
  int64_t dst_off; /* into: the result's first byte, this far into a 64-byte-aligned buffer */
  char layout[96];
} kase;

/* Element counts log-uniform in [lo, hi]. */
static int64_t log_between(rng *g, int64_t lo, int64_t hi) {
  const double a = log((double)lo), b = log((double)hi);
  const double u = (double)(next(g) >> 11) / 9007199254740992.0;
  return (int64_t)exp(a + (b - a) * u);
}
/* a length near n: sometimes a multiple of 64 or a power of two, sometimes
 * one off */
static int64_t length_near(rng *g, int64_t n) {
  if (n < 1) n = 1;
  const int64_t roll = between(g, 0, 9);
  if (roll < 2 && n >= 64) n = n / 64 * 64;
  else if (roll < 4) {
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    n = p;
  }
  if (chance(g, 15)) n += between(g, -1, 1);
  return n < 1 ? 1 : n;
}

/* SOAK_DEVICE's device, or cpu:0 (main sets it). */
static DLDevice target = {kDLCPU, 0};

static void draw(rng *g, kase *c, int64_t max_bytes) {
  memset(c, 0, sizeof *c);
  /* a cast in 45 cases of 100, the rest copies; through a device, whose
   * kernels only casts reach, 75 */
  if (chance(g, target.device_type == kDLCPU ? 45 : 75)) {
    const int i = (int)between(g, 0, sizeof CASTS / sizeof CASTS[0] - 1);
    c->from = CASTS[i].from;
    c->to = CASTS[i].to;
  } else {
    static const enum kind same[] = {U8, U8, U16, F16, F32, F32, F64, C64, C128, I8, BF16, I32};
    c->from = c->to = same[between(g, 0, sizeof same / sizeof same[0] - 1)];
  }
  const size_t es_out = K[c->to].size, es_in = K[c->from].size;
  const size_t es_max = es_out > es_in ? es_out : es_in;
  /* half of the cases from 1 MiB up: the streaming bound (4 MiB) and the
   * thread splits are crossed often */
  const int64_t top = max_bytes / (int64_t)es_max, mib = ((int64_t)1 << 20) / (int64_t)es_max;
  const int64_t n = log_between(g, chance(g, 50) && top > mib ? mib : 256 / (int64_t)es_max + 1, top);
  const int shape_kind = (int)between(g, 0, 9);
  int64_t sh[MAXD]; /* logical shape before the reorder */
  if (shape_kind < 5) { /* 2-D transpose */
    c->ndim = 2;
    const double aspect = exp((double)between(g, -1386, 1386) / 1000.0); /* 1/4 .. 4 */
    sh[0] = length_near(g, (int64_t)sqrt((double)n * aspect));
    sh[1] = length_near(g, n / sh[0]);
    c->perm[0] = 1;
    c->perm[1] = 0;
    snprintf(c->layout, sizeof c->layout, "transpose");
  } else if (shape_kind < 7) { /* batched (N, H, W) -> (N, W, H) */
    c->ndim = 3;
    sh[0] = between(g, 2, 16);
    const int64_t plane = n / sh[0];
    sh[1] = length_near(g, (int64_t)sqrt((double)plane));
    sh[2] = length_near(g, plane / sh[1]);
    c->perm[0] = 0;
    c->perm[1] = 2;
    c->perm[2] = 1;
    snprintf(c->layout, sizeof c->layout, "batched transpose");
  } else if (shape_kind < 9) { /* HWC -> CHW or CHW -> HWC */
    c->ndim = 3;
    const int64_t ch = between(g, 1, 4);
    const int64_t px = n / ch;
    const int64_t h = length_near(g, (int64_t)sqrt((double)px));
    const int64_t w = length_near(g, px / h);
    if (chance(g, 50)) {
      sh[0] = h, sh[1] = w, sh[2] = ch;
      c->perm[0] = 2, c->perm[1] = 0, c->perm[2] = 1;
      snprintf(c->layout, sizeof c->layout, "HWC->CHW");
    } else {
      sh[0] = ch, sh[1] = h, sh[2] = w;
      c->perm[0] = 1, c->perm[1] = 2, c->perm[2] = 0;
      snprintf(c->layout, sizeof c->layout, "CHW->HWC");
    }
  } else { /* random rank and order, or a plain copy of a pitched source */
    c->ndim = (int)between(g, 1, MAXD);
    int64_t left = n;
    for (int i = 0; i < c->ndim; i++) {
      const int rest = c->ndim - i;
      const int64_t share = (int64_t)pow((double)left, 1.0 / rest);
      sh[i] = i == c->ndim - 1 ? length_near(g, left) : between(g, 1, 2 * share + 1);
      left = left / sh[i] > 0 ? left / sh[i] : 1;
      c->perm[i] = i;
    }
    if (chance(g, 70))
      for (int i = c->ndim - 1; i > 0; i--) {
        const int j = (int)between(g, 0, i);
        const int32_t t = c->perm[i];
        c->perm[i] = c->perm[j];
        c->perm[j] = t;
      }
    snprintf(c->layout, sizeof c->layout, "rank %d", c->ndim);
  }
  /* The source: compact in its own order (sh), its rows padded now and
   * then (row pitches off lines), now and then a dim reversed or
   * broadcast. */
  int64_t acc = 1;
  int64_t src_st[MAXD];
  for (int i = c->ndim - 1; i >= 0; i--) {
    src_st[i] = acc;
    acc *= sh[i];
    if (i == c->ndim - 1 && chance(g, 35)) acc += between(g, 1, 70); /* pitch */
  }
  if (c->ndim > 1 && chance(g, 8)) src_st[between(g, 0, c->ndim - 1)] *= -1;
  if (c->ndim > 1 && chance(g, 5)) src_st[between(g, 0, c->ndim - 1)] = 0; /* broadcast */
  /* The call: opts.permute over the source, or the source handed over
   * already reordered (a view of it in the result's order). */
  c->permute = chance(g, 50);
  for (int i = 0; i < c->ndim; i++) {
    if (c->permute) {
      c->shape[i] = sh[i];
      c->st[i] = src_st[i];
    } else {
      c->shape[i] = sh[c->perm[i]];
      c->st[i] = src_st[c->perm[i]];
    }
  }
  /* Maps: affine or per channel on casts into floats and from them. */
  const bool mappable = c->from != C64 && c->from != C128;
  const int roll = (int)between(g, 0, 9);
  if (mappable && c->from != c->to && roll < 3) {
    c->map = 1;
    static const double scales[] = {1.0 / 255, 255, 0.5, -3.25, 1.0 / 3};
    c->scale = scales[between(g, 0, 4)];
    c->offset = chance(g, 50) ? 0 : (double)between(g, -40, 40) / 8;
  } else if (mappable && roll < 5) {
    c->map = 2;
    /* the channel axis: a short one where there is one */
    int a = 0;
    for (int i = 0; i < c->ndim; i++)
      if (c->permute ? sh[i] <= 8 : c->shape[i] <= 8) a = i;
    c->axis = a;
    const int64_t chn = c->permute ? sh[a] : c->shape[a];
    if (chn > 8) c->map = 0;
    for (int i = 0; i < 8; i++) {
      c->cs[i] = 1.0 / (255.0 * (0.2 + 0.05 * i));
      c->co[i] = -(0.4 + 0.01 * i) / (0.2 + 0.05 * i);
    }
  }
  /* 0 (the library's default, which AB_NUM_THREADS sets) half the time */
  static const uint32_t threads[] = {0, 0, 0, 0, 0, 1, 1, 2, 3, 7};
  c->threads = threads[between(g, 0, 9)];
  /* into a caller's buffer: on a line, or off lines by whole elements, or
   * by any byte count (elements off their natural alignment) */
  c->back = chance(g, 40);
  c->into = chance(g, 35);
  if (c->into) {
    const int64_t r = between(g, 0, 2);
    c->dst_off = r == 0 ? 64 : r == 1 ? 64 + between(g, 1, 15) * (int64_t)es_out : 64 + between(g, 1, 63);
  }
}

static int64_t numel(const kase *c) {
  int64_t e = 1;
  for (int i = 0; i < c->ndim; i++) e *= c->shape[i];
  return e;
}

/* Source values: mostly small numbers on quarters (ties for the rounding),
 * some random bits (NaNs, infinities, saturation), some specials. */
static void fill(rng *g, enum kind k, char *p, size_t bytes) {
  const size_t es = K[k].size;
  for (size_t off = 0; off + es <= bytes; off += es) {
    const uint64_t r = next(g);
    if (!K[k].is_float || r % 10 < 2) { /* random bits, 8 at a time */
      for (size_t b = 0; b < es; b += 8) {
        const uint64_t bits = b ? next(g) : r;
        memcpy(p + off + b, &bits, es - b < 8 ? es - b : 8);
      }
      continue;
    }
    double v;
    if (r % 10 < 9) v = (double)((int64_t)((r >> 16) % 4801) - 2400) / 4.0;
    else {
      static const double sp[] = {0.0, -0.0, 65504.0, 65520.0, 1e30, -1e30, 3.4e38, 0.5, 1.5, 2.5, -2.5, 255.5, 1e-6};
      v = sp[(r >> 8) % (sizeof sp / sizeof sp[0])];
    }
    if (k == F64) memcpy(p + off, &v, 8);
    else if (k == F32) {
      float f = (float)v;
      memcpy(p + off, &f, 4);
    } else if (k == F16) {
      uint16_t h = double_to_half(v);
      memcpy(p + off, &h, 2);
    } else {
      uint16_t b = f32_to_bf16((float)v);
      memcpy(p + off, &b, 2);
    }
  }
}

/* The NaN an unmapped float -> float cast gives for a NaN at sp
 * (docs/guide.md), on the host and in a device's kernels alike: quiet,
 * its sign kept, and as much of its payload as the result holds (the top
 * bits where it narrows). False for a pair those words do not cover. */
static bool expected_nan(enum kind from, enum kind to, const char *sp, char *want) {
  uint64_t sign, out;
  const uint64_t src = get_low(sp, K[from].size);
  if (from == F16 || from == BF16) {
    sign = src >> 15;
    const int mbits = from == F16 ? 10 : 7;
    const uint64_t m = src & ((1u << mbits) - 1);
    if (to == F32) out = sign << 31 | 0x7fc00000u | m << (23 - mbits);
    else if (to == F64) out = sign << 63 | 0x7ff8000000000000ull | m << (52 - mbits);
    else return false;
  } else if (from == F32) {
    sign = src >> 31;
    const uint64_t m = src & 0x7fffff;
    if (to == F16) out = sign << 15 | 0x7e00 | m >> 13;
    else if (to == BF16) out = src >> 16 | 0x40;
    else if (to == F64) out = sign << 63 | 0x7ff8000000000000ull | m << 29;
    else return false;
  } else if (from == F64) {
    sign = src >> 63;
    const uint64_t m = src & 0xfffffffffffffull;
    if (to == F32) out = sign << 31 | 0x7fc00000u | m >> 29;
    else if (to == F16) out = sign << 15 | 0x7e00 | m >> 42;
    else if (to == BF16) out = sign << 15 | 0x7fc0 | m >> 45;
    else return false;
  } else {
    return false;
  }
  put_low(want, out, K[to].size);
  return true;
}

static bool is_nan_at(enum kind k, const char *p) {
  value v;
  switch (k) {
  case F16: case BF16: case F32: case F64: v = load(k, p); return isnan(v.f);
  default: return false;
  }
}

/* Runs case c; returns true when the result matches. */
static uint64_t checksum(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
  return h;
}

/* What target's plans say where it converts ("convert on opencl:1");
 * whether this case's conversion ran there (its plan, ab_explain_convert),
 * and how many cases' did. */
static char convert_there[64];
static bool device_converted;
static int on_device;

/* Through `target`: the source converted there and brought back as it is,
 * or (c->back) taken there as it is and converted on the way back. */
static ab_status through_device(const DLTensor *t, const kase *c, const ab_convert_opts *o,
                                DLManagedTensorVersioned **r) {
  ab_convert_opts plain = AB_CONVERT_OPTS_INIT;
  plain.copy = AB_COPY_ALWAYS;
  DLManagedTensorVersioned *there = NULL;
  char plan[2048];
  device_converted = false;
  if (!c->back && ab_explain_convert(t, target, o, plan, sizeof plan) == AB_OK)
    device_converted = strstr(plan, convert_there) != NULL;
  ab_status st = ab_convert_memory(t, target, c->back ? &plain : o, &there);
  if (st != AB_OK) return st;
  if (c->back && ab_explain_convert(&there->dl_tensor, (DLDevice){kDLCPU, 0}, o, plan, sizeof plan) == AB_OK)
    device_converted = strstr(plan, convert_there) != NULL;
  st = ab_convert_memory(&there->dl_tensor, (DLDevice){kDLCPU, 0}, c->back ? o : &plain, r);
  there->deleter(there);
  on_device += st == AB_OK && device_converted && !(c->from == c->to && c->map == 0);
  return st;
}

static bool run(rng *g, kase *c, char *why, size_t why_size) {
  const size_t es_in = K[c->from].size, es_out = K[c->to].size;
  /* the source's extent */
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < c->ndim; i++) {
    const int64_t span = (c->shape[i] - 1) * c->st[i];
    if (span < 0) lo += span;
    else hi += span;
  }
  const int64_t off_el = between(g, 0, 2) == 0 ? 0 : between(g, 0, 70); /* elements before the first */
  const size_t src_bytes = (size_t)(hi - lo + 1 + off_el) * es_in;
  char *buf = aligned_alloc(64, (src_bytes + 63) / 64 * 64);
  if (buf == NULL) {
    snprintf(why, why_size, "out of memory for the source");
    return false;
  }
  fill(g, c->from, buf, src_bytes);
  const uint64_t src_sum = checksum(buf, src_bytes);
  DLTensor t = {buf, {kDLCPU, 0}, c->ndim, K[c->from].dt, c->shape, c->st, (uint64_t)(off_el - lo) * es_in};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = c->from == c->to && c->map == 0 ? (DLDataType){0, 0, 0} : K[c->to].dt;
  if (c->permute) o.permute = c->perm;
  if (c->map == 1) {
    o.flags |= AB_CONVERT_AFFINE;
    o.scale = c->scale;
    o.offset = c->offset;
  } else if (c->map == 2) {
    o.flags |= AB_CONVERT_PER_CHANNEL;
    o.channel_axis = c->axis;
    o.channel_scale = c->cs;
    o.channel_offset = c->co;
  }
  o.threads = c->threads;
  o.copy = AB_COPY_ALWAYS;
  /* the result: compact in the result's order */
  int64_t rshape[MAXD], rst[MAXD]; /* result dim i: source (as passed) dim */
  for (int i = 0; i < c->ndim; i++) {
    const int d = c->permute ? c->perm[i] : i;
    rshape[i] = c->shape[d];
    rst[i] = c->st[d];
  }
  const int64_t total = numel(c);
  const size_t out_bytes = (size_t)total * es_out;
  DLManagedTensorVersioned *r = NULL;
  /* into: dst_off bytes of canary (64 or more), the result, AFTER more */
  char *dbuf = NULL;
  const size_t AFTER = 128, dbuf_bytes = c->into ? (size_t)c->dst_off + out_bytes + AFTER : 0;
  const char *out;
  if (target.device_type != kDLCPU) {
    if (through_device(&t, c, &o, &r) != AB_OK) {
      snprintf(why, why_size, "through %s: %s", getenv("SOAK_DEVICE"), ab_last_error());
      free(buf);
      return false;
    }
    out = (const char *)r->dl_tensor.data + r->dl_tensor.byte_offset;
  } else if (c->into) {
    dbuf = aligned_alloc(64, (dbuf_bytes + 63) / 64 * 64);
    if (dbuf == NULL) {
      snprintf(why, why_size, "out of memory for the result");
      free(buf);
      return false;
    }
    memset(dbuf, 0xa5, dbuf_bytes);
    DLTensor dst = {dbuf, {kDLCPU, 0}, c->ndim, K[c->to].dt, rshape, NULL, (uint64_t)c->dst_off};
    if (ab_convert_into(&t, &dst, &o) != AB_OK) {
      snprintf(why, why_size, "ab_convert_into: %s", ab_last_error());
      free(dbuf);
      free(buf);
      return false;
    }
    out = dbuf + c->dst_off;
  } else {
    if (ab_convert_memory(&t, (DLDevice){kDLCPU, 0}, &o, &r) != AB_OK) {
      snprintf(why, why_size, "ab_convert_memory: %s", ab_last_error());
      free(buf);
      return false;
    }
    out = (const char *)r->dl_tensor.data + r->dl_tensor.byte_offset;
  }
  bool ok = true;
  if (r != NULL) {
    ok = r->dl_tensor.ndim == c->ndim && r->dl_tensor.dtype.code == K[c->to].dt.code &&
         r->dl_tensor.dtype.bits == K[c->to].dt.bits;
    ok = ok && r->dl_tensor.device.device_type == kDLCPU && r->dl_tensor.device.device_id == 0;
    for (int i = 0; ok && i < c->ndim; i++) ok = r->dl_tensor.shape[i] == rshape[i];
    /* compact row-major: NULL strides, or the row-major ones (a size-1 dim may have any) */
    for (int64_t i = c->ndim - 1, want = 1; ok && r->dl_tensor.strides != NULL && i >= 0; want *= rshape[i--])
      ok = rshape[i] == 1 || r->dl_tensor.strides[i] == want;
    if (!ok) snprintf(why, why_size, "result device, shape, strides or dtype differs");
  } else { /* nothing written outside the result */
    for (size_t b = 0; ok && b < dbuf_bytes; b++)
      if ((b < (size_t)c->dst_off || b >= (size_t)c->dst_off + out_bytes) && (uint8_t)dbuf[b] != 0xa5) {
        snprintf(why, why_size, "byte %lld of the caller's buffer, outside the result (%lld bytes from %lld), written",
                 (long long)b, (long long)out_bytes, (long long)c->dst_off);
        ok = false;
      }
  }
  const char *first = buf + (off_el - lo) * (int64_t)es_in;
  int64_t idx[MAXD] = {0};
  const int chan_src = c->map == 2 ? c->axis : -1; /* in the source as passed */
  for (int64_t e = 0; ok && e < total; e++) {
    int64_t so = 0, chan = 0;
    for (int i = 0; i < c->ndim; i++) so += idx[i] * rst[i];
    if (chan_src >= 0)
      for (int i = 0; i < c->ndim; i++)
        if ((c->permute ? c->perm[i] : i) == chan_src) chan = idx[i];
    const char *sp = first + so * (int64_t)es_in;
    char want[16];
    const char *got = out + e * (int64_t)es_out;
    if (c->from == c->to && c->map == 0) memcpy(want, sp, es_in);
    else {
      value v = load(c->from, sp);
      if (c->map == 1) v = affine(v, c->scale, c->offset, c->from, c->to);
      else if (c->map == 2) v = affine(v, c->cs[chan], c->co[chan], c->from, c->to);
      store(c->to, want, v);
    }
    /* NaNs: unmapped, the one the rules name (expected_nan rewrites
     * want; where a device's kernels converted, any NaN between float32
     * and float64, which the guide leaves to the device); under a map, or
     * for a pair the rules leave open, any NaN */
    bool any_nan = false;
    if (!(c->from == c->to && c->map == 0) && is_nan_at(c->to, want)) {
      const bool named = c->map == 0 && expected_nan(c->from, c->to, sp, want);
      const bool open_there = device_converted && (c->from == F64 || c->to == F64) && (c->from == F32 || c->to == F32);
      any_nan = (!named || open_there) && is_nan_at(c->to, got);
    }
    if (!any_nan && memcmp(want, got, es_out) != 0) {
      int m = snprintf(why, why_size, "element %lld (at", (long long)e);
      for (int i = 0; i < c->ndim; i++) m += snprintf(why + m, why_size - (size_t)m, " %lld", (long long)idx[i]);
      m += snprintf(why + m, why_size - (size_t)m, "): got");
      for (size_t b = 0; b < es_out; b++) m += snprintf(why + m, why_size - (size_t)m, " %02x", (uint8_t)got[b]);
      m += snprintf(why + m, why_size - (size_t)m, ", want");
      for (size_t b = 0; b < es_out; b++) m += snprintf(why + m, why_size - (size_t)m, " %02x", (uint8_t)want[b]);
      ok = false;
    }
    for (int i = c->ndim - 1; i >= 0; i--) {
      if (++idx[i] < rshape[i]) break;
      idx[i] = 0;
    }
  }
  if (ok && checksum(buf, src_bytes) != src_sum) {
    snprintf(why, why_size, "the source changed");
    ok = false;
  }
  if (r != NULL) r->deleter(r);
  free(dbuf);
  free(buf);
  return ok;
}

static void describe(const kase *c, char *s, size_t n) {
  int m = snprintf(s, n, "%s %s -> %s%s, %s shape (", c->layout, K[c->from].name, K[c->to].name,
                   c->map == 1 ? " affine" : c->map == 2 ? " per channel" : "", c->permute ? "permute" : "reordered view");
  for (int i = 0; i < c->ndim; i++)
    m += snprintf(s + m, n - (size_t)m, "%s%lld:%lld", i ? " " : "", (long long)c->shape[i], (long long)c->st[i]);
  m += snprintf(s + m, n - (size_t)m, ") perm (");
  for (int i = 0; i < c->ndim; i++) m += snprintf(s + m, n - (size_t)m, "%s%d", i ? " " : "", c->perm[i]);
  m += snprintf(s + m, n - (size_t)m, ") threads %u", c->threads);
  if (target.device_type != kDLCPU)
    snprintf(s + m, n - (size_t)m, ", converted on the way %s", c->back ? "back" : "there");
  else if (c->into)
    snprintf(s + m, n - (size_t)m, ", into a buffer at +%lld", (long long)(c->dst_off - 64));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: stress_soak SEED [CASES=40] [MAX_MIB=40] [ONLY_CASE]\n");
    return 2;
  }
  const uint64_t seed = strtoull(argv[1], NULL, 0);
  const int cases = argc > 2 ? atoi(argv[2]) : 40;
  const long long max_mib = argc > 3 ? atoll(argv[3]) : 40;
  const int64_t max_bytes = max_mib >= 1 && max_mib <= 4096 ? (int64_t)max_mib << 20 : 0;
  const int only = argc > 4 ? atoi(argv[4]) : -1;
  const char *dev = getenv("SOAK_DEVICE");
  if (dev != NULL && ab_parse_device(dev, &target) != AB_OK) {
    fprintf(stderr, "stress_soak: SOAK_DEVICE=%s: %s\n", dev, ab_last_error());
    return 2;
  }
  snprintf(convert_there, sizeof convert_there, "convert on %s:%d", ab_device_type_name(target.device_type),
           (int)target.device_id);
  /* A missing device: a skip (77) in a plain ctest, a failure where the
   * tests were told the devices (make test exports AB_TEST_EXPECT_*). */
  if (target.device_type != kDLCPU && ab_device_count(target.device_type) <= target.device_id) {
    const char *expect = getenv(target.device_type == kDLOpenCL ? "AB_TEST_EXPECT_OPENCL" : "AB_TEST_EXPECT_CUDA");
    const bool told = expect != NULL && atoi(expect) > 0;
    printf("stress_soak: %s: no such device (%d %s devices)%s\n", dev, (int)ab_device_count(target.device_type),
           ab_device_type_name(target.device_type), told ? ", but the tests were told it exists" : ": SKIP");
    return told ? 1 : 77;
  }
  if (cases < 1 || max_bytes < 4096) {
    fprintf(stderr, "stress_soak: CASES must be >= 1 and MAX_MIB 1..4096\n");
    return 2;
  }
  int failed = 0, ran = 0;
  for (int k = only >= 0 ? only : 0; k < (only >= 0 ? only + 1 : cases); k++) {
    rng g = {seed * 0x100000001b3ull + (uint64_t)k};
    kase c;
    draw(&g, &c, max_bytes);
    char why[512] = "", what[400];
    describe(&c, what, sizeof what);
    ran++;
    if (!run(&g, &c, why, sizeof why)) {
      failed++;
      printf("FAIL seed %llu case %d: %s: %s\n", (unsigned long long)seed, k, what, why);
      fflush(stdout);
    } else if (getenv("SOAK_VERBOSE")) {
      printf("ok   case %d: %s%s\n", k, what, device_converted ? " (converted on the device)" : "");
    }
  }
  printf("stress_soak seed %llu: %d cases, %d failed", (unsigned long long)seed, ran, failed);
  if (target.device_type != kDLCPU) printf(", %d converted on %s", on_device, dev);
  printf("\n");
  /* SOAK_EXPECT_ON_DEVICE=1: a run where the device converted nothing
   * checked its transfers only, and fails */
  const char *expect_on = getenv("SOAK_EXPECT_ON_DEVICE");
  if (expect_on != NULL && atoi(expect_on) > 0 && on_device == 0) {
    printf("stress_soak: no case was converted on %s\n", dev ? dev : "the host");
    failed++;
  }
  ab_shutdown();
  return failed ? 1 : 0;
}
