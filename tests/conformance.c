/* The backend conformance suite: what every device type must do, written
 * once and compiled once per registered device type (tests/CMakeLists.txt
 * builds test_conformance_<type> with AB_CONFORMANCE_TYPE set to it):
 * round trips of every dtype and size, strided sources both ways, every
 * cast pair on the device against the host, and the fault sweeps. A
 * backend's own test file keeps only what is specific to it. A test that
 * needs more devices than the machine has skips, saying why, unless
 * AB_TEST_EXPECT_<TYPE> says they should be there (make test, the simcuda
 * runs), where it fails. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "internal.h"
#include "support.h"

#ifndef AB_CONFORMANCE_TYPE
#error "build with -DAB_CONFORMANCE_TYPE=<DLDeviceType> (tests/CMakeLists.txt)"
#endif

#define DEV(i) ((DLDevice){(DLDeviceType)(AB_CONFORMANCE_TYPE), (i)})

static void need_devices(int n) { need_devices_of((DLDeviceType)(AB_CONFORMANCE_TYPE), n); }

/* The second device of the type when there is one, else the first. */
static int32_t second(void) { return ab_device_count((DLDeviceType)(AB_CONFORMANCE_TYPE)) > 1 ? 1 : 0; }

static const char *type_name(void) { return ab_device_type_name((DLDeviceType)(AB_CONFORMANCE_TYPE)); }

/* ---- round trips ------------------------------------------------------- */

/* Every byte-sized dtype: host -> dev:0 -> dev:1 (or :0 again) -> host. */
Test(conformance, round_trip_of_every_dtype_is_bit_exact) {
  need_devices(1);
  const DLDataType types[] = {
    {kDLInt, 8, 1},    {kDLInt, 16, 1},  {kDLInt, 32, 1},     {kDLInt, 64, 1},  {kDLUInt, 8, 1},
    {kDLUInt, 16, 1},  {kDLUInt, 32, 1}, {kDLUInt, 64, 1},    {kDLFloat, 16, 1}, {kDLFloat, 32, 1},
    {kDLFloat, 64, 1}, {kDLBfloat, 16, 1}, {kDLComplex, 64, 1}, {kDLComplex, 128, 1}, {kDLBool, 8, 1},
    {10, 8, 1} /* float8_e4m3fn */, {kDLFloat, 32, 4},
  };
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    int64_t shape[2] = {7, 13};
    size_t n = (size_t)(7 * 13) * elsize_of(types[k]);
    void *src = malloc(n);
    fill_pattern(src, n, (uint32_t)k + 1);
    DLTensor t = {src, CPU0, 2, types[k], shape, NULL, 0};
    /* (a copy on every type: cpu:0 -> cpu:0 would otherwise be a view) */
    DLManagedTensorVersioned *a = convert_ok(&t, DEV(0), AB_COPY_ALWAYS, NULL);
    cr_assert(a->flags & DLPACK_FLAG_BITMASK_IS_COPIED, "dtype %zu: not flagged as a copy", k);
    cr_assert(a->dl_tensor.strides && a->dl_tensor.strides[0] == 13 && a->dl_tensor.strides[1] == 1,
              "dtype %zu: not compact", k);
    cr_assert_eq(a->dl_tensor.byte_offset, 0);
    cr_assert_eq(a->dl_tensor.device.device_id, 0);
    DLManagedTensorVersioned *b = convert_ok(&a->dl_tensor, DEV(second()), AB_COPY_ALWAYS, NULL);
    DLManagedTensorVersioned *c = convert_ok(&b->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(c->dl_tensor.data, src, n), 0, "dtype %zu differs after the round trip", k);
    c->deleter(c);
    b->deleter(b);
    a->deleter(a);
    free(src);
  }
  assert_pool_clean(DEV(0));
}

/* From nothing to past the staging ring's chunk size and the parallel
 * threshold, with odd tails. */
Test(conformance, round_trips_are_exact_at_every_size) {
  need_devices(1);
  const int64_t sizes[] = {0, 1, 3, 4097, (int64_t)1 << 20, ((int64_t)64 << 20) + 5};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int64_t shape[1] = {sizes[k]};
    unsigned char *buf = malloc((size_t)sizes[k] + 1);
    fill_pattern(buf, (size_t)sizes[k], (uint32_t)k + 7);
    DLTensor h = {buf, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
    DLManagedTensorVersioned *g = convert_ok(&h, DEV(0), AB_COPY_ALWAYS, NULL);
    cr_assert(is_compact_copy_of(g, &h), "%lld bytes: not a compact copy", (long long)sizes[k]);
    cr_assert_eq(g->dl_tensor.device.device_id, 0);
    DLManagedTensorVersioned *back = convert_ok(&g->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(first_diff_vs_reference(&h, back), -1, "%lld bytes differ after the round trip",
                 (long long)sizes[k]);
    back->deleter(back);
    g->deleter(g);
    free(buf);
  }
  assert_pool_clean(DEV(0));
}

/* ---- strided sources ------------------------------------------------------ */

/* One layout over host memory and over a device buffer holding the same
 * bytes: host strided -> dev -> host, dev strided -> host, dev strided ->
 * a compact copy on the same device, and dev:0 strided -> dev:1; every
 * result equal to the reference gather. */
static void check_layout(const char *what, DLDataType type, int32_t ndim, const int64_t *shape,
                         const int64_t *strides, uint64_t byte_offset, size_t buf_bytes, int64_t data_shift) {
  char *host = malloc(buf_bytes);
  fill_pattern(host, buf_bytes, (uint32_t)buf_bytes);
  int64_t n = numel_of(ndim, shape);
  size_t out_bytes = (size_t)n * elsize_of(type);
  char *want = malloc(out_bytes ? out_bytes : 1);

  DLTensor h = {host + data_shift, CPU0, ndim, type, (int64_t *)shape, (int64_t *)strides, byte_offset};
  reference_gather(&h, want);

  DLManagedTensorVersioned *up = convert_ok(&h, DEV(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *down = convert_ok(&up->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(down->dl_tensor.data, want, out_bytes), 0, "%s: host -> %s -> host differs", what, type_name());
  down->deleter(down);
  up->deleter(up);

  /* the whole buffer on dev:0, then the same layout over it */
  int64_t flat[1] = {(int64_t)buf_bytes};
  DLTensor whole = {host, CPU0, 1, dt(kDLUInt, 8, 1), flat, NULL, 0};
  DLManagedTensorVersioned *dev = convert_ok(&whole, DEV(0), AB_COPY_ALWAYS, NULL);
  DLTensor d = h;
  d.device = DEV(0);
  d.data = dev->dl_tensor.data;
  d.byte_offset = dev->dl_tensor.byte_offset + byte_offset + (uint64_t)data_shift;
  cr_assert_eq(ab_tensor_validate(&d), AB_OK, "%s: %s", what, ab_last_error());
  DLManagedTensorVersioned *back = convert_ok(&d, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, want, out_bytes), 0, "%s: strided %s -> host differs", what, type_name());
  back->deleter(back);
  DLManagedTensorVersioned *same = convert_ok(&d, DEV(0), AB_COPY_ALWAYS, NULL);
  cr_assert(is_compact_copy_of(same, &d), "%s: the copy on the same device is not compact", what);
  back = convert_ok(&same->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, want, out_bytes), 0, "%s: strided -> compact on one %s device differs",
               what, type_name());
  back->deleter(back);
  same->deleter(same);
  if (second() != 0) {
    DLManagedTensorVersioned *other = convert_ok(&d, DEV(1), AB_COPY_IF_NEEDED, NULL);
    DLManagedTensorVersioned *check = convert_ok(&other->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(check->dl_tensor.data, want, out_bytes), 0, "%s: strided %s:0 -> %s:1 differs", what,
                 type_name(), type_name());
    check->deleter(check);
    other->deleter(other);
  }
  dev->deleter(dev);
  free(want);
  free(host);
}

Test(conformance, strided_negative_broadcast_offset_crop_and_empty_layouts_survive) {
  need_devices(1);
  /* transposed 2-D f32 */
  int64_t s2[2] = {31, 17}, t2[2] = {1, 31};
  check_layout("transpose", dt(kDLFloat, 32, 1), 2, s2, t2, 0, 31 * 17 * 4, 0);
  /* HWC image seen as CHW */
  int64_t s3[3] = {3, 20, 24}, t3[3] = {1, 24 * 3, 3};
  check_layout("HWC->CHW", dt(kDLUInt, 8, 1), 3, s3, t3, 0, 20 * 24 * 3, 0);
  /* reversed rows and columns: data points at the last element */
  int64_t sr[2] = {9, 11}, tr[2] = {-11, -1};
  check_layout("reversed", dt(kDLInt, 16, 1), 2, sr, tr, 0, 9 * 11 * 2, (9 * 11 - 1) * 2);
  /* broadcast rows */
  int64_t sb[2] = {5, 40}, tb[2] = {0, 1};
  check_layout("broadcast", dt(kDLFloat, 64, 1), 2, sb, tb, 0, 40 * 8, 0);
  /* a crop with byte_offset */
  int64_t sc[2] = {6, 7}, tc[2] = {50, 1};
  check_layout("crop+offset", dt(kDLUInt, 32, 1), 2, sc, tc, 4 * (50 * 3 + 5), 50 * 20 * 4, 0);
  /* a 3-channel crop of a 37 x 53 x 3 u16 image (rows of contiguous bytes:
   * a rectangle) and its transpose (not one) */
  enum { H = 37, W = 53, C = 3 };
  int64_t crop_shape[3] = {20, 30, 3}, crop_strides[3] = {W * C, C, 1};
  check_layout("3-channel crop", dt(kDLUInt, 16, 1), 3, crop_shape, crop_strides,
               sizeof(uint16_t) * (5 * W * C + 7 * C), sizeof(uint16_t) * H * W * C, 0);
  int64_t tr_shape[3] = {W, H, C}, tr_strides[3] = {C, W * C, 1};
  check_layout("3-channel transpose", dt(kDLUInt, 16, 1), 3, tr_shape, tr_strides, 0, sizeof(uint16_t) * H * W * C, 0);
  /* crops in 3 and 4 dims (rectangle reads where the backend has them),
   * one with a slice pitch that is not a whole number of row pitches
   * (OpenCL's rectangles cannot say it: another route) */
  int64_t sk[3] = {2, 3, 5}, tk[3] = {200, 20, 1};
  check_layout("3-D crop", dt(kDLUInt, 16, 1), 3, sk, tk, 2 * 7, 2 * 400, 0);
  int64_t sp[3] = {2, 3, 4}, tp[3] = {25, 6, 1};
  check_layout("3-D crop, odd slice pitch", dt(kDLUInt, 8, 1), 3, sp, tp, 0, 64, 0);
  int64_t s4[4] = {2, 2, 3, 5}, t4[4] = {900, 300, 20, 1}; /* 4 dims: the extent route */
  check_layout("4-D crop", dt(kDLUInt, 8, 1), 4, s4, t4, 3, 2000, 0);
  /* zero-size */
  int64_t sz[2] = {0, 5};
  float dummy[1];
  DLTensor z = {dummy, CPU0, 2, dt(kDLFloat, 32, 1), sz, NULL, 0};
  DLManagedTensorVersioned *r = convert_ok(&z, DEV(0), AB_COPY_ALWAYS, NULL);
  cr_assert_null(r->dl_tensor.data);
  DLManagedTensorVersioned *r2 = convert_ok(&r->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(r2->dl_tensor.shape[0], 0);
  r2->deleter(r2);
  r->deleter(r);
  assert_pool_clean(DEV(0));
}

/* ---- every cast pair on the device --------------------------------------- */

static void convert_place(const char *place) {
  setenv("AB_CONVERT_PLACE", place, 1);
  ab__env_reload();
}

static uint64_t pool_allocations(DLDevice dev) {
  struct ab_pool_stats s = {.size = sizeof s};
  cr_assert_eq(ab_pool_stats(dev, &s), AB_OK, "%s", ab_last_error());
  return s.allocations;
}

/* Whether `plan` (ab_explain_convert's text) is one conversion on dev. */
static bool one_kernel_on(const char *plan, DLDevice dev) {
  char step[64];
  snprintf(step, sizeof step, "1. convert on %s:%d:", ab_device_type_name(dev.device_type), (int)dev.device_id);
  return strstr(plan, step) != NULL && strstr(plan, "2. ") == NULL;
}

/* Skips unless the device runs conversions itself, float64 arithmetic
 * included (OpenCL devices without cl_khr_fp64, CUDA builds without the
 * kernels and simcuda leave such work to the host), asked of the library
 * as a user would: the plan of one such conversion. */
static void need_device_conversions(void) {
  need_devices(1);
  double v[6] = {0};
  int64_t shape[2] = {2, 3};
  const int32_t perm[2] = {1, 0};
  DLTensor h = {v, CPU0, 2, dt(kDLFloat, 64, 1), shape, NULL, 0};
  DLManagedTensorVersioned *src = convert_ok(&h, DEV(0), AB_COPY_IF_NEEDED, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLInt, 8, 1);
  o.permute = perm;
  char plan[2048];
  convert_place("device");
  const ab_status st = ab_explain_convert(&src->dl_tensor, DEV(0), &o, plan, sizeof plan);
  convert_place("auto");
  src->deleter(src);
  cr_assert_eq(st, AB_OK, "%s", ab_last_error());
  if (AB_CONFORMANCE_TYPE == kDLCPU)
    cr_skip_test("cpu:0 is the host: its conversions are the host converter's own (test_cast checks them)");
  if (!one_kernel_on(plan, DEV(0)))
    cr_skip_test("%s:0 leaves float64 conversions to the host (no doubles, or no device kernels in this build): %s",
                 type_name(), plan);
}

Test(conformance, every_cast_pair_converts_on_the_device_bit_exact_with_the_host) {
  /* All 13 x 13 one-lane dtype pairs, each with no map, a per-tensor and a
   * per-channel map, in a random axis order (and once through a view with
   * a negative stride), within one device (so the conversion is one
   * kernel), against the host converter. */
  need_device_conversions();
  test_rng rng = {2031};
  int runs = 0;
  for (size_t f = 0; f < CAST_NKINDS; f++) {
    for (int trial = 0; trial < 3; trial++) {
      int32_t ndim, perm[4], chan;
      int64_t shape[4], n;
      void *v = cast_source(&rng, cast_kinds[f], &ndim, shape, perm, &chan, &n);
      DLTensor h = {v, CPU0, ndim, cast_kinds[f], shape, NULL, 0};
      DLManagedTensorVersioned *src = convert_ok(&h, DEV(0), AB_COPY_IF_NEEDED, NULL);
      DLTensor hv = h, dv = src->dl_tensor;
      int64_t rstrides[4];
      if (trial == 1) { /* both read through a view reversed along axis 0 (a negative stride) */
        int64_t step = 1;
        for (int32_t i = ndim - 1; i >= 0; i--) {
          rstrides[i] = step;
          step *= shape[i];
        }
        const uint64_t last = (uint64_t)((shape[0] - 1) * rstrides[0]) * (cast_kinds[f].bits / 8u);
        rstrides[0] = -rstrides[0];
        hv.strides = dv.strides = rstrides;
        hv.byte_offset += last;
        dv.byte_offset += last;
      }
      for (size_t t = 0; t < CAST_NKINDS; t++) {
        ab_convert_opts o;
        const int mode = (trial + (int)t) % 3; /* every pair gets all three */
        cast_opts(mode, cast_kinds[f], cast_kinds[t], chan, perm, &o);
        DLManagedTensorVersioned *want = convert_ok_with(&hv, CPU0, &o), *dev, *got;
        convert_place("device");
        const uint64_t before = pool_allocations(DEV(0));
        dev = convert_ok_with(&dv, DEV(0), &o);
        const uint64_t allocs = pool_allocations(DEV(0)) - before;
        cr_assert_eq(allocs, 1, "kind %zu -> %zu mode %d: %llu blocks on the device, not one kernel's", f, t, mode,
                     (unsigned long long)allocs);
        /* and the plan was that kernel alone: the host's route (download,
         * convert, upload) allocates one device block as well */
        char plan[2048];
        cr_assert_eq(ab_explain_convert(&dv, DEV(0), &o, plan, sizeof plan), AB_OK, "%s", ab_last_error());
        cr_assert(one_kernel_on(plan, DEV(0)), "kind %zu -> %zu mode %d: not one kernel on the device: %s", f, t, mode,
                  plan);
        convert_place("auto");
        got = convert_ok(&dev->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
        const int64_t bad = first_different_element(cast_kinds[t], want->dl_tensor.data, got->dl_tensor.data, n);
        if (bad >= 0) {
          const size_t os = cast_kinds[t].bits / 8u;
          uint64_t x = 0, y = 0;
          memcpy(&x, (const char *)want->dl_tensor.data + (size_t)bad * os, os);
          memcpy(&y, (const char *)got->dl_tensor.data + (size_t)bad * os, os);
          cr_assert_fail("kind %zu -> %zu mode %d element %lld: host %#llx, device %#llx", f, t, mode, (long long)bad,
                         (unsigned long long)x, (unsigned long long)y);
        }
        runs++;
        got->deleter(got);
        dev->deleter(dev);
        want->deleter(want);
      }
      src->deleter(src);
      free(v);
    }
  }
  cr_assert_eq(runs, CAST_NKINDS * CAST_NKINDS * 3);
  assert_pool_clean(DEV(0));
}

/* ---- faults ----------------------------------------------------------------- */

/* Whether any device of the type stages through memory of its own (pinned
 * memory): a lost staging chunk is then survived (the transfer goes
 * direct), which a persistent fault may reach. */
static bool stages(void) {
  const struct ab_backend *be = ab__backend_for((DLDeviceType)(AB_CONFORMANCE_TYPE));
  DLDevice s;
  for (int32_t i = 0; be != NULL && i < ab_device_count((DLDeviceType)(AB_CONFORMANCE_TYPE)); i++)
    if (ab__staging_device(be, i, &s)) return true;
  return false;
}

/* Every pool the routes below may touch is clean: the device's two, the
 * host's, and the staging memory's. */
static void assert_pools_clean(int32_t other) {
  assert_pool_clean(DEV(0));
  assert_pool_clean(DEV(other));
  assert_pool_clean(CPU0);
  const struct ab_backend *be = ab__backend_for((DLDeviceType)(AB_CONFORMANCE_TYPE));
  DLDevice s;
  for (int32_t i = 0; be != NULL && i < ab_device_count((DLDeviceType)(AB_CONFORMANCE_TYPE)); i++)
    if (ab__staging_device(be, i, &s)) assert_pool_clean(s);
}

/* host (strided) -> dev:0 -> dev:1 -> host with the Nth allocation failing
 * (or every one from the Nth on), for N = 1, 2, ... until a run meets no
 * fault: each run fails cleanly as out of memory or gives the right
 * result, leaves the source alone, every pool clean and no host block
 * behind. */
static void sweep(bool persistent) {
  int64_t shape[2] = {33, 19}, strides[2] = {1, 33};
  float *v = malloc(sizeof(float) * 33 * 19);
  fill_pattern(v, sizeof(float) * 33 * 19, 5);
  uint64_t sum = checksum(v, sizeof(float) * 33 * 19);
  DLTensor h = {v, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 0};
  float want[33 * 19];
  reference_gather(&h, want);
  const int32_t other = second();
  const bool staged = stages();
  int faults = 0, failures = 0, first_survival = -1;
  int n;
  for (n = 1; n < 500; n++) {
    ab_shutdown();
    long live = ab__alloc_live_settled();
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    DLManagedTensorVersioned *a = SENTINEL_OUT, *b = SENTINEL_OUT, *c = SENTINEL_OUT;
    if (persistent) ab__fault_arm_persistent(n);
    else ab__fault_arm(n);
    ab_status st = ab_convert_memory(&h, DEV(0), &o, &a);
    if (st == AB_OK) st = ab_convert_memory(&a->dl_tensor, DEV(other), &o, &b);
    if (st == AB_OK) st = ab_convert_memory(&b->dl_tensor, CPU0, &o, &c);
    long injected = ab__fault_injected();
    ab__fault_arm(0);
    if (st == AB_OK) {
      cr_assert_eq(memcmp(c->dl_tensor.data, want, sizeof want), 0, "N=%d: wrong result", n);
    } else {
      cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY, "N=%d: %s (%s)", n, ab_status_name(st), ab_last_error());
      cr_assert_gt(injected, 0);
      failures++;
    }
    if (st == AB_OK && injected > 0 && first_survival < 0) first_survival = n;
    if (c != SENTINEL_OUT) c->deleter(c);
    if (b != SENTINEL_OUT) b->deleter(b);
    if (a != SENTINEL_OUT) a->deleter(a);
    cr_assert_eq(checksum(v, sizeof(float) * 33 * 19), sum, "N=%d: source changed", n);
    assert_pools_clean(other);
    cr_assert_eq(ab__alloc_live_settled(), live, "N=%d: %ld host blocks leaked", n, ab__alloc_live_settled() - live);
    if (injected == 0) break;
    faults++;
  }
  cr_assert_lt(n, 500);
  /* At least five: on the cpu routes the host pool, the first result's
   * block descriptor (which holds its header) and block, and the headers
   * of the two zero-copy views that follow. */
  cr_assert_geq(faults, 5, "only %d fault points on the %s routes", faults, type_name());
  /* Staging chunks are an optimisation: a run whose only lost allocation
   * was a staging chunk transfers directly and succeeds. */
  if (persistent && !staged)
    cr_assert_eq(failures, faults, "a persistent fault was survived");
  else if (persistent) /* survivals only at the tail: no allocation after a lost chunk may succeed */
    cr_assert_eq(first_survival < 0 ? faults : first_survival - 1, failures,
                 "a persistent fault was survived before the staging chunks' sites (N=%d)", first_survival);
  free(v);
}

/* ab_convert_into a destination on the device whose byte_offset is not a
 * multiple of the result's element size (DLPack allows it), with the
 * conversion placed on the device where the route allows: the kernels
 * store whole elements, so the library must convert elsewhere rather than
 * fail the step (OpenCL: AB_ERR_INTERNAL) or fault (CUDA: a misaligned
 * store ends all CUDA work in the process). */
Test(conformance, a_conversion_into_an_unaligned_destination_is_exact) {
  need_devices(1);
  convert_place("device");
  uint8_t x[300];
  fill_pattern(x, sizeof x, 61);
  int64_t shape[1] = {300}, bshape[1] = {300 * 4 + 8}; /* also holds 50 x 6 int32 and 8 bytes */
  DLTensor h = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *src = convert_ok(&h, DEV(0), AB_COPY_ALWAYS, NULL), *buf;
  cr_assert_eq(ab_tensor_alloc(DEV(0), 1, bshape, dt(kDLUInt, 8, 1), &buf), AB_OK, "%s", ab_last_error());
  for (uint64_t off = 1; off < 4; off++) {
    DLTensor d = buf->dl_tensor;
    d.dtype = dt(kDLInt, 32, 1);
    d.shape = shape;
    d.strides = NULL;
    d.byte_offset = off;
    cr_assert_eq(ab_convert_into(&src->dl_tensor, &d, NULL), AB_OK, "byte_offset %llu: %s", (unsigned long long)off,
                 ab_last_error());
    DLManagedTensorVersioned *back = convert_ok(&buf->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
    const uint8_t *b = (const uint8_t *)back->dl_tensor.data + off;
    for (int i = 0; i < 300; i++) {
      int32_t v;
      memcpy(&v, b + 4 * i, 4);
      cr_assert_eq(v, (int32_t)x[i], "byte_offset %llu, element %d: %d, want %d", (unsigned long long)off, i, v, x[i]);
    }
    back->deleter(back);
  }
  /* and a plain copy of a transposed view, no conversion: the device's
   * strided gather must not move whole elements to an unaligned place */
  int32_t y[6 * 50];
  fill_pattern(y, sizeof y, 62);
  int64_t yshape[2] = {6, 50}, tshape[2] = {50, 6}, tst[2] = {1, 50};
  DLTensor hy = {y, CPU0, 2, dt(kDLInt, 32, 1), yshape, NULL, 0};
  DLManagedTensorVersioned *gy = convert_ok(&hy, DEV(0), AB_COPY_ALWAYS, NULL);
  DLTensor view = gy->dl_tensor, hview = hy;
  view.shape = hview.shape = tshape;
  view.strides = hview.strides = tst;
  for (uint64_t off = 0; off < 8; off++) {
    DLTensor d = buf->dl_tensor;
    d.ndim = 2;
    d.dtype = dt(kDLInt, 32, 1);
    d.shape = tshape;
    d.strides = NULL;
    d.byte_offset = off;
    cr_assert_eq(ab_convert_into(&view, &d, NULL), AB_OK, "byte_offset %llu: %s", (unsigned long long)off,
                 ab_last_error());
    DLManagedTensorVersioned *back = convert_ok(&buf->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
    const uint8_t *b = (const uint8_t *)back->dl_tensor.data + off;
    for (int i = 0; i < 50; i++)
      for (int j = 0; j < 6; j++) {
        int32_t v;
        memcpy(&v, b + 4 * (i * 6 + j), 4);
        cr_assert_eq(v, y[j * 50 + i], "copy at byte_offset %llu, element (%d, %d)", (unsigned long long)off, i, j);
      }
    back->deleter(back);
  }
  gy->deleter(gy);
  buf->deleter(buf);
  src->deleter(src);
  convert_place("auto");
  assert_pool_clean(DEV(0));
}

/* ab_convert_into a device destination at an aligned byte_offset inside
 * a larger buffer, from the host: a plain copy of several staging chunks
 * (through the ring where the variant stages), and a cast that uploads
 * the source and converts on the device into the destination. The bytes
 * land at the offset and nothing before or after them changes. */
Test(conformance, host_sources_land_at_a_device_destinations_byte_offset) {
  need_devices(1);
  enum { N = 200000, PAD = 16 }; /* 800 KB: more than one 64 KiB chunk */
  float *src = malloc(N * sizeof *src), *zeros = calloc(N + 2 * PAD, sizeof *zeros);
  cr_assert(src != NULL && zeros != NULL);
  for (int i = 0; i < N; i++) src[i] = (float)(i + 1);
  int64_t shape[1] = {N}, bshape[1] = {N + 2 * PAD};
  DLTensor hs = {src, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLTensor hz = {zeros, CPU0, 1, dt(kDLFloat, 32, 1), bshape, NULL, 0};
  for (int pass = 0; pass < 2; pass++) {
    DLManagedTensorVersioned *buf = convert_ok(&hz, DEV(0), AB_COPY_ALWAYS, NULL);
    DLTensor d = buf->dl_tensor;
    d.shape = shape;
    d.byte_offset = PAD * sizeof(float);
    uint8_t x[300];
    int64_t xshape[1] = {300};
    DLTensor hx = {x, CPU0, 1, dt(kDLUInt, 8, 1), xshape, NULL, 0};
    if (pass == 0) {
      cr_assert_eq(ab_convert_into(&hs, &d, NULL), AB_OK, "copy: %s", ab_last_error());
    } else { /* uint8 -> float32, converted on the device where it can */
      for (int i = 0; i < 300; i++) x[i] = (uint8_t)(i * 7 + 3);
      d.shape = xshape;
      convert_place("device");
      const ab_status st = ab_convert_into(&hx, &d, NULL);
      convert_place("auto");
      cr_assert_eq(st, AB_OK, "cast: %s", ab_last_error());
    }
    DLManagedTensorVersioned *back = convert_ok(&buf->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
    const float *b = back->dl_tensor.data;
    const int n = pass == 0 ? N : 300;
    for (int i = 0; i < N + 2 * PAD; i++) {
      const float want = i < PAD || i >= PAD + n ? 0.0f : pass == 0 ? src[i - PAD] : (float)x[i - PAD];
      cr_assert_eq(b[i], want, "%s: element %d of the buffer is %g, want %g", pass == 0 ? "copy" : "cast", i,
                   (double)b[i], (double)want);
    }
    back->deleter(back);
    buf->deleter(buf);
  }
  free(src);
  free(zeros);
  assert_pool_clean(DEV(0));
}

Test(conformance, fault_sweep_transient) {
  need_devices(1);
  sweep(false);
}

Test(conformance, fault_sweep_persistent) {
  need_devices(1);
  sweep(true);
}
