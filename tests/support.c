#include "support.h"

#include <criterion/criterion.h>

#include "converters/host/convert.h" /* the 16-bit roundings */

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
  /* data is an address, 256-byte aligned; an OpenCL tensor's is a cl_mem
   * handle, whose alignment says nothing */
  if (t->data != NULL && t->device.device_type != kDLOpenCL && ((uintptr_t)t->data % 256) != 0) return 0;
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

int same_f32(float a, float b, int mapped) {
  uint32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return x == y || (mapped && a != a && b != b);
}

int same_element(DLDataType t, const void *a, const void *b) {
  const size_t n = t.bits / 8u;
  if (memcmp(a, b, n) == 0) return 1;
  if (t.code == kDLFloat && t.bits == 64) {
    double x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return x != x && y != y;
  }
  if (t.code == kDLFloat && t.bits == 32) {
    float x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    return x != x && y != y;
  }
  if (t.bits == 16 && (t.code == kDLFloat || t.code == kDLBfloat)) {
    uint16_t x, y;
    memcpy(&x, a, 2);
    memcpy(&y, b, 2);
    return same_16(x, y, t.code == kDLFloat ? 0x7c00 : 0x7f80);
  }
  return 0;
}

void fill_cast_probes(void *v, int64_t n, DLDataType t, test_rng *rng) {
  static const double fvals[] = {
    0.5, 1.5, 2.5, -0.5, -1.5, 127.5, -128.5, 255.5, 32767.5, -32768.5, 65535.5, 2147483647.5, 2147483648.0,
    -2147483648.5, -2147483649.0, 4294967295.5, 4294967296.0, 9223372036854775807.0 /* 2^63 */,
    -9223372036854775808.0, -9.3e18, 9.2e18, 18446744073709551615.0 /* 2^64 */, 1.8e19, 1.9e19, 16777217.0,
    9007199254740993.0, 65519.99, 65520.0, 5.9604644775390625e-08, 2.98023223876953125e-08, 1e-40, 1e-310,
    3.4028235677973366e38, 3.5e38, 1e300, -1e300, 0.0, -0.0, 0.25, -0.75, 3.0, -7.0};
  const size_t es = t.bits / 8u, nf = sizeof fvals / sizeof fvals[0];
  fill_pattern(v, (size_t)n * es, (uint32_t)rng_next(rng));
  for (int64_t i = 0; i < n; i++) {
    unsigned char *p = (unsigned char *)v + (size_t)i * es;
    const uint64_t pick = rng_next(rng) % 4;
    if (t.code == kDLBool) {
      *p = (uint8_t)(pick == 0 ? 0 : 1 + rng_next(rng) % 255);
      continue;
    }
    if (pick == 3) continue; /* random bits */
    if (t.code == kDLInt || t.code == kDLUInt) {
      static const int64_t ivals[] = {0, 1, -1, 16777217, 16777219, 9007199254740993LL, -9007199254740993LL,
                                      9007199254740995LL, 127, 128, 255, 256, 32767, 65535, 65536, 2147483647,
                                      2147483648LL, 4294967295LL, 4294967296LL};
      const unsigned bits = t.bits;
      const uint64_t top = bits == 64 ? ~0ull : (1ull << bits) - 1;
      uint64_t x;
      switch (rng_next(rng) % 6) { /* the type's extremes, or a probe cut to the type's bits */
      case 0: x = t.code == kDLInt ? top >> 1 : top; break;               /* max */
      case 1: x = t.code == kDLInt ? ~(top >> 1) : 0; break;              /* min */
      case 2: x = (t.code == kDLInt ? top >> 1 : top) - 1; break;         /* max - 1 */
      default: x = (uint64_t)ivals[rng_next(rng) % (sizeof ivals / sizeof ivals[0])]; break;
      }
      put_low_bytes(p, x, es);
      continue;
    }
    const double x = rng_next(rng) % 8 == 0 ? (pick == 0 ? __builtin_nan("") : pick == 1 ? __builtin_inf() : -__builtin_inf())
                                            : fvals[rng_next(rng) % nf];
    if (t.code == kDLFloat && t.bits == 64) {
      memcpy(p, &x, 8);
    } else if (t.code == kDLFloat && t.bits == 32) {
      const float f = (float)x;
      memcpy(p, &f, 4);
    } else {
      const uint16_t h = t.code == kDLBfloat ? ab__bf16_from_double(x) : ab__half_from_double(x);
      memcpy(p, &h, 2);
    }
  }
  if (t.bits == 64 && (t.code == kDLInt || t.code == kDLUInt) && n > 0) {
    /* in every source: the values a double would round twice on the way
     * to float32 and bfloat16 (2^60 + 2^36 + 1, 2^54 + 2^46 + 1) */
    static const int64_t twice[] = {(1LL << 60) + (1LL << 36) + 1, -((1LL << 60) + (1LL << 36) + 1),
                                    (1LL << 54) + (1LL << 46) + 1, -((1LL << 54) + (1LL << 46) + 1)};
    for (int64_t k = 0; k < 4; k++) memcpy((char *)v + (size_t)((k * 7) % n) * 8, &twice[k], 8);
  }
}

const DLDataType cast_kinds[CAST_NKINDS] = {
  {kDLBool, 8, 1}, {kDLInt, 8, 1},  {kDLInt, 16, 1},  {kDLInt, 32, 1},    {kDLInt, 64, 1},   {kDLUInt, 8, 1},  {kDLUInt, 16, 1},
  {kDLUInt, 32, 1}, {kDLUInt, 64, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1}};

void cast_shape(test_rng *rng, int32_t *ndim, int64_t *shape, int32_t *perm, int32_t *chan) {
  *ndim = (int32_t)rng_between(rng, 2, 4);
  for (int32_t i = 0; i < *ndim; i++) {
    shape[i] = rng_between(rng, 1, 6);
    perm[i] = i;
  }
  for (int32_t i = *ndim - 1; i > 0; i--) {
    const int32_t j = (int32_t)rng_between(rng, 0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  bool identity = true;
  for (int32_t i = 0; i < *ndim; i++) identity = identity && perm[i] == i;
  if (identity) /* an order that changes: a pure permutation is then a conversion, not a view */
    for (int32_t i = 0; i < *ndim; i++) perm[i] = (i + 1) % *ndim;
  *chan = (int32_t)rng_between(rng, 0, *ndim - 1);
  if (shape[*chan] > 4) shape[*chan] = 4;
}

void cast_opts(int mode, DLDataType from, DLDataType to, int32_t chan, const int32_t *perm, ab_convert_opts *o) {
  static const double scale[4] = {1.0, -1.0, 0.5, 1e-3}, offset[4] = {0.5, -0.25, 1e10, -1e19};
  *o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o->dtype = to;
  o->permute = perm;
  if (mode == 0 && from.code == to.code && from.bits == 16 && to.bits == 16) mode = 1;
  if (mode == 1) {
    o->flags = AB_CONVERT_AFFINE;
    o->scale = 2.0;
    o->offset = 0.5;
  } else if (mode == 2) {
    o->flags = AB_CONVERT_PER_CHANNEL;
    o->channel_axis = chan;
    o->channel_scale = scale;
    o->channel_offset = offset;
  }
}

void *cast_source(test_rng *rng, DLDataType t, int32_t *ndim, int64_t *shape, int32_t *perm, int32_t *chan, int64_t *n) {
  cast_shape(rng, ndim, shape, perm, chan);
  *n = numel_of(*ndim, shape);
  void *v = malloc((size_t)*n * 8);
  if (v != NULL) fill_cast_probes(v, *n, t, rng);
  return v;
}

int64_t first_different_element(DLDataType t, const void *a, const void *b, int64_t n) {
  const size_t es = t.bits / 8u;
  for (int64_t i = 0; i < n; i++)
    if (!same_element(t, (const char *)a + (size_t)i * es, (const char *)b + (size_t)i * es)) return i;
  return -1;
}

uint64_t pool_in_use(DLDevice dev) {
  struct ab_pool_stats s = {.size = sizeof s};
  cr_assert_eq(ab_pool_stats(dev, &s), AB_OK, "%s", ab_last_error());
  return s.in_use_bytes.current;
}

DLManagedTensorVersioned *convert_ok_with(const DLTensor *src, DLDevice to, const ab_convert_opts *o) {
  DLManagedTensorVersioned *r = NULL;
  ab_status st = ab_convert_memory(src, to, o, &r);
  cr_assert_eq(st, AB_OK, "convert %s:%d -> %s:%d: %s (%s)", ab_device_type_name(src->device.device_type),
               (int)src->device.device_id, ab_device_type_name(to.device_type), (int)to.device_id,
               ab_status_name(st), ab_last_error());
  cr_assert_eq(r->dl_tensor.device.device_type, to.device_type);
  return r;
}

DLManagedTensorVersioned *convert_ok(const DLTensor *src, DLDevice to, ab_copy_mode copy, void *stream) {
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = copy;
  o.stream = stream;
  return convert_ok_with(src, to, &o);
}

void assert_pool_clean(DLDevice dev) {
  struct ab_pool_stats s = {.size = sizeof s};
  cr_assert_eq(ab_pool_stats(dev, &s), AB_OK, "%s", ab_last_error());
  cr_assert_eq(s.in_use_bytes.current, 0, "%s:%d still has %llu bytes in use", ab_device_type_name(dev.device_type),
               (int)dev.device_id, (unsigned long long)s.in_use_bytes.current);
  cr_assert_eq(ab_pool_trim(dev), AB_OK);
  cr_assert_eq(ab_pool_stats(dev, &s), AB_OK);
  cr_assert_eq(s.backend_allocs, s.backend_frees, "%s:%d: driver allocations leaked: %llu made, %llu freed",
               ab_device_type_name(dev.device_type), (int)dev.device_id, (unsigned long long)s.backend_allocs,
               (unsigned long long)s.backend_frees);
  cr_assert_eq(s.reserved_bytes.current, 0);
}

void need_devices_of(DLDeviceType type, int n) {
  const int32_t have = ab_device_count(type);
  if (have >= n) return;
  struct ab_device_info info;
  ab_device_info((DLDevice){type, 0}, &info); /* fails; its message says why */
  /* AB_TEST_EXPECT_OPENCL, AB_TEST_EXPECT_CUDA, ...: the devices of that
   * type the machine is known to have */
  char var[64];
  int k = snprintf(var, sizeof var, "AB_TEST_EXPECT_");
  for (const char *c = ab_device_type_name(type); *c != '\0' && k < (int)sizeof var - 1; c++)
    var[k++] = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c);
  var[k] = '\0';
  const char *expect = getenv(var);
  if (expect != NULL && atoi(expect) >= n)
    cr_assert_fail("needs %d %s device%s and %s=%s says this machine has them, but it has %d: %s", n,
                   ab_device_type_name(type), n == 1 ? "" : "s", var, expect, (int)have, ab_last_error());
  cr_skip_test("needs %d %s device%s, have %d: %s", n, ab_device_type_name(type), n == 1 ? "" : "s", (int)have,
               ab_last_error());
}


void cpuinfo_value(const char *key, char *out, size_t len) {
  out[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[256];
  const size_t k = strlen(key);
  while (out[0] == '\0' && fgets(line, sizeof line, f) != NULL) {
    char *colon = strchr(line, ':');
    if (colon == NULL || strncmp(line, key, k) != 0 || strspn(line + k, " \t") != (size_t)(colon - line - k)) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(out, len, "%s", colon); /* an empty value: the next processor's */
  }
  fclose(f);
}

int thread_ids(int *ids, int n) {
  DIR *d = opendir("/proc/self/task");
  cr_assert_not_null(d, "cannot list /proc/self/task");
  int k = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') {
      if (k < n) ids[k] = atoi(e->d_name);
      k++;
    }
  closedir(d);
  return k;
}

/* One reading of thread tid's mask: 1 as the library's threads keep it, 0
 * not, -1 gone. */
static int signals_left_once(int tid, unsigned long long *blk) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f != NULL && !found && fgets(line, sizeof line, f) != NULL)
    found = sscanf(line, "SigBlk: %llx", blk) == 1;
  if (f != NULL) fclose(f);
  cr_assert(found || access(path, F_OK) != 0, "no SigBlk line in %s", path);
  if (!found) return -1;
  static const int waited[] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP}, faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  bool ok = true;
  for (size_t i = 0; i < 4; i++) {
    ok = ok && (*blk >> (waited[i] - 1) & 1) != 0;
    ok = ok && (*blk >> (faults[i] - 1) & 1) == 0;
  }
  return ok;
}

bool thread_leaves_signals_to_the_program(int tid, unsigned long long *blk) {
  /* glibc starts a new thread with every signal blocked and sets its
   * own mask as it first runs: a thread made a moment ago may not have
   * run yet (seen on i386 under load). Up to 10 s for that. */
  int ok = 0;
  for (int tries = 0; tries < 10000 && (ok = signals_left_once(tid, blk)) == 0; tries++)
    nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
  return ok != 0;
}

void put_low_bytes(void *p, uint64_t v, size_t n) {
  cr_assert(n == 1 || n == 2 || n == 4 || n == 8, "put_low_bytes of %zu bytes", n);
  const uint8_t b = (uint8_t)v;
  const uint16_t h = (uint16_t)v;
  const uint32_t w = (uint32_t)v;
  memcpy(p, n == 1 ? (const void *)&b : n == 2 ? (const void *)&h : n == 4 ? (const void *)&w : (const void *)&v, n);
}

uint64_t get_low_bytes(const void *p, size_t n) {
  cr_assert(n == 1 || n == 2 || n == 4 || n == 8, "get_low_bytes of %zu bytes", n);
  uint8_t b;
  uint16_t h;
  uint32_t w;
  uint64_t v;
  void *to = n == 1 ? (void *)&b : n == 2 ? (void *)&h : n == 4 ? (void *)&w : (void *)&v;
  memcpy(to, p, n);
  return n == 1 ? b : n == 2 ? h : n == 4 ? w : v;
}
