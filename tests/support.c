#include "support.h"

#include <stdlib.h>
#include <string.h>

void fill_pattern(void *p, size_t n, uint32_t seed) {
  unsigned char *b = p;
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[i] = (unsigned char)(x >> 7);
  }
}

size_t elsize_of(DLDataType d) { return (size_t)(d.bits / 8u) * d.lanes; }

int64_t numel_of(int32_t ndim, const int64_t *shape) {
  /* an empty tensor's other dims may multiply past int64 */
  for (int32_t i = 0; i < ndim; i++)
    if (shape[i] == 0) return 0;
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void reference_gather(const DLTensor *t, void *dst) {
  size_t es = elsize_of(t->dtype);
  int64_t n = numel_of(t->ndim, t->shape);
  if (n == 0) return;
  int64_t idx[AB_MAX_NDIM] = {0};
  int64_t st[AB_MAX_NDIM];
  int64_t acc = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    st[i] = t->strides ? t->strides[i] : acc;
    acc *= t->shape[i];
  }
  const char *base = (const char *)t->data + t->byte_offset;
  for (int64_t e = 0; e < n; e++) {
    int64_t off = 0;
    for (int32_t i = 0; i < t->ndim; i++) off += idx[i] * st[i];
    memcpy((char *)dst + e * (int64_t)es, base + off * (int64_t)es, es);
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
}

int is_compact_copy_of(const DLManagedTensorVersioned *r, const DLTensor *src) {
  const DLTensor *t = &r->dl_tensor;
  if (r->version.major != 1) return 0;
  if (!(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) return 0;
  if (t->ndim != src->ndim) return 0;
  if (t->ndim > 0 && (t->strides == NULL || t->shape == NULL)) return 0;
  /* its own arrays (a scalar has none to share) */
  if (t->ndim > 0 && (t->shape == src->shape || t->strides == src->strides)) return 0;
  int64_t acc = 1;
  int overflowed = 0; /* only an empty tensor's dims can overflow; past that, strides are free */
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != src->shape[i]) return 0;
    if (!overflowed && t->shape[i] != 1 && t->strides[i] != acc) return 0;
    if (__builtin_mul_overflow(acc, t->shape[i] > 1 ? t->shape[i] : 1, &acc)) overflowed = 1;
  }
  if (numel_of(t->ndim, t->shape) == 0 && t->data != NULL) return 0;
  if (t->data != NULL && ((uintptr_t)t->data % 256) != 0) return 0;
  return 1;
}

int64_t first_diff_vs_reference(const DLTensor *src, const DLManagedTensorVersioned *r) {
  size_t n = (size_t)numel_of(src->ndim, src->shape) * elsize_of(src->dtype);
  if (n == 0) return -1;
  unsigned char *want = malloc(n);
  if (want == NULL) return 0;
  reference_gather(src, want);
  const unsigned char *got = (const unsigned char *)r->dl_tensor.data + r->dl_tensor.byte_offset;
  int64_t diff = -1;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      diff = (int64_t)i;
      break;
    }
  free(want);
  return diff;
}

uint64_t checksum(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t rng_next(test_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t rng_between(test_rng *r, int64_t lo, int64_t hi) {
  uint64_t span = (uint64_t)(hi - lo) + 1u;
  return lo + (int64_t)(rng_next(r) % span);
}

void fill_half_probes(float *v, int64_t n, test_rng *rng) {
  static const uint32_t ties[] = {0x3f801000u, 0x3f803000u, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u,
                                  0x33400000u, 0x387fe000u, 0x3f808000u, 0x3f818000u, 0x7f7f8000u, 0x7f7f7fffu,
                                  0x7fc00001u, 0xff800000u, 0x7f800000u, 0x80000000u, 0x34200000u, 0xb3c00000u};
  const uint64_t nties = sizeof ties / sizeof ties[0];
  for (int64_t i = 0; i < n; i++) {
    const uint64_t r = rng_next(rng);
    uint32_t u = r % 4 == 0 ? ties[(r >> 2) % nties]
                            : (uint32_t)((r >> 8) & 0x80000000u) | ((uint32_t)(100 + (r >> 2) % 46) << 23) |
                                  ((uint32_t)(r >> 20) & 0x7fffffu);
    memcpy(&v[i], &u, 4);
  }
}

int same_16(uint16_t a, uint16_t b, uint16_t inf) {
  return a == b || ((a & 0x7fffu) > inf && (b & 0x7fffu) > inf);
}
