/* Fuzz target: arbitrary bytes decoded into a DLTensor (hostile ndim,
 * shapes, strides, offsets, dtypes, devices, NULL pointers) and into
 * ab_convert_opts, then ab_tensor_validate and ab_convert_memory to a
 * decoded target. Properties checked, beyond "no crash, no sanitizer
 * report":
 *  - validate and convert agree on whether the tensor is acceptable;
 *  - a failed call leaves *out untouched and leaks nothing;
 *  - a successful copy equals an independent element-by-element gather;
 *    a view aliases the source's bytes.
 * Conversions run only when the tensor's addressed bytes lie inside the
 * harness's buffer (the library cannot know a host buffer's size; reading
 * outside is the caller's bug, not the library's).
 *
 * Built with libFuzzer (make fuzz) or with regression_driver.c, which
 * replays tests/fuzz/corpus/ in ordinary CI. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arraybridge/arraybridge.h"
#include "internal.h"

#define BUF_SIZE 4096
#define MAX_DIMS 80

struct reader {
  const uint8_t *p;
  size_t n;
};

static uint64_t take(struct reader *r, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; i++) {
    uint8_t b = r->n ? *r->p++ : 0;
    if (r->n) r->n--;
    v |= (uint64_t)b << (8 * i);
  }
  return v;
}

/* Mostly small values (so layouts are interesting), sometimes raw 64-bit. */
static int64_t take_dim(struct reader *r) {
  uint8_t mode = (uint8_t)take(r, 1);
  switch (mode & 3) {
  case 0: return (int64_t)(int8_t)take(r, 1);
  case 1: return (int64_t)(int16_t)take(r, 2);
  case 2: return (int64_t)(uint8_t)take(r, 1) % 7;
  default: return (int64_t)take(r, 8);
  }
}

static void fail(const char *what) {
  (void)what;
  __builtin_trap();
}

/* Byte range [lo, hi) addressed by t relative to its first element, exact
 * in 64 bits: 1, or 0 when empty, or -1 when a step leaves int64's range
 * (then the range is far past any buffer here). No __int128: 32-bit
 * targets build this file too. */
static int extent(const DLTensor *t, size_t es, int64_t *lo, int64_t *hi) {
  int64_t a = 0, b = 0, acc = 1;
  /* Empty first: with a zero dim the others may multiply past any range. */
  for (int32_t i = 0; i < t->ndim; i++)
    if (t->shape[i] == 0) return 0;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    const int64_t st = t->strides ? t->strides[i] : acc;
    if (!t->strides && __builtin_mul_overflow(acc, t->shape[i], &acc)) return -1;
    if (t->shape[i] == 1) continue;
    int64_t span;
    if (__builtin_mul_overflow(t->shape[i] - 1, st, &span) || __builtin_mul_overflow(span, (int64_t)es, &span))
      return -1;
    if (__builtin_add_overflow(span > 0 ? b : a, span, span > 0 ? &b : &a)) return -1;
  }
  *lo = a;
  if (__builtin_add_overflow(b, (int64_t)es, hi)) return -1;
  return 1;
}

static void gather_ref(const DLTensor *t, size_t es, uint8_t *out) {
  int64_t idx[MAX_DIMS] = {0}, n = 1, acc = 1, st[MAX_DIMS];
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    st[i] = t->strides ? t->strides[i] : acc;
    acc *= t->shape[i];
    n *= t->shape[i];
  }
  const uint8_t *base = (const uint8_t *)t->data + t->byte_offset;
  for (int64_t e = 0; e < n; e++) {
    int64_t off = 0;
    for (int32_t i = 0; i < t->ndim; i++) off += t->shape[i] == 1 ? 0 : idx[i] * st[i];
    memcpy(out + (size_t)e * es, base + off * (int64_t)es, es);
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t buf[BUF_SIZE];
  struct reader r = {data, size};
  int64_t shape[MAX_DIMS] = {0}, strides[MAX_DIMS] = {0};
  DLTensor t;
  memset(&t, 0, sizeof t);

  for (size_t i = 0; i < BUF_SIZE; i++) buf[i] = (uint8_t)(i * 131u + 7u);
  t.ndim = (int32_t)(int8_t)take(&r, 1);
  uint8_t ptrs = (uint8_t)take(&r, 1);
  t.dtype.code = (uint8_t)take(&r, 1);
  t.dtype.bits = (uint8_t)take(&r, 1);
  t.dtype.lanes = (uint16_t)take(&r, 1); /* small lane counts */
  t.device.device_type = (DLDeviceType)(int8_t)take(&r, 1);
  t.device.device_id = (int32_t)(int8_t)take(&r, 1);
  uint64_t base = take(&r, 2) % BUF_SIZE;
  t.byte_offset = (ptrs & 8) ? take(&r, 8) : take(&r, 1);
  int32_t nd = t.ndim < 0 ? 0 : (t.ndim > MAX_DIMS ? MAX_DIMS : t.ndim);
  for (int32_t i = 0; i < nd; i++) {
    shape[i] = take_dim(&r);
    strides[i] = take_dim(&r);
  }
  t.shape = (ptrs & 1) ? NULL : shape;
  t.strides = (ptrs & 2) ? NULL : strides;
  t.data = (ptrs & 4) ? NULL : buf + base;

  ab_convert_opts o;
  memset(&o, 0, sizeof o);
  o.copy = (ab_copy_mode)(int8_t)take(&r, 1);
  o.flags = (uint32_t)take(&r, 1);
  o.dtype.code = (uint8_t)take(&r, 1);
  o.dtype.bits = (uint8_t)((ptrs & 16) ? take(&r, 1) : 0);
  o.dtype.lanes = 1;
  DLDevice target = {(DLDeviceType)(int8_t)take(&r, 1), (int32_t)(int8_t)take(&r, 1)};
  if (ptrs & 32) target = (DLDevice){kDLCPU, 0};

  /* The tensor's own verdict: never reads data. */
  ab_status v = ab_tensor_validate(&t);
  if (v != AB_OK && (v < AB_ERR_INVALID_ARGUMENT || v > AB_ERR_NO_DEVICE)) fail("validate status");

  size_t es = (size_t)(t.dtype.bits / 8u) * t.dtype.lanes;
  int safe = 0;
  if (v == AB_OK) {
    int64_t lo = 0, hi = 0;
    const int range = t.ndim == 0 ? 1 : extent(&t, es, &lo, &hi);
    /* base < BUF_SIZE, es < 2^24 and byte_offset < 2^64: first and the
     * ends below are exact in int64 unless byte_offset is past 2^62, which
     * puts any range past the buffer. */
    const bool near = t.byte_offset < ((uint64_t)1 << 62);
    const int64_t first = (int64_t)base + (int64_t)(near ? t.byte_offset : 0);
    if (t.ndim == 0) safe = near && t.data != NULL && first + (int64_t)es <= BUF_SIZE;
    else if (range == 0) safe = 1;
    else safe = range > 0 && near && t.data != NULL && first + lo >= 0 && first <= BUF_SIZE - hi;
  }
  /* Results over 1 MiB (broadcast strides make huge ones cheap to
   * describe) would only time the allocator and the reference gather:
   * validate them, do not convert. The out-of-memory path for impossible
   * sizes is bad_input::a_copy_too_large_for_memory_is_out_of_memory. */
  if (v == AB_OK && safe) {
    /* A zero dim makes any other dims valid, so multiply with a cap. */
    int64_t total = (int64_t)es;
    for (int32_t i = 0; i < t.ndim; i++)
      if (t.shape[i] == 0) total = 0;
    for (int32_t i = 0; i < t.ndim && total != 0 && total <= ((int64_t)1 << 20); i++)
      if (__builtin_mul_overflow(total, t.shape[i], &total)) total = INT64_MAX;
    if (total > ((int64_t)1 << 20)) safe = 0;
  }
  long live = ab__alloc_live_settled();
  uint8_t before[BUF_SIZE];
  memcpy(before, buf, BUF_SIZE);
  if (v != AB_OK || safe) {
    DLManagedTensorVersioned *out = (DLManagedTensorVersioned *)(uintptr_t)0x5eed;
    ab_status c = ab_convert_memory(&t, target, &o, &out);
    if (c != AB_OK) {
      if (out != (DLManagedTensorVersioned *)(uintptr_t)0x5eed) fail("out written on failure");
    } else {
      if (v != AB_OK) fail("convert accepted what validate refused");
      const DLTensor *rt = &out->dl_tensor;
      const bool converts = (o.flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)) != 0 ||
                            (o.dtype.bits != 0 && (o.dtype.code != t.dtype.code || o.dtype.bits != t.dtype.bits ||
                                                   o.dtype.lanes != t.dtype.lanes));
      if (rt->device.device_type == kDLCPU && (out->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
        size_t n = es;
        for (int32_t i = 0; i < t.ndim; i++) n *= (size_t)t.shape[i];
        if (n > 0) {
          uint8_t *want = malloc(n);
          gather_ref(&t, es, want);
          if (!converts) {
            if (memcmp(want, (const uint8_t *)rt->data + rt->byte_offset, n) != 0) fail("copy differs");
          } else {
            /* a conversion: the same from a compact copy of the source,
             * so the strided reads are checked against the plain ones */
            DLTensor c = t;
            c.data = want;
            c.strides = NULL;
            c.byte_offset = 0;
            DLManagedTensorVersioned *ref = NULL;
            if (ab_convert_memory(&c, target, &o, &ref) != AB_OK) fail("the compact source was refused");
            size_t rn = (size_t)(rt->dtype.bits / 8u) * rt->dtype.lanes;
            for (int32_t i = 0; i < rt->ndim; i++) rn *= (size_t)rt->shape[i];
            if (memcmp((const uint8_t *)ref->dl_tensor.data + ref->dl_tensor.byte_offset,
                       (const uint8_t *)rt->data + rt->byte_offset, rn) != 0)
              fail("conversion differs from the compact source's");
            ref->deleter(ref);
          }
          free(want);
        }
      } else if (!(out->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
        if (rt->data != t.data || rt->byte_offset != t.byte_offset) fail("view does not alias");
      }
      out->deleter(out);
    }
    if (memcmp(before, buf, BUF_SIZE) != 0) fail("source changed");
    if (ab__alloc_live_settled() != live) fail("leak");
  }
  return 0;
}
