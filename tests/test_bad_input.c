/* Malformed input: one test per class of mistake. Each checks the exact
 * status, that ab_last_error() names the problem, that *out was not written,
 * that the source bytes are unchanged and that nothing leaked; and that
 * ab_tensor_validate gives the same status for the same tensor. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "internal.h"
#include "support.h"

#define CPU1 ((DLDevice){kDLCPU, 1})

/* A valid 4 x 6 float32 source the tests break one field at a time. */
static float g_buf[24];
static int64_t g_shape[2];

static DLTensor good_tensor(void) {
  for (int i = 0; i < 24; i++) g_buf[i] = (float)(i * 3 - 11);
  g_shape[0] = 4;
  g_shape[1] = 6;
  return (DLTensor){g_buf, CPU0, 2, dt(kDLFloat, 32, 1), g_shape, NULL, 0};
}

/* Leaves a known message behind so each check sees a message the call under
 * test wrote (the primer's own text is compared against). */
static char g_primer[512];
static void prime_last_error(void) {
  struct ab_device_info info;
  cr_assert_eq(ab_device_info((DLDevice){kDLCPU, 7}, &info), AB_ERR_NO_DEVICE);
  strncpy(g_primer, ab_last_error(), sizeof g_primer - 1);
}

static void assert_message(const char *what, const char *word) {
  const char *msg = ab_last_error();
  cr_assert_str_neq(msg, g_primer, "%s: the call left no message of its own", what);
  cr_assert_not_null(strstr(msg, word), "%s: message \"%s\" does not mention \"%s\"", what, msg, word);
}

/* Converts `src` expecting `want`, with message containing `word`. The
 * source's bytes are the `nbytes` at `bytes` (NULL: not checked). */
static void expect_convert_fails(const DLTensor *src, DLDevice target, const ab_convert_opts *opts,
                                 ab_status want, const char *word, const void *bytes, size_t nbytes,
                                 const char *what) {
  uint64_t before = bytes ? checksum(bytes, nbytes) : 0;
  DLTensor copy_of_src;
  if (src) copy_of_src = *src;
  long live = ab__alloc_live_settled();
  prime_last_error();
  DLManagedTensorVersioned *out = SENTINEL_OUT;
  ab_status st = ab_convert_memory(src, target, opts, &out);
  cr_assert_eq(st, want, "%s: got %s, want %s (%s)", what, ab_status_name(st), ab_status_name(want),
               ab_last_error());
  assert_message(what, word);
  cr_assert_eq(out, SENTINEL_OUT, "%s: *out was written on failure", what);
  if (bytes) cr_assert_eq(checksum(bytes, nbytes), before, "%s: source bytes changed", what);
  if (src) cr_assert(memcmp(&copy_of_src, src, sizeof *src) == 0, "%s: the DLTensor was modified", what);
  cr_assert_eq(ab__alloc_live_settled(), live, "%s: leaked %ld blocks", what, ab__alloc_live_settled() - live);
}

/* ab_tensor_validate on a tensor that ab_convert_memory rejects. */
static void expect_validate_fails(const DLTensor *t, ab_status want, const char *word, const char *what) {
  prime_last_error();
  ab_status st = ab_tensor_validate(t);
  cr_assert_eq(st, want, "validate %s: got %s, want %s (%s)", what, ab_status_name(st), ab_status_name(want),
               ab_last_error());
  assert_message(what, word);
}

static void expect_tensor_rejected(const DLTensor *t, ab_status want, const char *word, const char *what) {
  expect_convert_fails(t, CPU0, NULL, want, word, g_buf, sizeof g_buf, what);
  ab_convert_opts always = {.copy = AB_COPY_ALWAYS};
  expect_convert_fails(t, CPU0, &always, want, word, g_buf, sizeof g_buf, what);
  expect_validate_fails(t, want, word, what);
}

/* ---- pointers ----------------------------------------------------------- */

Test(bad_input, null_src_is_invalid) {
  expect_convert_fails(NULL, CPU0, NULL, AB_ERR_INVALID_ARGUMENT, "NULL", NULL, 0, "NULL src");
  expect_validate_fails(NULL, AB_ERR_INVALID_ARGUMENT, "NULL", "NULL tensor");
}

Test(bad_input, null_out_is_invalid) {
  DLTensor t = good_tensor();
  uint64_t before = checksum(g_buf, sizeof g_buf);
  long live = ab__alloc_live_settled();
  prime_last_error();
  cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, NULL), AB_ERR_INVALID_ARGUMENT);
  assert_message("NULL out", "out");
  assert_message("NULL out", "NULL");
  cr_assert_eq(checksum(g_buf, sizeof g_buf), before);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* ---- ndim and shape ------------------------------------------------------ */

Test(bad_input, negative_ndim_is_invalid) {
  DLTensor t = good_tensor();
  t.ndim = -1;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "ndim", "ndim -1");
}

Test(bad_input, ndim_above_64_is_invalid) {
  int64_t shape[65];
  for (int i = 0; i < 65; i++) shape[i] = 1;
  DLTensor t = good_tensor();
  t.ndim = 65;
  t.shape = shape;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "ndim", "ndim 65");
  /* 64 itself is fine */
  t.ndim = 64;
  cr_assert_eq(ab_tensor_validate(&t), AB_OK, "%s", ab_last_error());
}

Test(bad_input, null_shape_with_positive_ndim_is_invalid) {
  DLTensor t = good_tensor();
  t.shape = NULL;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "shape", "NULL shape");
  assert_message("NULL shape", "NULL");
}

Test(bad_input, negative_shape_is_invalid) {
  DLTensor t = good_tensor();
  int64_t shape[2] = {4, -6};
  t.shape = shape;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "shape[1]", "shape[1] = -6");
  /* a negative dim is wrong even when another dim makes the tensor empty */
  int64_t shape0[2] = {0, -1};
  t.shape = shape0;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "shape[1]", "shape {0, -1}");
}

Test(bad_input, element_count_overflow_is_invalid) {
  DLTensor t = good_tensor();
  int64_t shape[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  t.shape = shape;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "shape[1]", "2^40 x 2^40 elements");
  assert_message("2^40 x 2^40 elements", "overflow");
}

Test(bad_input, byte_size_overflow_is_invalid) {
  DLTensor t = good_tensor();
  int64_t shape[1] = {(int64_t)1 << 61};
  t.ndim = 1;
  t.shape = shape;
  t.dtype = dt(kDLFloat, 64, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "byte size", "2^61 float64");
  assert_message("2^61 float64", "overflow");
}

/* ---- strides, data, offsets ------------------------------------------- */

Test(bad_input, stride_extent_overflow_is_invalid) {
  DLTensor t = good_tensor();
  int64_t shape[1] = {3}, strides[1] = {INT64_MAX / 2};
  t.ndim = 1;
  t.shape = shape;
  t.strides = strides;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "extent", "stride INT64_MAX/2, shape 3");
  assert_message("stride INT64_MAX/2", "stride");
  int64_t neg[1] = {INT64_MIN / 3};
  t.strides = neg;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "extent", "stride INT64_MIN/3, shape 3");
}

Test(bad_input, range_wrapping_below_address_zero_is_invalid) {
  /* data is a small fake address; a negative stride reaches below 0. The
   * library must reject it without reading anything. */
  int64_t shape[1] = {3}, strides[1] = {-100};
  DLTensor t = {(void *)(uintptr_t)16, CPU0, 1, dt(kDLUInt, 8, 1), shape, strides, 0};
  expect_convert_fails(&t, CPU0, NULL, AB_ERR_INVALID_ARGUMENT, "address", NULL, 0, "wrap below 0");
  expect_validate_fails(&t, AB_ERR_INVALID_ARGUMENT, "address", "wrap below 0");
  /* and past the top, through byte_offset */
  int64_t shape2[1] = {4};
  DLTensor t2 = {g_buf, CPU0, 1, dt(kDLFloat, 32, 1), shape2, NULL, UINT64_MAX - 8};
  good_tensor();
  expect_tensor_rejected(&t2, AB_ERR_INVALID_ARGUMENT, "byte_offset", "byte_offset near 2^64");
  /* and past the top of this process's address space: 2^32 in a 32-bit
   * build, where data + byte_offset wrapped to memory before data (the
   * 32-bit probe: read and written out of bounds) */
  int64_t shape3[1] = {16};
  DLTensor t3 = {g_buf, CPU0, 1, dt(kDLUInt, 8, 1), shape3, NULL, (uint64_t)UINTPTR_MAX - 7};
  expect_tensor_rejected(&t3, AB_ERR_INVALID_ARGUMENT, "byte_offset", "byte_offset wrapping the address space");
  t3.data = (void *)(UINTPTR_MAX - 7);
  t3.byte_offset = 0;
  expect_tensor_rejected(&t3, AB_ERR_INVALID_ARGUMENT, "outside", "data 8 bytes below the top of the address space");
  /* ending at the top exactly: its one-past-the-end pointer would be 0 */
  shape3[0] = 8;
  expect_tensor_rejected(&t3, AB_ERR_INVALID_ARGUMENT, "outside", "8 bytes ending at the top of the address space");
}

Test(bad_input, extent_larger_than_any_buffer_is_invalid) {
  /* Regression (review of the foundation): shape {2}, stride INT64_MAX
   * addresses data + 2^63 - 1, which does not wrap the 64-bit space but no
   * buffer can reach; it used to pass validation and crash the gather. */
  int64_t shape[1] = {2}, strides[1] = {INT64_MAX};
  good_tensor();
  DLTensor t = {g_buf, CPU0, 1, dt(kDLInt, 8, 1), shape, strides, 0};
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "buffer", "stride INT64_MAX, shape 2");
  /* The same with byte_offset INT64_MAX: the message's extent must be
   * formatted without signed overflow (UBSan would abort the test). */
  t.byte_offset = (uint64_t)INT64_MAX;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "buffer", "stride and byte_offset INT64_MAX");
  /* Reversed: a negative extent larger than PTRDIFF_MAX. */
  int64_t neg[1] = {INT64_MIN + 1};
  t.strides = neg;
  t.byte_offset = 0;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "buffer", "stride INT64_MIN + 1, shape 2");
}

Test(bad_input, null_data_with_elements_is_invalid) {
  DLTensor t = good_tensor();
  t.data = NULL;
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "data", "NULL data");
  assert_message("NULL data", "NULL");
}

/* ---- dtypes --------------------------------------------------------------- */

Test(bad_input, unknown_dtype_code_is_invalid) {
  DLTensor t = good_tensor();
  t.dtype = dt(99, 8, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "code 99", "dtype code 99");
}

Test(bad_input, zero_bits_is_invalid) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLFloat, 0, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "bits", "bits 0");
}

Test(bad_input, zero_lanes_is_invalid) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLFloat, 32, 0);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "lanes", "lanes 0");
}

Test(bad_input, bool_of_16_bits_is_invalid) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLBool, 16, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "bool", "bool16");
  assert_message("bool16", "bits");
}

Test(bad_input, float_of_24_bits_is_invalid) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLFloat, 24, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "bits", "float24");
  t.dtype = dt(kDLBfloat, 32, 1);
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "bits", "bfloat32");
  t.dtype = dt(9, 16, 1); /* a float8 code with 16 bits */
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "bits", "float8 code 9 with 16 bits");
}

Test(bad_input, opaque_handle_is_unsupported) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLOpaqueHandle, 64, 1);
  expect_tensor_rejected(&t, AB_ERR_UNSUPPORTED, "opaque", "opaque handle");
}

Test(bad_input, sub_byte_types_are_unsupported) {
  DLTensor t = good_tensor();
  t.dtype = dt(kDLInt, 4, 1);
  expect_tensor_rejected(&t, AB_ERR_UNSUPPORTED, "sub-byte", "int4");
  t.dtype = dt(kDLUInt, 1, 1);
  expect_tensor_rejected(&t, AB_ERR_UNSUPPORTED, "sub-byte", "uint1");
  t.dtype = dt(17, 4, 1); /* float4_e2m1fn */
  expect_tensor_rejected(&t, AB_ERR_UNSUPPORTED, "sub-byte", "float4_e2m1fn");
  t.dtype = dt(15, 6, 1); /* float6_e2m3fn */
  expect_tensor_rejected(&t, AB_ERR_UNSUPPORTED, "sub-byte", "float6_e2m3fn");
}

/* ---- devices ------------------------------------------------------------ */

Test(bad_input, unknown_source_device_type_is_invalid) {
  static const int types[] = {0, 5, 6, 99, -1};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    DLTensor t = good_tensor();
    t.device = (DLDevice){(DLDeviceType)types[k], 0};
    char what[40];
    snprintf(what, sizeof what, "src device type %d", types[k]);
    expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "device", what);
    char num[16];
    snprintf(num, sizeof num, "%d", types[k]);
    assert_message(what, num);
  }
}

/* A CPU tensor's memory is host memory whatever its device_id says (JAX
 * exports its CPU devices' indices there: test_convert), but an id below 0
 * is no device at all. */
Test(bad_input, source_cpu_with_a_negative_id_is_refused) {
  DLTensor t = good_tensor();
  t.device = (DLDevice){kDLCPU, -1};
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "negative", "src cpu:-1");
  assert_message("src cpu:-1", "device id -1");
}

/* cpu:0 skips the device search once the backends are up
 * (ab__check_tensor_device): before the first call, after ab_shutdown and
 * after the re-initialisation it gives what the search gives, and the
 * devices around it are still refused. */
Test(bad_input, the_cpu_0_shortcut_agrees_with_the_search_across_shutdown) {
  ab_shutdown(); /* whatever the test runner did before: the search first */
  for (int round = 0; round < 4; round++) {
    cr_assert_not(ab__device_shortcut_ready(), "round %d: the shortcut before the backends are up", round);
    DLDevice r = {(DLDeviceType)99, 99};
    const struct ab_backend *be = NULL;
    cr_assert_eq(ab__check_tensor_device(CPU0, "src device", false, &r, &be), AB_OK, "round %d: %s", round,
                 ab_last_error());
    cr_assert(r.device_type == kDLCPU && r.device_id == 0, "round %d: resolved to %d:%d", round, r.device_type,
              r.device_id);
    cr_assert_eq(be, ab__backend_for(kDLCPU), "round %d: another backend", round);
    cr_assert(ab__device_shortcut_ready(), "round %d: no shortcut once the backends are up", round);
    cr_assert_eq(ab__check_tensor_device(CPU1, "target device", true, &r, &be), AB_ERR_NO_DEVICE, "round %d", round);
    cr_assert_eq(ab__check_tensor_device(CPU1, "src device", false, &r, &be), AB_OK, "round %d", round);
    cr_assert(r.device_type == kDLCPU && r.device_id == 0, "round %d: cpu:1 memory resolved to %d:%d", round,
              r.device_type, r.device_id);
    cr_assert_eq(ab__check_tensor_device((DLDevice){kDLCPU, -3}, "src device", false, &r, &be),
                 AB_ERR_INVALID_ARGUMENT, "round %d", round);
    /* the staging type is still refused by its own check */
    cr_assert_eq(ab__check_tensor_device((DLDevice){(DLDeviceType)AB_DEVICE_OPENCL_HOST, 0}, "src device", false, &r,
                                         &be),
                 AB_ERR_INVALID_ARGUMENT, "round %d", round);
    DLTensor t = good_tensor();
    DLManagedTensorVersioned *m = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &m), AB_OK, "round %d: %s", round, ab_last_error());
    cr_assert_eq(m->dl_tensor.data, t.data, "round %d: not a view", round);
    m->deleter(m);
    ab_shutdown();
  }
}

Test(bad_input, negative_source_device_id_is_invalid) {
  DLTensor t = good_tensor();
  t.device = (DLDevice){kDLCPU, -3};
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "-3", "src cpu:-3");
  assert_message("src cpu:-3", "device");
  /* AB_DEVICE_AUTO names a target, never a source */
  t.device = (DLDevice){kDLCPU, AB_DEVICE_AUTO};
  expect_tensor_rejected(&t, AB_ERR_INVALID_ARGUMENT, "-1", "src cpu:AUTO");
}

Test(bad_input, target_cuda_is_absent_from_this_build) {
  DLTensor t = good_tensor();
  expect_convert_fails(&t, (DLDevice){kDLCUDA, 0}, NULL, AB_ERR_NO_DEVICE, "cuda", g_buf, sizeof g_buf,
                       "target cuda:0");
  assert_message("target cuda:0", "target");
  expect_convert_fails(&t, (DLDevice){kDLCUDA, AB_DEVICE_AUTO}, NULL, AB_ERR_NO_DEVICE, "cuda", g_buf,
                       sizeof g_buf, "target cuda:AUTO");
}

Test(bad_input, target_vulkan_has_no_backend) {
  DLTensor t = good_tensor();
  expect_convert_fails(&t, (DLDevice){kDLVulkan, 0}, NULL, AB_ERR_NO_DEVICE, "vulkan", g_buf, sizeof g_buf,
                       "target vulkan:0");
}

Test(bad_input, target_cpu_1_does_not_exist) {
  DLTensor t = good_tensor();
  expect_convert_fails(&t, CPU1, NULL, AB_ERR_NO_DEVICE, "cpu:1", g_buf, sizeof g_buf, "target cpu:1");
  ab_convert_opts never = {.copy = AB_COPY_NEVER};
  expect_convert_fails(&t, CPU1, &never, AB_ERR_NO_DEVICE, "cpu:1", g_buf, sizeof g_buf,
                       "target cpu:1, COPY_NEVER");
}

Test(bad_input, unknown_target_device_type_is_invalid) {
  DLTensor t = good_tensor();
  expect_convert_fails(&t, (DLDevice){(DLDeviceType)42, 0}, NULL, AB_ERR_INVALID_ARGUMENT, "42", g_buf,
                       sizeof g_buf, "target type 42");
  expect_convert_fails(&t, (DLDevice){kDLCPU, -3}, NULL, AB_ERR_INVALID_ARGUMENT, "-3", g_buf, sizeof g_buf,
                       "target cpu:-3");
}

/* ---- options ------------------------------------------------------------ */

Test(bad_input, unknown_copy_mode_is_invalid) {
  DLTensor t = good_tensor();
  ab_convert_opts o = {.copy = (ab_copy_mode)7};
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "copy", g_buf, sizeof g_buf, "copy 7");
  assert_message("copy 7", "7");
  o.copy = (ab_copy_mode)-1;
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "copy", g_buf, sizeof g_buf, "copy -1");
}

Test(bad_input, unknown_flag_bits_are_invalid) {
  DLTensor t = good_tensor();
  ab_convert_opts o = {.flags = 1u << 5};
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "flags", g_buf, sizeof g_buf, "flag bit 5");
  assert_message("flag bit 5", "0x20");
  o.flags = AB_CONVERT_READ_ONLY | 0x80000000u;
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "flags", g_buf, sizeof g_buf, "flag bit 31");
}

Test(bad_input, invalid_opts_dtype_is_invalid) {
  DLTensor t = good_tensor();
  ab_convert_opts o = {.dtype = dt(99, 8, 1)};
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "opts->dtype code 99 is not", g_buf, sizeof g_buf,
                       "opts dtype code 99");
  cr_expect(strstr(ab_last_error(), "dtype dtype") == NULL, "a word repeated: %s", ab_last_error());
  o.dtype = dt(kDLFloat, 32, 0);
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "lanes", g_buf, sizeof g_buf, "opts dtype lanes 0");
}

Test(bad_input, dtype_pairs_that_cannot_convert_are_unsupported_naming_both) {
  DLTensor t = good_tensor();
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLComplex, 64, 1);
  expect_convert_fails(&t, CPU0, &o, AB_ERR_UNSUPPORTED, "float32 to complex64", g_buf, sizeof g_buf,
                       "float32 -> complex64");
  o.dtype = dt(kDLFloat, 32, 4);
  expect_convert_fails(&t, CPU0, &o, AB_ERR_UNSUPPORTED, "float32x4", g_buf, sizeof g_buf, "float32 -> float32x4");
  o.dtype = dt(10, 8, 1); /* float8_e4m3fn (DLPack 1.1 code 10): a DLPack type, not converted */
  expect_convert_fails(&t, CPU0, &o, AB_ERR_UNSUPPORTED, "float32 to", g_buf, sizeof g_buf, "float32 -> float8");
  o.dtype = dt(kDLFloat, 64, 1);
  o.flags = AB_CONVERT_AFFINE;
  DLTensor c = t;
  c.dtype = dt(kDLComplex, 64, 1);
  c.shape = (int64_t[]){12};
  c.ndim = 1;
  o.dtype = dt(kDLComplex, 128, 1);
  expect_convert_fails(&c, CPU0, &o, AB_ERR_UNSUPPORTED, "with scale/offset", g_buf, sizeof g_buf,
                       "complex affine");
  /* with COPY_NEVER, a conversion is a copy first */
  o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 64, 1);
  o.copy = AB_COPY_NEVER;
  expect_convert_fails(&t, CPU0, &o, AB_ERR_COPY_REQUIRED, "dtype", g_buf, sizeof g_buf,
                       "float32 -> float64, COPY_NEVER");
  /* the source's own dtype is fine */
  o.copy = AB_COPY_IF_NEEDED;
  o.dtype = t.dtype;
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
}

Test(bad_input, bad_permutations_and_channel_axes_are_invalid) {
  DLTensor t = good_tensor();
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  const int32_t *perms[] = {(int32_t[]){0, 0}, (int32_t[]){1, 2}, (int32_t[]){-1, 0}};
  for (int i = 0; i < 3; i++) {
    o.permute = perms[i];
    expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "permute", g_buf, sizeof g_buf, "bad permutation");
  }
  o.permute = NULL;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "channel_axis", g_buf, sizeof g_buf, "axis 2 of 2-D");
  o.channel_axis = -1;
  expect_convert_fails(&t, CPU0, &o, AB_ERR_INVALID_ARGUMENT, "channel_axis", g_buf, sizeof g_buf, "axis -1");
}

/* ---- ab_tensor_alloc -------------------------------------------------- */

static void expect_alloc_fails(DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType d, ab_status want,
                               const char *word, const char *what) {
  long live = ab__alloc_live_settled();
  prime_last_error();
  DLManagedTensorVersioned *out = SENTINEL_OUT;
  ab_status st = ab_tensor_alloc(dev, ndim, shape, d, &out);
  cr_assert_eq(st, want, "%s: got %s, want %s (%s)", what, ab_status_name(st), ab_status_name(want),
               ab_last_error());
  assert_message(what, word);
  cr_assert_eq(out, SENTINEL_OUT, "%s: *out was written", what);
  cr_assert_eq(ab__alloc_live_settled(), live, "%s: leaked", what);
}

Test(bad_input, tensor_alloc_rejects_bad_shapes_dtypes_devices_and_null_out) {
  int64_t neg[2] = {3, -2};
  expect_alloc_fails(CPU0, 2, neg, dt(kDLFloat, 32, 1), AB_ERR_INVALID_ARGUMENT, "shape[1]", "alloc shape[1] -2");
  expect_alloc_fails(CPU0, -1, neg, dt(kDLFloat, 32, 1), AB_ERR_INVALID_ARGUMENT, "ndim", "alloc ndim -1");
  expect_alloc_fails(CPU0, 65, neg, dt(kDLFloat, 32, 1), AB_ERR_INVALID_ARGUMENT, "ndim", "alloc ndim 65");
  expect_alloc_fails(CPU0, 2, NULL, dt(kDLFloat, 32, 1), AB_ERR_INVALID_ARGUMENT, "shape", "alloc NULL shape");
  int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  expect_alloc_fails(CPU0, 2, huge, dt(kDLFloat, 32, 1), AB_ERR_INVALID_ARGUMENT, "overflow", "alloc 2^80 elements");
  int64_t ok[2] = {3, 2};
  expect_alloc_fails(CPU0, 2, ok, dt(kDLFloat, 0, 1), AB_ERR_INVALID_ARGUMENT, "bits", "alloc bits 0");
  expect_alloc_fails(CPU0, 2, ok, dt(kDLInt, 4, 1), AB_ERR_UNSUPPORTED, "sub-byte", "alloc int4");
  expect_alloc_fails((DLDevice){kDLCUDA, 0}, 2, ok, dt(kDLFloat, 32, 1), AB_ERR_NO_DEVICE, "cuda", "alloc on cuda:0");
  expect_alloc_fails(CPU1, 2, ok, dt(kDLFloat, 32, 1), AB_ERR_NO_DEVICE, "cpu:1", "alloc on cpu:1");
  prime_last_error();
  cr_assert_eq(ab_tensor_alloc(CPU0, 2, ok, dt(kDLFloat, 32, 1), NULL), AB_ERR_INVALID_ARGUMENT);
  assert_message("alloc NULL out", "NULL");
}

/* ---- what is accepted --------------------------------------------------- */

Test(bad_input, edge_cases_that_are_valid_return_ok) {
  DLManagedTensorVersioned *r = NULL;
  /* zero-size with NULL data and strides that are never used */
  int64_t empty[3] = {3, 0, 2}, junk[3] = {INT64_MAX, -5, INT64_MIN};
  DLTensor e = {NULL, CPU0, 3, dt(kDLFloat, 32, 1), empty, junk, 0};
  cr_assert_eq(ab_tensor_validate(&e), AB_OK, "%s", ab_last_error());
  for (int copy = 0; copy < 3; copy++) {
    ab_convert_opts o = {.copy = (ab_copy_mode)copy};
    cr_assert_eq(ab_convert_memory(&e, CPU0, &o, &r), AB_OK, "empty, copy=%d: %s", copy, ab_last_error());
    r->deleter(r);
  }
  /* a scalar with NULL shape and strides */
  double v = 2.5;
  DLTensor s = {&v, CPU0, 0, dt(kDLFloat, 64, 1), NULL, NULL, 0};
  cr_assert_eq(ab_tensor_validate(&s), AB_OK, "%s", ab_last_error());
  cr_assert_eq(ab_convert_memory(&s, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  /* size-1 dims with any stride */
  int64_t ones[3] = {1, 24, 1}, odd[3] = {INT64_MIN, 1, INT64_MAX};
  DLTensor o1 = good_tensor();
  o1.ndim = 3;
  o1.shape = ones;
  o1.strides = odd;
  cr_assert_eq(ab_tensor_validate(&o1), AB_OK, "%s", ab_last_error());
  ab_convert_opts always = {.copy = AB_COPY_ALWAYS};
  cr_assert_eq(ab_convert_memory(&o1, CPU0, &always, &r), AB_OK, "%s", ab_last_error());
  cr_assert(memcmp(r->dl_tensor.data, g_buf, sizeof g_buf) == 0);
  r->deleter(r);
  /* exactly AB_MAX_NDIM dims */
  int64_t shape64[AB_MAX_NDIM];
  for (int i = 0; i < AB_MAX_NDIM; i++) shape64[i] = 1;
  shape64[10] = 24;
  DLTensor t64 = good_tensor();
  t64.ndim = AB_MAX_NDIM;
  t64.shape = shape64;
  cr_assert_eq(ab_convert_memory(&t64, CPU0, &always, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
}

/* Found by fuzzing: a broadcast tensor is cheap to describe and impossible
 * to copy. The copy must fail as out of memory, with the numbers, not
 * crash or abort (the sanitizer tier runs with allocator_may_return_null).
 * A 32-bit process cannot describe its bytes at all (size_t), so there it
 * is refused as an argument, with the reason (check-cross.sh i386). */
Test(bad_input, a_copy_too_large_for_memory_is_out_of_memory) {
  uint8_t one = 7;
  int64_t shape[2] = {(int64_t)1 << 30, (int64_t)1 << 10}, strides[2] = {0, 0}; /* 1 TiB of one byte */
  DLTensor t = {&one, CPU0, 2, dt(kDLUInt, 8, 1), shape, strides, 0};
  ab_convert_opts always = {.copy = AB_COPY_ALWAYS};
  if (SIZE_MAX <= 0xffffffffu) {
    expect_convert_fails(&t, CPU0, &always, AB_ERR_INVALID_ARGUMENT, "1099511627776 bytes) is more than a 32-bit",
                         &one, 1, "1 TiB broadcast");
    return;
  }
  expect_convert_fails(&t, CPU0, &always, AB_ERR_OUT_OF_MEMORY, "1099511627776 bytes", &one, 1, "1 TiB broadcast");
  assert_message("1 TiB broadcast", "cpu:0");
}
