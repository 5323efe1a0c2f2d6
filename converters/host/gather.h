/* Host strided gather: any-strided N-d array -> compact row-major copy. */
#ifndef AB_CONVERTERS_HOST_GATHER_H
#define AB_CONVERTERS_HOST_GATHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A cache line's bytes, as the kernels write them (whole lines, lines'
 * alignment), on every CPU they run on. */
#define AB_CACHE_LINE 64

/* Copies the ndim-dimensional array at `src` into `dst` in row-major order.
 * shape[i] >= 0; byte_strides[i] is the distance in bytes between
 * neighbours along dim i (any sign, 0 for broadcast); elsize is the bytes
 * of one element. The caller has validated that every addressed byte is
 * readable and that dst holds prod(shape) * elsize bytes, which must not
 * overlap src. ndim <= AB_MAX_NDIM. */
void ab__host_gather(void *dst, const void *src, int32_t ndim, const int64_t *shape,
                     const int64_t *byte_strides, size_t elsize);

/* The same for a part of a larger conversion (a band of it on one
 * thread): whole is the bytes the whole one reads and writes (source and
 * output), which decide whether a transpose is large enough for
 * streaming stores and whether it is timed as one from the last-level
 * cache or from memory; 0: this part alone. */
void ab__host_gather_part(void *dst, const void *src, int32_t ndim, const int64_t *shape,
                          const int64_t *byte_strides, size_t elsize, size_t whole);

/* The same into an output that need not be compact: dst_strides[i] is
 * the byte distance in dst between neighbours along dim i (NULL: compact
 * row-major), positive, not overlapping (a band of every plane of a larger
 * output, say). The kernels run where the innermost dim of size > 1 is
 * contiguous in the output; elsewhere it goes element by element. dst and
 * the bytes it addresses must not overlap src. */
void ab__host_gather_into(void *dst, const int64_t *dst_strides, const void *src, int32_t ndim,
                          const int64_t *shape, const int64_t *byte_strides, size_t elsize, size_t whole);

/* How large transposes of es-byte elements write on this machine, for
 * output rows on cache lines from source rows at one offset in a line,
 * planes of 16 MiB and more too large for the last-level cache (other
 * rows and sizes:
 * ab__host_transpose_pick): 0 (plain tiles, ordinary stores), 1 (streamed
 * L1 tiles) or 2 (streamed L2 blocks), from AB_HOST_STREAMING (0, 1,
 * blocked) or measured once per element size and kind of rows (auto:
 * this measures rows on lines where no transpose has yet); element sizes
 * other than 1, 2, 4, 8 and 16 bytes are always 0. See gather.c. */
int ab__host_transpose_mode(size_t es);
/* The same without deciding: -1 while not yet measured. */
int ab__host_transpose_mode_known(size_t es);
/* The kinds of rows whose trials have run for es-byte elements (forced
 * ones included), a bit each: 1 rows on lines, 2 output rows off lines,
 * 4 source rows off, 8 both off; each is measured at the first transpose
 * that asks for it. */
unsigned ab__host_transpose_kinds_known(size_t es);
/* The variant (0, 1, 2 as above) for one large transpose: output rows all
 * on cache lines or not, source rows all at one offset in a line or not,
 * reading and writing `whole` bytes in all (the last-level cache or
 * memory), in 2-D transposes of `plane` bytes each as this band runs them
 * (a plane of a batch, or a thread's strip of a plane: the kernel's first
 * and last blocks are each strip's). Decides as ab__host_transpose_mode. */
int ab__host_transpose_pick(size_t es, bool rows_on_lines, bool src_on_lines, size_t whole, size_t plane);
/* Where the trial picks a streaming variant (1 or 2) and the other was
 * open to it, the transposes measure the two themselves: per element
 * size, kind of rows, regime, band size (a power of two of the band's
 * output bytes) and whether the band is the whole job's output or less
 * (a band of a job cut between threads, or a piece of a cast that
 * transposes through a buffer), the first 6 bands alternate the trial's
 * pick and the other, each timed, and the faster is kept (the other only where
 * ab__host_learn_pick says); the trial's pick is kept at once where the
 * first band of each says so (ab__host_learn_settles); every
 * AB__STREAM_RELEARN bands after a pick time both again.
 * AB_HOST_STREAMING=trial (or forced) keeps the trial's picks. See
 * gather.c. */
#define AB__STREAM_RELEARN 256u
/* Whether the first timed bands of the trial's pick and of the other
 * (femtoseconds a byte; 0: not timed yet) end the measuring at once with
 * the trial's pick: the other took `lead_pct` percent of the pick's time
 * or more (AB__STREAM_SETTLE_PCT; 0: never). */
#define AB__STREAM_SETTLE_PCT 130
bool ab__host_learn_settles(double trial_fs, double other_fs, int lead_pct);
/* For tests: the lead (percent) that ends the measuring early, from now
 * on (0: never); returns the one before. */
int ab__host_learn_settle_pct(int lead_pct);
/* For tests: every kind of rows of es-byte elements taken as measured,
 * with `mode` picked in every regime (the streaming variants are then
 * still measured on the transposes, as after a trial). */
void ab__host_transpose_preset(size_t es, int mode);
/* The pick from each arm's fastest band, femtoseconds a byte (0: none
 * timed): 1 the trial's pick, 2 the other (5% faster at least). */
int ab__host_learn_pick(double trial_fs, double other_fs);
/* For tests: the measuring of a band of `bytes` output bytes in such a
 * transpose (arguments as ab__host_transpose_pick): -1 where none runs,
 * 0 while measuring, else the variant kept; state: slots handed out,
 * slots done, bands since the pick. */
int ab__host_learned_stores(size_t es, bool rows_on_lines, bool src_on_lines, size_t whole, size_t plane,
                            size_t bytes, int state[3]);
/* The variant the calling thread's last 2-D transpose band ran (0, 1,
 * 2), -1 before any. */
int ab__host_last_transpose_mode(void);
/* The smallest output (bytes) a transpose may stream or block: 4 MiB;
 * smaller ones take the plain tiles. SIZE_MAX where no streaming variant
 * exists (off x86-64). */
size_t ab__host_stream_min(void);
/* Bytes of cpu0's last-level data or unified cache (Linux sysfs; 0 where
 * unknown), read once. */
size_t ab__host_llc_bytes(void);
/* n bytes (whole cache lines) from s to line-aligned d with streaming
 * stores where the CPU has them (x86-64; memcpy elsewhere), unordered
 * with later stores until ab__host_stream_fence. For results too large
 * to stay in the cache (the casts' rows, convert.c). */
void ab__host_stream_lines(void *d, const void *s, size_t n);
/* Orders this thread's streaming stores before its later stores (sfence). */
void ab__host_stream_fence(void);
/* The rule that picks from a trial's best times (seconds, indexed 0, 1,
 * 2 as above): a streaming variant where it beats the plain tiles by 10%,
 * the blocks (if `blocks` lets them in) where they also beat the L1 tiles
 * by 10%; for large planes from memory (`large`), the blocks wherever
 * they trail neither other variant by more than 10%. */
int ab__host_pick_variant(const double best[3], bool blocks, bool large);
/* "plain", "streamed", "blocked" for 0, 1, 2; "auto" for -1. */
const char *ab__host_transpose_mode_name(int mode);
/* ab__host_transpose_mode(4): that choice for float32. */
int ab__host_streaming(void);
/* The instruction sets of the host kernels, in order, and the widest this
 * CPU runs as AB_HOST_TILES caps it (AB_TILES_SSE2 off x86-64); the cast
 * loops (convert.c) follow it too. */
enum { AB_TILES_SSE2, AB_TILES_SSSE3, AB_TILES_AVX, AB_TILES_AVX2, AB_TILES_AVX512, AB_TILES_AVX512VBMI };
int ab__host_tiles_level(void);
/* The host kernels this CPU runs ("avx512vbmi", "avx512", "avx2", "avx", "ssse3", "sse2"; "portable"
 * off x86-64), as AB_HOST_TILES caps them; see gather.c. */
const char *ab__host_tiles(void);
/* Which uint8 and uint16 blocks from memory prefetch the next strip's
 * source rows: "pages" (those whose row runs cross a 4 KiB page: Intel,
 * ab__host_vendor), "narrow" (all: every other x86-64 vendor), "off";
 * AB_HOST_PREFETCH decides instead. "off" off x86-64 (no blocks there); see gather.c.
 * For tests: ab_device_info's version line has no room left for it
 * (abtool info prints the CPU's vendor, which decides it unless
 * AB_HOST_VENDOR says otherwise). */
const char *ab__host_prefetch(void);
/* Whether the host kernels take Intel's answers where those differ by
 * vendor (the prefetches above, uint16's L2 block layout, uint8's one L2
 * block buffer): "intel" where
 * cpuid says GenuineIntel, else "other"; AB_HOST_VENDOR=intel or other
 * decides instead (for tests). "other" off x86-64. */
const char *ab__host_vendor(void);
/* Whether the L2 blocks of es-byte transposes read 4 KiB of each source
 * row (uint8 4096 columns, uint16 2048; up to an eighth more before a
 * second block is cut) rather than 1024 columns: uint8
 * blocks with AVX-512 and uint16 ones on Intel CPUs with it (the strip
 * layouts) where the L2 holds 2 MiB or more (sysfs), or as
 * AB_HOST_WIDE_BLOCKS=1 or 0 says; false for other sizes and off x86-64.
 * See gather.c. For tests. */
bool ab__host_wide_blocks(size_t es);
/* How many buffers the L2 blocks of es-byte transposes fill: 1 (a block
 * is filled, then streamed out whole, before the next fills the same
 * buffer: uint8 blocks with AVX-512 on Intel CPUs, ab__host_vendor) or 2
 * (the previous block streams out of one while the next fills the other:
 * every other case); AB_HOST_BLOCK_BUFFERS=1 or 2 decides instead, for
 * every element size. 0 off x86-64 (no blocks there). See gather.c. For
 * tests. */
int ab__host_block_buffers(size_t es);
/* Whether the plain tiles (outputs under 4 MiB, and larger ones where
 * they are picked or forced) of es-byte elements take
 * the AVX-512 tiles that store whole lines where output rows start on
 * lines and source rows are sb bytes apart: 2- and 8-byte elements with
 * AVX-512 only; where sb is not a whole number of lines, measured once per
 * process and element size (the first call may run the trial);
 * AB_HOST_LINE_TILES=1 or 0 forces the answer. See gather.c. */
int ab__host_line_tiles(size_t es, int64_t sb);
/* The answer for source rows off lines without measuring: 1 or 0 once
 * measured or forced, -1 before; 0 for other element sizes. */
int ab__host_line_tiles_known(size_t es);
/* Whether the plain tiles of uint16 whose output rows are off lines take
 * the AVX-512 16 x 32 tile (32-byte stores) rather than SSE2's 8 x 8,
 * for source rows sb bytes apart: with AVX-512, where sb is a whole
 * number of lines, or as AB_HOST_LINE_TILES=1 or 0 forces; 0 without
 * AVX-512 and off x86-64. See gather.c. For tests. */
int ab__host_wide_off_lines(int64_t sb);
/* Whether the plain and L1 tiles' uint8 64 x 64 tiles (AVX-512, output
 * rows on lines) gather their registers' lanes from source rows sb bytes
 * apart (where those rows' lines fit L1's sets, by sysfs's geometry)
 * rather than join their output rows from a scratch; AB_HOST_U8_LANES=1
 * or 0 forces the answer. The rule's answer on any x86-64 CPU, though
 * only the AVX-512 tiles act on it; 0 off x86-64. See gather.c. For
 * tests. */
int ab__host_u8_lanes(int64_t sb);
/* What a one-pass transposed cast writes (ab__host_widen_8). */
typedef enum { AB_ONE_PASS_F32, AB_ONE_PASS_F16, AB_ONE_PASS_BF16 } ab__one_pass_to;
/* A uint8 (int8 where sign) plane transposed and widened to float32,
 * float16 or bfloat16 (`to`) in one pass, for transposed casts
 * (convert.c, transposed_in_one_pass): result element (i, j), at dst + i
 * * pitch + j * (4, or 2 for 16-bit results), is source byte (i, j) at src
 * + i + j * sb, as float, times a plus b where affine (in float32),
 * rounded to nearest even for 16-bit results as ab__host_narrow_f32_16
 * rounds. Whole lines are written, with streaming stores where `stream`
 * (the caller then fences them), with ordinary ones elsewhere. Does the
 * whole 64 x 64 tiles, rows [0, na - na % 64) by columns [0, nb - nb %
 * 64), and returns true; the caller does the ragged edges. Returns false,
 * having written nothing, without AVX-512 (or as AB_HOST_TILES caps it),
 * where either side is under 64, rows do not all start on cache lines,
 * or AB_HOST_CAST_TILES=0 turns it off. */
bool ab__host_widen_8(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb, bool sign,
                      ab__one_pass_to to, bool stream, bool affine, float a, float b);
/* The 16-bit sources ab__host_widen_16_f32 widens. */
typedef enum { AB_WIDEN16_U16, AB_WIDEN16_I16, AB_WIDEN16_F16, AB_WIDEN16_BF16 } ab__widen16_from;
/* The same for a plane of 16-bit elements (`from`: uint16, int16,
 * float16 or bfloat16) widened to float32: result element (i, j), at dst
 * + i * pitch + 4 * j, is the element at src + 2 * i + j * sb, as float
 * (a float16 or bfloat16 NaN quiet with its sign and payload, as
 * convert.c's loops make it), times a plus b where affine. Does the whole
 * 32 x 32 tiles, rows [0, na - na % 32) by columns [0, nb - nb % 32);
 * false, having written nothing, on the same terms with 32 for 64. */
bool ab__host_widen_16_f32(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb,
                           ab__widen16_from from, bool stream, bool affine, float a, float b);
/* The same for a float32 plane narrowed to float16, or bfloat16 where
 * bf16 (convert.c, transposed_in_one_pass): result element (i, j), at
 * dst + i * pitch + 2 * j, is the float32 at src + 4 * i + j * sb (times
 * a plus b where affine) rounded to nearest even: float16 as F16C's
 * VCVTPS2PH rounds, bfloat16 as convert.c's loops do (NaNs quiet with
 * their top payload bits). Whole lines, streamed where `stream` (the
 * caller fences them) or stored. Does the whole 32 x 32 tiles, rows [0,
 * na - na % 32) by columns [0, nb - nb % 32), and returns true; false,
 * having written nothing, on the same terms with 32 for 64. */
bool ab__host_narrow_f32_16(void *dst, int64_t pitch, const void *src, int64_t sb, int64_t na, int64_t nb, bool bf16,
                            bool stream, bool affine, float a, float b);
/* How many planes (or bands of planes) ab__host_widen_8 and
 * ab__host_narrow_f32_16 have done in this process. For tests. */
unsigned long ab__host_one_pass_planes(void);
/* Kernel choices counted for the tests, so that a test forcing one can
 * tell it was taken (the bytes are the same whichever runs): each a
 * process-wide count, kept only after ab__host_count_choices(true) (in
 * other processes no thread writes the counts' line; the strips of
 * ab__host_u8_shifted_strips likewise), never bumped per tile or row: the
 * plain tiles' choices once per plane (or thread's band of one), the
 * blocks' once per block walk, the casts' once per call of the typed loops
 * (a whole cast, or a chunk or plane edge of one). Counted where the
 * choice is made, not in the kernels. */
typedef enum {
  AB_RAN_PLANES_U8_VBMI, /* uint8 pixels of 3 or 4 channels to planes by VBMI (visit_transpose) */
  AB_RAN_U8_LANES,       /* plain tiles of uint8 that gather their lanes (visit_transpose) */
  AB_RAN_WIDE_BLOCKS,    /* wide strip-layout blocks (transpose_blocked) */
  AB_RAN_ONE_BUFFER,     /* blocks through one buffer (transpose_blocked) */
  AB_RAN_TWO_BUFFERS,    /* blocks through two halves of one */
  AB_RAN_CAST_BASE,      /* the fast cast loops' baseline build (convert.c, fast_plain_row) */
  AB_RAN_CAST_AVX2,      /* their AVX2 build */
  AB_RAN_CAST_AVX512,    /* their AVX-512 build */
  AB_RAN_PLANES_RGB_SSSE3, /* the SSSE3 image loop, uint8 RGB to float32 planes (convert.c, u8_planes_f32) */
  AB_RAN_CAST_F16C,      /* float16 on a side through F16C (convert.c, fast_row) */
  AB_RAN_CAST_F16_BITS,  /* float16 on a side through the float32 loops without F16C (convert.c, fast_row) */
  AB_RAN_U8_GROUPS,      /* plain tiles of uint8 in groups of pieces (tile_u8_avx512, u8_grouped) */
  AB_RAN_U16_GROUPS,     /* uint16 in groups of pieces (band_u16_grouped, u8_grouped) */
  AB_RAN_KINDS
} ab__host_choice;
void ab__host_count_choices(bool on);
void ab__host_ran(ab__host_choice k);
unsigned long ab__host_ran_count(ab__host_choice k); /* 0 for k outside the kinds above */
/* How many strips of 64 destination rows the plain tiles have written
 * through the uint8 tiles for destination rows off cache lines (AVX-512
 * VBMI; gather.c, strip_u8_shifted) in this process while counting (see
 * ab__host_count_choices). For tests. */
unsigned long ab__host_u8_shifted_strips(void);
/* Whether rows of n bytes at s, s + sb, ... all lie within one 4 KiB page
 * each, as the "pages" rule asks (false off x86-64). For tests. */
bool ab__host_runs_in_pages(const void *s, int64_t sb, size_t n);


#endif
