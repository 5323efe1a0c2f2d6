/* Helpers shared by the tests: reference tensors and an obviously-correct
 * element-by-element gather to compare the library against. */
#ifndef AB_TEST_SUPPORT_H
#define AB_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arraybridge/arraybridge.h"

#define CPU0 ((DLDevice){kDLCPU, 0})
/* A size far past any cache or memory that size_t holds on 32- and 64-bit
 * targets alike: 2^40, or 2^31 where size_t has 32 bits. Loops that shift
 * sizes up to it stop at 0 too (a shift past the top gives 0). */
#define TEST_HUGE_SIZE ((size_t)1 << (SIZE_MAX > 0xffffffffu ? 40 : 31))

static inline DLDataType dt(uint8_t code, uint8_t bits, uint16_t lanes) {
  DLDataType t = {code, bits, lanes};
  return t;
}

/* Fills n bytes with a deterministic pattern that differs per seed. */
void fill_pattern(void *p, size_t n, uint32_t seed);

/* Reference gather: walks every logical index in row-major order and copies
 * one element from its strided address. Slow and obviously right. */
void reference_gather(const DLTensor *t, void *dst);

/* Element size in bytes of a (valid, byte-sized) dtype. */
size_t elsize_of(DLDataType d);

/* Number of elements of a shape. */
int64_t numel_of(int32_t ndim, const int64_t *shape);

/* Checks a result's invariants as a copy: compact strides, IS_COPIED,
 * version 1, shape equal to src's, its own shape and strides arrays, data
 * 256-aligned (NULL when empty). Returns 1 if all hold. */
int is_compact_copy_of(const DLManagedTensorVersioned *r, const DLTensor *src);

/* Compares a result's bytes with reference_gather(src): -1 when every byte
 * matches (or both are empty), else the index of the first differing byte. */
int64_t first_diff_vs_reference(const DLTensor *src, const DLManagedTensorVersioned *r);

/* Bytes of dev's pool in use now; fails the test if the pool cannot say. */
uint64_t pool_in_use(DLDevice dev);

/* FNV-1a 64 of n bytes, to prove a buffer was not written. */
uint64_t checksum(const void *p, size_t n);

/* A small seeded generator (splitmix64) so random cases replay exactly. */
typedef struct test_rng {
  uint64_t s;
} test_rng;
uint64_t rng_next(test_rng *r);
/* Uniform in [lo, hi] (inclusive). */
int64_t rng_between(test_rng *r, int64_t lo, int64_t hi);

/* Writes n float32 values that probe the float16 and bfloat16 roundings:
 * values spread over float16's range (subnormals to overflow), exact ties
 * of both types, the overflow thresholds, NaN and infinities. */
void fill_half_probes(float *v, int64_t n, test_rng *rng);

/* Equal bits, or both NaN, for a 16-bit float type whose exponent field is
 * all ones at `inf` (float16 0x7c00, bfloat16 0x7f80). */
int same_16(uint16_t a, uint16_t b, uint16_t inf);

/* Equal float32 bits; where `mapped` (a device's conversion with an
 * affine or per-channel map), both NaN will do too: the payload of a NaN
 * is then what the device's multiply and add make of it (a GPU returns
 * its canonical NaN), which need not be the host's. Without a map the
 * device kernels' loads and stores keep the host's NaNs (docs/guide.md). */
int same_f32(float a, float b, int mapped);

/* Equal elements of dtype t (one lane): equal bits, or for float16,
 * bfloat16, float32 and float64 both NaN (payloads may differ between
 * devices). */
int same_element(DLDataType t, const void *a, const void *b);

/* Fills n elements of dtype t (bool, 8- to 64-bit integers, float16,
 * bfloat16, float32, float64) with values that decide conversions among
 * random bits: for integers each type's extremes and the neighbours of
 * 2^24 and 2^53 (where float32 and float64 round); for bool any nonzero
 * byte; for floats the ties of every integer type, values at and past
 * the bounds of every integer type and of float16, float32, NaN,
 * infinities, signed zeros and subnormals. */
void fill_cast_probes(void *v, int64_t n, DLDataType t, test_rng *rng);

/* The one-lane dtypes the converters take, complex aside: bool, int8..64,
 * uint8..64, float16, bfloat16, float32, float64. */
#define CAST_NKINDS 13
extern const DLDataType cast_kinds[CAST_NKINDS];

/* A layout for a conversion test: 2- to 4-D, at most 6 per axis, axis
 * `*chan` at most 4 long (a channel axis), and a random axis order. */
void cast_shape(test_rng *rng, int32_t *ndim, int64_t *shape, int32_t *perm, int32_t *chan);

/* Options converting to `to` in the axis order `perm`, with (mode 0) no
 * map, (1) a per-tensor map x * 2 + 0.5 that puts integers on ties, or
 * (2) a per-channel map along `chan` whose scales and offsets push values
 * past every integer range. A float16 or bfloat16 source to its own type
 * gets mode 1 for 0 (a bare permutation of those is a gather, no cast). */
void cast_opts(int mode, DLDataType from, DLDataType to, int32_t chan, const int32_t *perm, ab_convert_opts *o);

/* A source for the tests of every pair: a cast_shape layout (ndim, shape,
 * perm, chan) of *n elements of dtype t holding fill_cast_probes values,
 * in memory to free(). */
void *cast_source(test_rng *rng, DLDataType t, int32_t *ndim, int64_t *shape, int32_t *perm, int32_t *chan, int64_t *n);

/* The first of n elements of dtype t at a and b that are not the same
 * (same_element), or -1. */
int64_t first_different_element(DLDataType t, const void *a, const void *b, int64_t n);

/* A value no library call may write into an output: tests preset *out to it
 * and check it is still there after a failure. */
#define SENTINEL_OUT ((DLManagedTensorVersioned *)(uintptr_t)0x5e41e1005e41e100ull)

/* Sanitizer builds run the same cases with smaller iteration counts. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define AB_TEST_SANITIZED 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#    define AB_TEST_SANITIZED 1
#  endif
#endif
#ifndef AB_TEST_SANITIZED
#  define AB_TEST_SANITIZED 0
#endif

/* ---- conversions and pools, checked (the test fails otherwise) ---- */

/* src converted to `to` with opts `o` (NULL: the defaults): fails the test
 * unless the call succeeds and the result is on a device of to's type. */
DLManagedTensorVersioned *convert_ok_with(const DLTensor *src, DLDevice to, const ab_convert_opts *o);
/* The same with only opts.copy and opts.stream set. */
DLManagedTensorVersioned *convert_ok(const DLTensor *src, DLDevice to, ab_copy_mode copy, void *stream);
/* dev's pool has nothing in use, and after a trim every driver allocation
 * it made is freed (nothing reserved). */
void assert_pool_clean(DLDevice dev);
/* Skips the test, saying why, unless `type` has n devices; fails it
 * instead when AB_TEST_EXPECT_<TYPE> (AB_TEST_EXPECT_OPENCL, ..._CUDA)
 * says this machine has at least n: make test exports
 * AB_TEST_EXPECT_OPENCL=2 (PoCL's two devices, which CI has), and the
 * simcuda tests set AB_TEST_EXPECT_CUDA=2 (their two simulated GPUs); a
 * plain ctest on another machine still skips, with the reason. */
void need_devices_of(DLDeviceType type, int n);
/* The first non-empty value of a `key` line in /proc/cpuinfo ("model
 * name", "vendor_id") into out, "" where there is none; read here, not
 * through the library, so tests can check what the library says. */
void cpuinfo_value(const char *key, char *out, size_t len);
/* The low n bytes (1, 2, 4 or 8) of v as an n-byte integer at p, in the
 * host's byte order; and back (zero-extended). Not memcpy of v's first n
 * bytes, which are its high ones on a big-endian host (s390x). */
void put_low_bytes(void *p, uint64_t v, size_t n);
uint64_t get_low_bytes(const void *p, size_t n);
/* The ids of this process's threads (/proc/self/task), at most n into
 * ids; how many there are. */
int thread_ids(int *ids, int n);
/* Whether thread tid (of this process) starts with every signal a program
 * waits for blocked (SIGINT, SIGTERM, SIGUSR1, SIGHUP) and every signal a
 * fault raises open (SIGSEGV, SIGBUS, SIGFPE, SIGILL): the mask the
 * library's threads and the drivers' it starts have; *blk: its SigBlk.
 * Waits up to 10 s for a thread that has not run yet (glibc blocks every
 * signal in a new thread until then); true for a thread that is gone.
 * Fails the test where its mask cannot be read but it is still there. */
bool thread_leaves_signals_to_the_program(int tid, unsigned long long *blk);

#endif
