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
 * version 1, shape equal to src's. Returns 1 if all hold. */
int is_compact_copy_of(const DLManagedTensorVersioned *r, const DLTensor *src);

#endif
