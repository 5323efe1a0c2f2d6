/* Host element conversion (see convert.h for the rules). One pass over
 * the source in the destination's row-major order; the element loop is
 * chosen once per call from the (source, result) pair. */
#include <string.h>

#include "arraybridge/arraybridge.h"
#include "convert.h"
#include "gather.h"
#include "rounding.h"
#include "src/element.h"
#include "src/internal.h"

/* ---- float16 and bfloat16 ------------------------------------------------ */

uint16_t ab__half_from_double(double x) { return ab__narrow_from_double(x, 10, 15, 31); }
uint16_t ab__half_from_float(float x) { return ab__narrow_from_float(x, 10, 15, 31); }
double ab__half_to_double(uint16_t h) { return ab__widen_to_double(h, 10, 15, 31); }
uint16_t ab__bf16_from_double(double x) { return ab__narrow_from_double(x, 7, 127, 255); }
uint16_t ab__bf16_from_float(float x) { return ab__narrow_from_float(x, 7, 127, 255); }
double ab__bf16_to_double(uint16_t h) { return ab__widen_to_double(h, 7, 127, 255); }

/* ---- element access ------------------------------------------------------------- */

/* The kinds the loops are specialised on. */
enum kind { K_BOOL, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_F16, K_BF16, K_F32, K_F64, K_C64, K_C128,
            K_NONE };

static enum kind kind_of(DLDataType t) {
  if (t.lanes != 1) return K_NONE;
  switch (t.code) {
  case kDLBool: return t.bits == 8 ? K_BOOL : K_NONE;
  case kDLInt: return t.bits == 8 ? K_I8 : t.bits == 16 ? K_I16 : t.bits == 32 ? K_I32 : t.bits == 64 ? K_I64 : K_NONE;
  case kDLUInt: return t.bits == 8 ? K_U8 : t.bits == 16 ? K_U16 : t.bits == 32 ? K_U32 : t.bits == 64 ? K_U64 : K_NONE;
  case kDLFloat: return t.bits == 16 ? K_F16 : t.bits == 32 ? K_F32 : t.bits == 64 ? K_F64 : K_NONE;
  case kDLBfloat: return t.bits == 16 ? K_BF16 : K_NONE;
  case kDLComplex: return t.bits == 64 ? K_C64 : t.bits == 128 ? K_C128 : K_NONE;
  default: return K_NONE;
  }
}

static bool is_int(enum kind k) { return k >= K_I8 && k <= K_U64; }
static bool is_complex(enum kind k) { return k == K_C64 || k == K_C128; }

/* Unaligned loads and stores of each width. */
#define DEFINE_RW(T, name)                                                      \
  static inline T rd_##name(const char *p) { T v; memcpy(&v, p, sizeof v); return v; } \
  static inline void wr_##name(char *p, T v) { memcpy(p, &v, sizeof v); }
DEFINE_RW(int16_t, i16)
DEFINE_RW(int32_t, i32)
DEFINE_RW(int64_t, i64)
DEFINE_RW(uint16_t, u16)
DEFINE_RW(uint32_t, u32)
DEFINE_RW(uint64_t, u64)
DEFINE_RW(float, f32)
DEFINE_RW(double, f64)

static double load_d(enum kind k, const char *p) {
  switch (k) {
  case K_BOOL: return *(const uint8_t *)p != 0;
  case K_I8: return *(const int8_t *)p;
  case K_I16: return rd_i16(p);
  case K_I32: return rd_i32(p);
  case K_I64: return (double)rd_i64(p);
  case K_U8: return *(const uint8_t *)p;
  case K_U16: return rd_u16(p);
  case K_U32: return rd_u32(p);
  case K_U64: return (double)rd_u64(p);
  case K_F16: return ab__half_to_double(rd_u16(p));
  case K_BF16: return ab__bf16_to_double(rd_u16(p));
  case K_F32: return rd_f32(p);
  default: return rd_f64(p);
  }
}


static void store_d(enum kind k, char *p, double v) {
  switch (k) {
  case K_BOOL: *(uint8_t *)p = v != 0; break; /* NaN != 0 */
  case K_I8: *(int8_t *)p = (int8_t)ab__to_signed(v, 8); break;
  case K_I16: wr_i16(p, (int16_t)ab__to_signed(v, 16)); break;
  case K_I32: wr_i32(p, (int32_t)ab__to_signed(v, 32)); break;
  case K_I64: wr_i64(p, ab__to_signed(v, 64)); break;
  case K_U8: *(uint8_t *)p = (uint8_t)ab__to_unsigned(v, 8); break;
  case K_U16: wr_u16(p, (uint16_t)ab__to_unsigned(v, 16)); break;
  case K_U32: wr_u32(p, (uint32_t)ab__to_unsigned(v, 32)); break;
  case K_U64: wr_u64(p, ab__to_unsigned(v, 64)); break;
  case K_F16: wr_u16(p, ab__half_from_double(v)); break;
  case K_BF16: wr_u16(p, ab__bf16_from_double(v)); break;
  case K_F32: wr_f32(p, (float)v); break;
  default: wr_f64(p, v); break;
  }
}

/* float32 arithmetic: sources exact in float, results of at most 32 bits. */
static float load_f(enum kind k, const char *p) {
  switch (k) {
  case K_F32: return rd_f32(p);
  case K_U8: return *(const uint8_t *)p;
  case K_I8: return *(const int8_t *)p;
  case K_U16: return rd_u16(p);
  case K_I16: return rd_i16(p);
  case K_BOOL: return *(const uint8_t *)p != 0;
  default: return (float)load_d(k, p); /* f16, bf16: exact in float */
  }
}

static void store_f(enum kind k, char *p, float v) {
  switch (k) {
  case K_F32: wr_f32(p, v); break;
  case K_F16: wr_u16(p, ab__half_from_float(v)); break;
  default: wr_u16(p, ab__bf16_from_float(v)); break;
  }
}

/* Integers exactly (no affine): every int64 and uint64 value, held as
 * the one or the other by its sign, so no wider type is needed (32-bit
 * targets have no __int128). */
struct ival {
  bool neg;   /* the value is s, below zero; else u */
  int64_t s;
  uint64_t u;
};

static struct ival ival_signed(int64_t v) {
  return v < 0 ? (struct ival){true, v, 0} : (struct ival){false, 0, (uint64_t)v};
}

static struct ival load_i(enum kind k, const char *p) {
  switch (k) {
  case K_BOOL: return ival_signed(*(const uint8_t *)p != 0);
  case K_I8: return ival_signed(*(const int8_t *)p);
  case K_I16: return ival_signed(rd_i16(p));
  case K_I32: return ival_signed(rd_i32(p));
  case K_I64: return ival_signed(rd_i64(p));
  case K_U8: return ival_signed(*(const uint8_t *)p);
  case K_U16: return ival_signed(rd_u16(p));
  case K_U32: return ival_signed(rd_u32(p));
  default: return (struct ival){false, 0, rd_u64(p)};
  }
}

/* v saturated to [lo, hi] (lo <= 0 <= hi), and to [0, hi]. */
static int64_t clamp_s(struct ival v, int64_t lo, int64_t hi) {
  if (v.neg) return v.s < lo ? lo : v.s;
  return v.u > (uint64_t)hi ? hi : (int64_t)v.u;
}
static uint64_t clamp_u(struct ival v, uint64_t hi) { return v.neg ? 0 : v.u > hi ? hi : v.u; }

static void store_i(enum kind k, char *p, struct ival v) {
  switch (k) {
  case K_BOOL: *(uint8_t *)p = v.neg || v.u != 0; break;
  case K_I8: *(int8_t *)p = (int8_t)clamp_s(v, INT8_MIN, INT8_MAX); break;
  case K_I16: wr_i16(p, (int16_t)clamp_s(v, INT16_MIN, INT16_MAX)); break;
  case K_I32: wr_i32(p, (int32_t)clamp_s(v, INT32_MIN, INT32_MAX)); break;
  case K_I64: wr_i64(p, clamp_s(v, INT64_MIN, INT64_MAX)); break;
  case K_U8: *(uint8_t *)p = (uint8_t)clamp_u(v, UINT8_MAX); break;
  case K_U16: wr_u16(p, (uint16_t)clamp_u(v, UINT16_MAX)); break;
  case K_U32: wr_u32(p, (uint32_t)clamp_u(v, UINT32_MAX)); break;
  default: wr_u64(p, clamp_u(v, UINT64_MAX)); break;
  }
}

/* ---- which arithmetic ------------------------------------------------------------ */

static ab__arith arith_of(enum kind from, enum kind to, bool affine) {
  if (is_complex(from)) return AB_ARITH_COMPLEX;
  if (!affine && (is_int(from) || from == K_BOOL) && (is_int(to) || to == K_BOOL)) return AB_ARITH_INT;
  const bool narrow_result = to == K_F32 || to == K_F16 || to == K_BF16;
  const bool wide_source = from == K_F64 || from == K_I32 || from == K_I64 || from == K_U32 || from == K_U64;
  return narrow_result && !wide_source ? AB_ARITH_FLOAT32 : AB_ARITH_FLOAT64;
}

bool ab__cast_supported(DLDataType from, DLDataType to, bool affine) {
  if (from.code == to.code && from.bits == to.bits && from.lanes == to.lanes && !affine) return true;
  enum kind f = kind_of(from), t = kind_of(to);
  if (f == K_NONE || t == K_NONE) return false;
  if (is_complex(f) || is_complex(t)) return is_complex(f) && is_complex(t) && !affine;
  return true;
}

ab__arith ab__cast_arith(DLDataType from, DLDataType to, bool affine) {
  if (!ab__cast_supported(from, to, affine)) return AB_ARITH_NONE;
  const enum kind f = kind_of(from), t = kind_of(to);
  if (f == K_NONE || t == K_NONE) return AB_ARITH_NONE; /* an identical exotic dtype: a copy, no arithmetic */
  return arith_of(f, t, affine);
}

/* ---- the loops ------------------------------------------------------------------------- */

/* A loop over a contiguous row of one (source, result) pair: see fast_row. */
typedef void (*fast_row_fn)(char *d, const char *s, int64_t n, ab__arith path, bool affine, double a, double b);

struct row_ctx {
  enum kind from, to;
  ab__arith path;
  size_t out_size;
  bool affine;
  bool odd; /* a 64-bit integer into float32, float16 or bfloat16, no map: rounded once (load_odd) */
  size_t in_size;
  fast_row_fn fast; /* contiguous rows of this pair, or NULL */
  bool f16;         /* float16 on a side: fast is the float32 loop, run through fast_f16_row */
  bool f16c;        /* ... which widens and narrows float16 through F16C (else the bits: f16_to_f32_bits), */
  void (*widen16)(char *d, const char *s, int64_t n);  /* ... by these: n float16 at s as float32 at d */
  void (*narrow16)(char *d, const char *s, int64_t n); /* and n float32 at s as float16 at d */
  bool stream;      /* the fast loops' rows go out with streaming stores (ab__host_cast_streams) */
  bool prefetch;    /* long rows run in prefetched pieces (fast_run; not into float16) */
  bool *streamed;   /* set where a row went out streamed (for ab__host_cast_streamed_calls) */
};

/* A 64-bit integer source for one rounding into a narrower float (see
 * ab__u64_to_double_odd); other kinds as load_d. */
static double load_odd(enum kind k, const char *p) {
  if (k == K_I64) return ab__i64_to_double_odd(rd_i64(p));
  if (k == K_U64) return ab__u64_to_double_odd(rd_u64(p));
  return load_d(k, p);
}

#if defined(__i386__) && !defined(__SSE2_MATH__)
#error "32-bit x86 needs float arithmetic in SSE2 (-msse2 -mfpmath=sse, which CMakeLists.txt adds): the x87's wider registers change float32 and float64 results"
#endif

/* The AVX2 and AVX-512 cast loops and the SSSE3 image loop: x86-64 only,
 * as the tiles of gather.c (whose level, which picks them, is SSE2's
 * elsewhere). */
#ifdef __x86_64__
#define HAVE_X86_64 1
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1 /* F16C's float16 loops, on 32-bit x86 too */

/* float32 -> float16, eight at a time with F16C's VCVTPS2PH: round to
 * nearest even, tiny results to subnormals ("MXCSR.FTZ is ignored"),
 * overflow to infinity, NaNs quiet with their top payload bits: the scalar
 * loop's results bit for bit. Returns how many elements it did. */
__attribute__((target("avx,f16c"))) static int64_t f32_to_f16_f16c(char *d, const char *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps((const float *)(const void *)(s + 4 * i));
    _mm_storeu_si128((__m128i *)(void *)(d + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}

/* CPUID leaf 1: ECX bit 29 (clang's __builtin_cpu_supports does not know
 * "f16c"). */
static bool cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}

/* Whether the F16C loop runs: the CPU has it and AB_HOST_F16C is not 0
 * (the tests force both ways). */
static int f16c_here(int wanted) { return wanted && __builtin_cpu_supports("avx") && cpu_has_f16c(); }
static bool use_f16c(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice modes[] = {{"1", 1}, {"auto", 1}, {"0", 0}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_F16C", modes, 1, "1, 0 or auto", f16c_here) != 0;
}
#endif

bool ab__host_f16c(void) {
#ifdef HAVE_X86
  return use_f16c();
#else
  return false;
#endif
}

/* ---- contiguous rows of the common pairs ------------------------------------------
 * The loops below, one per (source, result) pair of int8, uint8, int16,
 * uint16, int32, uint32, float32 and float64 sources and int8, uint8,
 * int16, uint16, int32, float32 and float64 results (and bfloat16, and
 * float16 where F16C runs, either side), with the rules of the element loop
 * spelled so that the compiler vectorizes them (this file is built at
 * -O3): typed pointers instead of a switch per element, and a float into
 * an integer clamped first (NaN to 0) and then rounded half to even by
 * adding and subtracting 1.5 * 2^52 (exact below 2^51, and a clamped value
 * is below 2^32), which gives what rounding then saturating gives. Each
 * loop holds only the arithmetic its pair can take (ab__cast_arith).
 * Only where the source is contiguous and the map the same along the
 * row; the tests hold every pair to the element loop's reference on edge
 * values (NaN included: a float16 or bfloat16 NaN source gives the
 * element loop's NaN, quiet with its sign and payload). */

/* bfloat16 as its bits, for the loops' type names. */
typedef uint16_t bf16_bits;

/* The result of a value in T's arithmetic (F: float32 or float64), by the
 * element loop's rules: floats as a C cast, integers of LO..HI clamped,
 * rounded half to even, NaN 0. */
static inline double fast_clamp_round(double v, double lo, double hi) {
  if (lo < 0) v = v == v ? v : 0.0; /* unsigned results: the clamp below makes NaN lo, 0 */
  v = v > lo ? v : lo; /* as written, x86's max and min, NaN included: one instruction each */
  v = v < hi ? v : hi;
  const double t = v + 6755399441055744.0; /* assigned: rounded to double even where sums keep more (x87) */
  return t - 6755399441055744.0;
}
static inline uint32_t fast_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}
static inline float fast_float(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}
/* bfloat16 <-> float32: the top half of the bits; rounded to nearest even
 * going down (carries into the exponent overflow to infinity, as they
 * should), a NaN quiet with its top payload bits (ab__narrow_from_double). */
static inline float fast_from_bf16(uint16_t h) {
  const uint32_t b = (uint32_t)h << 16; /* a NaN quiet, sign and payload kept: the element loop's */
  return fast_float((h & 0x7fff) > 0x7f80 ? b | 0x00400000u : b);
}
static inline uint16_t fast_to_bf16(float f) {
  const uint32_t b = fast_bits(f);
  const uint16_t nan = (uint16_t)((b >> 16) | 0x40), r = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
  return f != f ? nan : r;
}

/* Source values as float (the float32 arithmetic) and as double. */
#define FAST_LOAD_F(F, v) FAST_LOAD_F_##F(v)
#define FAST_LOAD_F_int8_t(v) ((float)(v))
#define FAST_LOAD_F_uint8_t(v) ((float)(v))
#define FAST_LOAD_F_int16_t(v) ((float)(v))
#define FAST_LOAD_F_uint16_t(v) ((float)(v))
#define FAST_LOAD_F_int32_t(v) ((float)(v))
#define FAST_LOAD_F_uint32_t(v) ((float)(v))
#define FAST_LOAD_F_float(v) ((float)(v))
#define FAST_LOAD_F_double(v) ((float)(v))
#define FAST_LOAD_F_bf16_bits(v) fast_from_bf16(v)
/* (float)x of an int32, uint32 or float64 would round: those load as double */
#define FAST_LOAD_DBL(F, v) FAST_LOAD_DBL_##F(v)
#define FAST_LOAD_DBL_int8_t(v) ((double)(v))
#define FAST_LOAD_DBL_uint8_t(v) ((double)(v))
#define FAST_LOAD_DBL_int16_t(v) ((double)(v))
#define FAST_LOAD_DBL_uint16_t(v) ((double)(v))
#define FAST_LOAD_DBL_int32_t(v) ((double)(v))
#define FAST_LOAD_DBL_uint32_t(v) ((double)(v))
#define FAST_LOAD_DBL_float(v) ((double)(v))
#define FAST_LOAD_DBL_double(v) ((double)(v))
#define FAST_LOAD_DBL_bf16_bits(v) ((double)fast_from_bf16(v))

/* Results from float32 arithmetic (F32) or float64 (F64) or, integers
 * without a map, from the integer (INT). */
#define FAST_STORE_float(v) ((float)(v))
#define FAST_STORE_double(v) ((double)(v))
#define FAST_STORE_bf16_bits(v) fast_to_bf16(v)
#define FAST_STORE_int8_t(v) ((int8_t)(int32_t)fast_clamp_round((double)(v), -128.0, 127.0))
#define FAST_STORE_uint8_t(v) ((uint8_t)(int32_t)fast_clamp_round((double)(v), 0.0, 255.0))
#define FAST_STORE_int16_t(v) ((int16_t)(int32_t)fast_clamp_round((double)(v), -32768.0, 32767.0))
#define FAST_STORE_uint16_t(v) ((uint16_t)(int32_t)fast_clamp_round((double)(v), 0.0, 65535.0))
#define FAST_STORE_int32_t(v) ((int32_t)fast_clamp_round((double)(v), -2147483648.0, 2147483647.0))
#define FAST_CLAMP_int8_t(x) ((int8_t)((int64_t)(x) < -128 ? -128 : (int64_t)(x) > 127 ? 127 : (int64_t)(x)))
#define FAST_CLAMP_uint8_t(x) ((uint8_t)((int64_t)(x) < 0 ? 0 : (int64_t)(x) > 255 ? 255 : (int64_t)(x)))
#define FAST_CLAMP_int16_t(x) ((int16_t)((int64_t)(x) < -32768 ? -32768 : (int64_t)(x) > 32767 ? 32767 : (int64_t)(x)))
#define FAST_CLAMP_uint16_t(x) ((uint16_t)((int64_t)(x) < 0 ? 0 : (int64_t)(x) > 65535 ? 65535 : (int64_t)(x)))
#define FAST_CLAMP_int32_t(x)                                                                                 \
  ((int32_t)((int64_t)(x) < INT32_MIN ? INT32_MIN : (int64_t)(x) > INT32_MAX ? INT32_MAX : (int64_t)(x)))
#define FAST_CLAMP_float(x) 0 /* the traits below keep these out */
#define FAST_CLAMP_double(x) 0
#define FAST_CLAMP_bf16_bits(x) 0

/* Traits, as ab__cast_arith has them: integers; sources that float32
 * arithmetic takes; float32, float16 and bfloat16 results; half results
 * (never from float64 arithmetic: one rounding from the double). */
#define FAST_INT_int8_t 1
#define FAST_INT_uint8_t 1
#define FAST_INT_int16_t 1
#define FAST_INT_uint16_t 1
#define FAST_INT_int32_t 1
#define FAST_INT_uint32_t 1
#define FAST_INT_float 0
#define FAST_INT_double 0
#define FAST_INT_bf16_bits 0
#define FAST_NARROW_int8_t 1
#define FAST_NARROW_uint8_t 1
#define FAST_NARROW_int16_t 1
#define FAST_NARROW_uint16_t 1
#define FAST_NARROW_int32_t 0
#define FAST_NARROW_uint32_t 0
#define FAST_NARROW_float 1
#define FAST_NARROW_double 0
#define FAST_NARROW_bf16_bits 1
#define FAST_FLOATRES_int8_t 0
#define FAST_FLOATRES_uint8_t 0
#define FAST_FLOATRES_int16_t 0
#define FAST_FLOATRES_uint16_t 0
#define FAST_FLOATRES_int32_t 0
#define FAST_FLOATRES_float 1
#define FAST_FLOATRES_double 0
#define FAST_FLOATRES_bf16_bits 1
#define FAST_HALF_int8_t 0
#define FAST_HALF_uint8_t 0
#define FAST_HALF_int16_t 0
#define FAST_HALF_uint16_t 0
#define FAST_HALF_int32_t 0
#define FAST_HALF_float 0
#define FAST_HALF_double 0
#define FAST_HALF_bf16_bits 1

#define DEFINE_FAST_ROW(ATTR, SET, F, T)                                                                   \
  ATTR static void fast_##SET##_##F##_##T(char *d, const char *s, int64_t n, ab__arith path, bool affine,    \
                                          double a, double b) {                                             \
    typedef F src_t __attribute__((aligned(1), may_alias));                                               \
    typedef T dst_t __attribute__((aligned(1), may_alias));                                               \
    const src_t *restrict x = (const src_t *)(const void *)s;                                             \
    dst_t *restrict y = (dst_t *)(void *)d;                                                               \
    if (FAST_INT_##F && FAST_INT_##T && path == AB_ARITH_INT) {                                           \
      for (int64_t i = 0; i < n; i++) y[i] = FAST_CLAMP_##T(x[i]);                                        \
    } else if (FAST_NARROW_##F && FAST_FLOATRES_##T) { /* float32 arithmetic */                           \
      const float fa = (float)a, fb = (float)b;                                                           \
      if (affine)                                                                                         \
        for (int64_t i = 0; i < n; i++) {                                                                 \
          const float m = FAST_LOAD_F(F, x[i]) * fa;                                                      \
          y[i] = FAST_STORE_##T(m + fb);                                                                  \
        }                                                                                                 \
      else                                                                                                \
        for (int64_t i = 0; i < n; i++) y[i] = FAST_STORE_##T(FAST_LOAD_F(F, x[i]));                      \
    } else if (!FAST_HALF_##T) { /* float64 arithmetic */                                                 \
      if (affine)                                                                                         \
        for (int64_t i = 0; i < n; i++) {                                                                 \
          const double m = FAST_LOAD_DBL(F, x[i]) * a;                                                    \
          y[i] = FAST_STORE_##T(m + b);                                                                   \
        }                                                                                                 \
      else                                                                                                \
        for (int64_t i = 0; i < n; i++) y[i] = FAST_STORE_##T(FAST_LOAD_DBL(F, x[i]));                    \
    }                                                                                                     \
  }
#define DEFINE_FAST_FROM(ATTR, SET, F)                                                                         \
  DEFINE_FAST_ROW(ATTR, SET, F, int8_t)                                                                        \
  DEFINE_FAST_ROW(ATTR, SET, F, uint8_t)                                                                       \
  DEFINE_FAST_ROW(ATTR, SET, F, int16_t)                                                                       \
  DEFINE_FAST_ROW(ATTR, SET, F, uint16_t)                                                                      \
  DEFINE_FAST_ROW(ATTR, SET, F, int32_t)                                                                       \
  DEFINE_FAST_ROW(ATTR, SET, F, float)                                                                         \
  DEFINE_FAST_ROW(ATTR, SET, F, double) DEFINE_FAST_ROW(ATTR, SET, F, bf16_bits)
#define FAST_FROM_ROW(SET, F)                                                                                     \
  {fast_##SET##_##F##_int8_t, fast_##SET##_##F##_uint8_t, fast_##SET##_##F##_int16_t, fast_##SET##_##F##_uint16_t, \
   fast_##SET##_##F##_int32_t, fast_##SET##_##F##_float, fast_##SET##_##F##_double, fast_##SET##_##F##_bf16_bits}
/* One instruction set's loops: [source][result] in the orders above. */
#define DEFINE_FAST_SET(ATTR, SET)                                                                             \
  DEFINE_FAST_FROM(ATTR, SET, int8_t)                                                                          \
  DEFINE_FAST_FROM(ATTR, SET, uint8_t)                                                                         \
  DEFINE_FAST_FROM(ATTR, SET, int16_t)                                                                         \
  DEFINE_FAST_FROM(ATTR, SET, uint16_t)                                                                        \
  DEFINE_FAST_FROM(ATTR, SET, int32_t)                                                                         \
  DEFINE_FAST_FROM(ATTR, SET, uint32_t)                                                                        \
  DEFINE_FAST_FROM(ATTR, SET, float)                                                                           \
  DEFINE_FAST_FROM(ATTR, SET, double)                                                                          \
  DEFINE_FAST_FROM(ATTR, SET, bf16_bits)                                                                       \
  static const fast_row_fn fast_##SET[9][8] = {                                                                \
      FAST_FROM_ROW(SET, int8_t),   FAST_FROM_ROW(SET, uint8_t), FAST_FROM_ROW(SET, int16_t),                  \
      FAST_FROM_ROW(SET, uint16_t), FAST_FROM_ROW(SET, int32_t), FAST_FROM_ROW(SET, uint32_t),                 \
      FAST_FROM_ROW(SET, float),    FAST_FROM_ROW(SET, double),  FAST_FROM_ROW(SET, bf16_bits)};
/* Compiled for the baseline, and on x86-64 for AVX2 and AVX-512 (F, BW,
 * VL), whose conversions between doubles and narrow integers take the
 * float-to-integer loops from 1 to 1.5 and 3 billion elements a second
 * (EPYC VM, float32 -> uint8 with a map, 64 MiB, a harness); the widest
 * that the CPU and AB_HOST_TILES allow runs. */
DEFINE_FAST_SET(, base)
#ifdef HAVE_X86_64
DEFINE_FAST_SET(__attribute__((target("avx2"))), avx2)
DEFINE_FAST_SET(__attribute__((target("avx512f,avx512bw,avx512vl"))), avx512)

/* Integer results of float64 arithmetic (int8, uint8, int16, uint16,
 * int32), written out for AVX-512 (and AVX2 below): GCC
 * vectorises the loops above for them, but clamps through mask registers
 * it moves to and from general ones, which took float32 -> uint8 with a
 * map to 2.2 billion elements a second in L1 (1.7 cycles an element,
 * Intel Xeon VM with AVX-512 FP16). Here 16 elements at a time go as two
 * vectors of doubles through the element loop's steps, each one
 * instruction: the multiply, then the add (-ffp-contract=off keeps them
 * two); NaN to 0 where the result is signed (unsigned ones get it from
 * the clamp); the clamp as VMAXPD and VMINPD, which are `v > lo ? v : lo`
 * and `v < hi ? v : hi` exactly, NaN included; VCVTPD2DQ's rounding,
 * which for values clamped into int32 is fast_clamp_round's: both round
 * as MXCSR says, half to even unless the caller changed it; the narrowing
 * by truncation, exact once clamped: 6.0 billion elements a second
 * there. The last 0-15 elements, and rows of the integer path, go to the
 * loop above. */
#define F2I_ATTR __attribute__((target("avx512f,avx512bw,avx512vl")))
#define F2I_X64(p) _mm_loadl_epi64((const __m128i *)(const void *)(p))  /* 8 bytes */
#define F2I_X128(p) _mm_loadu_si128((const __m128i *)(const void *)(p)) /* 16 bytes */
#define F2I_LOAD_int8_t(p) _mm512_cvtepi32_pd(_mm256_cvtepi8_epi32(F2I_X64(p)))
#define F2I_LOAD_uint8_t(p) _mm512_cvtepi32_pd(_mm256_cvtepu8_epi32(F2I_X64(p)))
#define F2I_LOAD_int16_t(p) _mm512_cvtepi32_pd(_mm256_cvtepi16_epi32(F2I_X128(p)))
#define F2I_LOAD_uint16_t(p) _mm512_cvtepi32_pd(_mm256_cvtepu16_epi32(F2I_X128(p)))
#define F2I_LOAD_int32_t(p) _mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define F2I_LOAD_uint32_t(p) _mm512_cvtepu32_pd(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define F2I_LOAD_float(p) _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)(p)))
#define F2I_LOAD_double(p) _mm512_loadu_pd((const void *)(p))
/* a bfloat16 NaN stays a NaN (its payload does not matter: it becomes 0) */
#define F2I_LOAD_bf16_bits(p)                                                                                          \
  _mm512_cvtps_pd(_mm256_castsi256_ps(                                                                                 \
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(F2I_X128(p)), 16)))
#define F2I_STORE_int8_t(p, v) _mm_storeu_si128((__m128i *)(void *)(p), _mm512_cvtepi32_epi8(v))
#define F2I_STORE_uint8_t(p, v) _mm_storeu_si128((__m128i *)(void *)(p), _mm512_cvtepi32_epi8(v))
#define F2I_STORE_int16_t(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), _mm512_cvtepi32_epi16(v))
#define F2I_STORE_uint16_t(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), _mm512_cvtepi32_epi16(v))
#define F2I_STORE_int32_t(p, v) _mm512_storeu_si512((void *)(p), v)
#define F2I_LO_int8_t (-128.0)
#define F2I_LO_uint8_t 0.0
#define F2I_LO_int16_t (-32768.0)
#define F2I_LO_uint16_t 0.0
#define F2I_LO_int32_t (-2147483648.0)
#define F2I_HI_int8_t 127.0
#define F2I_HI_uint8_t 255.0
#define F2I_HI_int16_t 32767.0
#define F2I_HI_uint16_t 65535.0
#define F2I_HI_int32_t 2147483647.0

/* Eight values of the map, clamped into [lo, hi], as int32. */
F2I_ATTR static inline __m256i f2i_eight(__m512d v, bool affine, bool is_signed, __m512d a, __m512d b, __m512d lo,
                                        __m512d hi) {
  if (affine) v = _mm512_add_pd(_mm512_mul_pd(v, a), b);
  if (is_signed) v = _mm512_mask_mov_pd(v, _mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q), _mm512_setzero_pd()); /* NaN to 0 */
  v = _mm512_min_pd(_mm512_max_pd(v, lo), hi);
  return _mm512_cvtpd_epi32(v);
}

#define DEFINE_F2I_ROW_avx512(F, T)                                                                                 \
  F2I_ATTR static void f2i_avx512_##F##_##T(char *d, const char *s, int64_t n, ab__arith path, bool affine,       \
                                            double a, double b) {                                                \
    int64_t i = 0;                                                                                                 \
    if (path == AB_ARITH_FLOAT64) {                                                                                \
      const __m512d va = _mm512_set1_pd(a), vb = _mm512_set1_pd(b);                                              \
      const __m512d lo = _mm512_set1_pd(F2I_LO_##T), hi = _mm512_set1_pd(F2I_HI_##T);                           \
      const bool sg = F2I_LO_##T < 0;                                                                              \
      for (; i + 16 <= n; i += 16) {                                                                               \
        const char *x = s + (size_t)i * sizeof(F);                                                                 \
        const __m256i r0 = f2i_eight(F2I_LOAD_##F(x), affine, sg, va, vb, lo, hi);                                 \
        const __m256i r1 = f2i_eight(F2I_LOAD_##F(x + 8 * sizeof(F)), affine, sg, va, vb, lo, hi);                 \
        F2I_STORE_##T(d + (size_t)i * sizeof(T), _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));         \
      }                                                                                                            \
    }                                                                                                              \
    fast_avx512_##F##_##T(d + (size_t)i * sizeof(T), s + (size_t)i * sizeof(F), n - i, path, affine, a, b);       \
  }
#define DEFINE_F2I_FROM(SET, F)                                                                                     \
  DEFINE_F2I_ROW##SET(F, int8_t)                                                                                   \
  DEFINE_F2I_ROW##SET(F, uint8_t)                                                                                  \
  DEFINE_F2I_ROW##SET(F, int16_t) DEFINE_F2I_ROW##SET(F, uint16_t) DEFINE_F2I_ROW##SET(F, int32_t)
#define DEFINE_F2I_SET(SET)                                                                                         \
  DEFINE_F2I_FROM(SET, int8_t)                                                                                     \
  DEFINE_F2I_FROM(SET, uint8_t)                                                                                    \
  DEFINE_F2I_FROM(SET, int16_t)                                                                                    \
  DEFINE_F2I_FROM(SET, uint16_t)                                                                                   \
  DEFINE_F2I_FROM(SET, int32_t)                                                                                    \
  DEFINE_F2I_FROM(SET, uint32_t)                                                                                   \
  DEFINE_F2I_FROM(SET, float)                                                                                      \
  DEFINE_F2I_FROM(SET, double)                                                                                     \
  DEFINE_F2I_FROM(SET, bf16_bits)
#define F2I_FROM_ROW(SET, F)                                                                                        \
  {f2i_##SET##_##F##_int8_t, f2i_##SET##_##F##_uint8_t, f2i_##SET##_##F##_int16_t, f2i_##SET##_##F##_uint16_t,   \
   f2i_##SET##_##F##_int32_t, NULL, NULL, NULL}
/* [source][result] as fast_avx512's; NULL: not an integer result. */
#define F2I_TABLE(SET)                                                                                              \
  static const fast_row_fn f2i_##SET[9][8] = {                                                                     \
      F2I_FROM_ROW(SET, int8_t),   F2I_FROM_ROW(SET, uint8_t),  F2I_FROM_ROW(SET, int16_t),                       \
      F2I_FROM_ROW(SET, uint16_t), F2I_FROM_ROW(SET, int32_t),  F2I_FROM_ROW(SET, uint32_t),                      \
      F2I_FROM_ROW(SET, float),    F2I_FROM_ROW(SET, double),   F2I_FROM_ROW(SET, bf16_bits)};
DEFINE_F2I_SET(_avx512)
F2I_TABLE(avx512)

/* The same for AVX2, four doubles to a vector: GCC's loop ran float32 ->
 * uint8 with a map at 1.35 billion elements a second in L1 on the same VM
 * (AB_HOST_TILES=avx2). Four groups of four are packed into 16 results
 * with PACKSSDW and PACKUSWB (or PACKSSWB, PACKUSDW): saturating, so exact
 * for values already clamped. uint32 goes through int32 by the flip of
 * its top bit, then 2^31 added back, exactly. */
#define F2I2_ATTR __attribute__((target("avx2")))
F2I2_ATTR static inline __m128i f2i2_load32(const char *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm_cvtsi32_si128(v);
}
#define F2I2_LOAD_int8_t(p) _mm256_cvtepi32_pd(_mm_cvtepi8_epi32(f2i2_load32(p)))
#define F2I2_LOAD_uint8_t(p) _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(f2i2_load32(p)))
#define F2I2_LOAD_int16_t(p) _mm256_cvtepi32_pd(_mm_cvtepi16_epi32(F2I_X64(p)))
#define F2I2_LOAD_uint16_t(p) _mm256_cvtepi32_pd(_mm_cvtepu16_epi32(F2I_X64(p)))
#define F2I2_LOAD_int32_t(p) _mm256_cvtepi32_pd(F2I_X128(p))
#define F2I2_LOAD_uint32_t(p)                                                                                       \
  _mm256_add_pd(_mm256_cvtepi32_pd(_mm_xor_si128(F2I_X128(p), _mm_set1_epi32(INT32_MIN))), _mm256_set1_pd(2147483648.0))
#define F2I2_LOAD_float(p) _mm256_cvtps_pd(_mm_loadu_ps((const float *)(const void *)(p)))
#define F2I2_LOAD_double(p) _mm256_loadu_pd((const double *)(const void *)(p))
#define F2I2_LOAD_bf16_bits(p)                                                                                      \
  _mm256_cvtps_pd(_mm_castsi128_ps(                                                                                \
      _mm_slli_epi32(_mm_cvtepu16_epi32(F2I_X64(p)), 16)))
#define F2I2_STORE_int8_t(p, r0, r1, r2, r3)                                                                        \
  _mm_storeu_si128((__m128i *)(void *)(p), _mm_packs_epi16(_mm_packs_epi32(r0, r1), _mm_packs_epi32(r2, r3)))
#define F2I2_STORE_uint8_t(p, r0, r1, r2, r3)                                                                       \
  _mm_storeu_si128((__m128i *)(void *)(p), _mm_packus_epi16(_mm_packs_epi32(r0, r1), _mm_packs_epi32(r2, r3)))
#define F2I2_STORE_int16_t(p, r0, r1, r2, r3)                                                                       \
  _mm256_storeu_si256((__m256i *)(void *)(p), _mm256_set_m128i(_mm_packs_epi32(r2, r3), _mm_packs_epi32(r0, r1)))
#define F2I2_STORE_uint16_t(p, r0, r1, r2, r3)                                                                      \
  _mm256_storeu_si256((__m256i *)(void *)(p), _mm256_set_m128i(_mm_packus_epi32(r2, r3), _mm_packus_epi32(r0, r1)))
#define F2I2_STORE_int32_t(p, r0, r1, r2, r3)                                                                       \
  do {                                                                                                             \
    _mm256_storeu_si256((__m256i *)(void *)(p), _mm256_set_m128i(r1, r0));                                         \
    _mm256_storeu_si256((__m256i *)(void *)((p) + 32), _mm256_set_m128i(r3, r2));                                  \
  } while (0)

/* Four values of the map, clamped into [lo, hi], as int32 (as f2i_eight). */
F2I2_ATTR static inline __m128i f2i2_four(__m256d v, bool affine, bool is_signed, __m256d a, __m256d b, __m256d lo,
                                         __m256d hi) {
  if (affine) v = _mm256_add_pd(_mm256_mul_pd(v, a), b);
  if (is_signed) v = _mm256_andnot_pd(_mm256_cmp_pd(v, v, _CMP_UNORD_Q), v); /* NaN to +0 */
  v = _mm256_min_pd(_mm256_max_pd(v, lo), hi);
  return _mm256_cvtpd_epi32(v);
}

#define DEFINE_F2I_ROW_avx2(F, T)                                                                                   \
  F2I2_ATTR static void f2i_avx2_##F##_##T(char *d, const char *s, int64_t n, ab__arith path, bool affine,        \
                                           double a, double b) {                                                  \
    int64_t i = 0;                                                                                                 \
    if (path == AB_ARITH_FLOAT64) {                                                                                \
      const __m256d va = _mm256_set1_pd(a), vb = _mm256_set1_pd(b);                                              \
      const __m256d lo = _mm256_set1_pd(F2I_LO_##T), hi = _mm256_set1_pd(F2I_HI_##T);                           \
      const bool sg = F2I_LO_##T < 0;                                                                              \
      for (; i + 16 <= n; i += 16) {                                                                               \
        const char *x = s + (size_t)i * sizeof(F);                                                                 \
        const __m128i r0 = f2i2_four(F2I2_LOAD_##F(x), affine, sg, va, vb, lo, hi);                                \
        const __m128i r1 = f2i2_four(F2I2_LOAD_##F(x + 4 * sizeof(F)), affine, sg, va, vb, lo, hi);                \
        const __m128i r2 = f2i2_four(F2I2_LOAD_##F(x + 8 * sizeof(F)), affine, sg, va, vb, lo, hi);                \
        const __m128i r3 = f2i2_four(F2I2_LOAD_##F(x + 12 * sizeof(F)), affine, sg, va, vb, lo, hi);               \
        F2I2_STORE_##T(d + (size_t)i * sizeof(T), r0, r1, r2, r3);                                                \
      }                                                                                                            \
    }                                                                                                              \
    fast_avx2_##F##_##T(d + (size_t)i * sizeof(T), s + (size_t)i * sizeof(F), n - i, path, affine, a, b);         \
  }
DEFINE_F2I_SET(_avx2)
F2I_TABLE(avx2)
#endif

/* The loop of this CPU for a pair of kinds other than float16, or NULL
 * (fast_row has already kept out half results of float64 arithmetic). */
static fast_row_fn fast_plain_row(enum kind from, enum kind to) {
  static const signed char src[K_NONE] = {[K_BOOL] = -1, [K_I8] = 0,    [K_U8] = 1,    [K_I16] = 2,  [K_U16] = 3,
                                          [K_I32] = 4,   [K_U32] = 5,   [K_F32] = 6,   [K_F64] = 7,  [K_I64] = -1,
                                          [K_U64] = -1,  [K_F16] = -1,  [K_BF16] = 8,  [K_C64] = -1, [K_C128] = -1};
  static const signed char dst[K_NONE] = {[K_BOOL] = -1, [K_I8] = 0,    [K_U8] = 1,    [K_I16] = 2,  [K_U16] = 3,
                                          [K_I32] = 4,   [K_U32] = -1,  [K_F32] = 5,   [K_F64] = 6,  [K_I64] = -1,
                                          [K_U64] = -1,  [K_F16] = -1,  [K_BF16] = 7,  [K_C64] = -1, [K_C128] = -1};
  if (from >= K_NONE || to >= K_NONE || src[from] < 0 || dst[to] < 0) return NULL;
#ifdef HAVE_X86_64
  const int level = ab__host_tiles_level();
  if (level >= AB_TILES_AVX512 && __builtin_cpu_supports("avx512vl")) {
    const fast_row_fn f2i = f2i_avx512[src[from]][dst[to]];
    ab__host_ran(AB_RAN_CAST_AVX512);
    return f2i != NULL ? f2i : fast_avx512[src[from]][dst[to]];
  }
  if (level >= AB_TILES_AVX2) {
    const fast_row_fn f2i = f2i_avx2[src[from]][dst[to]];
    ab__host_ran(AB_RAN_CAST_AVX2);
    return f2i != NULL ? f2i : fast_avx2[src[from]][dst[to]];
  }
#endif
  ab__host_ran(AB_RAN_CAST_BASE);
  return fast_base[src[from]][dst[to]];
}

/* float16 a block at a time: a float16 source is widened to float32
 * (exactly) and goes through the float32 source's loop, which takes the
 * same arithmetic; a float16 result is computed as float32 by the loop
 * for a float32 result (float32 arithmetic, as for float16) and narrowed
 * in one rounding to nearest even: the element loop's bits. Widening and
 * narrowing run through F16C where it runs (f16c), else through the bits
 * below, which compilers vectorize. EPYC VM, one thread, 94 MB, F16C
 * against the element loop: float16 -> float32 0.03x -> about 1x of
 * memcpy. */
#define F16_BLOCK 512

/* A float16 as float32; a NaN as the element loop's, quiet with its sign
 * and payload. Every case is computed and one picked, so that compilers
 * vectorize the loop below. */
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = h & 0x7c00u, m = h & 0x3ffu;
  const uint32_t normal = ((uint32_t)(h & 0x7fffu) << 13) + (112u << 23); /* exponent rebiased 15 -> 127 */
  const uint32_t special = m != 0 ? 0x7fc00000u | m << 13 : 0x7f800000u;
  const uint32_t subnormal = fast_bits((float)(int32_t)m * 0x1p-24f); /* (or zero): exact, and normal in float32 */
  return fast_float(sign | (e == 0x7c00u ? special : e == 0 ? subnormal : normal));
}

/* A float32 as float16 in one rounding to nearest even, NaNs quiet with
 * the top of their payload: ab__half_from_float's bits for all 2^32
 * inputs in every rounding mode, denormals flushed or not (checked
 * exhaustively), without its branches. */
static inline uint16_t float_to_half(float f) {
  const uint32_t x = fast_bits(f);
  /* Signed from here (|f|'s bits fit): SSE2 compares no unsigned lanes. */
  const int32_t sign = (int32_t)(x >> 16 & 0x8000u), a = (int32_t)(x & 0x7fffffffu);
  const int32_t nan = 0x7e00 | (a >> 13 & 0x3ff);
  /* 2^-14 and up: rebias 127 -> 15 and round off 13 bits, ties to even;
   * a carry out of the mantissa lands in the exponent, and 65520 and up
   * are cut to infinity. (Below, it is not taken.) */
  int32_t normal = (int32_t)((uint32_t)a - (112u << 23) + 0xfffu + (uint32_t)(a >> 13 & 1)) >> 13;
  normal = normal < 0x7c00 ? normal : 0x7c00;
  /* Below 2^-14: |f| in float16's subnormal steps of 2^-24, x = |f| * 2^24
   * (exact), cut to its whole steps q (C's conversion truncates whatever
   * the rounding mode) and rounded by the rest (exact too) to nearest,
   * ties to even, as the element loop rounds, in every rounding mode. A
   * float32 subnormal gives 0, flushed to zero or not. */
  const float x24 = fast_float((uint32_t)a) * 0x1p24f;
  const int32_t q = (int32_t)(x24 < 2048.0f ? x24 : 0.0f); /* (larger ones are not taken: no overflow) */
  const float rest = x24 - (float)q;
  const int32_t sub = q + (int32_t)(rest > 0.5f || (rest == 0.5f && (q & 1)));
  return (uint16_t)(sign | (a > 0x7f800000 ? nan : a < 0x38800000 ? sub : normal));
}

/* d: n float32, s: n float16, both at any alignment. */
static void f16_to_f32_bits(char *d, const char *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) wr_f32(d + 4 * i, half_to_float(rd_u16(s + 2 * i)));
}
static void f32_to_f16_bits(char *d, const char *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) wr_u16(d + 2 * i, float_to_half(rd_f32(s + 4 * i)));
}

#ifdef HAVE_X86
/* VCVTPH2PS gives half_to_float's bits, NaNs included (quiet, sign and
 * payload kept). */
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(char *d, const char *s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + 2 * i));
    _mm256_storeu_ps((float *)(void *)(d + 4 * i), _mm256_cvtph_ps(h));
  }
  if (i < n) { /* the last 1-7 through a zero-padded register */
    _Alignas(16) uint16_t tail[8] = {0};
    memcpy(tail, s + 2 * i, (size_t)(n - i) * 2);
    _Alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)tail)));
    memcpy(d + 4 * i, out, (size_t)(n - i) * sizeof(float));
  }
}

/* s: n float32 at any alignment. */
__attribute__((target("avx,f16c"))) static void f32_to_f16_all(char *d, const char *s, int64_t n) {
  const int64_t i = f32_to_f16_f16c(d, s, n);
  if (i < n) {
    _Alignas(32) float tail[8] = {0};
    memcpy(tail, s + (size_t)i * sizeof(float), (size_t)(n - i) * sizeof(float));
    _Alignas(16) uint16_t out[8];
    _mm_store_si128((__m128i *)(void *)out, _mm256_cvtps_ph(_mm256_load_ps(tail), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    memcpy(d + 2 * i, out, (size_t)(n - i) * 2);
  }
}
#endif

/* n elements through c->fast, the loop with float32 in float16's place. */
static void fast_f16_row(const struct row_ctx *c, char *d, const char *s, int64_t n, double a, double b) {
  const bool from_f16 = c->from == K_F16, to_f16 = c->to == K_F16;
  if (to_f16 && c->from == K_F32 && !c->affine) { /* float32 itself */
    c->narrow16(d, s, n);
    return;
  }
  if (from_f16 && c->to == K_F32 && !c->affine) { /* into float32 itself: the loop would only copy */
    c->widen16(d, s, n);
    return;
  }
  _Alignas(64) float in[F16_BLOCK], out[F16_BLOCK];
  for (int64_t i = 0; i < n; i += F16_BLOCK) {
    const int64_t m = n - i < F16_BLOCK ? n - i : F16_BLOCK;
    const char *x = s + (size_t)i * c->in_size;
    if (from_f16) {
      c->widen16((char *)in, x, m);
      x = (const char *)in;
    }
    c->fast(to_f16 ? (char *)out : d + (size_t)i * c->out_size, x, m, c->path, c->affine, a, b);
    if (to_f16) c->narrow16(d + (size_t)i * 2, (const char *)out, m);
  }
}

/* The loop for a pair of kinds, or NULL; for a pair with float16 on a
 * side, the loop with float32 in its place (run by fast_f16_row). A
 * float16 or bfloat16 result from float64 arithmetic (wide sources) is
 * rounded once from the double by the element loop, not through a
 * float32 here. */
static fast_row_fn fast_row(enum kind from, enum kind to, bool f16c) {
  if ((to == K_F16 || to == K_BF16) && arith_of(from, to, false) != AB_ARITH_FLOAT32) return NULL;
  if (from != K_F16 && to != K_F16) return fast_plain_row(from, to);
  const fast_row_fn f = fast_plain_row(from == K_F16 ? K_F32 : from, to == K_F16 ? K_F32 : to);
  if (f != NULL) ab__host_ran(f16c ? AB_RAN_CAST_F16C : AB_RAN_CAST_F16_BITS);
  return f;
}

static void convert_impl(void *dst, int64_t dst0, const void *src, int32_t ndim, const int64_t *shape,
                         const int64_t *byte_strides, const ab__cast_op *op, bool stream, bool *streamed);

/* The fast loops read their rows PREFETCH_CHUNK source bytes at a time,
 * after asking for the lines PREFETCH_AHEAD bytes on: the CPU's own
 * prefetcher left float32 -> uint8 with a map, 99 MB, one thread,
 * reading 6.5 GB/s where a loop that only reads ran 12.5; asked 2 KiB
 * ahead it read 9.8 GB/s (Intel Xeon VM with AVX-512 FP16). Rows shorter
 * than two chunks run whole, and so do float16 results, which bench_host
 * ran at 0.87-0.99x of memcpy in pieces against 0.99-1.02x whole (float32
 * -> float16). AB_HOST_CAST_PREFETCH=0 turns it off (the same bytes either
 * way). */
#define PREFETCH_CHUNK ((size_t)512)
#define PREFETCH_AHEAD 2048

static bool cast_prefetch(void) {
  static ab__env_cache cache;
  return ab__env_switch(&cache, "AB_HOST_CAST_PREFETCH", 1);
}

/* n contiguous elements through the pair's fast loop, map a * x + b. */
static void fast_piece(const struct row_ctx *c, char *d, const char *s, int64_t n, double a, double b) {
  if (c->f16) {
    fast_f16_row(c, d, s, n, a, b);
    return;
  }
  c->fast(d, s, n, c->path, c->affine, a, b);
}

/* fast_piece over a row, in prefetched pieces where it is long enough. */
static void fast_run(const struct row_ctx *c, char *d, const char *s, int64_t n, double a, double b) {
  if (c->prefetch && (size_t)n * c->in_size >= 2 * PREFETCH_CHUNK) {
    const int64_t per = (int64_t)(PREFETCH_CHUNK / c->in_size);
    for (int64_t k = 0; k < n; k += per) {
      const int64_t m = n - k < per ? n - k : per;
      const char *x = s + (size_t)k * c->in_size;
      for (size_t o = 0; o < PREFETCH_CHUNK; o += 64)
        __builtin_prefetch((const void *)((uintptr_t)x + PREFETCH_AHEAD + o), 0, 3);
      fast_piece(c, d + (size_t)k * c->out_size, x, m, a, b);
    }
    return;
  }
  fast_piece(c, d, s, n, a, b);
}

/* Results that will not stay in the cache go out with streaming stores:
 * ordinary ones read each line of the result from memory before writing
 * it back, so a widening cast, which writes more than it reads, moved its
 * result's bytes twice. Rows of STREAM_ROW bytes or more are cast
 * STREAM_BUF bytes of result at a time into a buffer in L1 by the same
 * loops, and the buffer's whole lines streamed out; the partial lines at
 * a row's ends get ordinary stores, so a line is written all one way
 * (see DEFINE_STREAM_ROW in gather.c). Intel Xeon VM with AVX-512 FP16
 * and AMX (Sapphire Rapids or later), one thread, 2160 x 3840 x 3
 * images, bench_host's GB/s (source and result bytes, halved), four
 * alternated rounds: uint8 -> float32 5.8-6.1 -> 12.4-13.1, float16 ->
 * float32 5.0-5.1 -> 7.3-7.8, bfloat16 -> float32 6.8-7.0 -> 10.9-11.6,
 * float32 -> float16 7.8-8.3 -> 8.5-9.4, float64 -> float32 the same
 * (bench/results/2026-11-27-cast-streaming.md). Which casts:
 * ab__host_cast_streams. */
#define STREAM_ROW 256
#define STREAM_BUF 8192

/* Conversions (or thread bands of one) that streamed rows out, for the
 * tests: counted once per call, not per row, so that threads do not
 * contend for it. */
static _Atomic uint64_t streamed_calls;

uint64_t ab__host_cast_streamed_calls(void) { return atomic_load_explicit(&streamed_calls, memory_order_relaxed); }

static void fast_streamed(const struct row_ctx *c, char *d, const char *s, int64_t n, double a, double b) {
  const size_t os = c->out_size, is = c->in_size;
  const size_t head = (size_t)(-(uintptr_t)d & (AB_CACHE_LINE - 1)); /* bytes up to d's next line */
  if (head % os != 0) { /* elements across lines (a result off its element alignment): ordinary stores */
    fast_run(c, d, s, n, a, b);
    return;
  }
  *c->streamed = true;
  int64_t k = (int64_t)(head / os) < n ? (int64_t)(head / os) : n;
  fast_run(c, d, s, k, a, b);
  _Alignas(64) char buf[STREAM_BUF];
  const int64_t per = (int64_t)(STREAM_BUF / os);
  while (k < n) {
    const int64_t m = n - k < per ? n - k : per;
    char *to = d + (size_t)k * os;
    const size_t bytes = (size_t)m * os, lines = bytes & ~(size_t)(AB_CACHE_LINE - 1);
    fast_run(c, buf, s + (size_t)k * is, m, a, b);
    ab__host_stream_lines(to, buf, lines);
    memcpy(to + lines, buf + lines, bytes - lines);
    k += m;
  }
}

/* n elements, source stride `ss` bytes, compact destination; scale/offset
 * per element when sc/of step (per_elem), else the first entries. */
static void convert_row(const struct row_ctx *c, char *d, const char *s, int64_t n, int64_t ss, const double *sc,
                        const double *of, bool per_elem) {
  const size_t os = c->out_size;
  if (c->fast != NULL && (size_t)ss == c->in_size && !per_elem) {
    if (c->stream && (size_t)n * os >= STREAM_ROW) {
      fast_streamed(c, d, s, n, sc[0], of[0]);
      return;
    }
    fast_run(c, d, s, n, sc[0], of[0]);
    return;
  }
  switch (c->path) {
  case AB_ARITH_INT:
    for (int64_t i = 0; i < n; i++) store_i(c->to, d + (size_t)i * os, load_i(c->from, s + i * ss));
    return;
  case AB_ARITH_FLOAT32:
    if (!c->affine) {
      for (int64_t i = 0; i < n; i++) store_f(c->to, d + (size_t)i * os, load_f(c->from, s + i * ss));
    } else if (!per_elem) {
      const float a = (float)sc[0], b = (float)of[0];
      for (int64_t i = 0; i < n; i++) {
        float y = load_f(c->from, s + i * ss) * a;
        store_f(c->to, d + (size_t)i * os, y + b);
      }
    } else {
      for (int64_t i = 0; i < n; i++) {
        float y = load_f(c->from, s + i * ss) * (float)sc[i];
        store_f(c->to, d + (size_t)i * os, y + (float)of[i]);
      }
    }
    return;
  case AB_ARITH_FLOAT64:
    for (int64_t i = 0; i < n; i++) {
      double y = c->odd ? load_odd(c->from, s + i * ss) : load_d(c->from, s + i * ss);
      if (c->affine) {
        double m = y * sc[per_elem ? i : 0]; /* a multiply, then an add: -ffp-contract=off */
        y = m + of[per_elem ? i : 0];
      }
      store_d(c->to, d + (size_t)i * os, y);
    }
    return;
  case AB_ARITH_COMPLEX: {
    const enum kind pf = c->from == K_C64 ? K_F32 : K_F64, pt = c->to == K_C64 ? K_F32 : K_F64;
    const size_t ih = c->from == K_C64 ? 4 : 8, oh = os / 2;
    for (int64_t i = 0; i < n; i++)
      for (int part = 0; part < 2; part++)
        store_d(pt, d + (size_t)i * os + (size_t)part * oh, load_d(pf, s + i * ss + (int64_t)((size_t)part * ih)));
    return;
  }
  case AB_ARITH_NONE: /* not a supported pair: the caller checked */
    return;
  }
}

#ifdef HAVE_X86_64
/* 16 RGB pixels (48 bytes at p) into three planes at o0/o1/o2 + x:
 * pshufb deinterleave, widen to float, multiply, then add (the same two
 * IEEE operations as the scalar loop, so the results are identical). */
__attribute__((target("ssse3"))) static void rgb16_to_planes(const uint8_t *p, float *o0, float *o1, float *o2,
                                                           const __m128 a[3], const __m128 b[3], bool nt) {
  const __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)p);
  const __m128i v1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
  const __m128i v2 = _mm_loadu_si128((const __m128i *)(const void *)(p + 32));
#define M(...) _mm_setr_epi8(__VA_ARGS__)
  const __m128i ch[3] = {
    _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, M(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                              _mm_shuffle_epi8(v1, M(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1))),
                 _mm_shuffle_epi8(v2, M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13))),
    _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, M(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                              _mm_shuffle_epi8(v1, M(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1))),
                 _mm_shuffle_epi8(v2, M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14))),
    _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, M(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                              _mm_shuffle_epi8(v1, M(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1))),
                 _mm_shuffle_epi8(v2, M(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15))),
  };
#undef M
  float *out[3] = {o0, o1, o2};
  const __m128i z = _mm_setzero_si128();
  for (int c = 0; c < 3; c++) {
    const __m128i lo = _mm_unpacklo_epi8(ch[c], z), hi = _mm_unpackhi_epi8(ch[c], z);
    const __m128i q[4] = {_mm_unpacklo_epi16(lo, z), _mm_unpackhi_epi16(lo, z), _mm_unpacklo_epi16(hi, z),
                          _mm_unpackhi_epi16(hi, z)};
    for (int k = 0; k < 4; k++) {
      __m128 v = _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(q[k]), a[c]), b[c]);
      if (nt)
        _mm_stream_ps(out[c] + 4 * k, v);
      else
        _mm_storeu_ps(out[c] + 4 * k, v);
    }
  }
}

/* One row of W pixels; returns how many were done (a multiple of 16).
 * nt: streaming stores, into planes whose rows start on lines
 * (u8_planes_f32 checks). */
__attribute__((target("ssse3"))) static int64_t rgb_row_to_planes(const uint8_t *row, float *o0, float *o1, float *o2,
                                                                int64_t W, const float a[3], const float b[3],
                                                                bool nt) {
  const __m128 va[3] = {_mm_set1_ps(a[0]), _mm_set1_ps(a[1]), _mm_set1_ps(a[2])};
  const __m128 vb[3] = {_mm_set1_ps(b[0]), _mm_set1_ps(b[1]), _mm_set1_ps(b[2])};
  int64_t x = 0;
  for (; x + 16 <= W; x += 16) rgb16_to_planes(row + 3 * x, o0 + x, o1 + x, o2 + x, va, vb, nt);
  return x;
}
#endif

/* The image path: uint8 -> float32 from an interleaved source to planes,
 * (C, H, W) after the permutation with C <= 4 and the channel the
 * smallest source stride (HWC -> CHW). One pass over the source, writing
 * the C planes together, instead of C strided passes. Same arithmetic as
 * the general AB_ARITH_FLOAT32 loop: (float)x * a, then + b. nt:
 * streaming stores (ab__host_cast_streams), for three channels in whole
 * lines; the caller fences them. */
static bool u8_planes_f32(float *dst, int64_t dst0, const uint8_t *src, int32_t ndim, const int64_t *shape,
                          const int64_t *st, const ab__cast_op *op, const double *cs, const double *co, bool nt,
                          bool *streamed) {
  if (ndim != 3 || shape[0] > 4 || st[0] != 1 || st[2] != shape[0] || op->to.code != kDLFloat || op->to.bits != 32)
    return false;
  const int64_t C = shape[0], H = shape[1], W = shape[2];
  const size_t plane = dst0 != 0 ? (size_t)dst0 / sizeof(float) : (size_t)H * (size_t)W; /* floats between planes */
  float a[4] = {1, 1, 1, 1}, b[4] = {0, 0, 0, 0};
  for (int64_t c = 0; c < C; c++) {
    if (op->affine && op->channel_dim == 0) {
      a[c] = cs ? (float)cs[c] : 1.0f;
      b[c] = co ? (float)co[c] : 0.0f;
    } else if (op->affine) {
      a[c] = (float)op->scale;
      b[c] = (float)op->offset;
    }
  }
#ifdef HAVE_X86_64
  const bool simd = C == 3 && ab__host_tiles_level() >= AB_TILES_SSSE3;
  if (simd) ab__host_ran(AB_RAN_PLANES_RGB_SSSE3);
  /* Streaming stores only where they write whole lines: rows of whole
   * 16-pixel steps (no scalar tail sharing a line with the next row's
   * streamed head) in planes that start on lines; else ordinary ones. */
  nt = nt && simd && W % 16 == 0 && (uintptr_t)dst % AB_CACHE_LINE == 0 && plane % 16 == 0;
  if (nt) *streamed = true;
#else
  (void)nt;
  (void)streamed;
#endif
  for (int64_t y = 0; y < H; y++) {
    const uint8_t *row = src + y * st[1];
    float *o0 = dst + (size_t)y * (size_t)W;
    if (C == 3) {
      float *o1 = o0 + plane, *o2 = o1 + plane;
      const float a0 = a[0], a1 = a[1], a2 = a[2], b0 = b[0], b1 = b[1], b2 = b[2];
      int64_t x = 0;
#ifdef HAVE_X86_64
      if (simd) x = rgb_row_to_planes(row, o0, o1, o2, W, a, b, nt);
#endif
      for (; x < W; x++) {
        const uint8_t *p = row + 3 * x;
        float v0 = (float)p[0] * a0, v1 = (float)p[1] * a1, v2 = (float)p[2] * a2;
        o0[x] = v0 + b0;
        o1[x] = v1 + b1;
        o2[x] = v2 + b2;
      }
    } else {
      for (int64_t x = 0; x < W; x++)
        for (int64_t c = 0; c < C; c++) {
          float v = (float)row[x * C + c] * a[c];
          o0[(size_t)c * plane + (size_t)x] = v + b[c];
        }
    }
  }
  return true; /* ab__host_convert_into fences the streaming stores */
}

/* A source whose rows are not contiguous (a permutation, a transposed
 * view), or whose rows are short: the element loop would read it an
 * element at a time across rows, a cache line for each, or pay a call per
 * few elements. Instead the result is cut into chunks of at most
 * CAST_CHUNK source bytes (measured: see bench/results/2026-11-25-pixels-
 * and-casts.md), each a run of indices of one dim k with every dim after
 * it whole (and the channel dims below), so that each chunk is a
 * sub-array of the source and one compact piece of the result (one piece
 * per channel); each is gathered into a buffer by the gather kernels
 * (transposes in tiles, pixels to planes) and cast from there as
 * contiguous rows (the loops above where the pair has one, the element
 * loop's contiguous case otherwise). The map must be the same along a
 * chunk's rows: per tensor, or per channel along dim k or a dim before
 * it. Returns false, having done nothing, where that does not hold or
 * where the buffer cannot be had. */
#define CAST_CHUNK ((size_t)256 << 10)

/* A narrowing cast moves the narrow elements: a chunk whose source runs
 * along one of its whole dims (planes to pixels: CHW float32 -> HWC uint8)
 * is cast first, in the source's own order, its contiguous rows through
 * the row loops, into a buffer of the result's elements, and then gathered
 * from there into the result's order, a quarter of the bytes for float32
 * -> uint8; the other way, it gathered the wide elements into the buffer
 * and read them back to cast them. The plan for the ns = ndim - k dims of
 * every chunk (dims k.., dim k cut into rows): their order in the source,
 * outermost first. */
struct narrow_plan {
  int32_t ns;
  int32_t order[AB_MAX_NDIM]; /* order[i]: the chunk's dim at place i of the source's order */
  int32_t place[AB_MAX_NDIM]; /* its inverse */
};

/* Whether the chunks of dims k.. of a cast from c->in_size-byte elements
 * to narrower ones can be cast in source order: every stride positive, the
 * smallest the element (contiguous rows) and not dim k's (so the rows are
 * whole in every chunk), at least NARROW_ROW elements long (shorter rows
 * would cost a row loop's call each). */
#define NARROW_ROW 64
static bool narrow_first(const struct row_ctx *c, int32_t ndim, int32_t k, const int64_t *shape, const int64_t *bst,
                         struct narrow_plan *np) {
  if (c->out_size >= c->in_size) return false;
  np->ns = ndim - k;
  for (int32_t j = 0; j < np->ns; j++) {
    if (bst[k + j] <= 0) return false;
    np->order[j] = j;
  }
  for (int32_t i = 1; i < np->ns; i++) /* by stride, largest first (insertion: at most 8) */
    for (int32_t x = i; x > 0 && bst[k + np->order[x - 1]] < bst[k + np->order[x]]; x--) {
      const int32_t t = np->order[x];
      np->order[x] = np->order[x - 1];
      np->order[x - 1] = t;
    }
  const int32_t last = np->order[np->ns - 1];
  if (last == 0 || bst[k + last] != (int64_t)c->in_size || shape[k + last] < NARROW_ROW) return false;
  for (int32_t i = 0; i < np->ns; i++) np->place[np->order[i]] = i;
  return true;
}

/* One chunk of a narrowing cast (see narrow_first): the source rows k0..
 * k0 + m of dim k at s, cast in source order into buf, gathered into the
 * result's piece at `to` (compact, result order). `a` and `b` are the map
 * when it is one for the whole chunk (per tensor, or a channel before dim
 * k); a channel per row of dim k keeps its arrays, from row k0 (channels
 * after dim k never reach the chunks: convert_in_chunks refuses them). */
static void narrow_chunk(const struct row_ctx *c, const struct narrow_plan *np, char *to, char *buf, const char *s,
                         int32_t k, int64_t k0, int64_t m, const int64_t *shape, const int64_t *bst,
                         const ab__cast_op *op, double a, double b) {
  int64_t sh[AB_MAX_NDIM], st[AB_MAX_NDIM], gsh[AB_MAX_NDIM], gst[AB_MAX_NDIM];
  for (int32_t i = 0; i < np->ns; i++) {
    const int32_t j = np->order[i];
    sh[i] = j == 0 ? m : shape[k + j];
    st[i] = bst[k + j];
  }
  ab__cast_op o = *op;
  if (op->affine && op->channel_dim == k) { /* the chunk's rows are channels k0..k0 + m */
    o.channel_dim = np->place[0];
    if (o.channel_scale) o.channel_scale += k0;
    if (o.channel_offset) o.channel_offset += k0;
  } else {
    o.channel_dim = -1;
    o.scale = a;
    o.offset = b;
  }
  bool unused;
  convert_impl(buf, 0, s, np->ns, sh, st, &o, false, &unused); /* into the buffer: ordinary stores */
  /* buf is compact in source order: its strides, read in result order */
  int64_t e = (int64_t)c->out_size;
  for (int32_t i = np->ns; i-- > 0;) {
    const int32_t j = np->order[i];
    gst[j] = e;
    gsh[j] = sh[i];
    e *= sh[i];
  }
  ab__host_gather(to, buf, np->ns, gsh, gst, c->out_size);
}

static bool convert_in_chunks(const struct row_ctx *c, char *dst, int64_t dst0, const char *src, int32_t ndim,
                              const int64_t *shape, const int64_t *bst, const ab__cast_op *op) {
  if (ndim < 2) return false;
  int32_t k = ndim - 1;
  int64_t inner = 1; /* elements of dims k+1.. */
  /* with output planes of their own (dst0), chunks never span dim 0 */
  const int32_t kmin = dst0 != 0 ? 1 : 0;
  while (k > kmin && (size_t)(inner * shape[k]) * c->in_size <= CAST_CHUNK) inner *= shape[k--];
  /* Dims q..k-1 ride whole in every chunk where they are the channels of
   * pixels: 16 indices or fewer, each dim's source extent within a cache
   * line (an HWC source read as CHW). A chunk is then gathered from every
   * channel at once (pixels to planes) and cast into a piece of each
   * plane, where a chunk per channel read each pixel once per channel.
   * Dims before q take chunks of their own, an index at a time. */
  int32_t q = k;
  int64_t outer = 1;
  while (q > 0 && outer * shape[q - 1] <= 16 && (bst[q - 1] < 0 ? -bst[q - 1] : bst[q - 1]) * shape[q - 1] <= 64 &&
         (size_t)(outer * shape[q - 1] * inner) * c->in_size <= CAST_CHUNK)
    outer *= shape[--q];
  const bool chan = op->affine && op->channel_dim >= 0;
  if (chan && op->channel_dim > k) return false;
  /* rows of dim k a chunk: a multiple of 16 where there are that many,
   * so that a transposed chunk is whole tiles wide, and of a cache line's
   * elements (64 uint8, 32 uint16) where there are that many, so that a
   * transposed chunk reads whole lines of each source row and leaves none
   * for the next to read again. Intel Xeon (Cascade Lake) VM, one thread,
   * a transposed 2880^2 uint8 -> float32, of memcpy: chunks of 80 rows
   * 0.67-0.70x, of 64 rows 0.87-0.89x (two paired runs; three alternated
   * rounds of whole builds later, 0.74-0.80x against 0.84-0.87x). */
  const int64_t fit = (int64_t)(CAST_CHUNK / ((size_t)(outer * inner) * c->in_size));
  const int64_t line = c->in_size >= 4 ? 16 : 64 / (int64_t)c->in_size;
  const int64_t rows = fit >= line ? fit / line * line : fit >= 16 ? fit / 16 * 16 : fit < 1 ? 1 : fit;
  const int64_t step = rows < shape[k] ? rows : shape[k];
  char *buf = ab__malloc((size_t)(outer * step * inner) * c->in_size);
  if (buf == NULL) return false;
  struct narrow_plan np = {0};
  const bool narrow = q == k && narrow_first(c, ndim, k, shape, bst, &np);
  int64_t idx[AB_MAX_NDIM] = {0}, sub_shape[AB_MAX_NDIM], sub_st[AB_MAX_NDIM];
  for (int32_t i = q; i < ndim; i++) {
    sub_shape[i - q] = shape[i];
    sub_st[i - q] = bst[i];
  }
  const double *sc = op->channel_scale, *of = op->channel_offset;
  const int64_t plane = shape[k] * inner; /* result elements of one index of dims 0..k-1 */
  /* Where the piece of index (i0, rest) of dims 0..k-1 goes: i0 * p0 +
   * rest * plane elements in; p0 is dst0 or the compact one. */
  int64_t m1 = 1; /* indices of dims 1..k-1 */
  for (int32_t i = 1; i < k; i++) m1 *= shape[i];
  const int64_t p0 = dst0 != 0 ? dst0 / (int64_t)c->out_size : m1 * plane;
  int64_t lin = 0; /* the current index of dims 0..q-1, row-major */
  for (;;) {
    const char *s = src;
    for (int32_t i = 0; i < q; i++) s += idx[i] * bst[i];
    for (int64_t k0 = 0; k0 < shape[k]; k0 += step) {
      const int64_t m = shape[k] - k0 < step ? shape[k] - k0 : step;
      sub_shape[k - q] = m;
      if (!narrow) ab__host_gather(buf, s + k0 * bst[k], ndim - q, sub_shape, sub_st, c->in_size);
      /* piece o of the buffer: index o of dims q..k-1 (o = 0 only, when
       * narrow), rows k0..k0+m of dim k */
      for (int64_t o = 0; o < outer; o++) {
        const int64_t at = k == 0 ? 0 : lin * outer + o; /* index of dims 0..k-1 */
        char *to = dst + (size_t)((at / m1) * p0 + (at % m1) * plane + k0 * inner) * c->out_size;
        /* the piece's map: per tensor, or per channel of a dim before k */
        int64_t ch = 0;
        if (chan && op->channel_dim < q) {
          ch = idx[op->channel_dim];
        } else if (chan && op->channel_dim < k) { /* the channel's index within o: dims q..k-1, row-major */
          int64_t r = o;
          for (int32_t i = k - 1; i > op->channel_dim; i--) r /= shape[i];
          ch = r % shape[op->channel_dim];
        }
        const double a = !chan ? op->scale : sc ? sc[ch] : 1.0, b = !chan ? op->offset : of ? of[ch] : 0.0;
        if (narrow) {
          narrow_chunk(c, &np, to, buf, s + k0 * bst[k], k, k0, m, shape, bst, op, a, b);
          continue;
        }
        const char *from = buf + (size_t)(o * m * inner) * c->in_size;
        if (chan && op->channel_dim == k) { /* a channel for each index of dim k */
          for (int64_t j = 0; j < m; j++) {
            const double ra = sc ? sc[k0 + j] : 1.0, rb = of ? of[k0 + j] : 0.0;
            convert_row(c, to + (size_t)(j * inner) * c->out_size, from + (size_t)(j * inner) * c->in_size, inner,
                        (int64_t)c->in_size, &ra, &rb, false);
          }
          continue;
        }
        convert_row(c, to, from, m * inner, (int64_t)c->in_size, &a, &b, false);
      }
    }
    lin++;
    int32_t i = q - 1;
    for (; i >= 0; i--) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
    if (i < 0) break;
  }
  ab__free(buf);
  return true;
}

/* A narrowing cast of transposed planes (of its last two dims, the first
 * contiguous in the source, which runs in rows along the second: the
 * transpose of a compact array, or a batch of them), with one map for
 * every element: bands of whole source rows, TCAST_BAND result
 * bytes' worth (256 rows for a float16 result), are cast in source order
 * through the row loops into a buffer of the result's elements, which the
 * transpose kernels then write into the band's columns of the result:
 * the source is read in long runs and the transpose moves the narrow
 * elements. Gathering each chunk of the result from the source first
 * (convert_in_chunks) read a line from each of its rows and moved the wide
 * ones. Intel Xeon (Cascade Lake) VM, one thread, 2880^2 float32 ->
 * float16: 1.70 -> 2.9 GB/s; bands of 128 bytes 2.5-2.6, 1 KiB 2.9; rows
 * cut in pieces of 512-2048 elements 2.6-2.7 against 2.9 whole. Widening
 * casts lose by it (uint8 -> float32 1.5-2.5 GB/s against 2.4): their
 * transpose would move the wide elements. Source rows longer than
 * TCAST_PIECE elements are cut in pieces (the buffer's bytes: at most
 * TCAST_BAND * TCAST_PIECE). Returns false, having done nothing, where
 * that does not hold or the buffer cannot be had. */
#define TCAST_BAND 512
#define TCAST_PIECE 4096

/* One plane of cast_then_transpose: n0 x n1 result elements at d, rows
 * pitch bytes apart, from source rows sp bytes apart at s, through buf
 * (band rows of piece elements). */
static void cast_then_transpose_plane(const struct row_ctx *c, char *d, int64_t pitch, const char *s, int64_t n0,
                                      int64_t n1, int64_t sp, const ab__cast_op *op, char *buf, int64_t band,
                                      int64_t piece, size_t whole) {
  const size_t os = c->out_size;
  const double a = op->scale, b = op->offset;
  const int64_t dst_st[2] = {pitch, (int64_t)os};
  for (int64_t j0 = 0; j0 < n1; j0 += band) {
    const int64_t w = n1 - j0 < band ? n1 - j0 : band;
    for (int64_t i0 = 0; i0 < n0; i0 += piece) {
      const int64_t h = n0 - i0 < piece ? n0 - i0 : piece;
      for (int64_t j = 0; j < w; j++) /* source row j0 + j, elements i0.. */
        convert_row(c, buf + (size_t)(j * h) * os, s + i0 * (int64_t)c->in_size + (j0 + j) * sp, h,
                    (int64_t)c->in_size, &a, &b, false);
      /* buf holds w rows of h: result element (i0 + i, j0 + j) is its (j, i) */
      const int64_t gshape[2] = {h, w}, gst[2] = {(int64_t)os, h * (int64_t)os};
      ab__host_gather_into(d + i0 * pitch + j0 * (int64_t)os, dst_st, buf, 2, gshape, gst, os, whole);
    }
  }
}

/* The planes are the last two dims; dims before them (a batch) take a
 * plane each, at their source strides, into compact result planes, or,
 * with dst0 (a band of a larger result), planes of dim 0 dst0 bytes
 * apart (dst0 is the rows' pitch when there is no batch). */
static bool cast_then_transpose(const struct row_ctx *c, char *dst, int64_t dst0, const char *src, int32_t ndim,
                                const int64_t *shape, const int64_t *bst, const ab__cast_op *op) {
  if (ndim < 2) return false;
  const int32_t r = ndim - 2; /* the plane's dims: r, r + 1 */
  const size_t os = c->out_size;
  const int64_t n0 = shape[r], n1 = shape[r + 1];
  if (c->out_size >= c->in_size || c->fast == NULL || bst[r] != (int64_t)c->in_size || bst[r + 1] <= 0 ||
      (op->affine && op->channel_dim >= 0) || n0 < 64 || n1 < 64)
    return false;
  int64_t outer = 1, m1 = 1; /* planes; and indices of dims 1..r-1 */
  for (int32_t i = 0; i < r; i++) outer *= shape[i];
  for (int32_t i = 1; i < r; i++) m1 *= shape[i];
  if (outer == 0) return true;
  const int64_t band = TCAST_BAND / (int64_t)os, piece = n0 < TCAST_PIECE ? n0 : TCAST_PIECE;
  struct row_ctx into_buf = *c; /* the rows go into the buffer, which stays in the cache */
  into_buf.stream = false;
  char *buf = ab__malloc((size_t)(band * piece) * os);
  if (buf == NULL) return false;
  const int64_t plane = n0 * n1 * (int64_t)os, pitch = r == 0 && dst0 != 0 ? dst0 : n1 * (int64_t)os;
  /* the bytes this call reads and writes: whether its transposes stream
   * (a band of a plane alone is too small to) */
  const size_t whole = (size_t)(outer * n0 * n1) * (os + c->in_size);
  int64_t idx[AB_MAX_NDIM] = {0};
  for (int64_t p = 0; p < outer; p++) {
    const char *s = src;
    for (int32_t i = 0; i < r; i++) s += idx[i] * bst[i];
    /* plane (i0, rest): i0 * dst0 + rest * plane bytes in with dst0, else p * plane */
    char *d = dst + (r > 0 && dst0 != 0 ? (p / m1) * dst0 + (p % m1) * plane : p * plane);
    cast_then_transpose_plane(&into_buf, d, pitch, s, n0, n1, bst[r + 1], op, buf, band, piece, whole);
    for (int32_t i = r - 1; i >= 0 && ++idx[i] == shape[i]; i--) idx[i] = 0;
  }
  ab__free(buf);
  return true;
}

/* Transposed planes cast in one pass, with one map for every element or
 * none: uint8 and int8 into float32, float16 (with F16C) and bfloat16
 * (ab__host_widen_8: each 64 x 64 tile gathered, widened in registers
 * and written out as whole lines), and uint16, int16, float16 (with
 * F16C) and bfloat16 into float32 (ab__host_widen_16_f32: 32 x 32 tiles
 * through the uint16 network), where convert_in_chunks transposes a
 * chunk of rows into a buffer and then casts each row out of it through
 * a second one; float32 into float16 (with F16C) and bfloat16
 * (ab__host_narrow_f32_16: each 32 x 32 tile narrowed as it is loaded,
 * transposed in registers and written out), where cast_then_transpose
 * casts bands of rows into a buffer and then transposes it. Where the
 * result streams (the casts' rule below) every pair takes it, with
 * streaming stores; elsewhere only uint8 and int8 into float16, with
 * ordinary ones, which leave the result in the cache as the buffered way
 * does. Intel Xeon (AMX) VM, one thread, ms a cast, median of 11, three
 * alternated runs (AB_HOST_CAST_TILES=0 against 1), streamed: uint8 ->
 * float32 2880^2 2.25-2.38 -> 1.65-1.71, 4000^2 6.06-6.17 -> 5.01-5.08,
 * 4096^2 6.0-7.2 -> 4.1-4.3; uint8 -> float16 4000^2 6.7-6.9 -> 3.9-4.1,
 * 4096^2 6.2-6.7 -> 3.3-3.4; uint8 -> bfloat16 4000^2 5.8-6.1 -> 5.2-5.4,
 * 4096^2 5.9-6.3 -> 3.9-4.0; float32 -> float16 2880^2 3.28-3.40 ->
 * 2.50-2.52, 4000^2 8.4-8.9 -> 4.6-5.5, 4096^2 9.5-10.2 -> 5.8-6.1;
 * float32 -> bfloat16 2880^2 3.27-4.72 -> 2.84-3.01, 4000^2 9.35-9.84 ->
 * 6.38-7.06, 4096^2 10.42-11.18 -> 6.89-7.49; uint16 -> float32 2048^2
 * 1.97-2.22 -> 1.16-1.37, 2880^2 4.63-5.18 -> 2.28-2.37, 4096^2
 * 12.5-13.5 -> 5.5-6.2 (two threads, two rounds, 2880^2 2.39-2.74 ->
 * 1.33-1.49); float16 -> float32 2880^2 5.1-5.5 -> 2.36-2.48, 4096^2
 * 13.9-16.2 -> 4.96-5.30; bfloat16 -> float32 2880^2 4.48-4.56 ->
 * 2.19-2.34, 4096^2 11.7-13.8 -> 4.89-5.05. With ordinary stores
 * (float16, median of 21): uint8 -> float16 1024^2 0.24-0.25 ->
 * 0.19-0.20, 1536^2 0.49-0.52 -> 0.44-0.46, 2048^2 0.96-1.23 ->
 * 0.89-0.92, 2880^2 2.0-2.2 -> 1.27-1.40; the other pairs did not gain
 * so (median of 11 for the two not float16): uint8 -> float32 1024^2
 * 0.29 -> 0.32, 2048^2 1.26-1.28 -> 1.59-1.71; float32 -> float16 1536^2
 * 0.80-0.83 -> 0.88-0.90 (2048^2 1.72-1.79 -> 1.34-1.61); uint8 ->
 * bfloat16 1536^2 0.48-0.50 -> 0.57-0.59, 2048^2 1.04-1.05 -> 1.15-1.20;
 * uint16 -> float32 (median of 21) 1536^2 0.98-1.01 -> 1.17-1.21, 1800^2
 * 1.41-1.43 -> 1.38-1.48; float16 and bfloat16 -> float32 1536^2
 * 0.96-1.05 -> 1.03-1.06. And streaming below the rule's bound would
 * leave nothing in the cache for the result's next reader, though uint8
 * -> float32 2048^2 ran 0.98-1.00 so
 * (bench/results/2026-12-01-widened-transposes.md,
 * 2026-12-01-half-results-in-one-pass.md). The planes are the last two
 * dims, the first contiguous in the source; dims before them take a
 * plane each as in cast_then_transpose. Result rows must all start on
 * cache lines, as whole lines are written: a result that starts on one,
 * rows a multiple of 64 bytes (or dst0 bytes, a multiple of 64) apart;
 * the ragged edges (the last columns and rows short of a tile) go
 * through convert_impl. Returns false, having done nothing, where that
 * does not hold. */
static bool transposed_in_one_pass(const struct row_ctx *c, char *dst, int64_t dst0, const char *src, int32_t ndim,
                                   const int64_t *shape, const int64_t *bst, const ab__cast_op *op, bool *streamed) {
  if (ndim < 2 || (op->affine && op->channel_dim >= 0)) return false;
  const bool f16 = c->to == K_F16 && c->f16c, from_f16 = c->from == K_F16 && c->f16c; /* float16 through F16C */
  const bool widen = (c->from == K_U8 || c->from == K_I8) && c->path == AB_ARITH_FLOAT32 &&
                     (c->to == K_F32 || f16 || c->to == K_BF16);
  const bool narrow = c->from == K_F32 && (f16 || c->to == K_BF16);
  const bool widen16 = (c->from == K_U16 || c->from == K_I16 || from_f16 || c->from == K_BF16) && c->to == K_F32 &&
                       c->path == AB_ARITH_FLOAT32;
  const ab__widen16_from w16 = c->from == K_I16   ? AB_WIDEN16_I16
                               : c->from == K_F16 ? AB_WIDEN16_F16
                               : c->from == K_BF16 ? AB_WIDEN16_BF16
                                                   : AB_WIDEN16_U16;
  if ((!widen && !narrow && !widen16) || (!c->stream && !(widen && f16))) return false;
  const ab__one_pass_to to = c->to == K_F32 ? AB_ONE_PASS_F32 : c->to == K_F16 ? AB_ONE_PASS_F16 : AB_ONE_PASS_BF16;
  const int64_t tile = widen ? 64 : 32, is = (int64_t)c->in_size, os = (int64_t)c->out_size;
  const int32_t r = ndim - 2; /* the plane's dims: r (contiguous in the source), r + 1 */
  const int64_t na = shape[r], nb = shape[r + 1], sb = bst[r + 1];
  if (bst[r] != is || na < tile || nb < tile || (dst0 != 0 && dst0 % AB_CACHE_LINE != 0) ||
      (uintptr_t)dst % AB_CACHE_LINE != 0)
    return false;
  const int64_t pitch = r == 0 && dst0 != 0 ? dst0 : nb * os, plane = na * nb * os;
  if (pitch % AB_CACHE_LINE != 0) return false;
  int64_t outer = 1, m1 = 1; /* planes; and indices of dims 1..r-1 */
  for (int32_t i = 0; i < r; i++) outer *= shape[i];
  for (int32_t i = 1; i < r; i++) m1 *= shape[i];
  const float a = op->affine ? (float)op->scale : 1.0f, b = op->affine ? (float)op->offset : 0.0f;
  const int64_t ka = na - na % tile, kb = nb - nb % tile; /* the whole tiles' rows and columns */
  int64_t idx[AB_MAX_NDIM] = {0};
  for (int64_t p = 0; p < outer; p++) {
    const char *s = src;
    for (int32_t i = 0; i < r; i++) s += idx[i] * bst[i];
    char *d = dst + (r > 0 && dst0 != 0 ? (p / m1) * dst0 + (p % m1) * plane : p * plane);
    const bool done =
        widen     ? ab__host_widen_8(d, pitch, s, sb, na, nb, c->from == K_I8, to, c->stream, op->affine, a, b)
        : widen16 ? ab__host_widen_16_f32(d, pitch, s, sb, na, nb, w16, c->stream, op->affine, a, b)
                  : ab__host_narrow_f32_16(d, pitch, s, sb, na, nb, to == AB_ONE_PASS_BF16, c->stream, op->affine,
                                           a, b);
    if (!done) {
      if (p == 0) return false; /* the first plane says for all: nothing done */
      convert_impl(d, pitch, s, 2, shape + r, bst + r, op, c->stream, streamed);
    } else {
      *streamed = *streamed || c->stream;
      const int64_t right[2] = {ka, nb - kb}, bottom[2] = {na - ka, nb};
      if (kb < nb) convert_impl(d + kb * os, pitch, s + kb * sb, 2, right, bst + r, op, c->stream, streamed);
      if (ka < na) convert_impl(d + ka * pitch, pitch, s + ka * is, 2, bottom, bst + r, op, c->stream, streamed);
    }
    for (int32_t i = r - 1; i >= 0 && ++idx[i] == shape[i]; i--) idx[i] = 0;
  }
  return true;
}

/* AB_HOST_CAST_STREAMING: 0 never, 1 every result (for tests), unset or
 * auto the rule below. */
static int cast_streaming(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice rules[] = {{"auto", 2}, {"0", 0}, {"1", 1}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_CAST_STREAMING", rules, 2, "auto, 0 or 1", NULL);
}

/* Casts whose source and result together would not stay in the
 * last-level cache stream; smaller ones gain by ordinary stores, which
 * leave the result there for its next reader. A VM's sysfs names the
 * whole socket's cache, of which its cores get a share: the Intel Xeon VM
 * above reports 480 MiB, and there uint8 -> float32 (one thread, source
 * warm, the result's pool block reused), GB/s of result, ran 22-24 with
 * ordinary stores against 18-20 streamed at 8-16 MiB of result (10-20
 * MiB in all), about even at 20 MiB, and 15-17 against 19.5-20 at 24-32
 * MiB (30-40 in all); on two threads the two crossed at 16-20 MiB of
 * result. Reading the result back after the cast, the same order. So the
 * bound is capped at 24 MiB (bench/results/2026-11-27-cast-streaming.md).
 * The image path (u8_planes_f32) streamed from 4 MiB of result before:
 * 1280 x 720 x 3 ran 19.4-20.4 GB/s streamed, 23.0-23.2 now. */
#define CAST_STREAM_CAP ((size_t)24 << 20)

size_t ab__host_cast_stream_min(void) {
  const size_t lo = ab__host_stream_min(), llc = ab__host_llc_bytes();
  if (lo == SIZE_MAX) return SIZE_MAX;
  const size_t b = llc == 0 || llc > CAST_STREAM_CAP ? CAST_STREAM_CAP : llc;
  return b < lo ? lo : b;
}

/* Results a quarter of their source or less (float32 -> uint8) keep
 * ordinary stores, which is how they ran before: streamed, float32 ->
 * uint8 * 255 of a 2160 x 3840 x 3 image was slower in two of three sets
 * of alternated rounds on the VM above (4.3-4.5 GB/s against 4.5-4.7 in
 * four rounds; 2.9-4.1 against 4.1-4.4 in three) and faster in one
 * (4.3-4.5 against 4.2-4.3). float64 -> float32 and float32 -> bfloat16
 * ran the same either way, float32 -> float16 8.5-9.4 against 7.8-8.3. */
bool ab__host_cast_streams(DLDataType from, DLDataType to, size_t whole) {
  const int rule = cast_streaming();
  if (rule != 2) return rule == 1;
  return whole >= ab__host_cast_stream_min() && ab__elsize(to) * 4 > ab__elsize(from);
}

void ab__host_convert_into(void *dst, int64_t dst0, const void *src, int32_t ndim, const int64_t *shape,
                           const int64_t *byte_strides, const ab__cast_op *op, size_t whole) {
  if (whole == 0) {
    whole = ab__elsize(op->from) + ab__elsize(op->to);
    for (int32_t i = 0; i < ndim; i++) whole *= (size_t)shape[i];
  }
  const bool stream = ab__host_cast_streams(op->from, op->to, whole);
  bool streamed = false;
  convert_impl(dst, dst0, src, ndim, shape, byte_strides, op, stream, &streamed);
  if (stream) ab__host_stream_fence(); /* the streamed lines before the caller's stores */
  if (streamed) atomic_fetch_add_explicit(&streamed_calls, 1, memory_order_relaxed);
}

static void convert_impl(void *dst, int64_t dst0, const void *src, int32_t ndim, const int64_t *shape,
                         const int64_t *byte_strides, const ab__cast_op *op, bool stream, bool *streamed) {
  struct row_ctx c;
  c.from = kind_of(op->from);
  c.to = kind_of(op->to);
  c.affine = op->affine;
  c.path = arith_of(c.from, c.to, op->affine);
  c.odd = !op->affine && (c.from == K_I64 || c.from == K_U64) && (c.to == K_F32 || c.to == K_F16 || c.to == K_BF16);
  c.out_size = ab__elsize(op->to);
  c.in_size = ab__elsize(op->from);
  c.f16 = c.from == K_F16 || c.to == K_F16;
  c.f16c = c.f16 && ab__host_f16c();
  c.widen16 = f16_to_f32_bits;
  c.narrow16 = f32_to_f16_bits;
#ifdef HAVE_X86
  if (c.f16c) {
    c.widen16 = f16_to_f32_f16c;
    c.narrow16 = f32_to_f16_all;
  }
#endif
  c.fast = fast_row(c.from, c.to, c.f16c);
  c.stream = stream;
  c.prefetch = c.to != K_F16 && cast_prefetch();
  c.streamed = streamed;
  const double one = 1, zero = 0;
  const double *sc = op->channel_scale, *of = op->channel_offset;
  double ts = op->scale, to = op->offset;

  for (int32_t i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  if (ndim == 0) {
    convert_row(&c, dst, src, 1, 0, &ts, &to, false);
    return;
  }
  /* The image path stores through float pointers: a destination of
   * ab_convert_into off a float's alignment takes the loops below, which
   * store bytes. */
  if (c.from == K_U8 && c.path == AB_ARITH_FLOAT32 && (op->channel_dim <= 0 || !op->affine) &&
      (uintptr_t)dst % _Alignof(float) == 0 &&
      u8_planes_f32(dst, dst0, src, ndim, shape, byte_strides, op, sc, of, stream, streamed))
    return;
  const int32_t inner = ndim - 1;
  const int64_t n = shape[inner], ss = byte_strides[inner];
  if (ss != (int64_t)c.in_size && transposed_in_one_pass(&c, dst, dst0, src, ndim, shape, byte_strides, op, streamed))
    return;
  if (ss != (int64_t)c.in_size && cast_then_transpose(&c, dst, dst0, src, ndim, shape, byte_strides, op)) return;
  if ((ss != (int64_t)c.in_size || n < 16) && convert_in_chunks(&c, dst, dst0, src, ndim, shape, byte_strides, op))
    return;
  const bool chan = op->channel_dim >= 0 && op->affine;
  int64_t idx[AB_MAX_NDIM] = {0};
  char *d = dst;
  const size_t row_bytes = (size_t)n * c.out_size;
  for (;;) {
    const char *s = (const char *)src;
    for (int32_t k = 0; k < inner; k++) s += idx[k] * byte_strides[k];
    if (chan && op->channel_dim == inner) {
      /* The channel changes along the row: per-element arrays (NULL ones
       * stand for 1 and 0, handled by a short loop per element). */
      if (sc != NULL && of != NULL) {
        convert_row(&c, d, s, n, ss, sc, of, true);
      } else {
        for (int64_t i = 0; i < n; i++)
          convert_row(&c, d + (size_t)i * c.out_size, s + i * ss, 1, 0, sc ? &sc[i] : &one, of ? &of[i] : &zero,
                      false);
      }
    } else if (chan) {
      const int64_t ch = idx[op->channel_dim];
      convert_row(&c, d, s, n, ss, sc ? &sc[ch] : &one, of ? &of[ch] : &zero, false);
    } else {
      convert_row(&c, d, s, n, ss, &ts, &to, false);
    }
    d += row_bytes;
    int32_t k = inner - 1;
    for (; k >= 0; k--) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
    if (k < 0) return;
    if (k == 0 && dst0 != 0) d = (char *)dst + idx[0] * dst0; /* the next plane of dim 0 */
  }
}
