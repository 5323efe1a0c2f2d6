/* The host strided gather. Strategy, chosen per call after the dims are
 * simplified (size-1 dims dropped, dims that are contiguous with their
 * inner neighbour merged), so that many layouts reduce to few cases:
 *   1. one contiguous run                       -> one memcpy
 *   2. contiguous innermost dim                 -> memcpy per row
 *   3. some outer dim is contiguous in the source (a permuted layout:
 *      transposes, HWC -> CHW)                  -> blocked 2-D transpose
 *   4. anything else (broadcast, reversed, gaps)-> strided element loop
 * Element moves are bit copies specialised for 1, 2, 4, 8 and 16 bytes. */
#define _DEFAULT_SOURCE 1 /* madvise, MADV_HUGEPAGE */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "arraybridge/arraybridge.h"
#include "gather.h"
#include "src/element.h"
#include "src/internal.h"


typedef struct dims {
  int n;
  int64_t shape[AB_MAX_NDIM];
  int64_t st[AB_MAX_NDIM]; /* source byte strides */
} dims;

static void simplify(dims *d, int32_t ndim, const int64_t *shape, const int64_t *st) {
  d->n = ab__merge_dims(ndim, shape, st, d->shape, d->st);
  AB_ASSUME(d->n >= 0 && d->n <= AB_MAX_NDIM);
}

/* ---- strided element loops -------------------------------------------- */

#define DEFINE_STRIDED(N)                                                        \
  static void strided_##N(char *d, const char *s, int64_t n, int64_t st) {       \
    for (int64_t i = 0; i < n; i++) memcpy(d + i * (N), s + i * st, (N));        \
  }
DEFINE_STRIDED(1)
DEFINE_STRIDED(2)
DEFINE_STRIDED(4)
DEFINE_STRIDED(8)
DEFINE_STRIDED(16)

static void strided_any(char *d, const char *s, int64_t n, int64_t st, size_t es) {
  switch (es) {
  case 1: strided_1(d, s, n, st); return;
  case 2: strided_2(d, s, n, st); return;
  case 4: strided_4(d, s, n, st); return;
  case 8: strided_8(d, s, n, st); return;
  case 16: strided_16(d, s, n, st); return;
  default:
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * es, s + i * st, es);
  }
}

/* ---- odometer over the outer dims --------------------------------------
 * Calls fn for every index of dims[0..n) except those listed in `skip`,
 * with the matching source and destination byte offsets. */
typedef void (*visit_fn)(void *ctx, char *d, const char *s);

static void for_outer(const dims *d, const int64_t *dst_st, uint64_t skip, char *dst,
                      const char *src, visit_fn fn, void *ctx) {
  int64_t idx[AB_MAX_NDIM] = {0};
  int k[AB_MAX_NDIM], m = 0;
  for (int i = 0; i < d->n; i++)
    if (!(skip >> i & 1)) k[m++] = i;
  for (;;) {
    fn(ctx, dst, src);
    int j = m - 1;
    for (; j >= 0; j--) {
      int i = k[j];
      if (++idx[i] < d->shape[i]) {
        src += d->st[i];
        dst += dst_st[i];
        break;
      }
      src -= d->st[i] * (d->shape[i] - 1);
      dst -= dst_st[i] * (d->shape[i] - 1);
      idx[i] = 0;
    }
    if (j < 0) return;
  }
}

/* ---- case 2: contiguous rows ------------------------------------------ */

struct rows_ctx { size_t row_bytes; };
static void visit_row(void *ctx, char *d, const char *s) {
  memcpy(d, s, ((struct rows_ctx *)ctx)->row_bytes);
}

/* ---- case 4: strided rows --------------------------------------------- */

struct strided_ctx { int64_t n, st; size_t es; };
static void visit_strided(void *ctx, char *d, const char *s) {
  struct strided_ctx *c = ctx;
  strided_any(d, s, c->n, c->st, c->es);
}

/* An output whose innermost dim is not contiguous (a band of one row of
 * every plane, in ab__host_gather_into): element by element both ways. */
struct scatter_ctx { int64_t n, st, dst; size_t es; };
static void visit_scatter(void *ctx, char *d, const char *s) {
  struct scatter_ctx *c = ctx;
  for (int64_t i = 0; i < c->n; i++) memcpy(d + i * c->dst, s + i * c->st, c->es);
}

/* ---- case 3: blocked 2-D transpose ------------------------------------
 * dst[a][b] = src[a][b] where, in bytes, dst(a, b) = a * dsa + b * es and
 * src(a, b) = a * es + b * sb: `a` is contiguous in the source, `b` in the
 * destination. The source is walked in strips of TILE_B rows, each cut into
 * TILE_A-column tiles; inside a tile, register micro-kernels transpose 8 x 8
 * (AVX) or 4 x 4 (SSE) blocks of 4-byte elements, 2 x 2 blocks of 8-byte
 * ones, and 16 x 16 uint8 (SSE2; with AVX2 and AVX-512, two or four such
 * blocks side by side at once) and 8 x 8 uint16 blocks; with AVX-512,
 * where the destination rows start on lines, uint8, uint16 and 8-byte
 * tiles that store whole lines instead (tr64x64_8 or tr64x64_8_lanes,
 * tr32x32_16, tr8x8_64; the L2 blocks below have AVX-512 kernels of
 * their own). Large outputs
 * may use non-temporal stores, as memcpy does, so the destination is not
 * read for ownership and does not evict the source: where the CPU gains
 * by them (ab__host_transpose_mode, below), through buffered L1 tiles or
 * L2 blocks that write whole lines (transpose_streamed,
 * transpose_blocked).
 * Measured on the 2-core CI machine (bench/results/): strips of 64-128 rows
 * beat 16 and 32 for the plain tiles. */
#define TILE_A 64
#define TILE_B 128

/* A cache line's bytes (gather.h), by the short name the kernels use. */
#define LINE AB_CACHE_LINE

#ifdef __x86_64__ /* the file is GNU C throughout (attributes, builtins) */
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86_KERNELS 1
/* Whether rows pitch bytes apart from d all start on cache lines: where
 * they do, a 64-byte store writes one line whole instead of parts of two. */
static inline bool on_lines(const char *d, int64_t pitch) { return ((uintptr_t)d | (uintptr_t)pitch) % LINE == 0; }
/* 4x4 tile of 4-byte elements: four source rows (fixed b, a..a+3) become
 * four destination rows (fixed a, b..b+3). */
static inline void tr4x4_32(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m128 r0 = _mm_loadu_ps((const float *)(const void *)(s + 0 * sb));
  __m128 r1 = _mm_loadu_ps((const float *)(const void *)(s + 1 * sb));
  __m128 r2 = _mm_loadu_ps((const float *)(const void *)(s + 2 * sb));
  __m128 r3 = _mm_loadu_ps((const float *)(const void *)(s + 3 * sb));
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps((float *)(void *)(d + 0 * dsa), r0);
  _mm_storeu_ps((float *)(void *)(d + 1 * dsa), r1);
  _mm_storeu_ps((float *)(void *)(d + 2 * dsa), r2);
  _mm_storeu_ps((float *)(void *)(d + 3 * dsa), r3);
}
/* 8x8 tile of 4-byte elements with AVX (unpack, shuffle, lane permute). */
__attribute__((target("avx"))) static void tr8x8_32(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(const void *)(s + i * sb));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i + 0] = _mm256_shuffle_ps(t[i + 0], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i + 0], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps((float *)(void *)(d + i * dsa), _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps((float *)(void *)(d + (i + 4) * dsa), _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}
/* 16x16 tile of 4-byte elements with AVX-512: every load and store a whole
 * 64-byte line (where the rows are line-aligned). Unpacking 32- and
 * 64-bit pairs leaves 4x4 blocks in the 128-bit lanes; two rounds of lane
 * shuffles put each block where its destination row wants it (r[k] ends
 * as destination row k). */
__attribute__((target("avx512f"))) static void tr16x16_32(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(s + i * sb));
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0xdd);
  }
  for (int k = 0; k < 16; k++) _mm512_storeu_si512((void *)(d + k * dsa), r[k]);
}
/* The byte and uint16 tiles, written once for every register width: the
 * SSE2 network below runs in every 128-bit lane of a V register at once
 * (W: its intrinsics' prefix), lane L holding elements 16L / es.. of each
 * source row, so one load takes 16, 32 or 64 bytes of a row and each
 * shuffle does the work of one, two or four; lane L of a result is one
 * 16-byte destination row, stored by itself (the byte tiles' STORE_LANES,
 * `apart` bytes between the lanes' rows) or joined with others (the
 * uint16 network's users). ATTR is the target the wider ones need. */
#define ST_LANES_128(p, v, apart) _mm_storeu_si128((__m128i *)(void *)(p), (v))
#define LOAD_128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define ST_LANES_256(p, v, apart)                                                                  \
  do {                                                                                             \
    _mm_storeu_si128((__m128i *)(void *)(p), _mm256_castsi256_si128(v));                           \
    _mm_storeu_si128((__m128i *)(void *)((p) + (apart)), _mm256_extracti128_si256(v, 1));          \
  } while (0)
#define ST_LANES_512(p, v, apart)                                                                  \
  do {                                                                                             \
    _mm_storeu_si128((__m128i *)(void *)(p), _mm512_castsi512_si128(v));                           \
    _mm_storeu_si128((__m128i *)(void *)((p) + (apart)), _mm512_extracti32x4_epi32(v, 1));         \
    _mm_storeu_si128((__m128i *)(void *)((p) + 2 * (apart)), _mm512_extracti32x4_epi32(v, 2));     \
    _mm_storeu_si128((__m128i *)(void *)((p) + 3 * (apart)), _mm512_extracti32x4_epi32(v, 3));     \
  } while (0)
#define LOAD_256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOAD_512(p) _mm512_loadu_si512((const void *)(p))

/* One stage of the unpack networks below, over n registers: pairs
 * in[g + k] and in[g + dist + k] in groups of 2 * dist and interleaves
 * them in units of BITS, the low halves to out[g + 2k], the high halves to
 * out[g + 2k + 1]. */
#define UNPACK_STAGE(W, BITS, out, in, n, dist)                                                     \
  for (int g = 0; g < (n); g += 2 * (dist))                                                        \
    for (int k = 0; k < (dist); k++) {                                                             \
      out[g + 2 * k] = W##_unpacklo_epi##BITS(in[g + k], in[g + (dist) + k]);                     \
      out[g + 2 * k + 1] = W##_unpackhi_epi##BITS(in[g + k], in[g + (dist) + k]);                 \
    }

/* 16x16 tiles of bytes, lane by lane: 16 source rows of 16 * lanes bytes
 * -> 16 * lanes destination rows of 16 bytes. Stage w (1, 2, 4, 8 bytes)
 * pairs groups of w rows and interleaves them in units of w bytes, so each
 * register holds 2w-row slices of 16 / 2w columns: after the 8-, 16- and
 * 32-bit stages t[g + c] holds columns 2c and 2c+1 of rows g..g+7, and the
 * 64-bit stage joins the two row halves into whole columns. The network
 * leaves in lane L of h[k] destination row k + 16L. */
#define DEFINE_NET_8(NAME, ATTR, V, W, LOAD)                                                        \
  ATTR static inline void NAME##_regs(V h[16], V r[16]) {                                          \
    V t[16];                                                                                       \
    UNPACK_STAGE(W, 8, t, r, 16, 1)                                                                \
    UNPACK_STAGE(W, 16, r, t, 16, 2)                                                               \
    UNPACK_STAGE(W, 32, t, r, 16, 4)                                                               \
    UNPACK_STAGE(W, 64, h, t, 16, 8)                                                               \
  }                                                                                                \
  ATTR static inline void NAME(V h[16], const char *s, int64_t sb) {                               \
    V r[16];                                                                                       \
    for (int i = 0; i < 16; i++) r[i] = LOAD(s + i * sb);                                          \
    NAME##_regs(h, r);                                                                             \
  }
/* The byte network's results stored lane by lane (STORE_LANES). */
#define DEFINE_WIDE_8(NAME, NET, ATTR, V, STORE_LANES)                                              \
  ATTR static inline void NAME(char *d, int64_t dsa, const char *s, int64_t sb) {                  \
    V h[16];                                                                                       \
    NET(h, s, sb);                                                                                 \
    for (int k = 0; k < 16; k++) STORE_LANES(d + k * dsa, h[k], 16 * dsa);                         \
  }

/* 8x8 tiles of 2-byte elements, lane by lane: 8 source rows (fixed b,
 * a..a+8*lanes-1) -> 8 * lanes destination rows (fixed a, b..b+7), by
 * unpacking 16-, 32- and 64-bit pairs in turn. The network leaves in lane
 * L of h[k] destination row k + 8L. */
#define DEFINE_NET_16(NAME, ATTR, V, W, LOAD)                                                       \
  ATTR static inline void NAME##_regs(V h[8], V r[8]) {                                            \
    V t[8], u[8];                                                                                  \
    UNPACK_STAGE(W, 16, t, r, 8, 1)                                                                \
    UNPACK_STAGE(W, 32, u, t, 8, 2)                                                                \
    UNPACK_STAGE(W, 64, h, u, 8, 4)                                                                \
  }                                                                                                \
  ATTR static inline void NAME(V h[8], const char *s, int64_t sb) {                                \
    V r[8];                                                                                        \
    for (int i = 0; i < 8; i++) r[i] = LOAD(s + i * sb);                                           \
    NAME##_regs(h, r);                                                                             \
  }
/* SSE2 (every x86-64), the plain and L1 tiles' and the narrow ones' of
 * the blocks. Wider: a 16 x 64 byte tile is 64 shuffles where four 16 x 16
 * tiles are 256. Measured on the Intel Xeon VM
 * (bench/results/2026-11-25-wide-tiles.md): uint8 12 GB/s (SSE2), 22
 * (AVX2), 30 (AVX-512) in L1, a 4096^2 transpose 6.0, 7.0 and 7.0 GB/s.
 * uint16 ran 14, 22 and 32 GB/s in L1 but slower than SSE2 in whole
 * transposes there (8.7 against 8.0-8.3 GB/s at 4096^2, 5.9 against
 * 3.9-5.2 at 8192^2), so the L1 tiles keep the SSE2 one, and so do the
 * plain tiles but where wide_off_lines or line_tiles say otherwise; the L2
 * blocks use an AVX-512 16 x 32 one (join16x32_16: tr16x32_16, faster on
 * the EPYC, and on Intel CPUs strip_fill_u16), and the plain tiles a
 * 32 x 32 one where output rows start on lines (tr32x32_16). */
DEFINE_NET_8(net16x16_8, , __m128i, _mm, LOAD_128)
DEFINE_NET_8(net16x32_8, __attribute__((target("avx2"))), __m256i, _mm256, LOAD_256)
DEFINE_NET_8(net16x64_8, __attribute__((target("avx512f,avx512bw"))), __m512i, _mm512, LOAD_512)
DEFINE_WIDE_8(tr16x16_8, net16x16_8, , __m128i, ST_LANES_128)
DEFINE_WIDE_8(tr16x32_8, net16x32_8, __attribute__((target("avx2"))), __m256i, ST_LANES_256)
DEFINE_WIDE_8(tr16x64_8, net16x64_8, __attribute__((target("avx512f,avx512bw"))), __m512i, ST_LANES_512)
/* The 16 x 64 byte tile on a ragged edge: pa <= 64 destination rows by
 * pb <= 16 columns, through masked loads (the bytes past pa of each of
 * the pb source rows, and the rows past pb, are not read) and masked
 * 16-byte stores (pb bytes of each of the pa rows). Edges of sizes that
 * are not multiples of 16 went element by element before: a 1000-wide
 * plane has 8 such columns and rows in every strip; at 300^2 (12 of each)
 * they took over a third of the time (perf, Intel Xeon VM). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void tr16x64_8_part(char *d, int64_t dsa, const char *s,
                                                                                int64_t sb, int64_t pa, int64_t pb) {
  const __mmask64 in = pa >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << pa) - 1;
  const __mmask16 out = (__mmask16)((1u << pb) - 1);
  __m512i r[16], h[16];
  for (int i = 0; i < 16; i++) r[i] = i < pb ? _mm512_maskz_loadu_epi8(in, s + i * sb) : _mm512_setzero_si512();
  net16x64_8_regs(h, r);
  for (int k = 0; k < 16 && k < pa; k++) {
    _mm_mask_storeu_epi8(d + k * dsa, out, _mm512_castsi512_si128(h[k]));
    if (k + 16 < pa) _mm_mask_storeu_epi8(d + (k + 16) * dsa, out, _mm512_extracti32x4_epi32(h[k], 1));
    if (k + 32 < pa) _mm_mask_storeu_epi8(d + (k + 32) * dsa, out, _mm512_extracti32x4_epi32(h[k], 2));
    if (k + 48 < pa) _mm_mask_storeu_epi8(d + (k + 48) * dsa, out, _mm512_extracti32x4_epi32(h[k], 3));
  }
}
/* A line joined from four 16-byte pieces, `apart` bytes from each other
 * from p (each 16-byte aligned): the uint8 kernels' rows, kept as pieces
 * of 16-row tiles (tr64x64_8, blk_stream_strips). */
__attribute__((target("avx512f"))) static inline __m512i join_pieces(const char *p, size_t apart) {
  __m512i v = _mm512_castsi128_si512(_mm_load_si128((const __m128i *)(const void *)p));
  v = _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(const void *)(p + apart)), 1);
  v = _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(const void *)(p + 2 * apart)), 2);
  return _mm512_inserti32x4(v, _mm_load_si128((const __m128i *)(const void *)(p + 3 * apart)), 3);
}
/* A 64 x 64 piece's four 16 x 64 networks into scr, whole registers
 * (prefetch: the next 64 source columns of its rows, for the groups'
 * streamed walk, band_u8_grouped). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void piece_u8_fill(char *scr, const char *s,
                                                                                     int64_t sb, bool prefetch) {
  for (int j = 0; j < 4; j++) {
    __m512i h[16];
    if (prefetch)
      for (int q = 0; q < 16; q++) _mm_prefetch(s + (16 * j + q) * sb + 64, _MM_HINT_T0);
    net16x64_8(h, s + 16 * j * sb, sb);
    for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(scr + j * 1024 + 64 * k), h[k]);
  }
}
/* Output row r of a piece filled by piece_u8_fill: lane r / 16 of each
 * network's h[r % 16]. */
__attribute__((target("avx512f"))) static inline __m512i piece_u8_row(const char *scr, int r) {
  return join_pieces(scr + (r & 15) * 64 + (r >> 4) * 16, 1024);
}
/* 64 x 64 bytes with AVX-512 into destination rows that start on lines:
 * four 16 x 64 tiles (source rows 16j..16j+15) kept in an L1 scratch as
 * whole registers, then each destination row joined from its four
 * 16-byte pieces (lane L of h[k] is row k + 16L) and stored as one line.
 * The 16 x 64 tile writes 16 bytes into each of 64 rows, so each line of
 * the output is written by four tiles in turn, and where the rows are a
 * power of two apart the 64 lines share 4 of L1's sets and leave it
 * between the turns. Intel Xeon (Cascade Lake) VM, one thread, plain
 * tiles, of memcpy: bench_host 1024^2 0.27-0.29x -> 0.42-0.43x, 1536^2
 * 0.46-0.48x -> 0.64-0.65x; a harness 512^2 0.43-0.46x -> 0.60-0.67x,
 * 1920 x 1080 0.51x -> 0.58-0.60x. Rows off lines (1040^2) lost a third
 * with it: each store there is two lines' writes. The L1 tiles' buffer
 * (transpose_streamed) is on lines and takes it too: forced to them,
 * 4096^2 0.61x -> 0.62x, 2048^2 0.34-0.35x -> 0.36x. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void tr64x64_8(char *d, int64_t dsa, const char *s,
                                                                           int64_t sb) {
  _Alignas(64) char scr[4 * 16 * 64];
  piece_u8_fill(scr, s, sb, false);
  for (int r = 0; r < 64; r++) _mm512_storeu_si512((void *)(d + r * dsa), piece_u8_row(scr, r));
}
/* The same 64 x 64 bytes with the lanes gathered as the source is read:
 * in four passes, one for each 16 source columns, register i holds 16
 * bytes of source rows i, i + 16, i + 32 and i + 48 (a load and three
 * inserts), so the 16 x 16 network within each lane leaves each register
 * a whole destination row, stored as it is: no scratch written and read
 * back, the inserts moved from the scratch to the source. Intel Xeon
 * (AMX) VM, one tile over and over in L1, ns a tile: 123 -> 90 with
 * rows 64 bytes apart, 160 -> 130 with 1536. But each source line is
 * read in all four passes and must stay in L1 between them: with rows
 * 1024 bytes apart the 64 lines fall in 4 of L1's sets, and this tile
 * lost (189 -> 203 ns; 4096: 240 -> 326), so u8_lanes decides by the
 * source's pitch (the callers ask it once for each plane). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void lanes_pass(__m512i h[16], const char *s,
                                                                                  int64_t sb, int c) {
  __m512i r[16];
  for (int i = 0; i < 16; i++) {
    const char *p = s + i * sb + 16 * c;
    __m512i v = _mm512_castsi128_si512(LOAD_128(p));
    v = _mm512_inserti32x4(v, LOAD_128(p + 16 * sb), 1);
    v = _mm512_inserti32x4(v, LOAD_128(p + 32 * sb), 2);
    r[i] = _mm512_inserti32x4(v, LOAD_128(p + 48 * sb), 3);
  }
  net16x64_8_regs(h, r); /* lane L of h[k]: column 16c + k of source rows 16L .. 16L + 15 */
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void tr64x64_8_lanes(char *d, int64_t dsa, const char *s,
                                                                                 int64_t sb) {
  for (int c = 0; c < 4; c++) {
    __m512i h[16];
    lanes_pass(h, s, sb, c);
    for (int k = 0; k < 16; k++) _mm512_storeu_si512((void *)(d + (16 * c + k) * dsa), h[k]);
  }
}
/* ---- uint8 tiles into destination rows off lines (AVX-512 VBMI) ----
 * Where uint8 destination rows do not start on lines, tile_u8_avx512 has
 * tr16x64_8 write 16 bytes into each of 64 rows, most of them across two
 * lines. strip_u8_shifted instead walks a strip of 64 destination rows
 * left to right in 64 x 64 tiles (either kind above, by u8_lanes, into an
 * L1 scratch; the other half of the scratch keeps the tile before), and
 * cuts each row's next whole line from its two tiles' rows by one byte
 * permute, stored on its line; each row's first partial line and its
 * last are masked stores. In the plain tiles only, planes (or a thread's
 * bands) of SHIFTED_MIN bytes or more, 64 rows and two tiles wide or
 * more, take it (tile_u8_shifted).
 * Intel Xeon (AMX) VM, one thread, of one-thread memcpy, a harness, three
 * alternated rounds against tr16x64_8 (AB_HOST_TILES=avx512): 1000^2
 * 0.38-0.45x -> 0.49-0.58x, a 1080 x 1920 array (output rows 1080 bytes
 * apart) 0.49-0.51x -> 0.56-0.58x, 1500^2 0.38-0.48x -> 0.48-0.66x, 2000^2
 * 0.48-0.51x -> 0.55-0.61x, a 700 x 900 array 0.27-0.34x -> 0.33-0.45x, 520^2
 * 0.29-0.30x -> 0.32-0.33x, 400^2 even; bench_host's 1080 x 1920 uint8
 * row 0.49-0.51x -> 0.59-0.61x. Before SHIFTED_MIN, 300^2 and 200 x 300
 * lost 11-14%. Taking each tile's rows straight from registers, with no
 * scratch, lost to tr16x64_8 (1080 x 1920 0.33-0.45x, where tr16x64_8 ran
 * 0.49-0.73x in the same rounds). The
 * same walk with uint16's 32 x 32 tile lost to the SSE2 and 16 x 32 tiles
 * (1000^2 0.77x -> 0.55x), so uint16 keeps them
 * (bench/results/2026-12-02-u8-rows-off-lines.md). */
#define SHIFTED_MIN ((int64_t)128 << 10)
/* Bytes 0, 1, ..., 63: the index of a byte permute that takes a register
 * whole (strip_u8_shifted, stream_seg_vbmi add a shift to it). */
#define IOTA_64                                                                                    \
  _mm512_set_epi64(0x3f3e3d3c3b3a3938, 0x3736353433323130, 0x2f2e2d2c2b2a2928, 0x2726252423222120, \
                   0x1f1e1d1c1b1a1918, 0x1716151413121110, 0x0f0e0d0c0b0a0908, 0x0706050403020100)
/* 64 destination rows dsa bytes apart from d (off lines), their first
 * nb / 64 * 64 columns (nb >= 64), from source rows sb bytes apart. A row's h bytes
 * up to its first line go first; after tile j, the line made of the last
 * 64 - h bytes of the row's piece of tile j - 1 and the first h of tile
 * j's; after the last tile, the last 64 - h bytes of its piece (all 64
 * where h is 0: those rows are on lines, and every line is a piece). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static void strip_u8_shifted(char *d, int64_t dsa,
                                                                                         const char *s, int64_t sb,
                                                                                         int64_t nb, bool lanes) {
  _Alignas(64) char scr[2][64 * LINE]; /* tile j's rows in scr[j & 1] */
  _Alignas(64) uint8_t idx[64][LINE];  /* row k's permute: bytes h .. h + 63 of two pieces side by side */
  uint8_t h[64];
  const __m512i iota = IOTA_64;
  for (int k = 0; k < 64; k++) {
    h[k] = (uint8_t)(-(uintptr_t)(d + k * dsa) & (LINE - 1));
    _mm512_store_si512((void *)idx[k], _mm512_add_epi8(iota, _mm512_set1_epi8((char)h[k])));
  }
  const int64_t tiles = nb / 64;
  for (int64_t j = 0; j < tiles; j++) {
    char *const cur = scr[j & 1], *const prev = scr[(j + 1) & 1];
    (lanes ? tr64x64_8_lanes : tr64x64_8)(cur, LINE, s + j * 64 * sb, sb);
    for (int k = 0; k < 64; k++) {
      char *const row = d + k * dsa;
      const __m512i piece = _mm512_load_si512((const void *)(cur + k * LINE));
      if (j == 0) {
        if (h[k]) _mm512_mask_storeu_epi8(row, ((__mmask64)1 << h[k]) - 1, piece);
        continue;
      }
      const __m512i before = _mm512_load_si512((const void *)(prev + k * LINE));
      _mm512_store_si512((void *)(row + h[k] + LINE * (j - 1)),
                         _mm512_permutex2var_epi8(before, _mm512_load_si512((const void *)idx[k]), piece));
    }
  }
  const char *const last = scr[(tiles - 1) & 1];
  for (int k = 0; k < 64; k++) {
    const __m512i rest = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)(last + k * LINE)),
                                                  _mm512_load_si512((const void *)idx[k]), _mm512_setzero_si512());
    const __mmask64 m = h[k] ? ((__mmask64)1 << (LINE - h[k])) - 1 : ~(__mmask64)0;
    _mm512_mask_storeu_epi8(d + k * dsa + h[k] + LINE * (tiles - 1), m, rest);
  }
}
static bool u8_lanes(int64_t sb);
/* Where uint8 destination rows start on lines a multiple of U8_GROUP_PITCH
 * apart, U8_GROUP 64 x 64 pieces side by side go through an L1 scratch,
 * and then each of the 64 destination rows takes its U8_GROUP lines in a
 * row. One piece alone writes a line into each of 64 rows: rows 2 KiB or
 * more apart put those lines in one or two of L1's sets (and few of
 * L2's), and each line's write waited for the last's. AMD EPYC (Zen 5)
 * VM, one thread, three alternated rounds, plain tiles forced: 2048^2
 * 16.4-16.7 -> 27.8-30.9 GB/s, 4096^2 5.4-5.6 -> 11.9-12.4; as picked
 * (the plain tiles, under the streaming threshold), 1024 rows of 2048:
 * 13.1-17.6 -> 21.7-30.9. A walk of the pieces with no shuffles, 2048^2:
 * 11.7-11.9 GB/s a line per row, 42.6-45.2 with 4 or 8 lines in a row.
 * In groups, rows 1 KiB apart were even, and rows of other lengths lost
 * (512^2 42.8-44.3 -> 27.9-40.5, 1536^2 32.9-35.9 -> 28.0-31.7), so they
 * keep a piece at a time
 * (bench/results/2026-12-04-amd-uint16-strips-and-line-walk.md). The
 * plain tiles' strips of such rows are 64 * U8_GROUP columns wide
 * (visit_transpose), so that a call holds whole groups. */
#define U8_GROUP 8
#define U8_GROUP_PITCH ((int64_t)2048)
static inline bool u8_grouped(const char *d, int64_t dsa) { return on_lines(d, dsa) && dsa % U8_GROUP_PITCH == 0; }
/* 64 destination rows dsa bytes apart from d (u8_grouped), their first
 * nb / 64 * 64 columns, U8_GROUP pieces at a time; returns those columns.
 * A function of its own so that only its callers' stacks hold the
 * scratch. */
__attribute__((target("avx512f,avx512bw,avx512vl"), noinline)) static int64_t
band_u8_grouped(char *d, int64_t dsa, const char *s, int64_t sb, int64_t nb, bool nt) {
  _Alignas(64) char grp[U8_GROUP][4 * 16 * 64]; /* piece k, as piece_u8_fill leaves it */
  int64_t b = 0;
  while (nb - b >= 64) {
    const int64_t g = (nb - b) / 64 < U8_GROUP ? (nb - b) / 64 : U8_GROUP;
    for (int64_t k = 0; k < g; k++) piece_u8_fill(grp[k], s + (b + 64 * k) * sb, sb, nt);
    for (int r = 0; r < 64; r++)
      for (int64_t k = 0; k < g; k++) {
        const __m512i line = piece_u8_row(grp[k], r);
        if (nt) _mm512_stream_si512((void *)(d + r * dsa + b + 64 * k), line);
        else _mm512_store_si512((void *)(d + r * dsa + b + 64 * k), line);
      }
    b += 64 * g;
  }
  return b;
}
/* A uint8 tile with AVX-512: 64 x 64 pieces where the destination rows
 * start on lines (tr64x64_8_lanes where `lanes`: u8_lanes' answer for
 * sb; else in groups where u8_grouped), 64 x 16 pieces elsewhere, the
 * ragged ones masked. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void tile_u8_avx512(char *d, int64_t dsa, const char *s,
                                                                                int64_t sb, int64_t na, int64_t nb,
                                                                                bool lanes) {
  const bool lines = on_lines(d, dsa), grouped = !lanes && u8_grouped(d, dsa);
  for (int64_t a = 0; a < na; a += 64) {
    int64_t b = 0;
    if (grouped && na - a >= 64 && nb >= 64) b = band_u8_grouped(d + a * dsa, dsa, s + a, sb, nb, false);
    else if (lines && na - a >= 64)
      for (; nb - b >= 64; b += 64)
        (lanes ? tr64x64_8_lanes : tr64x64_8)(d + a * dsa + b, dsa, s + a + b * sb, sb);
    for (; b < nb; b += 16) {
      const int64_t pa = na - a < 64 ? na - a : 64, pb = nb - b < 16 ? nb - b : 16;
      if (pa == 64 && pb == 16) tr16x64_8(d + a * dsa + b, dsa, s + a + b * sb, sb);
      else tr16x64_8_part(d + a * dsa + b, dsa, s + a + b * sb, sb, pa, pb);
    }
  }
}
DEFINE_NET_16(net8x8_16, , __m128i, _mm, LOAD_128)
DEFINE_NET_16(net8x32_16, __attribute__((target("avx512f,avx512bw"))), __m512i, _mm512, LOAD_512)
static inline void tr8x8_16(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m128i h[8];
  net8x8_16(h, s, sb);
  for (int k = 0; k < 8; k++) _mm_storeu_si128((__m128i *)(void *)(d + k * dsa), h[k]);
}
/* 16 x 32 tile of uint16 with AVX-512: rows 0-7 (h0, from the 8 x 8
 * network four lanes wide) and rows 8-15 (h1), each destination row's
 * two 16-byte halves joined (vpermt2q): v[2k] holds destination rows k
 * and k + 8 (its low and high 32 bytes), v[2k + 1] rows k + 16 and
 * k + 24. */
__attribute__((target("avx512f,avx512bw"))) static inline void join16x32_16(__m512i v[16], const __m512i h0[8],
                                                                           const __m512i h1[8]) {
  const __m512i lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int k = 0; k < 8; k++) {
    v[2 * k] = _mm512_permutex2var_epi64(h0[k], lo, h1[k]);
    v[2 * k + 1] = _mm512_permutex2var_epi64(h0[k], hi, h1[k]);
  }
}
/* The 16 x 32 tile into destination rows 32 bytes at a time, for the L2
 * blocks where they do not keep strips (see strip_fill_u16). */
__attribute__((target("avx512f,avx512bw"))) static void tr16x32_16(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m512i h[2][8], v[16];
  net8x32_16(h[0], s, sb);
  net8x32_16(h[1], s + 8 * sb, sb);
  join16x32_16(v, h[0], h[1]);
  for (int k = 0; k < 8; k++) {
    _mm256_storeu_si256((__m256i *)(void *)(d + k * dsa), _mm512_castsi512_si256(v[2 * k]));
    _mm256_storeu_si256((__m256i *)(void *)(d + (k + 8) * dsa), _mm512_extracti64x4_epi64(v[2 * k], 1));
    _mm256_storeu_si256((__m256i *)(void *)(d + (k + 16) * dsa), _mm512_castsi512_si256(v[2 * k + 1]));
    _mm256_storeu_si256((__m256i *)(void *)(d + (k + 24) * dsa), _mm512_extracti64x4_epi64(v[2 * k + 1], 1));
  }
}
/* 32 x 32 tile of uint16 with AVX-512 into destination rows that start on
 * lines, for the plain tiles: two 16 x 32 tiles (the same network and
 * joins as join16x32_16, written out here: through join16x32_16 gcc 12
 * spills registers to the stack in this kernel, and the plain tiles'
 * speed was measured with this code), the first kept in an L1 scratch,
 * each destination row's two
 * 32-byte halves then joined and stored as one line. The SSE2 8 x 8 tile
 * the plain tiles use elsewhere stores 16 bytes of a row at a time, and
 * 16 x 32 tiles (32 bytes) gained nothing or lost in some shapes on
 * lines (off lines they serve where wide_off_lines says). Intel
 * Xeon (Cascade Lake) VM, one thread, of memcpy: 512^2 0.42x -> 0.62x,
 * 1024^2 0.51x -> 0.69x, 1536 x 1024 0.56x -> 0.70x, 1920 x 1080
 * (output rows 1920 wide) 0.67x -> 0.78x, 1280 x 720 0.72x -> 0.74x. */
#define DEFINE_TR32X32_16(NAME, ATTR, PARAMS, NET, STORE)                                          \
  ATTR static void NAME(char *d, int64_t dsa, const char *s, int64_t sb PARAMS) {                  \
    __m512i h[2][8];                                                                               \
    _Alignas(64) char scr[16 * 64];                                                                \
    const __m512i lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4); \
    NET(h[0], s);                                                                                  \
    NET(h[1], s + 8 * sb);                                                                         \
    for (int k = 0; k < 8; k++) {                                                                  \
      _mm512_store_si512((void *)(scr + 128 * k), _mm512_permutex2var_epi64(h[0][k], lo, h[1][k])); \
      _mm512_store_si512((void *)(scr + 128 * k + 64), _mm512_permutex2var_epi64(h[0][k], hi, h[1][k])); \
    }                                                                                              \
    NET(h[0], s + 16 * sb);                                                                        \
    NET(h[1], s + 24 * sb);                                                                        \
    for (int k = 0; k < 8; k++) {                                                                  \
      const __m512i a = _mm512_permutex2var_epi64(h[0][k], lo, h[1][k]),                          \
                    b = _mm512_permutex2var_epi64(h[0][k], hi, h[1][k]);                          \
      const __m512i pa = _mm512_load_si512((const void *)(scr + 128 * k)),                        \
                    pb = _mm512_load_si512((const void *)(scr + 128 * k + 64));                   \
      STORE(d + k * dsa, _mm512_shuffle_i64x2(pa, a, 0x44));                                       \
      STORE(d + (k + 8) * dsa, _mm512_shuffle_i64x2(pa, a, 0xee));                                 \
      STORE(d + (k + 16) * dsa, _mm512_shuffle_i64x2(pb, b, 0x44));                                \
      STORE(d + (k + 24) * dsa, _mm512_shuffle_i64x2(pb, b, 0xee));                                \
    }                                                                                              \
  }
#define TR32_NO_PARAMS
#define TR32_NET(h, p) net8x32_16(h, p, sb)
#define TR32_STORE(p, v) _mm512_storeu_si512((void *)(p), v)
DEFINE_TR32X32_16(tr32x32_16, __attribute__((target("avx512f,avx512bw"))), TR32_NO_PARAMS, TR32_NET, TR32_STORE)
#undef TR32_NO_PARAMS
#undef TR32_NET
#undef TR32_STORE

/* The uint8 groups' walk (band_u8_grouped) for uint16: U16_GROUP 32 x 32
 * pieces (tr32x32_16, each into its 2 KiB of an L1 scratch), then each of
 * the 32 destination rows takes its U16_GROUP lines in a row, where those
 * rows start on lines a multiple of U8_GROUP_PITCH apart (u8_grouped) and
 * the whole-line tile goes (line_tiles; AB_HOST_LINE_TILES=0 turns both
 * off). One tr32x32_16 alone writes a line into each of 32 such rows,
 * which share one or two of L1's sets. AMD EPYC (Zen 5) VM, one thread,
 * three alternated rounds, GB/s: plain tiles forced, 2048^2 8.5-11.1 ->
 * 9.5-15.4, 4096^2 4.3-4.5 -> 5.9-6.1; as picked, 512 x 2048 (rows 4 KiB
 * apart, the plain tiles) 10.7-14.5 -> 18.9-23.6, 1024 x 3072 17.3-19.2
 * -> 20.4-20.9, 1024 x 4096 20.4-21.9 -> 22.1-24.4; 1024^2 (2 KiB)
 * 15.8-22.7 -> 20.6-21.6. 16 pieces a group were no better
 * (bench/results/2026-12-04-amd-uint16-groups.md). */
#define U16_GROUP 8
/* 32 destination rows dsa bytes apart from d, their first nb / 32 * 32
 * columns, U16_GROUP pieces at a time, streamed where nt (and then the
 * next band's source lines prefetched); returns those columns. */
__attribute__((target("avx512f,avx512bw"), noinline)) static int64_t band_u16_grouped(char *d, int64_t dsa,
                                                                                     const char *s, int64_t sb,
                                                                                     int64_t nb, bool nt) {
  _Alignas(64) char grp[U16_GROUP][32 * LINE];
  int64_t b = 0;
  while (nb - b >= 32) {
    const int64_t g = (nb - b) / 32 < U16_GROUP ? (nb - b) / 32 : U16_GROUP;
    for (int64_t k = 0; k < g; k++) {
      const char *const sk = s + (b + 32 * k) * sb;
      if (nt)
        for (int q = 0; q < 32; q++) _mm_prefetch(sk + q * sb + LINE, _MM_HINT_T0);
      tr32x32_16(grp[k], LINE, sk, sb);
    }
    for (int r = 0; r < 32; r++)
      for (int64_t k = 0; k < g; k++) {
        const __m512i line = _mm512_load_si512((const void *)(grp[k] + r * LINE));
        if (nt) _mm512_stream_si512((void *)(d + r * dsa + 2 * b + LINE * k), line);
        else _mm512_store_si512((void *)(d + r * dsa + 2 * b + LINE * k), line);
      }
    b += 32 * g;
  }
  return b;
}

/* 16 float32 as bfloat16, as convert.c's fast_to_bf16 makes each: the
 * top half of the bits rounded to nearest even (a carry into the exponent
 * overflows to infinity), a NaN its top half made quiet (| 0x40). */
__attribute__((target("avx512f,avx512bw"))) static inline __m256i bf16_of(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v), top = _mm512_srli_epi32(bits, 16);
  const __m512i even = _mm512_and_si512(top, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), even), 16);
  const __m512i quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, quiet));
}
/* 16 float32 as float16 by VCVTPS2PH, rounded to nearest even as F16C's
 * loop in convert.c rounds (f32_to_f16_f16c: the same instruction, NaNs
 * and subnormals alike), or as bfloat16 (bf16_of). */
__attribute__((target("avx512f,avx512bw"))) static inline __m256i half_of(__m512 v, bool bf16) {
  return bf16 ? bf16_of(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* 8 source rows of 32 float32 (two lines each; x * a + b first where
 * affine: a multiply, then an add, -ffp-contract=off) narrowed to float16
 * or bfloat16 (half_of), through the 8 x 32 uint16 network. */
__attribute__((target("avx512f,avx512bw"))) static inline void net8x32_f32_16(__m512i h[8], const char *s, int64_t sb,
                                                                              bool affine, bool bf16, __m512 a,
                                                                              __m512 b) {
  __m512i r[8];
  for (int i = 0; i < 8; i++) {
    __m512 x = _mm512_loadu_ps((const void *)(s + i * sb)), y = _mm512_loadu_ps((const void *)(s + i * sb + 64));
    if (affine) {
      x = _mm512_add_ps(_mm512_mul_ps(x, a), b);
      y = _mm512_add_ps(_mm512_mul_ps(y, a), b);
    }
    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(half_of(x, bf16)), half_of(y, bf16), 1);
  }
  net8x32_16_regs(h, r);
}
/* One line of a one-pass cast's result: streamed (nt) or stored. */
__attribute__((target("avx512f"))) static inline void put_line(void *p, __m512i v, bool nt) {
  if (nt) _mm512_stream_si512(p, v);
  else _mm512_store_si512(p, v);
}
/* 32 x 32 of a float32 transpose narrowed to float16 or bfloat16 on the
 * way in and each destination row's 64 bytes written out as one line,
 * streamed where nt (rows dsa bytes apart, all on lines): tr32x32_16 with
 * net8x32_f32_16's rows (see ab__host_narrow_f32_16). */
#define NARROW_PARAMS , bool affine, bool bf16, bool nt, __m512 fa, __m512 fb
#define NARROW_NET(h, p) net8x32_f32_16(h, p, sb, affine, bf16, fa, fb)
#define NARROW_STORE(p, v) put_line((void *)(p), v, nt)
DEFINE_TR32X32_16(narrow32x32_f32_16, __attribute__((target("avx512f,avx512bw"))), NARROW_PARAMS, NARROW_NET,
                  NARROW_STORE)
#undef NARROW_PARAMS
#undef NARROW_NET
#undef NARROW_STORE
/* The two lines at s of each of `rows` rows sb bytes apart, into L1 (a
 * hint: no fault, whatever the addresses). */
static inline void prefetch_next_f32(const char *s, int64_t sb, int rows) {
  for (int j = 0; j < rows; j++) {
    _mm_prefetch(s + j * sb, _MM_HINT_T0);
    _mm_prefetch(s + j * sb + 64, _MM_HINT_T0);
  }
}
/* Every whole 32 x 32 tile of a plane, down the source 64 rows at a time
 * (two tiles at each step along it, so each destination row gets two
 * lines in a row, not one: streamed lines wanted two a row in the uint8
 * tiles, bench/results/2026-12-01-l1-tiles-and-dead-ends.md), then a last
 * band of 32 where the rows leave one. Each step first asks for the next
 * step's two lines of each of its rows (into L1): without it, float32
 * sources with rows 16000 and 16384 bytes apart mostly ran slower in one
 * pass than through the buffer (Intel Xeon (AMX) VM, one thread, ms,
 * two rounds, without -> with, buffered: 4000^2 10.0-10.4 -> 4.3-4.4,
 * 8.1-8.2; 4096^2 7.6-11.0 -> 5.5-5.6, 8.4-9.5; 2880^2 2.4-2.5 either
 * way, 3.2-3.3; two and four steps ahead no better;
 * bench/results/2026-12-01-widened-transposes.md, raw section 6). */
__attribute__((target("avx512f,avx512bw"))) static void narrow_tiles_f32_16(void *dst, int64_t pitch, const void *src,
                                                                            int64_t sb, int64_t na, int64_t nb, bool bf16,
                                                                            bool nt, bool affine, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  char *d = dst;
  const char *s = src;
  int64_t b0 = 0;
  for (; b0 + 64 <= nb; b0 += 64)
    for (int64_t a0 = 0; a0 + 32 <= na; a0 += 32) {
      if (a0 + 64 <= na) prefetch_next_f32(s + (a0 + 32) * 4 + b0 * sb, sb, 64);
      narrow32x32_f32_16(d + a0 * pitch + b0 * 2, pitch, s + a0 * 4 + b0 * sb, sb, affine, bf16, nt, va, vb);
      narrow32x32_f32_16(d + a0 * pitch + b0 * 2 + 64, pitch, s + a0 * 4 + (b0 + 32) * sb, sb, affine, bf16,
                         nt, va, vb);
    }
  if (b0 + 32 <= nb)
    for (int64_t a0 = 0; a0 + 32 <= na; a0 += 32) {
      if (a0 + 64 <= na) prefetch_next_f32(s + (a0 + 32) * 4 + b0 * sb, sb, 32);
      narrow32x32_f32_16(d + a0 * pitch + b0 * 2, pitch, s + a0 * 4 + b0 * sb, sb, affine, bf16, nt, va, vb);
    }
}
/* 16 elements of 16 bits (in h) as float32, as convert.c's loops make
 * them: uint16 and int16 exactly; float16 by VCVTPH2PS (a NaN quiet, its
 * sign and payload kept); bfloat16 as the top half of the bits, a NaN
 * made quiet (fast_from_bf16). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 float_of_16(__m256i h,
                                                                                       ab__widen16_from from) {
  switch (from) {
  case AB_WIDEN16_I16: return _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(h));
  case AB_WIDEN16_F16: return _mm512_cvtph_ps(h);
  case AB_WIDEN16_BF16: {
    const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(bits, nan, bits, _mm512_set1_epi32(0x00400000)));
  }
  default: return _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(h));
  }
}
/* One destination row of a 32 x 32 tile of 16-bit elements, 32 values in
 * v, widened to float32 (float_of_16; then x * a + b where affine, a
 * multiply, then an add) and written as two lines at p, streamed where
 * nt. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void widen_row_16(char *p, __m512i v,
                                                                                    ab__widen16_from from,
                                                                                    bool affine, bool nt, __m512 a,
                                                                                    __m512 b) {
  __m512 x = float_of_16(_mm512_castsi512_si256(v), from), y = float_of_16(_mm512_extracti64x4_epi64(v, 1), from);
  if (affine) {
    x = _mm512_add_ps(_mm512_mul_ps(x, a), b);
    y = _mm512_add_ps(_mm512_mul_ps(y, a), b);
  }
  put_line(p, _mm512_castps_si512(x), nt);
  put_line(p + 64, _mm512_castps_si512(y), nt);
}
/* 32 x 32 of a transpose of 16-bit elements widened to float32 on the
 * way out: tr32x32_16's network and joins, each destination row's 32
 * values then widened and written as two lines (widen_row_16; rows dsa
 * bytes apart, all on lines). */
#define WIDEN16_PARAMS , ab__widen16_from from, bool affine, bool nt, __m512 fa, __m512 fb
#define WIDEN16_NET(h, p) net8x32_16(h, p, sb)
#define WIDEN16_STORE(p, v) widen_row_16(p, v, from, affine, nt, fa, fb)
DEFINE_TR32X32_16(widen32x32_16_f32, __attribute__((target("avx512f,avx512bw,avx512vl"))), WIDEN16_PARAMS,
                  WIDEN16_NET, WIDEN16_STORE)
#undef WIDEN16_PARAMS
#undef WIDEN16_NET
#undef WIDEN16_STORE
/* Every whole 32 x 32 tile of a plane, down the source a band of 32 rows
 * at a time and along each band. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void widen_tiles_16_f32(void *dst, int64_t pitch,
                                                                                   const void *src, int64_t sb,
                                                                                   int64_t na, int64_t nb,
                                                                                   ab__widen16_from from, bool nt,
                                                                                   bool affine, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t b0 = 0; b0 + 32 <= nb; b0 += 32)
    for (int64_t a0 = 0; a0 + 32 <= na; a0 += 32)
      widen32x32_16_f32((char *)dst + a0 * pitch + b0 * 4, pitch, (const char *)src + a0 * 2 + b0 * sb, sb, from,
                        affine, nt, va, vb);
}
/* 64 x 64 bytes of a uint8 (or int8: sign) transpose widened on the way
 * out to float32, float16 or bfloat16 (`to`), x * a + b where affine (in
 * float32: a multiply, then an add, as the cast loops compute it,
 * -ffp-contract=off; then rounded to nearest even as half_of rounds),
 * each destination row's 64 values written as four whole lines to d
 * (two for 16-bit results; rows dsa bytes apart, all on lines), streamed
 * where nt. The lanes are gathered as in tr64x64_8_lanes, so nothing is
 * stored but the result, also where u8_lanes would join a plain tile's
 * rows from a scratch instead: with source rows 4096 bytes apart this
 * still ran 1.4-1.7x the chunked way (convert.c, transposed_in_one_pass). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void widen64x64_8(char *d, int64_t dsa, const char *s,
                                                                              int64_t sb, bool sign,
                                                                              ab__one_pass_to to, bool nt, bool affine,
                                                                              __m512 a, __m512 b) {
  for (int c = 0; c < 4; c++) {
    __m512i h[16];
    lanes_pass(h, s, sb, c);
    for (int k = 0; k < 16; k++) {
      char *row = d + (16 * c + k) * dsa;
      /* the lanes by constant index: the extract's lane is an immediate */
      const __m128i xs[4] = {_mm512_castsi512_si128(h[k]), _mm512_extracti32x4_epi32(h[k], 1),
                             _mm512_extracti32x4_epi32(h[k], 2), _mm512_extracti32x4_epi32(h[k], 3)};
      __m512 v[4];
      for (int q = 0; q < 4; q++) {
        v[q] = _mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(xs[q]) : _mm512_cvtepu8_epi32(xs[q]));
        if (affine) v[q] = _mm512_add_ps(_mm512_mul_ps(v[q], a), b);
      }
      if (to == AB_ONE_PASS_F32) {
        for (int q = 0; q < 4; q++) put_line(row + 64 * q, _mm512_castps_si512(v[q]), nt);
      } else {
        const bool bf16 = to == AB_ONE_PASS_BF16;
        for (int q = 0; q < 4; q += 2)
          put_line(row + 32 * q,
                   _mm512_inserti64x4(_mm512_castsi256_si512(half_of(v[q], bf16)), half_of(v[q + 1], bf16), 1), nt);
      }
    }
  }
}
/* Every whole tile of a plane, down the source a band of 64 rows at a
 * time and along each band: the L1 tiles' walk (transpose_streamed). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void widen_tiles_8(void *dst, int64_t pitch,
                                                                               const void *src, int64_t sb, int64_t na,
                                                                               int64_t nb, bool sign,
                                                                               ab__one_pass_to to, bool nt,
                                                                               bool affine, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  const int64_t os = to == AB_ONE_PASS_F32 ? 4 : 2;
  for (int64_t b0 = 0; b0 + 64 <= nb; b0 += 64)
    for (int64_t a0 = 0; a0 + 64 <= na; a0 += 64)
      widen64x64_8((char *)dst + a0 * pitch + b0 * os, pitch, (const char *)src + a0 + b0 * sb, sb, sign, to, nt,
                   affine, va, vb);
}
/* 2x2 tile of 8-byte elements. */
static inline void tr2x2_64(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)s);
  __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)(s + sb));
  _mm_storeu_si128((__m128i *)(void *)d, _mm_unpacklo_epi64(r0, r1));
  _mm_storeu_si128((__m128i *)(void *)(d + dsa), _mm_unpackhi_epi64(r0, r1));
}

/* 8x8 tile of 8-byte elements with AVX-512, whole lines in and out: pairs
 * of rows unpacked, then two rounds of 128-bit lane shuffles gather each
 * column's four row pairs. Used by the L2 blocks, and by the plain
 * tiles where output rows start on lines (visit_transpose). */
__attribute__((target("avx512f"))) static void tr8x8_64(char *d, int64_t dsa, const char *s, int64_t sb) {
  __m512i r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = LOAD_512(s + i * sb);
  for (int i = 0; i < 8; i += 2) { /* lane L of t[i + h]: column 2L + h of rows i, i+1 */
    t[i] = _mm512_unpacklo_epi64(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi64(r[i], r[i + 1]);
  }
  for (int h = 0; h < 2; h++) {
    const __m512i u0 = _mm512_shuffle_i64x2(t[h], t[2 + h], 0x88), u1 = _mm512_shuffle_i64x2(t[h], t[2 + h], 0xdd);
    const __m512i v0 = _mm512_shuffle_i64x2(t[4 + h], t[6 + h], 0x88), v1 = _mm512_shuffle_i64x2(t[4 + h], t[6 + h], 0xdd);
    _mm512_storeu_si512((void *)(d + h * dsa), _mm512_shuffle_i64x2(u0, v0, 0x88));
    _mm512_storeu_si512((void *)(d + (4 + h) * dsa), _mm512_shuffle_i64x2(u0, v0, 0xdd));
    _mm512_storeu_si512((void *)(d + (2 + h) * dsa), _mm512_shuffle_i64x2(u1, v1, 0x88));
    _mm512_storeu_si512((void *)(d + (6 + h) * dsa), _mm512_shuffle_i64x2(u1, v1, 0xdd));
  }
}
#endif

#define DEFINE_TILE(N)                                                             \
  static void tile_##N(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, \
                       int64_t nb) {                                               \
    for (int64_t a = 0; a < na; a++)                                               \
      for (int64_t b = 0; b < nb; b++)                                             \
        memcpy(d + a * dsa + b * (N), s + a * (N) + b * sb, (N));                  \
  }
DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(4)
DEFINE_TILE(8)
DEFINE_TILE(16)

typedef void (*micro_fn)(char *d, int64_t dsa, const char *s, int64_t sb);

typedef void (*scalar_fn)(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb);

#ifdef HAVE_X86_KERNELS
/* Runs a micro-kernel that takes wa destination rows by wb columns over the
 * largest such multiple of an na x nb tile, and the scalar tile on the
 * ragged right and bottom edges. */
static void tile_micro(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb,
                       int64_t es, int64_t wa, int64_t wb, micro_fn micro, scalar_fn scalar) {
  int64_t ka = na - na % wa, kb = nb - nb % wb;
  for (int64_t a = 0; a < ka; a += wa)
    for (int64_t b = 0; b < kb; b += wb) micro(d + a * dsa + b * es, dsa, s + a * es + b * sb, sb);
  if (kb < nb) scalar(d + kb * es, dsa, s + kb * sb, sb, ka, nb - kb);
  if (ka < na) scalar(d + ka * dsa, dsa, s + ka * es, sb, na - ka, nb);
}

/* A wide kernel (wa rows) over the rows it covers whole, then the square
 * one (wb x wb) over the rest. */
static void tile_wide(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb, int64_t es,
                      int64_t wa, int64_t wb, micro_fn wide, micro_fn square, scalar_fn scalar) {
  const int64_t ka = na - na % wa;
  tile_micro(d, dsa, s, sb, ka, nb, es, wa, wb, wide, scalar);
  tile_micro(d + ka * dsa, dsa, s + ka * es, sb, na - ka, nb, es, wb, wb, square, scalar);
}
#endif

/* The widest kernels this CPU runs, capped by AB_HOST_TILES (sse2, ssse3,
 * avx, avx2, avx512, avx512vbmi or auto; the tests force each): SSE2 (every x86-64:
 * 4x4 float32, 8x8 uint16 and 16x16 uint8 tiles), SSSE3, AVX (8x8
 * float32 tiles), AVX2 (uint8 tiles two lanes wide) or AVX-512 (F, BW and
 * VL: four lanes wide, uint8 masked on ragged edges and joined into
 * whole lines where output rows start on them; the L2 blocks' float32,
 * float64 and uint16 kernels; whole-line uint16 and 8-byte tiles in the
 * plain tiles where output rows start on lines; streamed lines joined and
 * written 64 bytes at a time) or AVX-512 with VBMI (as AVX-512, and the
 * uint8 pixels-to-planes kernel, and the strip-layout blocks' rows off
 * lines cut by byte permutes, stream_seg_vbmi, and the plain tiles'
 * uint8 rows off lines cut the same way, strip_u8_shifted); the L1 tiles' 2- and
 * 8-byte kernels, and the plain tiles' on the whole-line tiles' ragged
 * edges and where output rows are off lines (but uint16's where
 * wide_off_lines says: the 16 x 32 AVX-512 tile), are SSE2. The pixel and plane loops
 * are compiled for SSE2, SSSE3 (AVX runs those too), AVX2 and AVX-512. */
enum { TILES_SSE2 = AB_TILES_SSE2, TILES_SSSE3 = AB_TILES_SSSE3, TILES_AVX = AB_TILES_AVX, TILES_AVX2 = AB_TILES_AVX2,
       TILES_AVX512 = AB_TILES_AVX512, TILES_AVX512VBMI = AB_TILES_AVX512VBMI };
#ifdef HAVE_X86_KERNELS
/* The widest kernels the CPU runs, at most cap. libgcc's answers include
 * the operating system's: AVX and AVX-512 count only where it saves their
 * registers. */
static int tiles_capped(int cap) {
  const bool ssse3 = __builtin_cpu_supports("ssse3"), avx = ssse3 && __builtin_cpu_supports("avx"),
             avx2 = avx && __builtin_cpu_supports("avx2"),
             avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl"),
             vbmi = avx512 && __builtin_cpu_supports("avx512vbmi");
  int cpu = vbmi     ? TILES_AVX512VBMI
            : avx512 ? TILES_AVX512
            : avx2   ? TILES_AVX2
            : avx    ? TILES_AVX
            : ssse3  ? TILES_SSSE3
                     : TILES_SSE2;
  return cap < cpu ? cap : cpu;
}
static int tiles_level(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice caps[] = {
      {"auto", TILES_AVX512VBMI}, {"avx512vbmi", TILES_AVX512VBMI}, {"avx512", TILES_AVX512}, {"avx2", TILES_AVX2},
      {"avx", TILES_AVX},         {"ssse3", TILES_SSSE3},           {"sse2", TILES_SSE2},     {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_TILES", caps, TILES_AVX512VBMI,
                               "auto, avx512vbmi, avx512, avx2, avx, ssse3 or sse2", tiles_capped);
}
#endif

/* An element size's micro-kernel where the CPU has one (SSE2 or AVX
 * registers), else its portable tile loop. lanes: uint8 with AVX-512,
 * u8_lanes' answer for sb (tile_u8_avx512); false for the others. */
#ifdef HAVE_X86_KERNELS
#define TILE_MICRO(es, w, kernel, tile) tile_micro(d, dsa, s, sb, na, nb, (es), (w), (w), (kernel), (tile))
#define TILE_WIDE(es, wa, w, wide, square, tile) tile_wide(d, dsa, s, sb, na, nb, (es), (wa), (w), (wide), (square), (tile))
#else
#define TILE_MICRO(es, w, kernel, tile) tile(d, dsa, s, sb, na, nb)
#define TILE_WIDE(es, wa, w, wide, square, tile) tile(d, dsa, s, sb, na, nb)
#endif

static void tile_any(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb,
                     size_t es, bool lanes) {
#ifdef HAVE_X86_KERNELS
  const int level = tiles_level();
#else
  (void)lanes;
#endif
  switch (es) {
  case 1:
#ifdef HAVE_X86_KERNELS
    if (level >= TILES_AVX512) {
      tile_u8_avx512(d, dsa, s, sb, na, nb, lanes);
      return;
    }
    if (level >= TILES_AVX2) {
      TILE_WIDE(1, 32, 16, tr16x32_8, tr16x16_8, tile_1);
      return;
    }
#endif
    TILE_MICRO(1, 16, tr16x16_8, tile_1);
    return;
  case 2:
    TILE_MICRO(2, 8, tr8x8_16, tile_2);
    return;
  case 4:
#ifdef HAVE_X86_KERNELS
    if (level < TILES_AVX) {
      TILE_MICRO(4, 4, tr4x4_32, tile_4);
      return;
    }
#endif
    TILE_MICRO(4, 8, tr8x8_32, tile_4);
    return;
  case 8: TILE_MICRO(8, 2, tr2x2_64, tile_8); return;
  case 16: tile_16(d, dsa, s, sb, na, nb); return;
  default:
    for (int64_t a = 0; a < na; a++)
      for (int64_t b = 0; b < nb; b++) memcpy(d + a * dsa + (size_t)b * es, s + (size_t)a * es + b * sb, es);
  }
}
#undef TILE_MICRO
#undef TILE_WIDE

/* Few rows (a small channel count, as in HWC -> CHW: FEW_ROWS or fewer)
 * from pixels that are not packed (3 channels of RGBA, say; packed ones
 * have the pixel loops below) go by blocks of PIXEL_BLOCK source pixels,
 * each deinterleaved into the rows by tile_N (so that the few output
 * streams and the input stay cached), never by the transposes' tiles. */
#define FEW_ROWS 4
#define PIXEL_BLOCK 4096


/* Pixels and planes: 2, 3 or 4 channels of 1, 2, 4 or 8 bytes, packed
 * pixels (HWC) to planes (CHW) and back. One loop per direction, channel
 * count and element size, which the compiler vectorizes (this file is
 * built at -O3) into whatever shuffles the instruction set has, compiled
 * for four sets and run in the widest that the CPU and AB_HOST_TILES
 * allow. Element-by-element copies ran 0.13-0.66x of memcpy; these, on the
 * EPYC VM (a harness, GCC 12, 2M pixels of each kind, from the cache):
 * SSE2 0.4-1.2x but 0.13x for uint8 with 3 channels, which needs byte
 * shuffles; SSSE3 0.5-1.0x, AVX2 0.5-1.2x, AVX-512 (F, BW) 0.8-1.1x for
 * every kind. The pointers' types allow any alignment. */
#if defined(__GNUC__)
#define HAVE_PIXEL_LOOPS 1
typedef uint8_t px1 __attribute__((aligned(1), may_alias));
typedef uint16_t px2 __attribute__((aligned(1), may_alias));
typedef uint32_t px4 __attribute__((aligned(1), may_alias));
typedef uint64_t px8 __attribute__((aligned(1), may_alias));
/* to_planes: C planes, dsa bytes apart from d, from n packed pixels at s;
 * to_pixels: n packed pixels at d from C planes, sb bytes apart from s. */
typedef void (*planes_fn)(char *d, int64_t dsa, const char *s, int64_t n);
typedef void (*pixels_fn)(char *d, const char *s, int64_t sb, int64_t n);
#define DEFINE_PIXEL_LOOPS(ATTR, SET, T, C)                                                            \
  ATTR static void to_planes_##SET##_##T##_##C(char *d, int64_t dsa, const char *s, int64_t n) {     \
    const T *restrict q = (const T *)(const void *)s;                                                 \
    T *restrict p[C];                                                                                 \
    for (int c = 0; c < (C); c++) p[c] = (T *)(void *)(d + c * dsa);                                   \
    for (int64_t i = 0; i < n; i++)                                                                   \
      for (int c = 0; c < (C); c++) p[c][i] = q[(C) * i + c];                                         \
  }                                                                                                   \
  ATTR static void to_pixels_##SET##_##T##_##C(char *d, const char *s, int64_t sb, int64_t n) {      \
    T *restrict q = (T *)(void *)d;                                                                   \
    const T *restrict p[C];                                                                           \
    for (int c = 0; c < (C); c++) p[c] = (const T *)(const void *)(s + c * sb);                        \
    for (int64_t i = 0; i < n; i++)                                                                   \
      for (int c = 0; c < (C); c++) q[(C) * i + c] = p[c][i];                                         \
  }
#define DEFINE_PIXEL_SIZE(ATTR, SET, T) \
  DEFINE_PIXEL_LOOPS(ATTR, SET, T, 2) DEFINE_PIXEL_LOOPS(ATTR, SET, T, 3) DEFINE_PIXEL_LOOPS(ATTR, SET, T, 4)
#define PIXEL_ROW(SET, T, DIR) {DIR##_##SET##_##T##_2, DIR##_##SET##_##T##_3, DIR##_##SET##_##T##_4}
/* One set's loops: [element size 1, 2, 4, 8][channels 2, 3, 4]. */
struct pixel_loops {
  planes_fn to_planes[4][3];
  pixels_fn to_pixels[4][3];
};
#define DEFINE_PIXEL_SET(ATTR, SET)                                                                     \
  DEFINE_PIXEL_SIZE(ATTR, SET, px1)                                                                     \
  DEFINE_PIXEL_SIZE(ATTR, SET, px2)                                                                     \
  DEFINE_PIXEL_SIZE(ATTR, SET, px4)                                                                     \
  DEFINE_PIXEL_SIZE(ATTR, SET, px8)                                                                     \
  static const struct pixel_loops pixels_##SET = {                                                      \
      {PIXEL_ROW(SET, px1, to_planes), PIXEL_ROW(SET, px2, to_planes), PIXEL_ROW(SET, px4, to_planes),   \
       PIXEL_ROW(SET, px8, to_planes)},                                                                 \
      {PIXEL_ROW(SET, px1, to_pixels), PIXEL_ROW(SET, px2, to_pixels), PIXEL_ROW(SET, px4, to_pixels),   \
       PIXEL_ROW(SET, px8, to_pixels)}};
DEFINE_PIXEL_SET(, base)
#ifdef HAVE_X86_KERNELS
DEFINE_PIXEL_SET(__attribute__((target("ssse3"))), ssse3)
DEFINE_PIXEL_SET(__attribute__((target("avx2"))), avx2)
DEFINE_PIXEL_SET(__attribute__((target("avx512f,avx512bw"))), avx512)
#endif

/* The loops for es-byte elements in the widest set this CPU runs; NULL
 * for other element sizes. */
static const struct pixel_loops *pixel_loops(size_t es, int *size) {
  const int k = es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : es == 8 ? 3 : -1;
  if (k < 0) return NULL;
  *size = k;
#ifdef HAVE_X86_KERNELS
  const int level = tiles_level();
  if (level >= TILES_AVX512) return &pixels_avx512;
  if (level >= TILES_AVX2) return &pixels_avx2;
  if (level >= TILES_SSSE3) return &pixels_ssse3;
#endif
  return &pixels_base;
}
#endif

#ifdef HAVE_X86_KERNELS
/* uint8 pixels of 3 or 4 channels to planes with AVX-512 VBMI byte
 * permutes (Ice Lake, Zen 4 and later), 64 pixels a round, faster than
 * what the compiler makes of the loop above (EPYC VM, a 3840 x 2160
 * frame, from memory: 24 GB/s against 19-20, 0.75-0.83x of memcpy):
 * channel c of pixel i is input byte C*i+c of the 3 or 4 loaded vectors;
 * one two-source permute takes those in the first 128 bytes, a second (of
 * the third vector, or of the last two) the rest, and a blend joins them.
 * The last pixels go through the AVX-512 loop. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void planes_u8_vbmi(char *d, int64_t dsa, const char *s,
                                                                                 int64_t nb, int C) {
  __m512i lo_idx[4], hi_idx[4];
  __mmask64 hi_mask[4];
  for (int c = 0; c < C; c++) {
    _Alignas(64) unsigned char lo[64], hi[64];
    uint64_t m = 0;
    for (int i = 0; i < 64; i++) {
      const int at = C * i + c;
      lo[i] = (unsigned char)(at & 127);
      hi[i] = (unsigned char)(C == 3 ? (at - 128) & 63 : at & 127);
      if (at >= 128) m |= 1ull << i;
    }
    lo_idx[c] = _mm512_load_si512((const void *)lo);
    hi_idx[c] = _mm512_load_si512((const void *)hi);
    hi_mask[c] = (__mmask64)m;
  }
  int64_t b = 0;
  for (; b + 64 <= nb; b += 64) {
    const char *q = s + (int64_t)C * b;
    const __m512i v0 = LOAD_512(q), v1 = LOAD_512(q + 64), v2 = LOAD_512(q + 128);
    const __m512i v3 = C == 4 ? LOAD_512(q + 192) : v2;
    for (int c = 0; c < C; c++) {
      const __m512i lo = _mm512_permutex2var_epi8(v0, lo_idx[c], v1);
      const __m512i hi = C == 3 ? _mm512_permutexvar_epi8(hi_idx[c], v2) : _mm512_permutex2var_epi8(v2, hi_idx[c], v3);
      _mm512_storeu_si512((void *)(d + c * dsa + b), _mm512_mask_blend_epi8(hi_mask[c], lo, hi));
    }
  }
  pixels_avx512.to_planes[0][C - 2](d + b, dsa, s + (int64_t)C * b, nb - b);
}
#endif

/* The streaming variant: whole cache lines out. Streaming stores pay only
 * when each line is written whole and at once: the write-combining buffer
 * then goes to memory without the line ever being read. A tile written
 * straight to the destination writes each output row a register (16-32
 * bytes) at a time, eight rows in turn, and the partial lines that leaves
 * are what made streaming collapse on Intel (issue 18). So a square tile
 * whose rows are SEG bytes (32 x 32 float32, 128 x 128 uint8) is
 * transposed into a buffer that stays in L1, by the same micro-kernels,
 * and each of its rows, SEG bytes of one output row, is then streamed out
 * in whole destination lines (stream_row); the strips run along the output
 * rows (a inner), so the source is read as bands of SEG / es rows walked
 * left to right. Measured on an Intel Xeon VM (4096^2 float32, one
 * thread): 0.41x of memcpy for the plain tiles, 0.9-1.6x for this; 64- and
 * 256-byte rows were slower, and walking the source a column strip at a
 * time (a outer) halved the speed (bench/results/). */
#define SEG 128

#ifdef HAVE_X86_KERNELS
static inline void stream16(char *d, const char *s) {
  _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
}

/* n bytes (whole lines) to line-aligned d, 32 bytes a store: half the
 * store instructions of stream16, which were a bottleneck of their own
 * (a 2048^2 uint8 transpose from cache, Intel Xeon VM: 7.3 -> 10.4 GB/s;
 * 64-byte AVX-512 stores were no faster there; on the AMD EPYC VM they
 * were 3-5% faster, so AVX-512 machines get them). */
__attribute__((target("avx"))) static void stream_lines_avx(char *d, const char *s, size_t n) {
  for (size_t k = 0; k < n; k += 32)
    _mm256_stream_si256((__m256i *)(void *)(d + k), _mm256_loadu_si256((const __m256i *)(const void *)(s + k)));
}

__attribute__((target("avx512f"))) static inline void stream_lines_avx512(char *d, const char *s, size_t n) {
  for (size_t k = 0; k < n; k += 64) _mm512_stream_si512((void *)(d + k), _mm512_loadu_si512((const void *)(s + k)));
}

static void stream_lines(char *d, const char *s, size_t n) {
  const int level = tiles_level();
  if (level >= TILES_AVX512) {
    stream_lines_avx512(d, s, n);
    return;
  }
  if (level >= TILES_AVX) {
    stream_lines_avx(d, s, n);
    return;
  }
  for (size_t k = 0; k < n; k += 16) stream16(d + k, s + k);
}

#endif

void ab__host_stream_lines(void *d, const void *s, size_t n) {
#ifdef HAVE_X86_KERNELS
  stream_lines(d, s, n);
#else
  memcpy(d, s, n);
#endif
}

void ab__host_stream_fence(void) {
#ifdef HAVE_X86_KERNELS
  _mm_sfence();
#endif
}

#ifdef HAVE_X86_KERNELS
/* One tile row: the n bytes at c go to d, the next bytes of an output row.
 * Output rows rarely start on a line (4104 float32: every other row 32
 * bytes in), so a tile row's bytes seldom match the lines they fall in.
 * Whole lines are streamed; the line that straddles this tile and the
 * previous one is joined from `carry`, which holds the previous tile's
 * last LINE bytes of this row (those past its last whole line were not
 * written), and this tile's head; this tile's last LINE bytes wait there
 * for the next. The row's first partial line (first) and last (last) get
 * ordinary stores, and so does the other side of those lines (the
 * neighbouring row's end or start, likewise partial): every line is
 * written all one way, for an ordinary store into a line that streaming
 * stores also write pulls it into the cache and the streaming stores then
 * flush it again (a 1000-wide uint8 plane ran at 0.1 GB/s that way). Tiles
 * other than a row's last are SEG bytes, a whole number of lines, so each
 * finds the row at the same offset in a line as the one before. JOIN
 * writes the straddling line, LINES the whole ones, KEEP this tile's last
 * line into the carry. */
#define DEFINE_STREAM_ROW(NAME, ATTR, JOIN, LINES, KEEP)                                            \
  ATTR static void NAME(char *d, const char *c, size_t n, char *carry, bool first, bool last) {    \
    size_t r = (size_t)(-(uintptr_t)d & (LINE - 1)); /* bytes up to the next line */               \
    if (first) {                                                                                   \
      if (r > n) r = n;                                                                            \
      if (r > 0) memcpy(d, c, r);                                                                  \
    } else if (r > n) { /* the row ends inside the straddling line: all ordinary */               \
      memcpy(d - (LINE - r), carry + r, LINE - r);                                                 \
      memcpy(d, c, n);                                                                             \
      return;                                                                                      \
    } else if (r > 0) {                                                                            \
      JOIN(d - (LINE - r), carry + r, c, r);                                                       \
    }                                                                                              \
    const size_t whole = (n - r) & ~(size_t)(LINE - 1);                                            \
    LINES(d + r, c + r, whole);                                                                    \
    if (last) {                                                                                    \
      if (n > r + whole) memcpy(d + r + whole, c + r + whole, n - r - whole);                      \
    } else if (r > 0) {                                                                            \
      KEEP(carry, c + n - LINE);                                                                   \
    }                                                                                              \
  }

/* The straddling line at `line`: LINE - r carried bytes from `carried`,
 * then this tile's first r bytes from c. */
static inline void join_line(char *line, const char *carried, const char *c, size_t r) {
  if (r % 16 == 0) {
    for (size_t k = 0; k < LINE; k += 16) stream16(line + k, k < LINE - r ? carried + k : c + k - (LINE - r));
  } else {
    _Alignas(16) char joined[LINE];
    memcpy(joined, carried, LINE - r);
    memcpy(joined + LINE - r, c, r);
    for (size_t k = 0; k < LINE; k += 16) stream16(line + k, joined + k);
  }
}

static inline void keep_line(char *carry, const char *last) { memcpy(carry, last, LINE); }

DEFINE_STREAM_ROW(stream_row, , join_line, stream_lines, keep_line)

/* With AVX-512 the straddling line is joined in a register by two masked
 * loads (bytes past the ones it needs are not read) and written with one
 * 64-byte streaming store, not four 16-byte ones, the whole lines go out
 * in one loop and the carried line is kept with one load and store. perf
 * had a third of the time of a blocked transpose with 4000-byte output
 * rows stalled on the first 16-byte store of the joined line (EPYC). The
 * L1 tiles gain as much there (64 MiB, forced to them: 3000^2 uint8
 * 11.5-12.5 -> 20 GB/s, 3001^2 uint16 7.6-7.9 -> 11.9-13.1, 2001^2
 * float64 7.9-9.2 -> 11.8); never measured on an Intel CPU with AVX-512,
 * where the probe still weighs them against the plain tiles. */
__attribute__((target("avx512f,avx512bw"))) static inline void join_line_avx512(char *line, const char *carried,
                                                                                const char *c, size_t r) {
  const __mmask64 own = ~(__mmask64)0 >> r; /* the line's first LINE - r bytes: the carried ones */
  _mm512_stream_si512((void *)line, _mm512_mask_loadu_epi8(_mm512_maskz_loadu_epi8(own, carried), ~own, c - (LINE - r)));
}

__attribute__((target("avx512f"))) static inline void keep_line_avx512(char *carry, const char *last) {
  _mm512_storeu_si512(carry, _mm512_loadu_si512(last));
}

DEFINE_STREAM_ROW(stream_row_avx512, __attribute__((target("avx512f,avx512bw"))), join_line_avx512, stream_lines_avx512,
                  keep_line_avx512)

/* A uint16 tile of the plain tiles into rows where u8_grouped: its bands
 * of 32 rows in groups, the columns and rows after the last whole piece
 * through tile_any. */
static void tile_u16_grouped(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb) {
  const int64_t wa = na / 32 * 32;
  int64_t wb = 0;
  for (int64_t a = 0; a < wa; a += 32) wb = band_u16_grouped(d + a * dsa, dsa, s + 2 * a, sb, nb, false);
  if (wb < nb) tile_any(d + 2 * wb, dsa, s + wb * sb, sb, wa, nb - wb, 2, false);
  if (wa < na) tile_any(d + wa * dsa, dsa, s + 2 * wa, sb, na - wa, nb, 2, false);
}

/* The L1 tiles of uint8 and uint16 into output rows on lines a multiple
 * of 2 KiB apart: the plain tiles' groups (band_u8_grouped,
 * band_u16_grouped) with streaming stores and the next band's source
 * lines prefetched, in strips of U8_GROUP (U16_GROUP) pieces; the
 * columns after the last whole piece and the rows below the last whole
 * band through the plain tiles; taken by visit_transpose instead of
 * transpose_streamed, which writes 128 bytes of a row at a time. AMD
 * EPYC (Zen 5) VM, one thread, three alternated rounds, as picked (the
 * trial now takes these over the blocks for such outputs), uint8: 4096^2
 * 16.0-16.8 -> 19.8-20.8 GB/s, 2048 x 4096 17.3-17.7 -> 20.7-21.8,
 * 2048^2 19.9-20.2 -> 24.1-24.8; 8192^2 (large planes: the blocks)
 * 13.4-13.9 either way
 * (bench/results/2026-12-04-amd-uint16-strips-and-line-walk.md). uint16,
 * the trial's 8 MiB (rows 4 KiB apart), from the cache: 5.8-6.1 ->
 * 15.5-19.2 GB/s, from memory 6.6-6.8 -> 10.6-11.5; the blocks still win
 * from memory (13.4-15.5) and stay picked there
 * (bench/results/2026-12-04-amd-uint16-groups.md). */
static void streamed_grouped(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb, size_t es) {
  const int64_t p = es == 1 ? 64 : 32, w = p * (es == 1 ? U8_GROUP : U16_GROUP), e = (int64_t)es;
  const int64_t wa = na / p * p, wb = nb / p * p;
  ab__host_ran(es == 1 ? AB_RAN_U8_GROUPS : AB_RAN_U16_GROUPS);
  for (int64_t b0 = 0; b0 < wb; b0 += w) {
    const int64_t mb = wb - b0 < w ? wb - b0 : w;
    for (int64_t a0 = 0; a0 < wa; a0 += p)
      (es == 1 ? band_u8_grouped : band_u16_grouped)(d + a0 * dsa + b0 * e, dsa, s + a0 * e + b0 * sb, sb, mb, true);
  }
  if (wb < nb) tile_any(d + wb * e, dsa, s + wb * sb, sb, wa, nb - wb, es, false);
  if (wa < na) tile_any(d + wa * dsa, dsa, s + wa * e, sb, na - wa, nb, es, false);
}

/* carry: LINE bytes for each of the na destination rows. */
static void transpose_streamed(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb,
                               size_t es, char *carry) {
  /* A line before the tile's rows: stream_row_avx512's masked load of a
   * row's head starts up to a line before it (the bytes it does not need
   * are not read, but every address stays in the array). */
  _Alignas(64) char bufs[LINE + SEG * SEG];
  char *const buf = bufs + LINE;
  const int64_t t = SEG / (int64_t)es; /* elements per tile side */
  const bool avx512 = tiles_level() >= TILES_AVX512, lanes = avx512 && es == 1 && u8_lanes(sb); /* the buffer is on lines */
  for (int64_t b0 = 0; b0 < nb; b0 += t) {
    const int64_t mb = nb - b0 < t ? nb - b0 : t;
    for (int64_t a0 = 0; a0 < na; a0 += t) {
      const int64_t ma = na - a0 < t ? na - a0 : t;
      tile_any(buf, SEG, s + a0 * (int64_t)es + b0 * sb, sb, ma, mb, es, lanes);
      for (int64_t a = 0; a < ma; a++)
        (avx512 ? stream_row_avx512 : stream_row)(d + (a0 + a) * dsa + b0 * (int64_t)es, buf + a * SEG,
                                                  (size_t)mb * es, carry + (a0 + a) * LINE, b0 == 0, b0 + mb == nb);
    }
  }
}

/* The blocked variant: the streamed tiles' bytes, a different walk through
 * memory. On an AMD EPYC (Zen 5) VM the L1 tiles above ran at 0.4-0.5x of
 * memcpy (float32 4096^2, one thread), and timing the parts apart showed
 * why: reading a band of source rows in 128-byte pieces a tile at a time
 * is slow there (32 rows: 21-25 GB/s against 37 for a plain read), and
 * the reads and the streamed writes took turns. So a block is up to
 * BLK_COLS source columns (wide blocks: blocks_wide) by SEG bytes of output rows, filled into an L2 buffer
 * 8 or 16 source rows at a time, left to right, so a few rows are read as
 * long runs, and the previous block (the other half of the buffer) is
 * streamed out while this one fills, a share after every chunk, so the
 * reads and the writes overlap (the order of the blocks themselves, and
 * the prefetches, are in transpose_blocked; uint8 blocks on Intel CPUs
 * keep one buffer instead, each block streamed out whole after it fills:
 * blocks_one_buffer). Measured there: float32 4096^2 from 12
 * (plain) and 8-9 GB/s (streamed tiles) to about 18, 0.75x of memcpy
 * (bench/results/2026-11-25-amd-blocked.md). Rows of the buffer are
 * BLK_PITCH apart, a line more than they hold, so the rows a micro-kernel
 * writes do not all fall in one L1 set. Output rows are streamed with
 * stream_row and its carried lines, as above. (uint8 and uint16 with
 * AVX-512 lay the buffer out in strips instead: strip_fill_u8 and
 * strip_fill_u16, below.) */
#define BLK_COLS 1024
#define BLK_PITCH (SEG + LINE)

/* The tiles of a block: with AVX-512, kernels that read whole source
 * lines (from line-aligned rows): 16 x 16 for float32 (the 8 x 8 one took
 * the blocks from 17.5 to 8.7 GB/s on the EPYC), 8 x 8 for float64 (11.1
 * against 7.3 GB/s) and 16 x 32 for uint16 (EPYC, 4096^2, one thread,
 * three runs each: 12.4-15.8 GB/s against 10.5-12.4 with the 8 x 32 tile
 * before it; from L3, 2048^2: 21.8-24.1 against 18.6-19.6) where its
 * blocks keep no strips; uint8, and uint16 on Intel CPUs, have layouts of
 * their own (strip_fill_u8, strip_fill_u16, below); every other case as
 * tile_any. The plain and L1 tiles keep theirs, but for whole-line
 * uint8, uint16 and 8-byte tiles where output rows start on lines (the
 * 8 x 8 float64 one is this one; see visit_transpose): the 16 x 16
 * float32 one measured the same there on the EPYC and on the Intel VM,
 * and the 16 x 32 uint16 one was slower than SSE2 on the Intel VM in
 * whole transposes and mixed in the plain tiles on lines (off lines the
 * plain tiles take it where wide_off_lines says). */
static void tile_block(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb, size_t es,
                       int level) {
  if (level >= TILES_AVX512) {
    if (es == 4) {
      tile_micro(d, dsa, s, sb, na, nb, 4, 16, 16, tr16x16_32, tile_4);
      return;
    }
    if (es == 8) {
      tile_micro(d, dsa, s, sb, na, nb, 8, 8, 8, tr8x8_64, tile_8);
      return;
    }
    if (es == 2) { /* the 16 x 32 kernel over the rows it covers whole, 8 x 8 tiles after */
      const int64_t ka = na - na % 32;
      tile_micro(d, dsa, s, sb, ka, nb, 2, 32, 16, tr16x32_16, tile_2);
      tile_micro(d + ka * dsa, dsa, s + ka * 2, sb, na - ka, nb, 2, 8, 8, tr8x8_16, tile_2);
      return;
    }
  }
  tile_any(d, dsa, s, sb, na, nb, es, false);
}

/* uint8 blocks with AVX-512 keep their buffer in another layout. In the
 * one above, the 16 x 64 tile writes each of its 64 buffer rows 16 bytes
 * (an extract and a store per row), and a row's line is written by four
 * strips in turn, long after the line has left L1: four trips to L2 for
 * every line. Timed apart (Intel Xeon VM, 4096^2, one thread), filling
 * the blocks ran 6.1 GB/s and streaming them out 6.7-7.0, but together
 * 3.4, the sum of their times. Here each strip of 16 source rows has a
 * region of its own, where a tile's 16 result registers go out whole, 64
 * contiguous bytes each (h[k] lane L holds output row k + 16L): filling
 * alone 11.7 GB/s. Output rows are put together from their strips'
 * 16-byte pieces as they are streamed out (strip_at). bench_host, three
 * runs alternated with the old layout: 4096^2 0.63-0.64x -> 0.73-0.77x
 * of memcpy, 8192^2 0.54-0.57x -> 0.63-0.64x, 1536^2 (from the L3,
 * while outputs from 2 MiB took the blocks) 0.31-0.33x -> 0.38-0.39x.
 * A block's rows are counted from a shift so that the tiles after a
 * narrow first chunk (the source's skew) start on a multiple of 64 and
 * take the full-line stores. */
#define STRIP_TILE 1024 /* bytes of one tile in a strip's region */
/* A strip's region for blocks of up to bc source columns in tiles of tc,
 * and a tile of slack (a block's rows counted from the shift reach bc - 1
 * at most); a line apart from the next region's sets. */
#define STRIP_REGION(bc, tc) (((size_t)(bc) / (tc) + 1) * STRIP_TILE + LINE)

/* Where the 16 bytes of strip j for block row p (counted from the shift)
 * lie, the strips' regions `region` bytes apart. */
static inline size_t strip_at(size_t region, int64_t j, int64_t p) {
  return (size_t)j * region + (size_t)(p >> 6) * STRIP_TILE + (size_t)(p & 15) * 64 + (size_t)((p >> 4) & 3) * 16;
}

/* Fills strip j of a strip-layout buffer from pb <= 16 source rows of pa
 * <= 64 bytes at s, the block rows from p = a + shift. A whole tile at a
 * multiple of 64 is 16 full-line stores; an edge goes through masked
 * loads (nothing past pa bytes or pb rows is read) and a 16-byte store
 * per row (bytes past pb are zeros and never streamed out). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void strip_fill_u8(char *buf, size_t region, int64_t j,
                                                                              int64_t p, const char *s, int64_t sb,
                                                                              int64_t pa, int64_t pb) {
  __m512i h[16];
  char *at = buf + strip_at(region, j, p);
  if (pa == 64 && pb == 16 && (p & 63) == 0) {
    net16x64_8(h, s, sb);
    for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(at + 64 * k), h[k]);
    return;
  }
  const __mmask64 in = pa >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << pa) - 1;
  __m512i r[16];
  for (int i = 0; i < 16; i++) r[i] = i < pb ? _mm512_maskz_loadu_epi8(in, s + i * sb) : _mm512_setzero_si512();
  net16x64_8_regs(h, r);
  _Alignas(64) char regs[16 * 64];
  for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(regs + 64 * k), h[k]);
  for (int64_t i = 0; i < pa; i++) /* tile row i: lane i / 16 of h[i % 16] */
    _mm_store_si128((__m128i *)(void *)(buf + strip_at(region, j, p + i)),
                    _mm_load_si128((const __m128i *)(const void *)(regs + 64 * (i & 15) + 16 * (i >> 4))));
}

/* uint16 blocks on Intel CPUs with AVX-512 keep theirs in strips too
 * (host_intel; elsewhere tr16x32_16 writes the layout above, as measured
 * on the EPYC (Zen 5), where the strips ran slower: 4096^2, one thread,
 * 0.51-0.53x of memcpy against 0.54-0.65x, 4096 x 4104 0.42-0.49x
 * against 0.56-0.58x, bench/results/2026-12-04-amd-uint16-strips-and-
 * line-walk.md). The 16 x 32 tile
 * writes 32 bytes into each of 32 buffer rows, so each 128-byte row (two
 * lines) was written by four strips in turn, half a line at a time, each
 * line leaving L1 in between. Timed apart on the Intel Xeon VM (4096^2,
 * one thread, blocks forced, of memcpy), filling ran 1.41x and streaming
 * out 0.93x, together 0.73x. Here each strip of 16 source rows has a
 * region of its own where a tile's 16 joined registers go out whole, 1 KiB
 * in a row (join16x32_16: v[2k] holds rows k and k + 8, v[2k + 1] rows
 * k + 16 and k + 24); output rows are put together from their strips'
 * 32-byte pieces on the way out (blk_stream_strips16), a line from two.
 * Gains were small and depended on the harness: 4096^2, one thread, of
 * memcpy, 0.76-0.79x -> 0.80-0.84x in bench_host's code cut to that row,
 * 0.74-0.77x -> 0.76-0.78x in the whole bench_host; 8192^2 0.73-0.75x
 * -> 0.77x (bc2, best of 7); never clearly slower
 * (bench/results/2026-11-27-intel-uint16-strips.md). */
/* Where the 32 bytes of strip j for block row p (counted from the shift)
 * lie, the strips' regions (STRIP_REGION(bc, 32)) `region` bytes apart. */
static inline size_t strip16_at(size_t region, int64_t j, int64_t p) {
  return (size_t)j * region + (size_t)(p >> 5) * STRIP_TILE + (size_t)(p & 7) * 128 +
         (size_t)((p >> 4) & 1) * 64 + (size_t)((p >> 3) & 1) * 32;
}

/* Fills strip j of a uint16 strip-layout buffer from pb <= 16 source rows
 * of pa <= 32 elements at s, the block rows from p = a + shift. A whole
 * tile at a multiple of 32 is 16 full-line stores; an edge goes through
 * masked loads (nothing past pa elements or pb rows is read) and a
 * 32-byte store per row (elements past pb are zeros and never streamed
 * out). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void strip_fill_u16(char *buf, size_t region, int64_t j,
                                                                               int64_t p, const char *s, int64_t sb,
                                                                               int64_t pa, int64_t pb) {
  __m512i h[2][8], v[16];
  if (pa == 32 && pb == 16 && (p & 31) == 0) {
    char *at = buf + strip16_at(region, j, p);
    net8x32_16(h[0], s, sb);
    net8x32_16(h[1], s + 8 * sb, sb);
    join16x32_16(v, h[0], h[1]);
    for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(at + 64 * k), v[k]);
    return;
  }
  const __mmask32 in = pa >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << pa) - 1;
  __m512i r[2][8];
  for (int i = 0; i < 16; i++)
    r[i >> 3][i & 7] = i < pb ? _mm512_maskz_loadu_epi16(in, s + i * sb) : _mm512_setzero_si512();
  net8x32_16_regs(h[0], r[0]);
  net8x32_16_regs(h[1], r[1]);
  join16x32_16(v, h[0], h[1]);
  _Alignas(64) char regs[16 * 64];
  for (int k = 0; k < 16; k++) _mm512_store_si512((void *)(regs + 64 * k), v[k]);
  for (int64_t i = 0; i < pa; i++) /* tile row i: where strip16_at puts row i of a tile */
    _mm256_store_si256((__m256i *)(void *)(buf + strip16_at(region, j, p + i)),
                       _mm256_load_si256((const __m256i *)(const void *)(regs + strip16_at(0, 0, i))));
}

/* A filled block waiting to be streamed out: rows [done, rows) remain. */
struct blk_pending {
  char *d;         /* its first output row, at its first column */
  const char *buf; /* its buffer rows */
  int64_t a0;      /* index of its first output row (for the carry) */
  int64_t rows, done;
  size_t n; /* bytes of each output row it holds */
  bool first, last;
  int strips;    /* the buffer is in the uint8 (1) or uint16 (2) strip layout (strip_fill_u8, _u16) */
  int64_t shift; /* strips: block row r is p = r + shift there */
  size_t region; /* strips: bytes from one strip's region to the next's */
};

/* Rows of whole lines out of a block with 64-byte stores, in one loop:
 * a call (and a check of the tile level) per 128-byte row took a fifth of
 * the time of a uint8 transpose from L3 (perf, EPYC). */
__attribute__((target("avx512f"))) static void blk_rows_avx512(char *d, int64_t dsa, const char *buf, int64_t rows,
                                                               size_t n) {
  for (int64_t r = 0; r < rows; r++, d += dsa, buf += BLK_PITCH) stream_lines_avx512(d, buf, n);
}

/* SEG bytes of an output row, a piece other than its first and last,
 * held in two registers (v0: the first line's worth, v1: the second's),
 * out to d with AVX-512 VBMI: the lines stream_row_avx512 writes (the
 * line straddling the previous piece joined with the carried bytes, then
 * a whole line, both streamed; the piece's last LINE bytes kept in the
 * carry), each cut from two registers by one byte permute, not copied to
 * a row in memory and read back a few bytes along: the whole line's load
 * there spans the two lines just stored, which the CPU cannot forward
 * from its store buffer, so it waits for the stores to reach L1
 * (inferred: the VM measured has no performance counters). Intel Xeon (AMX) VM,
 * one thread, blocks forced, GB/s, four runs each against the build
 * before: uint8 16 x 1000^2 6.7-7.0 -> 8.0-8.3 (one run before at 5.0),
 * 4000 x 4096 7.1-7.6 -> 7.9-8.3; uint16 2000 x 4096 8.0-8.9 -> 9.2-9.4,
 * 4104 x 4096 6.9-8.3 -> 8.9-9.5. A row's first and last pieces, which
 * write their partial lines with ordinary stores, lost this way (masked
 * stores for those lines: 16 x 1000^2 6.4-6.6 against 7.0-7.8 without)
 * and keep stream_row_avx512 (bench/results/2026-11-27-intel-vbmi-rows.md). */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static inline void stream_seg_vbmi(char *d, __m512i v0, __m512i v1,
                                                                                         char *carry) {
  const size_t r = (size_t)(-(uintptr_t)d & (LINE - 1)); /* bytes up to the next line */
  if (r == 0) {
    _mm512_stream_si512((void *)d, v0);
    _mm512_stream_si512((void *)(d + LINE), v1);
    return;
  }
  /* bytes r to r + 63 of two registers side by side */
  const __m512i idx = _mm512_add_epi8(IOTA_64, _mm512_set1_epi8((char)r));
  _mm512_stream_si512((void *)(d - (LINE - r)), _mm512_permutex2var_epi8(_mm512_loadu_si512(carry), idx, v0));
  _mm512_stream_si512((void *)(d + r), _mm512_permutex2var_epi8(v0, idx, v1));
  _mm512_storeu_si512(carry, v1);
}

/* blk_stream for a strip-layout block: each output row's n bytes put
 * together from its strips' pieces, a line in a register (JOIN: from
 * LINE / PIECE pieces p->region bytes apart, where AT puts the row's first),
 * straight out where rows start on lines and hold whole lines, else
 * through a row's copy and stream_row_avx512 (NAME##_row); with VBMI
 * (NAME##_vbmi), pieces other than a row's first and last, where rows are
 * off lines, cut into lines in registers instead (stream_seg_vbmi).
 * Pieces past n (a line's worth at most) are copied, never streamed. */
#define DEFINE_BLK_STREAM_STRIPS(NAME, AT, PIECE, JOIN)                                             \
  __attribute__((target("avx512f,avx512bw"))) static inline void NAME##_row(const struct blk_pending *p, int64_t r, \
                                                                          int64_t dsa, char *carry) { \
    const int64_t pieces = (int64_t)(p->n + (PIECE) - 1) / (PIECE);                                \
    _Alignas(64) char row[LINE + SEG]; /* a line before the row: stream_row_avx512 may reach back */ \
    const char *at = p->buf + AT(0, 0, r + p->shift);                                              \
    for (int64_t j = 0; j < pieces; j += LINE / (PIECE))                                           \
      _mm512_store_si512((void *)(row + LINE + j * (PIECE)), JOIN(at + j * p->region, p->region)); \
    stream_row_avx512(p->d + r * dsa, row + LINE, p->n, carry + (p->a0 + r) * LINE, p->first, p->last); \
  }                                                                                                \
  __attribute__((target("avx512f,avx512bw"))) static void NAME(struct blk_pending *p, int64_t upto, \
                                                              int64_t dsa, char *carry) {          \
    const int64_t pieces = (int64_t)(p->n + (PIECE) - 1) / (PIECE);                                \
    if (p->n % LINE == 0 && on_lines(p->d, dsa))                                                   \
      for (int64_t r = p->done; r < upto; r++) {                                                   \
        const char *at = p->buf + AT(0, 0, r + p->shift);                                          \
        for (int64_t j = 0; j < pieces; j += LINE / (PIECE))                                       \
          _mm512_stream_si512((void *)(p->d + r * dsa + j * (PIECE)), JOIN(at + j * p->region, p->region)); \
      }                                                                                            \
    else                                                                                           \
      for (int64_t r = p->done; r < upto; r++) NAME##_row(p, r, dsa, carry);                       \
    p->done = upto;                                                                                \
  }                                                                                                \
  __attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void NAME##_vbmi(struct blk_pending *p, int64_t upto, \
                                                                               int64_t dsa, char *carry) { \
    if (p->first || p->last || p->n != SEG || on_lines(p->d, dsa)) {                               \
      NAME(p, upto, dsa, carry);                                                                   \
      return;                                                                                      \
    }                                                                                              \
    for (int64_t r = p->done; r < upto; r++) {                                                     \
      const char *at = p->buf + AT(0, 0, r + p->shift);                                            \
      stream_seg_vbmi(p->d + r * dsa, JOIN(at, p->region), JOIN(at + (LINE / (PIECE)) * p->region, p->region), \
                      carry + (p->a0 + r) * LINE);                                                 \
    }                                                                                              \
    p->done = upto;                                                                                \
  }

/* A line from two 32-byte pieces `apart` bytes from each other from p
 * (each 32-byte aligned): uint16 strips. */
__attribute__((target("avx512f"))) static inline __m512i join_halves(const char *p, size_t apart) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)(const void *)p)),
                            _mm256_load_si256((const __m256i *)(const void *)(p + apart)), 1);
}

DEFINE_BLK_STREAM_STRIPS(blk_stream_strips, strip_at, 16, join_pieces)
DEFINE_BLK_STREAM_STRIPS(blk_stream_strips16, strip16_at, 32, join_halves)

/* Out to rows [done, upto) of the pending block. rows_inline: see
 * transpose_blocked; level: tiles_level's (with AVX-512,
 * stream_row_avx512 for rows off a line; with VBMI, the strips'
 * stream_seg_vbmi). */
static void blk_stream(struct blk_pending *p, int64_t upto, int64_t dsa, char *carry, bool rows_inline,
                       int level) {
  if (upto <= p->done) return;
  if (p->strips) {
    const bool vbmi = level >= TILES_AVX512VBMI;
    if (p->strips == 2) vbmi ? blk_stream_strips16_vbmi(p, upto, dsa, carry) : blk_stream_strips16(p, upto, dsa, carry);
    else vbmi ? blk_stream_strips_vbmi(p, upto, dsa, carry) : blk_stream_strips(p, upto, dsa, carry);
    return;
  }
  const bool avx512 = level >= TILES_AVX512;
  /* Output rows that start on lines and blocks of whole lines have no
   * partial lines to join: straight out (stream_row's bookkeeping cost
   * 20-40% here). */
  if (p->n % LINE == 0 && on_lines(p->d, dsa)) {
    if (rows_inline) blk_rows_avx512(p->d + p->done * dsa, dsa, p->buf + p->done * BLK_PITCH, upto - p->done, p->n);
    else
      for (int64_t r = p->done; r < upto; r++) stream_lines(p->d + r * dsa, p->buf + r * BLK_PITCH, p->n);
  } else {
    void (*const row)(char *, const char *, size_t, char *, bool, bool) = avx512 ? stream_row_avx512 : stream_row;
    for (int64_t r = p->done; r < upto; r++)
      row(p->d + r * dsa, p->buf + r * BLK_PITCH, p->n, carry + (p->a0 + r) * LINE, p->first, p->last);
  }
  p->done = upto;
}

/* Asks for the lines of rows rows of n bytes each, sb apart from s, to be
 * brought into L2 (a hint: no fault, whatever the addresses). */
static inline void prefetch_rows(const char *s, int64_t sb, int64_t rows, size_t n) {
  for (int64_t j = 0; j < rows; j++) {
    const uintptr_t q = (uintptr_t)(s + j * sb);
    for (uintptr_t l = q & ~(uintptr_t)(LINE - 1); l < q + n; l += LINE) _mm_prefetch((const char *)l, _MM_HINT_T1);
  }
}

/* From memory, which uint8 and uint16 blocks ask for the next strip's
 * source lines (the next_strip prefetches of transpose_blocked, whose
 * comment has the AMD figures). The answer differs between vendors:
 * - AMD EPYC (Zen 5) VM: every block gained, rows a multiple of 4 KiB
 *   apart included (uint8 8192^2, uint16 4096 x 8192): PF_NARROW.
 * - Intel Xeon (Cascade Lake) VM, one thread, bench_host, of memcpy:
 *   where each source row's run in a block lies within one 4 KiB page
 *   (rows a multiple of 4 KiB apart, the run inside a page) they cost:
 *   uint16 4096^2 0.67-0.71x with them, 0.76-0.77x without; uint8 8192^2
 *   0.63-0.65x and 0.69-0.73x; uint8 4096^2 about the same either way.
 *   Where runs cross pages they never lost: uint16 4096 x 4104 0.56-0.60x
 *   without, 0.66-0.70x with in one set of three runs, 0.65-0.69x
 *   either way in another. So PF_PAGES: only blocks whose runs cross a
 *   page. The CPU's own prefetcher follows a run within a page and
 *   stops at its end, which is the likely reason; it was not measured
 *   apart. float32 and float64 with runs across pages were mixed there
 *   (float32 4000^2: 0.67-0.70x -> 0.78-0.79x in one harness, bc2;
 *   0.82-0.84x -> 0.76-0.81x in bench_host), so they still never ask.
 * Intel CPUs (host_intel: cpuid's vendor, or AB_HOST_VENDOR) get
 * PF_PAGES, every other one PF_NARROW
 * (bench/results/2026-11-27-intel-prefetch-pages.md). The rule goes by
 * vendor, not generation: one Intel and one AMD generation were measured.
 * AB_HOST_PREFETCH=pages, narrow or off decides instead. */
enum { PF_OFF, PF_NARROW, PF_PAGES };

/* AB_HOST_VENDOR's answer (1 intel, 0 other), or for auto (-1) cpuid's:
 * whether the vendor is GenuineIntel. */
static int vendor_intel(int intel) {
  unsigned a, b, c, d;
  if (intel >= 0) return intel;
  return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
}

/* Whether the choices that differ by vendor (the blocks' prefetches here,
 * uint16's block layout in transpose_blocked, uint8's one block buffer:
 * blocks_one_buffer) take Intel's answer: cpuid's
 * vendor is GenuineIntel, or AB_HOST_VENDOR=intel or other says so (for
 * tests, and for machines whose answer you know). */
static bool host_intel(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice vendors[] = {{"auto", -1}, {"intel", 1}, {"other", 0}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_VENDOR", vendors, -1, "auto, intel or other", vendor_intel) != 0;
}

static int prefetch_by_vendor(int rule) { return rule >= 0 ? rule : host_intel() ? PF_PAGES : PF_NARROW; }
static int strip_prefetch(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice rules[] = {
      {"auto", -1}, {"pages", PF_PAGES}, {"narrow", PF_NARROW}, {"off", PF_OFF}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_PREFETCH", rules, -1, "auto, pages, narrow or off", prefetch_by_vendor);
}

/* Which layout a block's buffer takes: the uint8 (1) or uint16 (2) strip
 * layout (strip_fill_u8, strip_fill_u16), or rows BLK_PITCH apart (0). */
static int strip_layout(size_t es, int level) {
  if (level < TILES_AVX512) return 0;
  return es == 1 ? 1 : es == 2 && host_intel() ? 2 : 0;
}

/* Wide blocks: where the L2 holds 2 MiB or more, the strip layouts' blocks
 * are BLK_RUN bytes of source row wide (uint8 4096 columns, uint16 2048),
 * not BLK_COLS columns (runs of 1 and 2 KiB), as float32's already are.
 * The CPU's own prefetcher follows a run within its 4 KiB page; runs of a
 * whole page read well beside the streamed writes, shorter ones do not.
 * Intel Xeon VM (2 MiB L2), 16 MiB of uint8 read in the blocks' pattern
 * while as many bytes were streamed out, no arithmetic: 9.6-9.7 GB/s with
 * runs of 1 KiB, 11.0-11.1 with 2 KiB, 12.2-12.6 with 4 KiB (and 8.2 with
 * 4 KiB runs but 64-byte pieces of output rows: the block rows stay SEG
 * bytes). A block may be up to an eighth wider (BLK_RUN_MAX) before a
 * second is cut, so that rows a little longer than a page take one block,
 * not two of half a page: 4096 x 4104 uint16 on two threads (bands of
 * 2052 columns) 17.0-17.3 GB/s in two blocks a band, 20.0-20.6 in one; on
 * one thread 9.2-9.6 in three blocks, 9.6-9.9 in two (a harness timing
 * ab_convert_memory alone; bench/results/2026-11-27-intel-wide-blocks.md). The buffer grows
 * with the runs: two halves of 585 KiB for uint8 (512 used by blocks of a
 * page; one on Intel CPUs, blocks_one_buffer), 292 for uint16 (256),
 * against 192 (BLK_COLS rows of BLK_PITCH),
 * which is why CPUs with a smaller L2 keep BLK_COLS: none was measured
 * with the wide ones. float32 (runs of 4 KiB already) and float64 gained
 * nothing from 8 KiB or 4 KiB runs there. AB_HOST_WIDE_BLOCKS=1 or 0
 * decides instead (for tests and comparisons). */
#define BLK_RUN 4096
#define BLK_RUN_MAX (BLK_RUN + BLK_RUN / 8)
#define WIDE_L2_MIN ((size_t)2 << 20)
_Static_assert(SEG / 16 * STRIP_REGION(BLK_COLS, 64) <= BLK_COLS * BLK_PITCH,
               "the uint8 strips' regions fit a half of the blocks' buffer");
_Static_assert(SEG / 2 / 16 * STRIP_REGION(BLK_COLS, 32) <= BLK_COLS * BLK_PITCH,
               "the uint16 strips' regions fit a half of the blocks' buffer");

static long long sysfs_cache_bytes(int want);

/* The rule, read once per process (and again after ab__env_reload): the
 * variable, else sysfs's L2. */
static int wide_by_l2(int wide) { return wide >= 0 ? wide : sysfs_cache_bytes(2) >= (long long)WIDE_L2_MIN; }
static bool wide_rule(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice rules[] = {{"auto", -1}, {"1", 1}, {"0", 0}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_WIDE_BLOCKS", rules, -1, "1, 0 or auto", wide_by_l2) != 0;
}

/* Whether es-byte blocks are wide here: strip layouts only. */
static bool blocks_wide(size_t es) { return strip_layout(es, tiles_level()) != 0 && wide_rule(); }

/* One buffer or two for the blocks. With two (the design above, from the
 * EPYC), the previous block is streamed out of one half while the next
 * fills the other. With one, a block is filled, then streamed out whole,
 * and the next fills the same buffer: half the buffer in L2, and no
 * overlap of a block's reads with the previous block's writes. On the
 * Intel Xeon VM (cpuid family 6 model 167, 2 MiB L2 a core) the overlap
 * bought nothing (a copy there takes as long as reading its bytes plus
 * writing them) and the second half cost. uint8 4096^2, one thread, the
 * blocks (the learner's pick or forced), two buffers, of memcpy:
 * 0.63-0.67x as built, 0.82-0.87x with the fill's stores into the buffer
 * left out, 0.66-0.71x with the shuffles left out instead (wrong bytes,
 * throwaway switches): mostly the buffer's cost, not the arithmetic's.
 * One buffer, the same harness, blocks forced, alternated runs: uint8
 * 4096^2 0.65-0.67x -> 0.75-0.80x, 4000^2 0.66x -> 0.76-0.80x, 4096 x
 * 4000 0.67-0.69x -> 0.78-0.81x, 4040 x 4096 0.61x -> 0.73-0.74x, 3000^2
 * 0.64-0.69x -> 0.74-0.75x, 8192^2 9.1-9.7 -> 10.5-11.1 GB/s; 16 x 1000^2
 * 0.61-0.64x -> 0.62-0.70x; 16 x 1024^2 the same. Timed apart, a uint8
 * block then fills at 23-25 GB/s and streams out at 22-24, each near what
 * one core reads alone or streams alone there (27-30 and 25-27 GB/s,
 * bench/results/2026-11-28-intel-copy-ceiling.md). The other layouts did
 * not gain alike (uint16 4096^2 within 6% either way, 4096 x 4104 2-5%
 * faster in the harness and not in bench_host; float32 4000^2, 4096^2 and
 * 4104^2 the same or 5% slower; float64 2048^2 11.1-11.2 -> 12.3-13.2 GB/s
 * but 4096^2 10.9-11.3 -> 9.9-10.0), so only uint8 blocks with AVX-512
 * (the strip layout) on Intel CPUs take one buffer; CPUs of other
 * vendors, where it was never measured, keep two
 * (bench/results/2026-12-01-one-block-buffer.md). AB_HOST_BLOCK_BUFFERS=1
 * or 2 decides instead, for every element size. */
static int block_buffers_rule(void) {
  static ab__env_cache cache;
  static const struct ab__env_choice ways[] = {{"auto", 0}, {"1", 1}, {"2", 2}, {NULL, 0}};
  return ab__env_choice_cached(&cache, "AB_HOST_BLOCK_BUFFERS", ways, 0, "1, 2 or auto", NULL);
}

/* Whether es-byte blocks fill and stream out of one buffer (above). */
static bool blocks_one_buffer(size_t es) {
  const int rule = block_buffers_rule();
  return rule != 0 ? rule == 1 : host_intel() && strip_layout(es, tiles_level()) == 1;
}

/* Bytes of one half of the blocks' buffer: the strip layout's SEG / es / 16
 * strips of wide blocks, or BLK_COLS rows of BLK_PITCH. */
static size_t blk_half(size_t es, bool wide) {
  return wide ? SEG / es / 16 * STRIP_REGION(BLK_RUN_MAX / es, 64 / es) : (size_t)BLK_COLS * BLK_PITCH;
}

/* The whole buffer (one half or two: blocks_one_buffer), and a line of
 * room to align it. */
static size_t blk_buffer(size_t es, bool wide, bool one) { return (one ? 1 : 2) * blk_half(es, wide) + LINE; }

/* Whether the runs of n bytes at s, s + sb, ... each lie within one
 * 4 KiB page: all do where the first does and sb is whole pages. */
static inline bool runs_in_pages(const char *s, int64_t sb, size_t n) {
  return sb % 4096 == 0 && (uintptr_t)s % 4096 + n <= 4096;
}

/* carry: LINE bytes for each of the na destination rows; bufs:
 * blk_buffer(es, wide, one); from_memory: the whole transpose is larger
 * than the last-level cache (the prefetches below); wide: blocks_wide(es)
 * and one: blocks_one_buffer(es) when the buffer was sized. */
static void transpose_blocked(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb, size_t es,
                              char *carry, char *bufs, bool from_memory, bool wide, bool one) {
  const int64_t t = SEG / (int64_t)es; /* source rows of a block */
  /* Source columns filled between two shares of streaming: a line of
   * each source row (16 columns at least; 64 for uint8, the wide tiles).
   * Shares this small (8 output rows for float32) overlapped best: 64
   * columns ran 12 GB/s where 16 ran 17.5. */
  const int64_t cw = es <= 4 ? LINE / (int64_t)es : 16;
  /* Source columns of a block: BLK_COLS, or rows of 2 KiB for 8- and
   * 16-byte elements (EPYC, bench_host: 16 x 1024^2 float32 19-20 GB/s
   * with 1024 columns, 14.5 with 512; 4096^2 float64 the same with 128 to
   * 1024, and 11.1-11.6 against 10.2 with 256 columns in a harness); wide
   * strip-layout blocks BLK_RUN to BLK_RUN_MAX bytes (blocks_wide). */
  const int level = tiles_level();
  const int strips = strip_layout(es, level);
  wide = wide && strips != 0; /* a buffer sized for wide blocks holds the others too */
  if (wide) ab__host_ran(AB_RAN_WIDE_BLOCKS);
  ab__host_ran(one ? AB_RAN_ONE_BUFFER : AB_RAN_TWO_BUFFERS);
  const int64_t bc = wide ? BLK_RUN_MAX / (int64_t)es : es <= 4 ? BLK_COLS : 2048 / (int64_t)es;
  const size_t region = STRIP_REGION(bc, 64 / (int64_t)es), half_bytes = blk_half(es, wide);
  /* Source rows read together: 16 where the block's micro-kernel is 16
   * rows tall (uint8; float32 and uint16 with AVX-512), else 8 (EPYC,
   * 4096^2: float64 14.5 GB/s with 8 rows against 12.0 with 16; float32
   * 15 with 16, 9.4 with 8, 6.4 with 32; uint16 with its 8 x 32 tile 14.1
   * with 8 rows, 11.1 with 16). */
  const int64_t strip = es == 1 || ((es == 2 || es == 4) && level >= TILES_AVX512) ? 16 : 8;
  /* Rows of whole lines go out through one inline loop of 64-byte stores
   * (blk_rows_avx512) where output rows are 8 KiB apart or more. EPYC,
   * one thread, 4096^2, three runs each: float32 17.8-18.4 -> 20.2-20.3
   * GB/s, float64 15.7-16.3 -> 17.6-18.2, uint8 15.4-16.2 -> 18.5-19.3;
   * but batches of float32 planes with rows 2-4 KiB apart lost (1024^2
   * planes: 22.2-22.6 -> 16.3-17.7 GB/s), while at 8 KiB they gained
   * (2048^2: 16.7-18.0 -> 18.9-19.1). Why the rows' spacing matters is not
   * known; the calls' pause between rows is what differs. (uint16 lost
   * with it too, 13.4 -> 11.8, while its tile was 8 rows tall and its
   * chunks half the size; with the 16-row tile it gains.) uint8, whose
   * tile takes longest, gained at any spacing: 4096^2 (4 KiB rows)
   * 16.8-17.2 -> 18.6-19.3 GB/s, 64 x 1024^2 8.2-10.2 -> 10.6-12.3, where
   * float32 planes of 1024^2 still lost 18.4-18.8 -> 17.2-17.7; uint8
   * with AVX-512, and uint16 on Intel CPUs, now stream out of their strip
   * layouts (blk_stream_strips, blk_stream_strips16), row by row with
   * 64-byte stores, never measured on the EPYC; this loop serves the
   * other sizes, and uint16 elsewhere. */
  const bool avx512 = level >= TILES_AVX512, rows_inline = avx512 && dsa >= 8192;
  /* A source whose rows all start at one offset in a line (NumPy's large
   * arrays: 16 bytes in) gets a narrow first chunk, so the kernels' loads
   * after it take whole lines, not two halves (EPYC, 4000^2 float32 from
   * Python, one thread: 5.8 -> 12.3 GB/s). The first block is skew + bw -
   * LINE / es columns wide, so every later block starts on a line and
   * needs no narrow chunk of its own. */
  const int64_t skew = sb % LINE == 0 && (uintptr_t)s % es == 0 ? (int64_t)((-(uintptr_t)s & (LINE - 1)) / es) : 0;
  /* Blocks of equal width bw (whole chunks; the first narrower by the
   * skew's line), not bc columns and a ragged rest: a narrow last block
   * streams out with little to overlap, and the next band's first block
   * then fills alone (EPYC, 64 MiB float32, one thread, a source 16 bytes
   * into a line as NumPy's are: 1024 output rows, once cut 1020 + 4, 10.5
   * -> 15.5 GB/s; 2048 rows 13.3 -> 17.9; 1080 rows from a line-aligned
   * source, forced to the blocks, 19 -> 26). bc is a whole number of
   * chunks, so bw <= bc. */
  const int64_t span = na + (skew > 0 ? LINE / (int64_t)es - skew : 0);
  const int64_t nblk = (span + bc - 1) / bc;
  const int64_t bw = ((span + nblk - 1) / nblk + cw - 1) / cw * cw;
  /* uint8 and uint16, from the cache or not, ask for the next chunk's
   * line of each of a chunk's rows into L1: perf had the uint8
   * tile waiting on its loads of 16 rows' lines (a fifth of its
   * samples on the first). EPYC, one thread, blocks forced, the
   * library build, three runs: uint8 4096^2 13.5-15.1 -> 16.5-17.4
   * GB/s, 2048^2 18.9-19.3 -> 19.6-21.2; uint16 4096^2 16.2-17.7 ->
   * 18.2-19.3; bench_host, uint8 8192^2 8.9-9.4 -> 11.6-11.8. Two
   * or four chunks ahead were no better; float32 and float64 gained
   * nothing (2048^2 float32 lost 5-15%). */
  const bool next_chunk = es <= 2;
  /* From memory, uint8 and uint16 also ask for the same columns of the
   * next strip's rows into L2 (in the last strip of a band, the next
   * band's, which the next block reads going down): their blocks read 128
   * and 64 rows in runs of 1 and 2 KiB, too short for the hardware
   * prefetcher. EPYC, one thread, blocks forced, 64 MiB, the library build
   * (ab__host_gather), GB/s: uint8 8192^2 7.4-7.7 -> 9.7-10.6, with both
   * kinds of rows off lines (8200^2) 6.4-6.5 -> 8.8-8.9; uint16 4096 x
   * 8192 14.2-14.4 -> 16.6-16.8, 4104 x 8200 10.2-11.0 -> 12.3-12.6. One
   * strip ahead: into L1, or two and four strips ahead, were no better.
   * Not from the cache (8 MiB, a harness: uint8 18.4 -> 16.8, uint16 22.2
   * -> 18.0), nor for float32, whose 4 KiB runs the hardware follows
   * (4096^2: 20.8 -> 15.0). That is the AMD answer: on an Intel CPU only
   * the blocks whose runs cross pages ask (strip_prefetch, above). */
  const int rule = next_chunk && from_memory ? strip_prefetch() : PF_OFF;
  struct blk_pending p = {0};
  int half = 0;
  /* The order of the blocks: for elements of up to 4 bytes down the
   * source, every band of one block's columns before the next block's,
   * so a group of output rows is written whole before the next; for 8 and
   * 16 bytes across, every block of one band before the next band. EPYC,
   * one thread, blocks, 64 MiB from memory (a harness at -O3; figures of
   * the library build are lower), GB/s across -> down: float32 4096^2
   * 19.6 -> 20.6, sources off lines (4096 x 4104) 17.6 -> 18.6, both
   * kinds of rows off lines (4096^2 in source and output rows 4104 wide)
   * 9.8 -> 16.9; uint16 4096 x 8192 11.7 -> 13.2; uint8 8192^2 6.0 ->
   * 8.0, and 16 MiB (4096^2) 7.0 -> 10.3; but float64 4096^2 17.2-18.3 ->
   * 14.5-15.2 and 2048 x 2052 16.5-16.8 -> 14.3-14.6, complex128 the
   * same or worse. Why down wins is not known; the blocks of 8 and 16
   * bytes are 256 and 128 columns wide, those of 4 and fewer 1024 (wide
   * uint8 and uint16 ones 4-4.5 KiB of each row). */
  const bool down = es <= 4;
  const int64_t first = skew > 0 ? skew + bw - LINE / (int64_t)es : bw; /* the first block's columns */
  const int64_t across = first >= na ? 1 : 1 + (na - first + bw - 1) / bw, bands = (nb + t - 1) / t;
  for (int64_t i = 0; i < across * bands; i++) {
    const int64_t ai = down ? i / bands : i % across, b0 = (down ? i % bands : i / across) * t;
    const int64_t a0 = ai == 0 ? 0 : first + (ai - 1) * bw, w = ai == 0 ? first : bw, ma = w < na - a0 ? w : na - a0;
    const int64_t head = a0 == 0 && skew < ma ? skew : 0, mb = nb - b0 < t ? nb - b0 : t;
    const int64_t shift = head > 0 ? LINE / (int64_t)es - head : 0; /* strips: the tiles after the head on whole tiles */
    char *buf = bufs + (size_t)half * half_bytes;
    const bool next_strip =
        rule == PF_NARROW || (rule == PF_PAGES && !runs_in_pages(s + a0 * (int64_t)es + b0 * sb, sb, (size_t)ma * es));
    const int64_t chunks = ((mb + strip - 1) / strip) * ((head > 0) + (ma - head + cw - 1) / cw);
    int64_t k = 0;
    for (int64_t b = 0; b < mb; b += strip) {
      const int64_t hb = mb - b < strip ? mb - b : strip;
      for (int64_t a = 0, ha; a < ma; a += ha) {
        ha = a == 0 && head > 0 ? head : ma - a < cw ? ma - a : cw;
        if (strips == 1) strip_fill_u8(buf, region, b / 16, a + shift, s + (a0 + a) + (b0 + b) * sb, sb, ha, hb);
        else if (strips == 2)
          strip_fill_u16(buf, region, b / 16, a + shift, s + (a0 + a) * 2 + (b0 + b) * sb, sb, ha, hb);
        else
          tile_block(buf + a * BLK_PITCH + b * (int64_t)es, BLK_PITCH, s + (a0 + a) * (int64_t)es + (b0 + b) * sb, sb,
                     ha, hb, es, level);
        if (next_chunk && a + ha < ma)
          for (int64_t j = 0; j < hb; j++) _mm_prefetch(s + (a0 + a + ha) * (int64_t)es + (b0 + b + j) * sb, _MM_HINT_T0);
        if (next_strip && b0 + b + strip < nb) {
          const int64_t r0 = b0 + b + strip, rows = nb - r0 < hb ? nb - r0 : hb;
          prefetch_rows(s + (a0 + a) * (int64_t)es + r0 * sb, sb, rows, (size_t)ha * es);
        }
        blk_stream(&p, p.rows * ++k / chunks, dsa, carry, rows_inline, level);
      }
    }
    blk_stream(&p, p.rows, dsa, carry, rows_inline, level);
    p = (struct blk_pending){d + a0 * dsa + b0 * (int64_t)es, buf, a0, ma, 0, (size_t)mb * es, b0 == 0, b0 + mb == nb,
                             strips, shift, region};
    if (one) blk_stream(&p, p.rows, dsa, carry, rows_inline, level); /* out whole before the next fills this buffer */
    else half ^= 1;
  }
  blk_stream(&p, p.rows, dsa, carry, rows_inline, level);
}
#endif

/* How a large transpose writes its output: ordinary stores from the plain
 * tiles, or streaming stores from the L1 tiles or from the L2 blocks. */
enum { TR_PLAIN, TR_STREAMED, TR_BLOCKED, TR_MODES };

struct transpose_ctx {
  int64_t na, nb, dsa, sb;
  size_t es;
  int mode;
  char *carry;       /* streamed and blocked: LINE bytes a row, then (blocked) blk_buffer(es, wide, one) */
  bool from_memory;  /* the whole transpose is larger than the last-level cache */
  bool wide;         /* blocked: the buffer holds wide blocks (blocks_wide) */
  int line_tiles;    /* plain: 1 or 0 forces line_tiles' answer (its trial), -1 asks it */
  bool one;          /* blocked: one buffer, not two halves (blocks_one_buffer) */
};

#ifdef HAVE_X86_KERNELS
static bool line_tiles(size_t es, int64_t sb);
static bool line_tiles_held(size_t es, int64_t sb);
static bool wide_off_lines(int64_t sb);
#endif

#ifdef HAVE_X86_KERNELS
/* The ragged right and bottom of the whole-line tiles (tile_micro's edge
 * tiles): tile_any's SSE2 kernels, not the element-by-element loop. */
static void edges_2(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb) {
  tile_any(d, dsa, s, sb, na, nb, 2, false);
}
static void edges_8(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb) {
  tile_any(d, dsa, s, sb, na, nb, 8, false);
}
#endif

/* Off (as in every process but the tests'), the counts' line is only
 * ever read: bumped for each plane while on, a batch of small planes cut
 * between threads ran 5-25% slower, the threads taking turns at it. */
static atomic_bool counting;
static atomic_ulong ran_counts[AB_RAN_KINDS];
static atomic_ulong shifted_strips;
void ab__host_count_choices(bool on) { atomic_store_explicit(&counting, on, memory_order_relaxed); }
static inline void count(atomic_ulong *n, unsigned long by) {
  if (atomic_load_explicit(&counting, memory_order_relaxed)) atomic_fetch_add_explicit(n, by, memory_order_relaxed);
}
void ab__host_ran(ab__host_choice k) { count(&ran_counts[k], 1); }
unsigned long ab__host_ran_count(ab__host_choice k) {
  if ((unsigned)k >= AB_RAN_KINDS) return 0; /* a harness's loop over kinds past the last reads nothing beyond */
  return atomic_load_explicit(&ran_counts[k], memory_order_relaxed);
}
unsigned long ab__host_u8_shifted_strips(void) { return atomic_load_explicit(&shifted_strips, memory_order_relaxed); }

#ifdef HAVE_X86_KERNELS
/* The plain tiles of a uint8 plane whose destination rows are off lines,
 * with VBMI: strips of 64 rows (strip_u8_shifted); the columns past a
 * strip's last whole tile, and the rows past the last whole strip, as
 * tile_any. */
static void tile_u8_shifted(char *d, int64_t dsa, const char *s, int64_t sb, int64_t na, int64_t nb) {
  const bool lanes = u8_lanes(sb);
  const int64_t cols = nb / 64 * 64;
  int64_t a = 0;
  for (; a + 64 <= na; a += 64) {
    strip_u8_shifted(d + a * dsa, dsa, s + a, sb, nb, lanes);
    if (cols < nb) tile_any(d + a * dsa + cols, dsa, s + a + cols * sb, sb, 64, nb - cols, 1, false);
  }
  if (a < na) tile_any(d + a * dsa, dsa, s + a, sb, na - a, nb, 1, false);
  count(&shifted_strips, (unsigned long)(na / 64));
}
#endif

#ifdef HAVE_X86_KERNELS
/* Whether uint16 goes in groups (band_u16_grouped): where its whole-line
 * tile goes (line_tiles), into rows u8_grouped takes. Asked only by the
 * walks that use the answer: line_tiles may run its trial. */
static bool u16_groups(const struct transpose_ctx *c, const char *d) {
  return c->es == 2 && tiles_level() >= TILES_AVX512 && u8_grouped(d, c->dsa) &&
         (c->line_tiles >= 0 ? c->line_tiles != 0 : line_tiles(2, c->sb));
}
#endif
static void visit_transpose(void *ctx, char *d, const char *s) {
  const struct transpose_ctx *c = ctx;
  const int64_t na = c->na, nb = c->nb, dsa = c->dsa, sb = c->sb;
  const size_t es = c->es;
#ifdef HAVE_X86_KERNELS
  if (es == 1 && (na == 3 || na == 4) && sb == na && tiles_level() >= TILES_AVX512VBMI) {
    planes_u8_vbmi(d, dsa, s, nb, (int)na);
    ab__host_ran(AB_RAN_PLANES_U8_VBMI);
    return;
  }
#endif
#ifdef HAVE_PIXEL_LOOPS
  /* packed pixels of 2-4 channels to planes, or back (the loops are
   * looked up only for those shapes, not for every plane of a transpose) */
  const bool to_planes = na >= 2 && na <= 4 && sb == (int64_t)es * na;
  const bool to_pixels = nb >= 2 && nb <= 4 && dsa == (int64_t)es * nb;
  int size;
  const struct pixel_loops *px = to_planes || to_pixels ? pixel_loops(es, &size) : NULL;
  if (px != NULL && to_planes) {
    px->to_planes[size][na - 2](d, dsa, s, nb);
    return;
  }
  if (px != NULL) {
    px->to_pixels[size][nb - 2](d, s, sb, na);
    return;
  }
#endif
  if (na <= FEW_ROWS && (es == 1 || es == 2 || es == 4)) {
    for (int64_t b0 = 0; b0 < nb; b0 += PIXEL_BLOCK) {
      int64_t m = nb - b0 < PIXEL_BLOCK ? nb - b0 : PIXEL_BLOCK;
      char *dd = d + b0 * (int64_t)es;
      const char *ss = s + b0 * sb;
      if (es == 1) tile_1(dd, dsa, ss, sb, na, m);
      else if (es == 2) tile_2(dd, dsa, ss, sb, na, m);
      else tile_4(dd, dsa, ss, sb, na, m);
    }
    return;
  }
#ifdef HAVE_X86_KERNELS
  if (c->mode == TR_STREAMED) {
    /* uint8 and uint16 in groups where they go (not from
     * transpose_streamed, whose buffer would then share the stack with the
     * groups' scratch) */
    if (es == 1 && na >= 64 && nb >= 64 && tiles_level() >= TILES_AVX512 && u8_grouped(d, dsa) && !u8_lanes(sb))
      streamed_grouped(d, dsa, s, sb, na, nb, 1);
    else if (na >= 32 && nb >= 32 && u16_groups(c, d))
      streamed_grouped(d, dsa, s, sb, na, nb, 2);
    else
      transpose_streamed(d, dsa, s, sb, na, nb, es, c->carry);
    return;
  }
  if (c->mode == TR_BLOCKED) {
    char *bufs = c->carry + (size_t)na * LINE;
    bufs += -(uintptr_t)bufs & (LINE - 1); /* whole lines: the buffer is read and written a line at a time */
    transpose_blocked(d, dsa, s, sb, na, nb, es, c->carry, bufs, c->from_memory, c->wide, c->one);
    return;
  }
#endif
  /* Output rows that start on lines, with AVX-512: tiles that store whole
   * lines for uint16 (tr32x32_16) and 8-byte elements (the blocks' 8 x 8
   * tile; the SSE2 2 x 2 one stores 16 bytes of a row at a time). Intel
   * Xeon (Cascade Lake) VM, float64, one thread, of memcpy: 512^2 0.47x ->
   * 0.67x, 256^2 0.42-0.47x -> 0.61-0.69x, 640 x 480 0.54x -> 0.72x,
   * 640^2 0.54x -> 0.76x. The blocks' float32 tile (whole lines too)
   * gained nothing here: 512^2 0.44-0.46x either way
   * (2026-11-27-intel-uint8-lines-and-dead-ends.md). uint8 has its own in
   * tile_u8_avx512, which tr64x64_8_lanes serves where u8_lanes says:
   * asked here once for the plane, not for every tile. */
#ifdef HAVE_X86_KERNELS
  const bool avx512 = tiles_level() >= TILES_AVX512, out_lines = on_lines(d, dsa);
  const bool lines = avx512 && out_lines && (es == 2 || es == 8) &&
                     (c->line_tiles >= 0 ? c->line_tiles != 0 : line_tiles(es, sb));
  const bool lines_2 = lines && es == 2, lines_8 = lines && es == 8;
  const bool lanes = avx512 && out_lines && es == 1 && na >= 64 && nb >= 64 && u8_lanes(sb);
  if (lanes) ab__host_ran(AB_RAN_U8_LANES);
  const bool wide_2 = avx512 && !out_lines && es == 2 && wide_off_lines(sb);
  if (es == 1 && !out_lines && na >= 64 && nb >= 128 && na * nb >= SHIFTED_MIN && tiles_level() >= TILES_AVX512VBMI) {
    tile_u8_shifted(d, dsa, s, sb, na, nb);
    return;
  }
#else
  const bool lanes = false;
#endif
#ifdef HAVE_X86_KERNELS
  /* groups_2: u16_groups' answer, whose other parts lines_2 has asked */
  const bool groups = avx512 && es == 1 && !lanes && u8_grouped(d, dsa), groups_2 = lines_2 && u8_grouped(d, dsa);
  const int64_t tile_b = groups ? 64 * U8_GROUP : groups_2 ? 32 * U16_GROUP : TILE_B;
  if (groups && na >= 64 && nb >= 64) ab__host_ran(AB_RAN_U8_GROUPS); /* band_u8_grouped runs */
  if (groups_2 && na >= 32 && nb >= 32) ab__host_ran(AB_RAN_U16_GROUPS);
#else
  const int64_t tile_b = TILE_B;
#endif
  for (int64_t b0 = 0; b0 < nb; b0 += tile_b) {
    int64_t mb = nb - b0 < tile_b ? nb - b0 : tile_b;
    for (int64_t a0 = 0; a0 < na; a0 += TILE_A) {
      int64_t ma = na - a0 < TILE_A ? na - a0 : TILE_A;
      char *const dt = d + a0 * dsa + b0 * (int64_t)es;
      const char *const st = s + a0 * (int64_t)es + b0 * sb;
#ifdef HAVE_X86_KERNELS
      if (groups_2) {
        tile_u16_grouped(dt, dsa, st, sb, ma, mb);
        continue;
      }
      if (lines_2) {
        tile_micro(dt, dsa, st, sb, ma, mb, 2, 32, 32, tr32x32_16, edges_2);
        continue;
      }
      if (lines_8) {
        tile_micro(dt, dsa, st, sb, ma, mb, 8, 8, 8, tr8x8_64, edges_8);
        continue;
      }
      if (wide_2) {
        tile_micro(dt, dsa, st, sb, ma, mb, 2, 32, 16, tr16x32_16, edges_2);
        continue;
      }
#endif
      tile_any(dt, dsa, st, sb, ma, mb, es, lanes);
    }
  }
}

/* ---- the store variant: measured, not assumed ------------------------------
 * How large transposes write (TR_PLAIN, TR_STREAMED or TR_BLOCKED).
 * Streaming stores help on some CPUs (the destination is not read for
 * ownership) and collapse on others (an Intel Skylake-SP server: 3.3 ->
 * 0.46 GB/s, issue 18); which walk through memory wins differs too (on an
 * Intel Xeon VM the L1 tiles, on an AMD EPYC VM the L2 blocks), and so
 * does the answer between element sizes on one CPU (the EPYC: plain uint8
 * tiles 2.2 GB/s, streamed 11), between kinds of rows (TR_KINDS) and
 * between transposes that run from the last-level cache and those that
 * run from memory (TR_REGIMES). So the choice is the CPU's, made for each
 * element size (1, 2, 4, 8 and 16 bytes: the sizes SEG holds whole), kind
 * and regime: AB_HOST_STREAMING=0, 1 or blocked forces one for all;
 * otherwise (auto) the first transpose of that element size and kind of
 * rows large enough to stream times an 8 MiB transpose of them each way
 * (probe_time, probe_kind: once per process, size and kind; all four
 * kinds at once took 30-65 ms on the EPYC VM, 250-340 on the Intel Xeon
 * VM in its slower hours) and keeps the fastest for each regime, a
 * streaming variant only when it wins by 10% or more, the blocks only
 * when they also beat the L1 tiles by 10% (ab__host_pick_variant). */
#define TR_CLASSES 5 /* element sizes 1, 2, 4, 8, 16 */

/* Kinds of rows: output rows that all start on a line or not, from source
 * rows that all start at one offset in a line (the blocks' kernels then
 * load whole lines after a narrow first chunk) or not. They differ most
 * in the blocks, which join the lines two blocks share in output rows off
 * lines and straddle lines in their loads from sources off them. EPYC,
 * 64 MiB float32, one thread, GB/s plain / streamed / blocked: on lines
 * (4096^2) 11.7 / 10.3 / 18.7; output off (4104 x 4096) 11.7 / 10.2 /
 * 15.6; source off (4096 x 4104) 10.4 / 8.7 / 16.0; both off (4104^2)
 * 10.4 / 8.2 / 9.4, until the blocks went down the source (16.9; see
 * transpose_blocked). Why the blocks going across lost only where both
 * are off, and only at such sizes, is not known: reading the source
 * through aligned loads into a buffer first lost the same. */
enum { TR_ON_LINES, TR_OUT_OFF, TR_SRC_OFF, TR_BOTH_OFF, TR_KINDS };
/* Regimes: a transpose whose source and output fit in the last-level
 * cache together (llc_bytes) may find them there, as a trial repeated on
 * one 8 MiB transpose does; a larger one reads and writes memory, as the
 * trial does after evicting both from every cache. The answers differ:
 * EPYC, float32 with both kinds of rows off lines: the L1 tiles from the
 * cache (8 MiB: 24.2 GB/s against 19.3 plain), the blocks from memory
 * (4104^2: 16.9 against 10.4 plain and 8.2 in the L1 tiles). What one
 * 8 MiB trial cannot show is still missed: from memory it picks the L1
 * tiles for uint8 with rows on lines (9.1-9.9 GB/s at 64 MiB), where the
 * blocks ran 10.0-10.9. */
enum { TR_CACHED, TR_MEMORY, TR_REGIMES };
/* The picks: one per regime, and a third for large planes from memory
 * (TR_LARGE_PLANE bytes or more in one plane), read off the memory
 * trial's times by another rule (ab__host_pick_variant). The 8 MiB trial
 * cannot see what such planes prefer: on an Intel Xeon (Cascade Lake) VM,
 * one thread, its blocks and L1 tiles were within 4% of each other for
 * float32 on every kind of rows, while from 3000^2 to 8192^2 float32 the
 * blocks ran 0.71-0.91x of memcpy and the L1 tiles 0.36-0.80x (3000^2,
 * both kinds of rows off lines: 0.71 against 0.36-0.44; 4104^2: 0.69
 * against 0.45); uint8, uint16 and float64 4096^2 planes were faster in
 * the blocks too. On the AMD EPYC VM 64 MiB float32 planes ran 15.6-18.7
 * GB/s in the blocks, 8.2-10.3 in the L1 tiles. */
#define TR_LARGE TR_REGIMES
#define TR_PICKS (TR_REGIMES + 1)
#define TR_LARGE_PLANE ((size_t)16 << 20)

/* tr_pick[size][pick][kind]: written once per size and kind before
 * tr_ready[size][kind] publishes it (release), read after it (acquire).
 * Each kind is measured at the first transpose that asks for it: all four
 * at once took 250-310 ms of a process's first 4096^2 uint8 transpose on
 * the Intel Xeon VM, which takes 7-9 ms once measured; one kind, 60-100
 * (bench/results/2026-11-26-intel-mid-sizes-and-trials.md). */
static int tr_pick[TR_CLASSES][TR_PICKS][TR_KINDS];
static _Atomic bool tr_ready[TR_CLASSES][TR_KINDS];
/* One trial at a time, whatever the size and kind: two at once would
 * time each other's memory traffic. */
static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;

/* Every regime the same variant. */
static void pick_all(int pick[TR_PICKS], int mode) {
  for (int r = 0; r < TR_PICKS; r++) pick[r] = mode;
}

/* A field of cpu0's data or unified cache at level `want` (0: the
 * highest level), as Linux's sysfs gives it ("size" in bytes, from its
 * K, M or G; "ways_of_associativity", "number_of_sets"); 0 where unknown. */
static long long sysfs_cache_field(int want, const char *field) {
  int best_level = 0;
  long long v = 0;
  for (int i = 0; i < 16; i++) {
    char path[96], type[32] = "", unit = 0;
    int level = 0;
    long long x = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (f == NULL) break;
    const bool got_level = fscanf(f, "%d", &level) == 1;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
    if ((f = fopen(path, "r")) != NULL) {
      if (fscanf(f, "%31s", type) != 1) type[0] = 0;
      fclose(f);
    }
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, field);
    if ((f = fopen(path, "r")) == NULL) continue;
    const int got = fscanf(f, "%lld%c", &x, &unit);
    fclose(f);
    if (!got_level || got < 1 || strcmp(type, "Instruction") == 0 || level <= best_level) continue;
    if (want > 0 && level != want) continue;
    best_level = level;
    v = x * (unit == 'K' ? 1024LL : unit == 'M' ? 1024LL * 1024 : unit == 'G' ? 1024LL * 1024 * 1024 : 1);
  }
  return v < 0 ? 0 : v;
}
static long long sysfs_cache_bytes(int want) { return sysfs_cache_field(want, "size"); }

/* Bytes of the last-level cache one core sees, read once; 0 where
 * unknown: then every large transpose counts as one from memory. glibc's
 * sysconf answer is not used: on the EPYC VM it says 384 MiB, every L3 of
 * the host, where the VM's core sees 32. */
static size_t llc_bytes(void) {
  static _Atomic long long cached = -1;
  long long v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v < 0) atomic_store_explicit(&cached, v = sysfs_cache_bytes(0), memory_order_relaxed);
  return (size_t)v;
}

/* The smallest output a transpose may stream or block for
 * (ab__host_transpose_pick; smaller ones take the plain tiles): 4 MiB.
 * Below it the output usually stays in the last-level cache, where
 * ordinary stores beat streaming ones, which send it to memory (and
 * leave its next reader nothing cached). Intel Xeon (Cascade Lake) VM,
 * 1 MiB L2, one thread, of memcpy, plain tiles against the trial's picks:
 * with the source warm (bench_host), 8 alternated runs each, float32
 * 1000^2 (3.8 MiB) median 0.84x against 0.42x, uint16 1080 x 1920 0.50x
 * against 0.36x, uint8 1536^2 0.48x against 0.38x (the picks won 4 of 24
 * pairs, in moments when other tenants crowded the L3); with source and
 * output evicted between conversions, 1.9-2.15 GB/s both ways. For a
 * session the bound was twice the L2 (2 MiB here), from an hour when the
 * L3 gave memcpy nothing beyond 2 MiB and the picks ran outputs of 1.5-4
 * MiB from an evicted source 1.1-1.6x faster. Outputs of 4.8-10 MB ran
 * 1.2-1.6x faster through the picks (source warm). 4 MiB for every CPU,
 * as before that session. */
#ifdef HAVE_X86_KERNELS
#define STREAM_MIN ((size_t)4 << 20)
#endif

size_t ab__host_llc_bytes(void) { return llc_bytes(); }

/* Whether a transpose that reads and writes `whole` bytes in all runs
 * from memory (TR_MEMORY) rather than from the last-level cache. The
 * cached trial covers about 16.5 MiB (source and output), so between that
 * and the whole cache its picks are stretched; they held better than the
 * memory trial's there on the EPYC VM (32 MiB L3): a 4096^2 uint8
 * transpose, 32 MiB in all, ran 13.4-16 GB/s in the blocks picked from
 * the cache and 9.1-9.3 in the L1 tiles that the memory trial picks in
 * some processes; 16 uint8 planes of 1000^2 would get the blocks from the
 * memory trial (10-12 GB/s, against 15 in the L1 tiles). */
static bool from_memory(size_t whole) {
  const size_t llc = llc_bytes();
  return llc == 0 || whole > llc;
}
/* The regime of a transpose reading and writing `whole` bytes, in 2-D
 * transposes of `plane` bytes (TR_LARGE: see above), and its kind of rows. */
static int tr_regime(size_t whole, size_t plane) {
  return !from_memory(whole) ? TR_CACHED : plane >= TR_LARGE_PLANE ? TR_LARGE : TR_MEMORY;
}
static int tr_kind(bool rows_on_lines, bool src_on_lines) {
  return rows_on_lines ? (src_on_lines ? TR_ON_LINES : TR_SRC_OFF) : src_on_lines ? TR_OUT_OFF : TR_BOTH_OFF;
}
#ifdef HAVE_X86_KERNELS
/* Whether the trial may pick the blocks: not uint8 from the cache with
 * both kinds of rows off lines (see ab__host_pick_variant's callers; the
 * transposes weigh them there all the same: learner_of). */
static bool blocks_open(size_t es, int regime, int kind) {
  return es > 1 || regime != TR_CACHED || kind != TR_BOTH_OFF;
}
#endif

/* The fastest variant: a streaming one only where it beats the plain
 * tiles by 10% or more, and the blocks only where they beat the L1 tiles
 * by as much too. The blocks fill one block while the one before streams
 * out, so a transpose's first and last blocks overlap nothing, which the
 * trial's single large transpose hides: EPYC, 16 uint8 planes of 1000^2
 * (both kinds of rows off lines) ran 9.8-11.7 GB/s in the blocks against
 * 14.7-15.3 in the L1 tiles, where their trial had the two within 5%.
 * Large planes have few first and last blocks for their size, and run
 * faster in the blocks than the trial says (TR_LARGE): for them the
 * blocks need only come within 10% of the fastest. */
int ab__host_pick_variant(const double best[3], bool blocks, bool large) {
  const double other = best[TR_PLAIN] < best[TR_STREAMED] ? best[TR_PLAIN] : best[TR_STREAMED];
  if (large && blocks && best[TR_BLOCKED] <= other * 1.1) return TR_BLOCKED; /* see TR_LARGE */
  const int fast = blocks && best[TR_BLOCKED] * 1.1 <= best[TR_STREAMED] ? TR_BLOCKED : TR_STREAMED;
  return best[fast] * 1.1 <= best[TR_PLAIN] ? fast : TR_PLAIN;
}

#ifdef HAVE_X86_KERNELS
/* Out of every cache: with clflushopt where the CPU has it, else clflush
 * (SSE2: every x86-64 CPU has it). clflush waits for each line before the
 * next: 16 MiB took 30 ms on the Intel Xeon (Cascade Lake) VM, which made
 * the trials 0.7 s per element size, against 0.5 ms with clflushopt,
 * whose lines go out together (the mfence waits for them all); on the
 * EPYC VM clflush took about 0.4 ms. */
__attribute__((target("clflushopt"))) static void evict_opt(const char *p, size_t n) {
  for (size_t i = 0; i < n; i += LINE) _mm_clflushopt((void *)(p + i));
  _mm_mfence();
}

static bool has_clflushopt(void) {
  unsigned a, b, c, d; /* CPUID leaf 7, subleaf 0: EBX bit 23 (clang's __builtin_cpu_supports does not know it) */
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 23 & 1u);
}

static void evict(const char *p, size_t n) {
  if (has_clflushopt()) {
    evict_opt(p, n);
    return;
  }
  for (size_t i = 0; i < n; i += LINE) _mm_clflush(p + i);
  _mm_mfence();
}

/* Times the three variants on one R x C source of es-byte elements (8 MiB),
 * its rows spitch bytes apart from s, into output rows pitch bytes apart
 * from d: the blocks once to warm up, then each variant twice as it
 * stands (each finds the output where the one before left it:
 * best[TR_CACHED]) and twice after evicting source and output
 * (best[TR_MEMORY]), best of two; the second time only where the first
 * was within 1.5x of the fastest in that regime. (The plain uint8 tiles
 * run at a fifth of the others' speed: with a warm-up of each variant and
 * no cut the uint8 trials took 100 ms on the EPYC VM; so, 65.) */
static void probe_time(char *d, int64_t pitch, const char *s, int64_t spitch, int64_t R, int64_t C, size_t es,
                       char *carry, bool wide, bool one, double best[TR_REGIMES][TR_MODES]) {
  double fastest[TR_REGIMES] = {1e30, 1e30};
  /* The plain tiles' whole-line choice (line_tiles) for this source, its
   * own trial run first if it has not been: this one holds the lock. */
  const int lines = line_tiles_held(es, spitch);
  for (int r = 0; r < TR_REGIMES; r++)
    for (int m = 0; m < TR_MODES; m++) best[r][m] = 1e30;
  for (int rep = 0; rep < 3; rep++)
    for (int m = 0; m < TR_MODES; m++)
      for (int r = 0; r < (rep == 0 ? 1 : TR_REGIMES); r++) {
        if ((rep == 0 && m != TR_BLOCKED) || (rep == 2 && best[r][m] > 1.5 * fastest[r])) continue;
        if (r == TR_MEMORY) {
          evict(s, (size_t)(R * spitch));
          evict(d, (size_t)(C * pitch));
        }
        struct transpose_ctx c = {C, R, pitch, spitch, es, m, carry, r == TR_MEMORY, wide, lines, one};
        const double t0 = ab__seconds();
        visit_transpose(&c, d, s);
        _mm_sfence();
        const double dt = ab__seconds() - t0;
        if (rep > 0 && dt < best[r][m]) best[r][m] = dt;
        if (rep > 0 && dt < fastest[r]) fastest[r] = dt;
      }
}

/* The trials' arrays, laid out as the library's own large outputs are
 * (backends/host/host.c) and as NumPy lays out large arrays: from a 2 MiB
 * boundary, offered for huge pages where AB_HOST_HUGEPAGES allows. The
 * trials from the cache still scatter between processes on the EPYC VM,
 * whose L3 other tenants share (uint8, both kinds of rows off lines, the
 * L1 tiles in five processes: 9.2-19.8 GB/s, and 7.8-23 with 4 KiB
 * pages), so a close call between the plain and the L1 tiles can go
 * either way from one process to the next. */
static void *trial_alloc(size_t bytes) {
  const size_t huge = (size_t)2 << 20, n = (bytes + huge - 1) & ~(huge - 1);
  void *p = aligned_alloc(huge, n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p != NULL && ab__host_hugepages()) (void)madvise(p, n, MADV_HUGEPAGE); /* advice: a refusal changes nothing */
#endif
  return p;
}

/* The trial of one kind of rows, on an 8 MiB source of 2048 rows: rows off
 * lines are 32 bytes off every other line (as 4104 float32 columns are).
 * The shape matters: with 1024 source rows (float32 output rows of 4 KiB)
 * the trial put the plain tiles ahead for float32 sources off lines, as
 * they then were at that shape (64 MiB, EPYC: 10.0 GB/s against 8.9 in
 * the blocks going across), while with output rows of 8 and 16 KiB the
 * blocks won by 1.6x. uint8 with both kinds of rows off lines from the
 * cache gets the plain or the L1 tiles, never the blocks: batches of small
 * uint8 planes run slowly in them (EPYC, one thread, 16 x 1000^2: 4.2-6.6
 * GB/s in bench_host where the trial let them in, against 6.9-9.2 with
 * the plain or L1 tiles; blocks forced, 4.5-5.9 against 9.9-14.6 in the
 * L1 tiles), and the trial, one 8 MiB transpose, cannot see it. For
 * larger elements the blocks stay in that trial: uint16 planes ran faster
 * in them (8 x 1000^2: 17.8-19.0 against 6.5-13.1 in the L1 tiles and 7.0-
 * 7.3 plain, which the trial without them picked in nine processes of
 * ten). Where memory for the trials is short, the plain tiles, for the
 * rest of the process. */
static void probe_kind(size_t es, int k, int pick[TR_PICKS]) {
  const int64_t R = 2048, C = 4096 / (int64_t)es, pitch = R * (int64_t)es, spitch = C * (int64_t)es;
  const size_t bytes = (size_t)(R * (spitch + 32));
  char *s = trial_alloc(bytes), *d = trial_alloc((size_t)C * (size_t)(pitch + 32));
  const bool wide = blocks_wide(es);
  const bool one = blocks_one_buffer(es);
  char *carry = malloc((size_t)C * LINE + blk_buffer(es, wide, one));
  pick_all(pick, TR_PLAIN);
  if (s != NULL && d != NULL && carry != NULL) {
    for (size_t i = 0; i < bytes; i++) s[i] = (char)(i * 7);
    const int64_t out_off = k == TR_OUT_OFF || k == TR_BOTH_OFF ? 32 : 0, src_off = k >= TR_SRC_OFF ? 32 : 0;
    double best[TR_REGIMES][TR_MODES];
    probe_time(d, pitch + out_off, s, spitch + src_off, R, C, es, carry, wide, one, best);
    for (int r = 0; r < TR_REGIMES; r++)
      pick[r] = ab__host_pick_variant(best[r], blocks_open(es, r, k), false);
    pick[TR_LARGE] = ab__host_pick_variant(best[TR_MEMORY], true, true);
    for (int r = 0; r < TR_REGIMES; r++)
      AB_LOG(AB_LOG_DEBUG, "transpose trial, %zu-byte elements, %s, %s: plain %.2f, streamed %.2f, blocked %.2f GB/s: %s%s%s",
             es, (const char *[]){"rows on lines", "output off lines", "source off lines", "both off lines"}[k],
             r == TR_MEMORY ? "from memory" : "cached", (double)bytes / best[r][TR_PLAIN] * 1e-9,
             (double)bytes / best[r][TR_STREAMED] * 1e-9, (double)bytes / best[r][TR_BLOCKED] * 1e-9,
             ab__host_transpose_mode_name(pick[r]), r == TR_MEMORY ? "; large planes: " : "",
             r == TR_MEMORY ? ab__host_transpose_mode_name(pick[TR_LARGE]) : "");
  }
  free(s);
  free(d);
  free(carry);
}
#else
static void probe_kind(size_t es, int k, int pick[TR_PICKS]) {
  (void)es;
  (void)k;
  pick_all(pick, TR_PLAIN);
}
#endif

/* AB_HOST_STREAMING: 0, 1 or blocked forces, auto (or unset) measures.
 * Decided once per process, element size and kind (the trials are not
 * cheap). */
static int forced_mode(void) {
  static const struct ab__env_choice modes[] = {
      {"auto", -1}, {"trial", -2}, {"1", TR_STREAMED}, {"0", TR_PLAIN}, {"blocked", TR_BLOCKED}, {NULL, 0}};
  static ab__env_cache cache; /* read for every large transpose's bands: a malformed value logs once */
  return ab__env_choice_cached(&cache, "AB_HOST_STREAMING", modes, -1, "1, 0, blocked, trial or auto", NULL);
}

/* fork: never while a trial holds the lock (the child would find it held
 * by a thread it does not have, and wait at its first trial for ever); a
 * fork waits for the trial to end. */
static void learners_fork_child(void);
static void trial_fork_prepare(void) { pthread_mutex_lock(&trial_lock); }
static void trial_fork_done(void) { pthread_mutex_unlock(&trial_lock); }
static void trial_fork_child(void) {
  learners_fork_child();
  pthread_mutex_unlock(&trial_lock);
}
/* Registered as the library is loaded, before the lock can be held: see
 * "fork" in src/lifetime.c. */
__attribute__((constructor)) static void trial_atfork(void) {
  ab__atfork(trial_fork_prepare, trial_fork_done, trial_fork_child, "the transpose trials' lock");
}

/* Size class k's picks for one kind of rows: measured (or forced) at the
 * first call that needs them; every later call reads them. */
static void decide(int k, size_t es, int kind) {
  if (atomic_load_explicit(&tr_ready[k][kind], memory_order_acquire)) return;
  pthread_mutex_lock(&trial_lock); /* one thread measures; the others wait for its answer */
  if (!atomic_load_explicit(&tr_ready[k][kind], memory_order_relaxed)) {
    int pick[TR_PICKS];
#ifdef HAVE_X86_KERNELS
    const int m = forced_mode();
#else
    const int m = TR_PLAIN; /* no streamed or blocked variant here, whatever AB_HOST_STREAMING says */
#endif
    if (m >= 0) pick_all(pick, m);
    else probe_kind(es, kind, pick);
    for (int r = 0; r < TR_PICKS; r++) tr_pick[k][r][kind] = pick[r];
    atomic_store_explicit(&tr_ready[k][kind], true, memory_order_release);
  }
  pthread_mutex_unlock(&trial_lock);
}

int ab__host_transpose_mode(size_t es) {
  const int k = ab__width_index(es);
  if (k < 0) return TR_PLAIN;
  decide(k, es, TR_ON_LINES);
  return tr_pick[k][TR_LARGE][TR_ON_LINES];
}

int ab__host_transpose_mode_known(size_t es) {
  const int k = ab__width_index(es);
#ifdef HAVE_X86_KERNELS
  if (k < 0) return TR_PLAIN;
  if (atomic_load_explicit(&tr_ready[k][TR_ON_LINES], memory_order_acquire)) return tr_pick[k][TR_LARGE][TR_ON_LINES];
  const int m = forced_mode();
  return m >= 0 ? m : -1; /* forced: known before any transpose */
#else
  (void)k;
  return TR_PLAIN; /* no streamed variants here */
#endif
}

unsigned ab__host_transpose_kinds_known(size_t es) {
  const int k = ab__width_index(es);
  unsigned known = 0;
  for (int kind = 0; k >= 0 && kind < TR_KINDS; kind++)
    if (atomic_load_explicit(&tr_ready[k][kind], memory_order_acquire)) known |= 1u << kind;
  return known;
}

int ab__host_transpose_pick(size_t es, bool rows_on_lines, bool src_on_lines, size_t whole, size_t plane) {
  const int k = ab__width_index(es);
  if (k < 0) return TR_PLAIN;
  const int regime = tr_regime(whole, plane), kind = tr_kind(rows_on_lines, src_on_lines);
  decide(k, es, kind);
  return tr_pick[k][regime][kind];
}

/* ---- the streaming variant measured on the transposes themselves ---------
 * The trial above times an 8 MiB transpose once, and from the cache it
 * times the L1 tiles right after the plain tiles have left the output's
 * lines dirty in the cache, where they run at half their own speed
 * (bench/results/2026-11-28-steady-state-trial.md). So where it picks
 * one streaming variant and the other was also open to it, the
 * transposes of each element size, kind of rows, regime, band size (a
 * power of two of one band's output bytes: a plane on one thread and its
 * halves on two learn apart; bands of one call on several threads are
 * timed side by side) and whether the band is the whole job's output or
 * less (bytes < whole / 2: a 32 MiB transpose on one thread, and a 32 MiB
 * band of a 64 MiB one beside another thread's, which shares the memory
 * bus with it, learn apart too; the pieces of a cast that transposes
 * through a buffer, cast_then_transpose, whose `whole` counts both
 * element sizes, are always less) measure the two themselves: of the first
 * LEARN_SLOTS bands, alternately the trial's pick and the other, each
 * timed (or fewer: settle_early); from then on the other only where its
 * fastest band ran LEARN_MARGIN faster than the trial's pick's. Every AB__STREAM_RELEARN
 * bands after a pick time both again: the pick may have met a noisy
 * moment, and other tenants of a shared cache come and go (a fairer
 * trial that moved 4096 x 4104 uint16 to the L1 tiles won 20% in a quiet
 * hour and lost 6-14% in a crowded one, same record). The bytes are the
 * same either way. AB_HOST_STREAMING=trial keeps the trial's picks. */
#define LEARN_SIZES 12 /* band outputs under 512 KiB, then each power of two, the last 512 MiB and more */
#define LEARN_SLOTS 6
#define LEARN_MARGIN 1.05
struct stream_learner {
  _Atomic uint32_t claimed, timed, uses; /* slots handed out and done; bands since the pick */
  _Atomic int pick;                      /* 0 measuring, 1 the trial's pick, 2 the other */
  _Atomic uint64_t best[2];              /* fastest band of each, femtoseconds a byte; 0 none yet */
};
static struct stream_learner learners[TR_CLASSES][TR_PICKS][TR_KINDS][LEARN_SIZES][2]; /* [..][part of a job] */
static _Thread_local int last_mode = -1;
static _Atomic int settle_pct = AB__STREAM_SETTLE_PCT; /* settle_early's lead; tests change it */

/* claimed last, released: a band that claims a slot of the new round
 * (acquiring it) sees the rest cleared */
static void learner_clear(struct stream_learner *L) {
  atomic_store_explicit(&L->best[0], 0, memory_order_relaxed);
  atomic_store_explicit(&L->best[1], 0, memory_order_relaxed);
  atomic_store_explicit(&L->timed, 0, memory_order_relaxed);
  atomic_store_explicit(&L->uses, 0, memory_order_relaxed);
  atomic_store_explicit(&L->claimed, 0, memory_order_release);
}
/* fork: bands timed by threads the child does not have would never
 * finish their slots, so measuring starts over there. */
static void learners_fork_child(void) {
  struct stream_learner *L = &learners[0][0][0][0][0];
  for (size_t i = 0; i < sizeof learners / sizeof *L; i++)
    if (atomic_load_explicit(&L[i].pick, memory_order_relaxed) == 0) learner_clear(&L[i]);
}
/* The streaming variant that is not `mode`. */
static int other_variant(int mode) { return mode == TR_STREAMED ? TR_BLOCKED : TR_STREAMED; }
static int learn_size(size_t bytes) {
  int c = 0;
  while (c < LEARN_SIZES - 1 && bytes >> (19 + c) != 0) c++;
  return c;
}
#ifdef HAVE_X86_KERNELS
/* The variant a band of `bytes` output takes where the trial picked
 * `mode` (streamed or blocked); *arm: which of the two to time (0 the
 * trial's pick, 1 the other), or -1 for none. */
static int learn_begin(struct stream_learner *L, int mode, int *arm) {
  const int other = other_variant(mode);
  *arm = -1;
  const int p = atomic_load_explicit(&L->pick, memory_order_acquire);
  if (p != 0) {
    if ((atomic_fetch_add_explicit(&L->uses, 1, memory_order_relaxed) + 1) % AB__STREAM_RELEARN != 0)
      return p == 1 ? mode : other;
    learner_clear(L); /* only this band saw this count: it starts the next round */
    atomic_store_explicit(&L->pick, 0, memory_order_release);
  }
  const uint32_t n = atomic_fetch_add_explicit(&L->claimed, 1, memory_order_acquire);
  if (n >= LEARN_SLOTS) return mode; /* the slots' bands are still running */
  *arm = (int)(n & 1);
  return *arm ? other : mode;
}
/* Where the first timed band of each arm already puts the other far
 * behind (ab__host_learn_settles), the trial's pick is kept now: the
 * measuring would run the other twice more at that speed. A 64 MiB
 * float32 transpose with both kinds of rows off lines (4104^2, the
 * blocks picked) ran its streamed bands at a third to a half of the
 * blocks' speed, and three of its first six calls were those (AMD EPYC
 * VM, bench/results/2026-12-04-amd-uint16-groups.md). Only the trial's
 * pick is kept early, never the other: the first band of a size is often
 * the first to touch its output's pages, and that is the pick's. Bands of
 * slots handed out before it still end and record their times; where all
 * LEARN_SLOTS were handed out (bands on several threads), the last of
 * them makes the usual pick, which may be the other. */
static void settle_early(struct stream_learner *L, int mode, size_t bytes) {
  const uint64_t a = atomic_load_explicit(&L->best[0], memory_order_relaxed),
                 b = atomic_load_explicit(&L->best[1], memory_order_relaxed);
  int measuring = 0;
  if (!ab__host_learn_settles((double)a, (double)b, atomic_load_explicit(&settle_pct, memory_order_relaxed)) ||
      !atomic_compare_exchange_strong_explicit(&L->pick, &measuring, 1, memory_order_acq_rel, memory_order_relaxed))
    return;
  atomic_store_explicit(&L->uses, 0, memory_order_relaxed);
  AB_LOG(AB_LOG_DEBUG, "transposes of about %zu bytes: %s %.2f GB/s, %s %.2f GB/s, one band each: %s", bytes,
         ab__host_transpose_mode_name(mode), 1e6 / (double)a, ab__host_transpose_mode_name(other_variant(mode)),
         1e6 / (double)b, ab__host_transpose_mode_name(mode));
}
/* A timed band's end (secs 0: it could not run its variant, so counts
 * without a time); the last slot's end makes the pick. */
static void learn_end(struct stream_learner *L, int arm, int mode, double secs, size_t bytes) {
  const uint64_t v = (uint64_t)(secs * 1e15 / (double)bytes) + 1;
  uint64_t cur = atomic_load_explicit(&L->best[arm], memory_order_relaxed);
  while (secs > 0 && (cur == 0 || v < cur) &&
         !atomic_compare_exchange_weak_explicit(&L->best[arm], &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
  if (atomic_fetch_add_explicit(&L->timed, 1, memory_order_acq_rel) + 1 != LEARN_SLOTS) {
    settle_early(L, mode, bytes);
    return;
  }
  const uint64_t a = atomic_load_explicit(&L->best[0], memory_order_relaxed),
                 b = atomic_load_explicit(&L->best[1], memory_order_relaxed);
  const int p = ab__host_learn_pick((double)a, (double)b);
  atomic_store_explicit(&L->uses, 0, memory_order_relaxed);
  atomic_store_explicit(&L->pick, p, memory_order_release);
  const int other = other_variant(mode);
  AB_LOG(AB_LOG_DEBUG, "transposes of about %zu bytes: %s %.2f GB/s, %s %.2f GB/s: %s", bytes,
         ab__host_transpose_mode_name(mode), 1e6 / (double)a, ab__host_transpose_mode_name(other), 1e6 / (double)b,
         ab__host_transpose_mode_name(p == 1 ? mode : other));
}
#endif
bool ab__host_learn_settles(double trial_fs, double other_fs, int lead_pct) {
  return lead_pct > 0 && trial_fs > 0 && other_fs > 0 && other_fs * 100 >= trial_fs * lead_pct;
}
int ab__host_learn_settle_pct(int lead_pct) {
  return atomic_exchange_explicit(&settle_pct, lead_pct, memory_order_relaxed);
}
int ab__host_learn_pick(double trial_fs, double other_fs) {
  if (other_fs <= 0) return 1; /* the other never ran */
  return trial_fs <= 0 || other_fs * LEARN_MARGIN < trial_fs ? 2 : 1;
}

/* The learner for a band, or NULL where nothing is measured: a forced or
 * trial-only AB_HOST_STREAMING, or the plain tiles picked. The blocks are
 * weighed here also where the trial may not pick them (uint8 from the
 * cache with both kinds of rows off lines, blocks_open): the trial's one
 * transpose hides their first and last blocks' cost, which these bands
 * pay. AMD EPYC VM, one thread, GB/s, L1 tiles (the trial's pick there)
 * against the blocks, two rounds: 4000^2 7.4-8.1 against 13.8-14.3, 4 x
 * 2000^2 6.8-7.0 against 12.0-13.1, 3000^2 11.7-12.3 against 14.4-14.8;
 * 8 x 1000^2 15.7-16.9 against 13.4-13.5 and 2800^2 17.4-19.3 against
 * 14.9-15.4 keep the L1 tiles
 * (bench/results/2026-12-04-amd-uint16-groups.md). */
static struct stream_learner *learner_of(size_t es, int mode, bool rows_on_lines, bool src_on_lines, size_t whole,
                                         size_t plane, size_t bytes) {
  const int k = ab__width_index(es);
  if (k < 0 || mode == TR_PLAIN || forced_mode() != -1) return NULL;
  const int regime = tr_regime(whole, plane), kind = tr_kind(rows_on_lines, src_on_lines);
  return &learners[k][regime][kind][learn_size(bytes)][bytes < whole / 2];
}

int ab__host_learned_stores(size_t es, bool rows_on_lines, bool src_on_lines, size_t whole, size_t plane,
                            size_t bytes, int state[3]) {
  const int mode = ab__host_transpose_pick(es, rows_on_lines, src_on_lines, whole, plane);
  struct stream_learner *L = learner_of(es, mode, rows_on_lines, src_on_lines, whole, plane, bytes);
  if (L == NULL) return -1;
  state[0] = (int)atomic_load(&L->claimed);
  state[1] = (int)atomic_load(&L->timed);
  state[2] = (int)atomic_load(&L->uses);
  const int p = atomic_load(&L->pick);
  return p == 0 ? 0 : p == 1 ? mode : other_variant(mode);
}
int ab__host_last_transpose_mode(void) { return last_mode; }

void ab__host_transpose_preset(size_t es, int mode) {
  const int k = ab__width_index(es);
  if (k < 0) return;
  pthread_mutex_lock(&trial_lock);
  for (int kind = 0; kind < TR_KINDS; kind++) {
    for (int r = 0; r < TR_PICKS; r++) {
      tr_pick[k][r][kind] = mode;
      for (int c = 0; c < LEARN_SIZES; c++) /* what was learned against another pick goes */
        for (int part = 0; part < 2; part++) {
          learner_clear(&learners[k][r][kind][c][part]);
          atomic_store_explicit(&learners[k][r][kind][c][part].pick, 0, memory_order_release);
        }
    }
    atomic_store_explicit(&tr_ready[k][kind], true, memory_order_release);
  }
  pthread_mutex_unlock(&trial_lock);
}

/* ---- whole-line plain tiles for uint16 and 8-byte elements ----------------
 * Outputs under 4 MiB take the plain tiles; where their rows start on
 * lines, uint16 and 8-byte elements may take tiles that store whole lines
 * (tr32x32_16, tr8x8_64) or the SSE2 ones (8 x 8, 2 x 2). Which is faster
 * depends on the CPU where the source's rows are off lines. Intel Xeon
 * (Cascade Lake) VM: 1920 x 1080 uint16 (source rows 2160 bytes apart)
 * 0.67x -> 0.78x of memcpy with the whole-line tile; Intel Xeon (AMX) VM,
 * the same shape, 0.76-0.81x with the SSE2 tile against 0.66-0.69x, 1600
 * x 1000 0.80-0.84x against 0.72-0.77x, 512 x 510 float64 0.69-0.71x
 * against 0.57-0.59x. Where the source's rows are a whole number of lines
 * apart the whole-line tiles won on both (1024^2 uint16 0.50-0.58x against
 * 0.43-0.44x on the AMX VM, also with the whole source 16 bytes into a
 * line: 1920 x 1024 0.66-0.69x against 0.46-0.50x; one float64 shape lost
 * by 5% there) (bench/results/2026-11-27-intel-vbmi-rows.md). So: the
 * whole-line tiles there, and elsewhere what a trial measured once per
 * process and element size (line_trial); AB_HOST_LINE_TILES=1 or 0 forces
 * either. */
static _Atomic int line_pick[2] = {-1, -1}; /* uint16, 8-byte: 1 whole-line, 0 SSE2, -1 not yet measured */

/* An AB_HOST_* variable that is "1", "0" or "auto" (unset), through its
 * cache: 1, 0, or -1 for auto. */
static int forced_1_0(ab__env_cache *cache, const char *name) {
  static const struct ab__env_choice ways[] = {{"auto", -1}, {"1", 1}, {"0", 0}, {NULL, 0}};
  return ab__env_choice_cached(cache, name, ways, -1, "1, 0 or auto", NULL);
}
static int forced_line_tiles(void) {
  static ab__env_cache cache;
  return forced_1_0(&cache, "AB_HOST_LINE_TILES");
}

#ifdef HAVE_X86_KERNELS
/* The trial: an L3-sized transpose (3 MiB each way for uint16, 2 MiB for
 * float64) with source rows off lines as 1000 uint16 or 510 float64
 * columns are, each tile in turn four times, the first a warm-up, best of
 * the other three; the SSE2 tiles only where they win by 5%. */
static int line_trial(size_t es) {
  const int64_t na = es == 2 ? 1000 : 510, nb = es == 2 ? 1600 : 512; /* output rows, columns */
  const int64_t sb = na * (int64_t)es, dsa = nb * (int64_t)es;
  char *s = trial_alloc((size_t)(nb * sb)), *d = trial_alloc((size_t)(na * dsa));
  int pick = 1;
  if (s != NULL && d != NULL) {
    for (int64_t i = 0; i < nb * sb; i++) s[i] = (char)(i * 7);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 4; rep++)
      for (int w = 0; w < 2; w++) {
        struct transpose_ctx c = {na, nb, dsa, sb, es, TR_PLAIN, NULL, false, false, w, false};
        const double t0 = ab__seconds();
        visit_transpose(&c, d, s);
        const double dt = ab__seconds() - t0;
        if (rep > 0 && dt < best[w]) best[w] = dt; /* the first round warms up */
      }
    pick = best[0] * 1.05 <= best[1] ? 0 : 1;
    AB_LOG(AB_LOG_DEBUG, "plain tiles trial, %zu-byte elements, source rows off lines: SSE2 %.2f, whole lines %.2f GB/s: %s",
           es, (double)(nb * sb) / best[0] * 1e-9, (double)(nb * sb) / best[1] * 1e-9, pick ? "whole lines" : "SSE2");
  }
  free(s);
  free(d);
  return pick;
}

/* The answer where nothing need be measured: forced, or the whole-line
 * tiles (source rows on lines; sizes and CPUs with no choice to weigh),
 * or the trial's once it has run; -1 where it has not. */
static int line_rule(size_t es, int64_t sb) {
  const int forced = forced_line_tiles();
  if (forced >= 0) return forced;
  if ((es != 2 && es != 8) || sb % LINE == 0 || tiles_level() < TILES_AVX512) return 1;
  return atomic_load_explicit(&line_pick[es == 8], memory_order_acquire);
}

/* line_tiles' answer for a caller that holds trial_lock (the store
 * variants' trial, which times the plain tiles too): measured here if
 * it is not yet. */
static bool line_tiles_held(size_t es, int64_t sb) {
  int v = line_rule(es, sb);
  if (v < 0) {
    v = line_trial(es);
    atomic_store_explicit(&line_pick[es == 8], v, memory_order_release);
  }
  return v != 0;
}

/* Whether the plain tiles of es-byte elements (2 or 8) take the whole-line
 * tiles, for output rows on lines and source rows sb bytes apart. */
static bool line_tiles(size_t es, int64_t sb) {
  const int v = line_rule(es, sb);
  if (AB_LIKELY(v >= 0)) return v != 0;
  pthread_mutex_lock(&trial_lock); /* one trial at a time (see decide) */
  const bool lines = line_tiles_held(es, sb);
  pthread_mutex_unlock(&trial_lock);
  return lines;
}

/* Whether the plain tiles of uint16 whose output rows are off lines take
 * the AVX-512 16 x 32 tile (tr16x32_16: 32 bytes of each of 32 output
 * rows a tile) rather than SSE2's 8 x 8 (16 bytes of 8): where source
 * rows are a whole number of lines apart, from a line or not, or as
 * AB_HOST_LINE_TILES forces. Intel (AMX) VM, one thread, a harness, GB/s,
 * SSE2 -> 16 x 32, two or three rounds: source rows a whole number of
 * lines apart, 1080 x 1920 (output rows of 2160 bytes) 6.5-7.1 ->
 * 7.8-8.2, 16 bytes into a line 5.8-6.6 -> 6.8-7.3, 1000 x 1024
 * 6.9-7.1 -> 9.0-9.2, 720 x 1280 6.8-7.4 -> 9.1-9.7, 200 x 4096 6.8-7.3
 * -> 9.4, 600 x 800 19.6-21.2 -> 23.3-26.7; source rows off lines,
 * 1000^2 12.7-12.8 -> 11.5-12.4, 1000 x 2000 10.6-11.6 -> 10.2-10.8,
 * 1503 x 1500 the same (bench/results/2026-11-27-intel-u8-lanes.md).
 * Not measured on other CPUs. */
static bool wide_off_lines(int64_t sb) {
  const int forced = forced_line_tiles();
  return forced >= 0 ? forced != 0 : sb % LINE == 0;
}

/* ---- uint8 64 x 64 tiles with their lanes gathered (tr64x64_8_lanes) ----
 * That tile reads each of its 64 source rows' line (or two, for rows off
 * lines) in four passes, so those lines must stay in L1 between passes.
 * The rule: rows sb bytes apart, counted from a line, put no more lines
 * into any one L1 set than two thirds of its ways (sysfs's L1 geometry;
 * 8 ways of 64 sets where sysfs says nothing). On the Intel (AMX) VM's
 * 12-way, 64-set L1: rows 512 and 1536 bytes apart (8 lines a set) pass,
 * rows a multiple of 1024 apart (16 or more) do not. One thread, uint8,
 * against the joined tile (tr64x64_8), GB/s: bench_host, six alternated
 * runs, 1536^2 6.8-7.6 -> 8.0-10.9, 16 x 1000^2 (the L1 tiles) 8.8-9.8
 * -> 9.7-10.5; a harness that reads each result after converting it,
 * 512^2 21-25 -> 27-28, 1536^2 and 1920 x 1080 within the noise; where
 * the rule says no, 1024^2 in bench_host 13.4-15.2 -> 13.4-13.8 forced
 * (bench/results/2026-11-27-intel-u8-lanes.md). AB_HOST_U8_LANES=1 or 0
 * forces either tile. Untried on CPUs whose L1 has 8 ways, where rows 512
 * and 1536 bytes apart keep the joined tile; the geometry is cpu0's, so
 * a hybrid CPU's other cores go by it too. */
static int l1_geometry(void) { /* ways << 16 | sets (sets at most 64) */
  static _Atomic int cached = -1;
  int g = atomic_load_explicit(&cached, memory_order_relaxed);
  if (AB_LIKELY(g >= 0)) return g;
  long long ways = sysfs_cache_field(1, "ways_of_associativity"), sets = sysfs_cache_field(1, "number_of_sets");
  if (ways <= 0 || ways > 64 || sets <= 0) ways = 8, sets = 64;
  g = (int)(ways << 16 | (sets < 64 ? sets : 64)); /* more sets than 64 only spread lines further */
  atomic_store_explicit(&cached, g, memory_order_relaxed);
  return g;
}

static bool u8_lanes_rule(int64_t sb) {
  const int g = l1_geometry(), ways = g >> 16, sets = g & 0xffff;
  unsigned char per_set[64] = {0};
  int most = 0;
  for (int64_t i = 0; i < 64; i++) {
    const uint64_t first = (uint64_t)i * (uint64_t)sb; /* row i's first byte, modulo 2^64 */
    const int lines = first % LINE == 0 ? 1 : 2;     /* its 64 bytes' lines */
    for (int k = 0; k < lines; k++) {
      const int n = ++per_set[(first / LINE + (uint64_t)k) % (uint64_t)sets];
      most = n > most ? n : most;
    }
  }
  return 3 * most <= 2 * ways;
}

/* Asked once for each plane (visit_transpose, transpose_streamed); a
 * batch of small planes asks again and again for one pitch, so the last
 * answer is kept: (sb + 2^30) << 1 | answer, for |sb| < 2^30. */
static bool u8_lanes(int64_t sb) {
  static ab__env_cache forced_cache, memo;
  const int forced = forced_1_0(&forced_cache, "AB_HOST_U8_LANES");
  if (forced >= 0) return forced != 0;
  const int64_t bias = (int64_t)1 << 30;
  const bool keep = sb >= -bias && sb < bias;
  uint32_t v;
  if (keep && AB_LIKELY(ab__env_cached(&memo, &v)) && (int64_t)(v >> 1) == sb + bias) return v & 1;
  const bool lanes = u8_lanes_rule(sb);
  if (keep) ab__env_keep(&memo, (uint32_t)(sb + bias) << 1 | lanes);
  return lanes;
}
#endif

int ab__host_u8_lanes(int64_t sb) {
#ifdef HAVE_X86_KERNELS
  return u8_lanes(sb);
#else
  (void)sb;
  return 0;
#endif
}

int ab__host_line_tiles(size_t es, int64_t sb) {
#ifdef HAVE_X86_KERNELS
  if ((es != 2 && es != 8) || tiles_level() < TILES_AVX512) return 0;
  return line_tiles(es, sb);
#else
  (void)es;
  (void)sb;
  return 0;
#endif
}

int ab__host_wide_off_lines(int64_t sb) {
#ifdef HAVE_X86_KERNELS
  return tiles_level() >= TILES_AVX512 && wide_off_lines(sb);
#else
  (void)sb;
  return 0;
#endif
}

int ab__host_line_tiles_known(size_t es) {
  if (es != 2 && es != 8) return 0;
  const int forced = forced_line_tiles();
  return forced >= 0 ? forced : atomic_load_explicit(&line_pick[es == 8], memory_order_acquire);
}

const char *ab__host_transpose_mode_name(int mode) {
  static const char *const names[] = {"plain", "streamed", "blocked"};
  return mode >= 0 && mode < TR_MODES ? names[mode] : "auto";
}

int ab__host_streaming(void) { return ab__host_transpose_mode(4); }

size_t ab__host_stream_min(void) {
#ifdef HAVE_X86_KERNELS
  return STREAM_MIN;
#else
  return SIZE_MAX;
#endif
}

int ab__host_tiles_level(void) {
#ifdef HAVE_X86_KERNELS
  return tiles_level();
#else
  return AB_TILES_SSE2;
#endif
}

bool ab__host_wide_blocks(size_t es) {
#ifdef HAVE_X86_KERNELS
  return blocks_wide(es);
#else
  (void)es;
  return false;
#endif
}

int ab__host_block_buffers(size_t es) {
#ifdef HAVE_X86_KERNELS
  return blocks_one_buffer(es) ? 1 : 2;
#else
  (void)es;
  return 0;
#endif
}

bool ab__host_runs_in_pages(const void *s, int64_t sb, size_t n) {
#ifdef HAVE_X86_KERNELS
  return runs_in_pages(s, sb, n);
#else
  (void)s, (void)sb, (void)n;
  return false;
#endif
}

const char *ab__host_vendor(void) {
#ifdef HAVE_X86_KERNELS
  return host_intel() ? "intel" : "other";
#else
  return "other";
#endif
}

const char *ab__host_prefetch(void) {
#ifdef HAVE_X86_KERNELS
  static const char *const names[] = {"off", "narrow", "pages"};
  return names[strip_prefetch()];
#else
  return "off";
#endif
}

const char *ab__host_tiles(void) {
#ifdef HAVE_X86_KERNELS
  static const char *const names[] = {"sse2", "ssse3", "avx", "avx2", "avx512", "avx512vbmi"};
  return names[tiles_level()];
#else
  return "portable";
#endif
}

static atomic_ulong one_pass_planes;
unsigned long ab__host_one_pass_planes(void) { return atomic_load_explicit(&one_pass_planes, memory_order_relaxed); }

#ifdef HAVE_X86_KERNELS
/* Whether the one-pass casts below may take an na x nb plane in tiles of
 * `tile`: AVX-512 kernels, a tile or more each way, result rows pitch
 * bytes apart from dst all on lines, and AB_HOST_CAST_TILES not 0 (one
 * cache for both casts). */
static bool one_pass_open(const void *dst, int64_t pitch, int64_t na, int64_t nb, int64_t tile) {
  static ab__env_cache cache;
  return tiles_level() >= TILES_AVX512 && na >= tile && nb >= tile && on_lines(dst, pitch) &&
         ab__env_switch(&cache, "AB_HOST_CAST_TILES", 1);
}
#endif

bool ab__host_widen_8(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb, bool sign,
                      ab__one_pass_to to, bool stream, bool affine, float a, float b) {
#ifdef HAVE_X86_KERNELS
  if (!one_pass_open(dst, pitch, na, nb, 64)) return false;
  widen_tiles_8(dst, pitch, src, sb, na, nb, sign, to, stream, affine, a, b);
  atomic_fetch_add_explicit(&one_pass_planes, 1, memory_order_relaxed);
  return true;
#else
  (void)dst, (void)pitch, (void)src, (void)sb, (void)na, (void)nb, (void)sign, (void)to, (void)stream, (void)affine,
      (void)a, (void)b;
  return false;
#endif
}

bool ab__host_widen_16_f32(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb,
                           ab__widen16_from from, bool stream, bool affine, float a, float b) {
#ifdef HAVE_X86_KERNELS
  if (!one_pass_open(dst, pitch, na, nb, 32)) return false;
  widen_tiles_16_f32(dst, pitch, src, sb, na, nb, from, stream, affine, a, b);
  atomic_fetch_add_explicit(&one_pass_planes, 1, memory_order_relaxed);
  return true;
#else
  (void)dst, (void)pitch, (void)src, (void)sb, (void)na, (void)nb, (void)from, (void)stream, (void)affine, (void)a,
      (void)b;
  return false;
#endif
}

bool ab__host_narrow_f32_16(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb, bool bf16,
                            bool stream, bool affine, float a, float b) {
#ifdef HAVE_X86_KERNELS
  if (!one_pass_open(dst, pitch, na, nb, 32)) return false;
  narrow_tiles_f32_16(dst, pitch, src, sb, na, nb, bf16, stream, affine, a, b);
  atomic_fetch_add_explicit(&one_pass_planes, 1, memory_order_relaxed);
  return true;
#else
  (void)dst, (void)pitch, (void)src, (void)sb, (void)na, (void)nb, (void)bf16, (void)stream, (void)affine, (void)a,
      (void)b;
  return false;
#endif
}

void ab__host_gather(void *dst, const void *src, int32_t ndim, const int64_t *shape,
                     const int64_t *byte_strides, size_t elsize) {
  ab__host_gather_part(dst, src, ndim, shape, byte_strides, elsize, 0);
}

void ab__host_gather_part(void *dst, const void *src, int32_t ndim, const int64_t *shape,
                          const int64_t *byte_strides, size_t elsize, size_t whole) {
  ab__host_gather_into(dst, NULL, src, ndim, shape, byte_strides, elsize, whole);
}

void ab__host_gather_into(void *dst, const int64_t *dst_strides, const void *src, int32_t ndim,
                          const int64_t *shape, const int64_t *byte_strides, size_t elsize, size_t whole) {
  dims d;
  int64_t dst_st[AB_MAX_NDIM];
  const int64_t es = (int64_t)elsize;

  for (int32_t i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  if (dst_strides != NULL) {
    d.n = ab__merge_dims2(ndim, shape, byte_strides, dst_strides, d.shape, d.st, dst_st);
  } else {
    simplify(&d, ndim, shape, byte_strides);
    int64_t acc = es;
    for (int i = d.n - 1; i >= 0; i--) {
      dst_st[i] = acc;
      acc *= d.shape[i];
    }
  }
  if (d.n == 0 || (d.n == 1 && d.st[0] == es && dst_st[0] == es)) {
    memcpy(dst, src, (size_t)(d.n == 0 ? 1 : d.shape[0]) * elsize);
    return;
  }
  const int last = d.n - 1;
  if (dst_st[last] != es) {
    struct scatter_ctx c = {d.shape[last], d.st[last], dst_st[last], elsize};
    for_outer(&d, dst_st, 1ull << last, dst, src, visit_scatter, &c);
    return;
  }
  if (d.st[last] == es) {
    struct rows_ctx c = {(size_t)(d.shape[last] * es)};
    for_outer(&d, dst_st, 1ull << last, dst, src, visit_row, &c);
    return;
  }
  int j = -1;
  for (int i = last - 1; i >= 0; i--)
    if (d.st[i] == es) { j = i; break; }
  if (j >= 0) {
    struct transpose_ctx c = {d.shape[j], d.shape[last], dst_st[j], d.st[last], elsize, TR_PLAIN, NULL, false, false,
                              -1, false};
#ifdef HAVE_X86_KERNELS
    int mode = TR_PLAIN, arm = -1, picked = TR_PLAIN;
    struct stream_learner *learner = NULL;
    int64_t total = es; /* the output's bytes */
    for (int i = 0; i < d.n; i++) total *= d.shape[i];
    /* Streaming stores for large outputs where the CPU gains by them, in
     * tiles of SEG-byte rows (element sizes that divide it) and output rows
     * of one tile or more. Without room for the carried lines (and the
     * blocks' buffer) the plain tiles do it. Large is the whole
     * conversion's output, not this band's: bands of a batch of planes on
     * two threads are a plane or two, and when they took the plain tiles
     * two threads ran no faster than one (EPYC, 16 uint8 planes of 1000^2,
     * bands of 1 MB: 15-16 GB/s; with the whole's variant, 34-36). */
    if (whole == 0) whole = 2 * (size_t)total;
    if (whole / 2 >= STREAM_MIN && SEG % es == 0 && c.nb * es >= SEG && c.na > FEW_ROWS) {
      bool rows_on_lines = (uintptr_t)dst % LINE == 0;
      for (int i = 0; i < last; i++) rows_on_lines = rows_on_lines && dst_st[i] % LINE == 0;
      const size_t plane = (size_t)(c.na * c.nb) * elsize;
      mode = ab__host_transpose_pick(elsize, rows_on_lines, c.sb % LINE == 0, whole, plane);
      learner = learner_of(elsize, mode, rows_on_lines, c.sb % LINE == 0, whole, plane, (size_t)total);
      picked = mode;
      if (learner != NULL) mode = learn_begin(learner, mode, &arm);
      c.from_memory = from_memory(whole);
      if (mode != TR_PLAIN) {
        /* the blocks' buffer after the carried lines; or a line of slack
         * for stream_row_avx512's masked load of the last row's carry */
        c.wide = mode == TR_BLOCKED && blocks_wide(elsize);
        c.one = mode == TR_BLOCKED && blocks_one_buffer(elsize);
        c.carry =
            ab__malloc((size_t)c.na * LINE + (mode == TR_BLOCKED ? blk_buffer(elsize, c.wide, c.one) : LINE));
        if (c.carry != NULL) c.mode = mode;
      }
    }
    if (arm >= 0 && c.mode != mode) { /* no room for the variant: its slot ends untimed */
      learn_end(learner, arm, picked, 0, (size_t)total);
      arm = -1;
    }
    const double t0 = arm >= 0 ? ab__seconds() : 0;
#else
    (void)whole; /* the plain tiles only: no variant to pick */
#endif
    for_outer(&d, dst_st, (1ull << last) | (1ull << j), dst, src, visit_transpose, &c);
#ifdef HAVE_X86_KERNELS
    if (c.carry != NULL) {
      _mm_sfence(); /* order the streaming stores before the caller's */
      ab__free(c.carry);
    }
    if (arm >= 0) learn_end(learner, arm, picked, ab__seconds() - t0, (size_t)total);
    last_mode = c.mode;
#endif
    return;
  }
  struct strided_ctx c = {d.shape[last], d.st[last], elsize};
  for_outer(&d, dst_st, 1ull << last, dst, src, visit_strided, &c);
}
