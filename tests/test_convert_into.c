/* ab_convert_into: conversions into memory the caller already holds. */
#include <criterion/criterion.h>
#include <string.h>

#include "support.h"

static DLTensor host_tensor(void *data, int32_t ndim, int64_t *shape, int64_t *strides, DLDataType d) {
  DLTensor t = {data, CPU0, ndim, d, shape, strides, 0};
  return t;
}

Test(convert_into, planes_of_a_stack_take_each_source_in_place) {
  /* Three 2x3 sources (one float32, one int16 cast on the way, one a
   * transposed view) into the planes of one 3x2x3 float32 buffer. */
  float a[6], out[3][2][3], tr_src[3][2];
  int16_t b[6];
  for (int i = 0; i < 6; i++) a[i] = (float)i + 0.5f, b[i] = (int16_t)(-10 * i);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 2; c++) tr_src[r][c] = (float)(100 + 10 * c + r); /* its transpose is [c][r] */
  memset(out, 0xff, sizeof out);
  int64_t shape2[2] = {2, 3}, shape3[3] = {3, 2, 3}, tr_shape[2] = {2, 3}, tr_strides[2] = {1, 2};
  DLTensor dst = host_tensor(out, 3, shape3, NULL, dt(kDLFloat, 32, 1));
  DLTensor srcs[3] = {host_tensor(a, 2, shape2, NULL, dt(kDLFloat, 32, 1)),
                      host_tensor(b, 2, shape2, NULL, dt(kDLInt, 16, 1)),
                      host_tensor(tr_src, 2, tr_shape, tr_strides, dt(kDLFloat, 32, 1))};
  for (int z = 0; z < 3; z++) {
    DLTensor plane = dst;
    plane.ndim = 2;
    plane.shape = shape3 + 1;
    plane.byte_offset = (uint64_t)z * sizeof out[0];
    ab_status st = ab_convert_into(&srcs[z], &plane, NULL);
    cr_assert_eq(st, AB_OK, "plane %d: %s (%s)", z, ab_status_name(st), ab_last_error());
  }
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 3; c++) {
      cr_assert_eq(out[0][r][c], a[r * 3 + c]);
      cr_assert_eq(out[1][r][c], (float)b[r * 3 + c]);
      cr_assert_eq(out[2][r][c], tr_src[c][r]);
    }
}

Test(convert_into, maps_and_permutes_like_convert_memory) {
  uint8_t img[2][2][3]; /* HWC */
  for (int i = 0; i < 12; i++) ((uint8_t *)img)[i] = (uint8_t)(i * 20);
  float chw[3][2][2];
  int64_t hwc[3] = {2, 2, 3}, shape_chw[3] = {3, 2, 2};
  int32_t perm[3] = {2, 0, 1};
  DLTensor src = host_tensor(img, 3, hwc, NULL, dt(kDLUInt, 8, 1));
  DLTensor dst = host_tensor(chw, 3, shape_chw, NULL, dt(kDLFloat, 32, 1));
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.permute = perm;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 0.5;
  o.offset = 1;
  cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_OK, "%s", ab_last_error());
  /* The same through ab_convert_memory, bit for bit. */
  DLManagedTensorVersioned *r;
  o.dtype = dt(kDLFloat, 32, 1);
  cr_assert_eq(ab_convert_memory(&src, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(memcmp(r->dl_tensor.data, chw, sizeof chw), 0);
  cr_assert_eq(chw[1][1][0], img[1][0][1] * 0.5f + 1);
  r->deleter(r);
}

Test(convert_into, images_into_planes_at_any_address) {
  /* uint8 HWC -> float32 CHW into a destination that is not 4-byte
   * aligned (a byte buffer the caller sliced): the image path stored
   * floats through float pointers, undefined there (the ASan/UBSan tier
   * stopped on it); the bytes must come out the same at any address. */
  enum { H = 5, W = 37 };
  uint8_t img[H * W * 4];
  for (int i = 0; i < H * W * 4; i++) img[i] = (uint8_t)(i * 7 + 3);
  unsigned char buf[4 * H * W * sizeof(float) + 8];
  for (int64_t c = 1; c <= 4; c++)
    for (int off = 0; off < 4; off++) {
      int64_t hwc[3] = {H, W, c}, chw[3] = {c, H, W};
      int32_t perm[3] = {2, 0, 1};
      DLTensor src = host_tensor(img, 3, hwc, NULL, dt(kDLUInt, 8, 1));
      DLTensor dst = host_tensor(buf + off, 3, chw, NULL, dt(kDLFloat, 32, 1));
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.permute = perm;
      o.threads = 1;
      memset(buf, 0, sizeof buf);
      cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_OK, "C=%lld +%d: %s", (long long)c, off, ab_last_error());
      for (int64_t ch = 0; ch < c; ch++)
        for (int64_t i = 0; i < H * W; i++) {
          float got;
          memcpy(&got, buf + off + (size_t)(ch * H * W + i) * sizeof got, sizeof got);
          cr_assert_eq(got, (float)img[i * c + ch], "C=%lld +%d: plane %lld, pixel %lld", (long long)c, off,
                       (long long)ch, (long long)i);
        }
    }
}

Test(convert_into, bad_destinations_are_refused_and_left_unwritten) {
  float a[6] = {1, 2, 3, 4, 5, 6}, out[8];
  int64_t shape[2] = {2, 3}, other[2] = {3, 2}, strided[2] = {6, 1}, big[2] = {2, 4};
  DLTensor src = host_tensor(a, 2, shape, NULL, dt(kDLFloat, 32, 1));
  struct {
    DLTensor dst;
    ab_convert_opts o;
    ab_status want;
    const char *what;
  } cases[] = {
    {host_tensor(out, 2, other, NULL, dt(kDLFloat, 32, 1)), AB_CONVERT_OPTS_INIT, AB_ERR_INVALID_ARGUMENT,
     "shape (3, 2), not the result's (2, 3)"},
    {host_tensor(out, 2, big, NULL, dt(kDLFloat, 32, 1)), AB_CONVERT_OPTS_INIT, AB_ERR_INVALID_ARGUMENT,
     "shape (2, 4), not the result's (2, 3)"},
    {host_tensor(out, 2, shape, strided, dt(kDLFloat, 32, 1)), AB_CONVERT_OPTS_INIT, AB_ERR_INVALID_ARGUMENT,
     "compact"},
    {host_tensor(a, 2, shape, NULL, dt(kDLFloat, 32, 1)), AB_CONVERT_OPTS_INIT, AB_ERR_INVALID_ARGUMENT, "share"},
    {host_tensor(NULL, 2, shape, NULL, dt(kDLFloat, 32, 1)), AB_CONVERT_OPTS_INIT, AB_ERR_INVALID_ARGUMENT, "NULL"},
  };
  int n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    memset(out, 0x5a, sizeof out);
    uint64_t before = checksum(out, sizeof out);
    ab_status st = ab_convert_into(&src, &cases[i].dst, &cases[i].o);
    cr_assert_eq(st, cases[i].want, "case %d (%s): %s (%s)", i, cases[i].what, ab_status_name(st), ab_last_error());
    cr_assert_neq(strstr(ab_last_error(), cases[i].what), NULL, "case %d: message \"%s\" lacks \"%s\"", i,
                  ab_last_error(), cases[i].what);
    cr_assert_eq(checksum(out, sizeof out), before, "case %d wrote into dst", i);
  }
  /* A dtype in opts other than dst's, AB_COPY_NEVER and READ_ONLY. */
  DLTensor dst = host_tensor(out, 2, shape, NULL, dt(kDLFloat, 32, 1));
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 64, 1);
  cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_ERR_INVALID_ARGUMENT);
  o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_NEVER;
  cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_ERR_COPY_REQUIRED);
  o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o.flags = AB_CONVERT_READ_ONLY;
  cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_convert_into(NULL, &dst, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_convert_into(&src, NULL, NULL), AB_ERR_INVALID_ARGUMENT);
  /* dtype named as dst's is fine, and nothing is left in use. */
  o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  cr_assert_eq(ab_convert_into(&src, &dst, &o), AB_OK, "%s", ab_last_error());
  cr_assert_eq(memcmp(out, a, sizeof a), 0);
  cr_assert_eq(pool_in_use(CPU0), 0);
}
