/* The arraybridge demo (`make demo`): lists the memory spaces this build
 * can reach, then converts tensors between every available device, checks
 * every result against the source and says what happened. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arraybridge/arraybridge.h>

/* The device types this build serves (ab_device_types), filled by main. */
static DLDeviceType kinds[16];
static size_t nkinds;

static int failures;

static void check(int ok, const char *what) {
  printf("  %-62s %s\n", what, ok ? "ok" : "MISMATCH");
  if (!ok) failures++;
}

static void list_devices(void) {
  printf("arraybridge %s\n\nDevices:\n", ab_version_string());
  for (size_t k = 0; k < nkinds; k++) {
    int32_t n = ab_device_count(kinds[k]);
    const char *name = ab_device_type_name(kinds[k]);
    if (n == 0) {
      struct ab_device_info info;
      DLDevice d = {kinds[k], 0};
      ab_device_info(d, &info); /* fails; its message says why */
      printf("  %-12s none: %s\n", name, ab_last_error());
      continue;
    }
    for (int32_t i = 0; i < n; i++) {
      struct ab_device_info info;
      DLDevice d = {kinds[k], i};
      if (ab_device_info(d, &info) != AB_OK) continue;
      if (info.total_memory) /* 0: the backend cannot say (pinned host memory) */
        printf("  %s:%" PRId32 "  %s  (%.1f GiB", name, i, info.name, (double)info.total_memory / (1u << 30));
      else
        printf("  %s:%" PRId32 "  %s  (size unknown", name, i, info.name);
      if (info.free_memory) printf(", %.1f GiB free", (double)info.free_memory / (1u << 30));
      printf(")\n");
    }
  }
}

/* An HWC uint8 image and its CHW view (a permutation of the strides). */
static void demo_host(void) {
  enum { H = 4, W = 5, C = 3 };
  uint8_t img[H * W * C];
  for (int i = 0; i < H * W * C; i++) img[i] = (uint8_t)(i * 7 + 1);
  int64_t shape[3] = {H, W, C};
  DLTensor hwc = {img, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, shape, NULL, 0};
  DLManagedTensorVersioned *r = NULL;
  ab_convert_opts opts = AB_CONVERT_OPTS_INIT;

  printf("\nOn the host:\n");
  if (ab_convert_memory(&hwc, (DLDevice){kDLCPU, 0}, &opts, &r) != AB_OK) {
    printf("  error: %s\n", ab_last_error());
    failures++;
    return;
  }
  check(r->dl_tensor.data == img && !(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED),
        "compact 4x5x3 u8 -> cpu: zero-copy view (no bytes moved)");
  r->deleter(r);

  int64_t chw_shape[3] = {C, H, W}, chw_strides[3] = {1, W * C, C};
  DLTensor chw = {img, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, chw_shape, chw_strides, 0};
  if (ab_convert_memory(&chw, (DLDevice){kDLCPU, 0}, &opts, &r) != AB_OK) {
    printf("  error: %s\n", ab_last_error());
    failures++;
    return;
  }
  const uint8_t *o = r->dl_tensor.data;
  int ok = (r->flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0;
  for (int c = 0; c < C; c++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) ok &= o[(c * H + y) * W + x] == img[(y * W + x) * C + c];
  check(ok, "HWC image viewed as CHW -> cpu: compact CHW copy");
  r->deleter(r);

  opts.copy = AB_COPY_NEVER;
  ab_status st = ab_convert_memory(&chw, (DLDevice){kDLCPU, 0}, &opts, &r);
  check(st == AB_ERR_COPY_REQUIRED, "the same with AB_COPY_NEVER: refused, as asked");
  printf("    (%s: %s)\n", ab_status_name(st), ab_last_error());
}

/* A float32 tensor through every available device and back to the host. */
static void demo_round_trips(void) {
  enum { N = 1000 };
  float *v = malloc(N * sizeof *v);
  if (v == NULL) {
    printf("  error: out of host memory\n");
    failures++;
    return;
  }
  for (int i = 0; i < N; i++) v[i] = (float)i * 0.5f;
  int64_t shape[1] = {N};
  DLTensor src = {v, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  ab_convert_opts always = AB_CONVERT_OPTS_INIT;
  always.copy = AB_COPY_ALWAYS;

  printf("\nRound trips of %d float32 values:\n", N);
  for (size_t k = 0; k < nkinds; k++) {
    for (int32_t i = 0; i < ab_device_count(kinds[k]); i++) {
      DLDevice dev = {kinds[k], i};
      DLManagedTensorVersioned *there = NULL, *back = NULL;
      char what[96];
      snprintf(what, sizeof what, "cpu:0 -> %s:%" PRId32 " -> cpu:0", ab_device_type_name(kinds[k]), i);
      if (ab_convert_memory(&src, dev, &always, &there) != AB_OK ||
          ab_convert_memory(&there->dl_tensor, (DLDevice){kDLCPU, 0}, &always, &back) != AB_OK) {
        printf("  %-58s error: %s\n", what, ab_last_error());
        failures++;
      } else {
        check(memcmp(back->dl_tensor.data, v, sizeof(float) * N) == 0, what);
      }
      if (back) back->deleter(back);
      if (there) there->deleter(there);
    }
  }
  /* and through every device in turn: device-to-device routes */
  DLManagedTensorVersioned *cur = NULL;
  char path[256] = "cpu:0";
  int hops = 0;
  bool broken = false; /* a hop failed: the chain stops there */
  for (size_t k = 0; k < nkinds && !broken; k++) {
    for (int32_t i = 0; i < ab_device_count(kinds[k]) && !broken; i++) {
      DLManagedTensorVersioned *next = NULL;
      const DLTensor *from = cur ? &cur->dl_tensor : &src;
      if (ab_convert_memory(from, (DLDevice){kinds[k], i}, &always, &next) != AB_OK) {
        printf("  %s -> %s:%" PRId32 " error: %s\n", path, ab_device_type_name(kinds[k]), i, ab_last_error());
        failures++;
        broken = true;
        continue;
      }
      if (cur) cur->deleter(cur);
      cur = next;
      hops++;
      size_t len = strlen(path);
      snprintf(path + len, sizeof path - len, " -> %s:%" PRId32, ab_device_type_name(kinds[k]), i);
    }
  }
  if (cur != NULL && hops > 1 && !broken) {
    DLManagedTensorVersioned *back = NULL;
    if (ab_convert_memory(&cur->dl_tensor, (DLDevice){kDLCPU, 0}, &always, &back) == AB_OK) {
      size_t len = strlen(path);
      snprintf(path + len, sizeof path - len, " -> cpu:0");
      check(memcmp(back->dl_tensor.data, v, sizeof(float) * N) == 0, path);
      back->deleter(back);
    } else {
      printf("  error: %s\n", ab_last_error());
      failures++;
    }
  }
  if (cur) cur->deleter(cur);
  free(v);
}

/* Converts the same frame size repeatedly: after the first, the pool serves
 * every destination from its cache. */
static void demo_pool(void) {
  enum { N = 64 * 1024 };
  static uint8_t frame[N];
  int64_t shape[1] = {N};
  DLTensor src = {frame, {kDLCPU, 0}, 1, {kDLUInt, 8, 1}, shape, NULL, 0};
  ab_convert_opts always = AB_CONVERT_OPTS_INIT;
  always.copy = AB_COPY_ALWAYS;
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  if (ab_pool_stats((DLDevice){kDLCPU, 0}, &before) != AB_OK) {
    printf("  error: %s\n", ab_last_error());
    failures++;
    return;
  }
  for (int i = 0; i < 100; i++) {
    DLManagedTensorVersioned *t;
    if (ab_convert_memory(&src, (DLDevice){kDLCPU, 0}, &always, &t) != AB_OK) {
      printf("  error: %s\n", ab_last_error());
      failures++;
      return;
    }
    t->deleter(t);
  }
  if (ab_pool_stats((DLDevice){kDLCPU, 0}, &after) != AB_OK) {
    printf("  error: %s\n", ab_last_error());
    failures++;
    return;
  }
  printf("\nThe host pool, after 100 copies of a 64 KiB frame:\n");
  check(after.backend_allocs - before.backend_allocs <= 1 && after.cache_hits - before.cache_hits >= 99,
        "at most one driver allocation, every other copy a cache hit");
  char summary[2048];
  if (ab_pool_summary((DLDevice){kDLCPU, 0}, summary, sizeof summary) == AB_OK) printf("\n%s", summary);
}

int main(void) {
  const int n = ab_device_types(kinds, (int)(sizeof kinds / sizeof kinds[0]));
  nkinds = (size_t)n < sizeof kinds / sizeof kinds[0] ? (size_t)n : sizeof kinds / sizeof kinds[0];
  list_devices();
  demo_host();
  demo_round_trips();
  demo_pool();
  printf("\n%s\n", failures ? "demo FAILED" : "demo finished: every result matched its source");
  return failures ? 1 : 0;
}
