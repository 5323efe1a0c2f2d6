/* Helpers shared by the tests: reference tensors and an obviously-correct
 * element-by-element gather to compare the library against. */
#ifndef AB_TEST_SUPPORT_H
#define AB_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "arraybridge/arraybridge.h"

#define CPU0 ((DLDevice){kDLCPU, 0})

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

#endif
