/* Strided host copies: every layout a DLPack producer can hand over comes
 * out as the same compact row-major bytes as the element-by-element
 * reference gather. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "support.h"

static DLDataType dtype_of_size(size_t es) {
  switch (es) {
  case 1: return dt(kDLUInt, 8, 1);
  case 2: return dt(kDLUInt, 16, 1);
  case 4: return dt(kDLFloat, 32, 1);
  case 8: return dt(kDLFloat, 64, 1);
  case 16: return dt(kDLComplex, 128, 1);
  case 32: return dt(kDLComplex, 128, 2);
  default: return dt(kDLUInt, 8, (uint16_t)es); /* odd sizes: uint8 vectors */
  }
}

/* Copies `t` with `copy` mode and checks the result against the reference:
 * compact copy invariants, every byte, and an untouched source of
 * `src_bytes` bytes at `src_buf`. */
static void check_copy_mode(const DLTensor *t, ab_copy_mode copy, const void *src_buf,
                            size_t src_bytes, const char *what) {
  uint64_t before = src_buf ? checksum(src_buf, src_bytes) : 0;
  long live = ab__alloc_live_settled();
  ab_convert_opts o = {.copy = copy};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(t, CPU0, &o, &r), AB_OK, "%s: %s", what, ab_last_error());
  cr_assert(is_compact_copy_of(r, t), "%s: result is not a compact copy", what);
  cr_assert_eq(r->dl_tensor.device.device_type, kDLCPU, "%s", what);
  cr_assert_eq(r->dl_tensor.byte_offset, 0, "%s", what);
  int64_t n = numel_of(t->ndim, t->shape);
  if (n == 0) cr_assert_null(r->dl_tensor.data, "%s: empty copy has data %p", what, r->dl_tensor.data);
  else cr_assert_not_null(r->dl_tensor.data, "%s", what);
  int64_t diff = first_diff_vs_reference(t, r);
  cr_assert_eq(diff, -1, "%s: byte %lld differs from the reference gather", what, (long long)diff);
  if (src_buf) cr_assert_eq(checksum(src_buf, src_bytes), before, "%s: source was written", what);
  r->deleter(r);
  cr_assert_eq(ab__alloc_live_settled(), live, "%s: deleter leaked", what);
}

static void check_copy(const DLTensor *t, const void *src_buf, size_t src_bytes, const char *what) {
  check_copy_mode(t, AB_COPY_ALWAYS, src_buf, src_bytes, what);
}

static void *pattern_buf(size_t n, uint32_t seed) {
  void *p = malloc(n ? n : 1);
  cr_assert_not_null(p);
  fill_pattern(p, n, seed);
  return p;
}

Test(strided, null_strides_mean_compact_row_major) {
  int64_t shape[3] = {5, 6, 7};
  size_t n = 5 * 6 * 7 * 2;
  void *buf = pattern_buf(n, 1);
  DLTensor t = {buf, CPU0, 3, dt(kDLUInt, 16, 1), shape, NULL, 0};
  check_copy(&t, buf, n, "NULL strides");
  free(buf);
}

Test(strided, explicit_compact_strides_copy_like_null_strides) {
  int64_t shape[3] = {5, 6, 7}, strides[3] = {42, 7, 1};
  size_t n = 5 * 6 * 7 * 2;
  void *buf = pattern_buf(n, 2);
  DLTensor t = {buf, CPU0, 3, dt(kDLUInt, 16, 1), shape, strides, 0};
  check_copy(&t, buf, n, "explicit compact strides");
  /* and the copy's bytes are the source's bytes in order */
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(memcmp(r->dl_tensor.data, buf, n) == 0);
  r->deleter(r);
  free(buf);
}

Test(strided, transposed_2d_matches_reference_for_each_element_size) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  static const int64_t shapes[][2] = {{1, 1}, {2, 3},   {31, 33},  {32, 32},  {64, 96}, {33, 65},
                                      {1, 100}, {100, 1}, {3, 1000}, {1000, 3}, {257, 131}};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    size_t es = sizes[si];
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      int64_t R = shapes[k][0], C = shapes[k][1];
      size_t n = (size_t)(R * C) * es;
      void *buf = pattern_buf(n, (uint32_t)(si * 100 + k));
      /* the buffer is R x C; the view is its transpose */
      int64_t shape[2] = {C, R}, strides[2] = {1, C};
      DLTensor t = {buf, CPU0, 2, dtype_of_size(es), shape, strides, 0};
      char what[64];
      snprintf(what, sizeof what, "transpose %lldx%lld of %zu-byte elements", (long long)C, (long long)R, es);
      check_copy(&t, buf, n, what);
      free(buf);
    }
  }
}

/* Outputs of several MiB: past the size where the gather may switch to
 * streaming stores, with row lengths that do and do not keep every row
 * 32-byte aligned, and ragged edges. */
Test(strided, large_transposes_match_reference, .timeout = 60) {
  static const struct {
    size_t es;
    int64_t B, R, C; /* B x R x C buffer, viewed as B x C x R */
  } cases[] = {
    {4, 1, 1024, 1100}, {4, 1, 1001, 1100}, {4, 3, 520, 1024}, {4, 1, 1100, 1029},
    {8, 1, 600, 1024},  {2, 1, 1024, 2100}, {1, 1, 2100, 2100}, {16, 1, 300, 1000},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    size_t es = cases[k].es;
    int64_t B = cases[k].B, R = cases[k].R, C = cases[k].C;
    size_t n = (size_t)(B * R * C) * es;
    void *buf = pattern_buf(n, 40 + (uint32_t)k);
    int64_t shape[3] = {B, C, R}, strides[3] = {R * C, 1, C};
    DLTensor t = {buf, CPU0, 3, dtype_of_size(es), shape, strides, 0};
    char what[80];
    snprintf(what, sizeof what, "large transpose %lldx%lldx%lld es=%zu", (long long)B, (long long)C,
             (long long)R, es);
    check_copy(&t, buf, n, what);
    free(buf);
  }
}

/* A 3-d batch of transposes: shape {B, C, R} over a B x R x C buffer. */
Test(strided, batched_transpose_matches_reference) {
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3, 12};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    size_t es = sizes[si];
    int64_t B = 3, R = 45, C = 37;
    size_t n = (size_t)(B * R * C) * es;
    void *buf = pattern_buf(n, 70 + (uint32_t)si);
    int64_t shape[3] = {B, C, R}, strides[3] = {R * C, 1, C};
    DLTensor t = {buf, CPU0, 3, dtype_of_size(es), shape, strides, 0};
    char what[64];
    snprintf(what, sizeof what, "batched transpose of %zu-byte elements", es);
    check_copy(&t, buf, n, what);
    free(buf);
  }
}

/* An interleaved H x W x C image seen as planar C x H x W (the permuted view
 * every HWC -> CHW pipeline starts from), and the reverse. */
Test(strided, hwc_viewed_as_chw_matches_reference) {
  static const size_t sizes[] = {1, 2, 4};
  static const int64_t hw[][2] = {{1, 1}, {5, 7}, {37, 53}, {67, 129}};
  for (size_t si = 0; si < 3; si++) {
    for (int64_t C = 1; C <= 5; C++) {
      for (size_t k = 0; k < sizeof hw / sizeof hw[0]; k++) {
        int64_t H = hw[k][0], W = hw[k][1];
        size_t es = sizes[si], n = (size_t)(H * W * C) * es;
        void *buf = pattern_buf(n, (uint32_t)(C * 10 + (int64_t)k));
        int64_t shape[3] = {C, H, W}, strides[3] = {1, W * C, C};
        DLTensor t = {buf, CPU0, 3, dtype_of_size(es), shape, strides, 0};
        char what[96];
        snprintf(what, sizeof what, "HWC->CHW C=%lld H=%lld W=%lld es=%zu", (long long)C, (long long)H,
                 (long long)W, es);
        check_copy(&t, buf, n, what);
        /* and the planar result, viewed back as HWC, gives the original */
        int64_t shape2[3] = {H, W, C}, strides2[3] = {W, 1, H * W};
        DLTensor back = {NULL, CPU0, 3, dtype_of_size(es), shape2, strides2, 0};
        ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
        DLManagedTensorVersioned *chw = NULL, *hwc = NULL;
        cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &chw), AB_OK, "%s", ab_last_error());
        back.data = chw->dl_tensor.data;
        snprintf(what, sizeof what, "CHW->HWC C=%lld H=%lld W=%lld es=%zu", (long long)C, (long long)H,
                 (long long)W, es);
        check_copy(&back, chw->dl_tensor.data, n, what);
        cr_assert_eq(ab_convert_memory(&back, CPU0, &o, &hwc), AB_OK, "%s", ab_last_error());
        cr_assert(memcmp(hwc->dl_tensor.data, buf, n) == 0, "%s: round trip differs", what);
        hwc->deleter(hwc);
        chw->deleter(chw);
        free(buf);
      }
    }
  }
}

Test(strided, negative_strides_read_reversed_rows_and_columns) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  const int64_t R = 13, C = 35;
  for (size_t si = 0; si < 5; si++) {
    size_t es = sizes[si], n = (size_t)(R * C) * es;
    char *buf = pattern_buf(n, 300 + (uint32_t)si);
    DLDataType d = dtype_of_size(es);
    int64_t shape[2] = {R, C};
    char what[64];

    int64_t rows_rev[2] = {-C, 1};
    DLTensor t1 = {buf + (size_t)((R - 1) * C) * es, CPU0, 2, d, shape, rows_rev, 0};
    snprintf(what, sizeof what, "reversed rows es=%zu", es);
    check_copy(&t1, buf, n, what);

    int64_t cols_rev[2] = {C, -1};
    DLTensor t2 = {buf + (size_t)(C - 1) * es, CPU0, 2, d, shape, cols_rev, 0};
    snprintf(what, sizeof what, "reversed columns es=%zu", es);
    check_copy(&t2, buf, n, what);

    /* both reversed: data points at the last element, so the copy is the
     * buffer's elements in reverse order */
    int64_t both_rev[2] = {-C, -1};
    DLTensor t3 = {buf + (size_t)(R * C - 1) * es, CPU0, 2, d, shape, both_rev, 0};
    snprintf(what, sizeof what, "reversed both es=%zu", es);
    check_copy(&t3, buf, n, what);
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t3, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    for (int64_t i = 0; i < R * C; i++)
      cr_assert(memcmp((char *)r->dl_tensor.data + (size_t)i * es, buf + (size_t)(R * C - 1 - i) * es, es) == 0,
                "%s: element %lld is not element %lld of the buffer", what, (long long)i,
                (long long)(R * C - 1 - i));
    r->deleter(r);

    /* the same end pointer reached through byte_offset instead of data */
    DLTensor t4 = {buf, CPU0, 2, d, shape, both_rev, (uint64_t)(R * C - 1) * es};
    snprintf(what, sizeof what, "reversed both via byte_offset es=%zu", es);
    check_copy(&t4, buf, n, what);

    /* a transposed, reversed view: columns become rows, read backwards */
    int64_t tshape[2] = {C, R}, trev[2] = {-1, -C};
    DLTensor t5 = {buf + (size_t)(R * C - 1) * es, CPU0, 2, d, tshape, trev, 0};
    snprintf(what, sizeof what, "reversed transpose es=%zu", es);
    check_copy(&t5, buf, n, what);
    free(buf);
  }
}

Test(strided, zero_strides_broadcast_one_element_or_row) {
  uint32_t row[5] = {11, 22, 33, 44, 55};
  int64_t shape[2] = {4, 5};
  /* every row is `row` */
  int64_t bc_rows[2] = {0, 1};
  DLTensor t1 = {row, CPU0, 2, dt(kDLUInt, 32, 1), shape, bc_rows, 0};
  check_copy(&t1, row, sizeof row, "row broadcast");
  /* every column is `col` */
  uint32_t col[4] = {7, 8, 9, 10};
  int64_t bc_cols[2] = {1, 0};
  DLTensor t2 = {col, CPU0, 2, dt(kDLUInt, 32, 1), shape, bc_cols, 0};
  check_copy(&t2, col, sizeof col, "column broadcast");
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t2, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  const uint32_t *p = r->dl_tensor.data;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++) cr_assert_eq(p[i * 5 + j], col[i], "column broadcast [%d][%d]", i, j);
  r->deleter(r);
  /* one element everywhere, in 3-d, for several element sizes */
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3};
  for (size_t si = 0; si < 6; si++) {
    size_t es = sizes[si];
    unsigned char one[16];
    fill_pattern(one, sizeof one, 400 + (uint32_t)si);
    int64_t shape3[3] = {3, 4, 5}, zero3[3] = {0, 0, 0};
    DLTensor t3 = {one, CPU0, 3, dtype_of_size(es), shape3, zero3, 0};
    char what[48];
    snprintf(what, sizeof what, "scalar broadcast es=%zu", es);
    check_copy(&t3, one, sizeof one, what);
  }
  /* a broadcast outer dim over a transposed inner pair */
  float buf[6 * 7];
  fill_pattern(buf, sizeof buf, 9);
  int64_t shape4[3] = {3, 7, 6}, st4[3] = {0, 1, 7};
  DLTensor t4 = {buf, CPU0, 3, dt(kDLFloat, 32, 1), shape4, st4, 0};
  check_copy(&t4, buf, sizeof buf, "broadcast over transpose");
}

Test(strided, gaps_every_other_element_and_crops) {
  /* every other element of a vector, of several sizes */
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3};
  for (size_t si = 0; si < 6; si++) {
    size_t es = sizes[si], n = 2 * 101 * es;
    void *buf = pattern_buf(n, 500 + (uint32_t)si);
    int64_t shape[1] = {101}, st[1] = {2};
    DLTensor t = {buf, CPU0, 1, dtype_of_size(es), shape, st, 0};
    char what[48];
    snprintf(what, sizeof what, "every other element es=%zu", es);
    check_copy(&t, buf, n, what);
    /* every other column and every third row of a matrix */
    int64_t shape2[2] = {10, 15}, st2[2] = {3 * 20, 2};
    size_t n2 = 30 * 20 * es;
    void *buf2 = pattern_buf(n2, 600 + (uint32_t)si);
    DLTensor t2 = {buf2, CPU0, 2, dtype_of_size(es), shape2, st2, 0};
    snprintf(what, sizeof what, "row/column gaps es=%zu", es);
    check_copy(&t2, buf2, n2, what);
    free(buf2);
    free(buf);
  }
  /* a region of interest of an H x W x 3 image: rows 10..29, columns
   * 5..44, all channels, then one channel of it */
  const int64_t H = 50, W = 60, C = 3;
  size_t n = (size_t)(H * W * C);
  unsigned char *img = pattern_buf(n, 77);
  int64_t roi_shape[3] = {20, 40, 3}, roi_st[3] = {W * C, C, 1};
  DLTensor roi = {img + (10 * W + 5) * C, CPU0, 3, dt(kDLUInt, 8, 1), roi_shape, roi_st, 0};
  check_copy(&roi, img, n, "ROI of HWC image");
  /* the same ROI with COPY_IF_NEEDED: a non-compact source is copied */
  check_copy_mode(&roi, AB_COPY_IF_NEEDED, img, n, "ROI with COPY_IF_NEEDED");
  int64_t ch_shape[2] = {20, 40}, ch_st[2] = {W * C, C};
  DLTensor ch = {img, CPU0, 2, dt(kDLUInt, 8, 1), ch_shape, ch_st, (uint64_t)((10 * W + 5) * C + 2)};
  check_copy(&ch, img, n, "one channel of a ROI");
  /* a ROI of full-width rows is contiguous and copies as one block */
  int64_t band_shape[3] = {7, 60, 3}, band_st[3] = {W * C, C, 1};
  DLTensor band = {img + 20 * W * C, CPU0, 3, dt(kDLUInt, 8, 1), band_shape, band_st, 0};
  check_copy(&band, img, n, "band of full rows");
  free(img);
}

/* DLPack lets a size-1 dim carry any stride; nothing may be read through
 * it and it must not disturb the rest of the layout. */
Test(strided, size_one_dims_with_garbage_strides) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  for (size_t si = 0; si < 5; si++) {
    size_t es = sizes[si];
    int64_t shape[4] = {1, 5, 1, 3};
    size_t n = 15 * es;
    void *buf = pattern_buf(n, 700 + (uint32_t)si);
    char what[64];
    /* compact apart from the size-1 dims */
    int64_t st1[4] = {INT64_MAX, 3, INT64_MIN, 1};
    DLTensor t1 = {buf, CPU0, 4, dtype_of_size(es), shape, st1, 0};
    snprintf(what, sizeof what, "compact with extreme size-1 strides es=%zu", es);
    check_copy(&t1, buf, n, what);
    if (es <= 8) { /* and through a cast, whose arguments must drop those strides too (times es, they overflow) */
      DLTensor compact = t1;
      compact.strides = NULL;
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = dt(kDLFloat, 64, 1);
      DLManagedTensorVersioned *want = convert_ok_with(&compact, CPU0, &o), *got = convert_ok_with(&t1, CPU0, &o);
      cr_assert(memcmp(got->dl_tensor.data, want->dl_tensor.data, 15 * 8) == 0, "%s, cast to float64", what);
      got->deleter(got);
      want->deleter(want);
    }
    int64_t st2[4] = {-123456789, 3, 987654321987, 1};
    DLTensor t2 = {buf, CPU0, 4, dtype_of_size(es), shape, st2, 0};
    snprintf(what, sizeof what, "compact with odd size-1 strides es=%zu", es);
    check_copy(&t2, buf, n, what);
    /* transposed apart from the size-1 dims */
    int64_t shape3[4] = {1, 3, 1, 5}, st3[4] = {INT64_MIN, 1, INT64_MAX, 3};
    DLTensor t3 = {buf, CPU0, 4, dtype_of_size(es), shape3, st3, 0};
    snprintf(what, sizeof what, "transposed with extreme size-1 strides es=%zu", es);
    check_copy(&t3, buf, n, what);
    /* all dims size 1: one element */
    int64_t shape4[3] = {1, 1, 1}, st4[3] = {INT64_MAX, INT64_MIN, -1};
    DLTensor t4 = {buf, CPU0, 3, dtype_of_size(es), shape4, st4, 0};
    snprintf(what, sizeof what, "all size-1 dims es=%zu", es);
    check_copy(&t4, buf, n, what);
    free(buf);
  }
}

Test(strided, byte_offset_moves_the_start) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  for (size_t si = 0; si < 5; si++) {
    size_t es = sizes[si], n = 64 * es;
    char *buf = pattern_buf(n, 800 + (uint32_t)si);
    char what[64];
    for (int64_t k = 0; k < 8; k++) {
      int64_t shape[2] = {4, 6};
      DLTensor t = {buf, CPU0, 2, dtype_of_size(es), shape, NULL, (uint64_t)k * es};
      snprintf(what, sizeof what, "compact, byte_offset %lld elements, es=%zu", (long long)k, es);
      check_copy(&t, buf, n, what);
      ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
      DLManagedTensorVersioned *r = NULL;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      cr_assert(memcmp(r->dl_tensor.data, buf + k * (int64_t)es, 24 * es) == 0, "%s", what);
      r->deleter(r);
      int64_t tshape[2] = {6, 4}, tst[2] = {1, 6};
      DLTensor tt = {buf, CPU0, 2, dtype_of_size(es), tshape, tst, (uint64_t)k * es};
      snprintf(what, sizeof what, "transposed, byte_offset %lld elements, es=%zu", (long long)k, es);
      check_copy(&tt, buf, n, what);
    }
    free(buf);
  }
}

Test(strided, scalar_copies_one_element) {
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3};
  for (size_t si = 0; si < 6; si++) {
    unsigned char v[16];
    fill_pattern(v, sizeof v, 900 + (uint32_t)si);
    size_t es = sizes[si];
    DLTensor t = {v, CPU0, 0, dtype_of_size(es), NULL, NULL, 0};
    char what[32];
    snprintf(what, sizeof what, "scalar es=%zu", es);
    check_copy(&t, v, sizeof v, what);
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert_eq(r->dl_tensor.ndim, 0);
    cr_assert_not_null(r->dl_tensor.data, "%s: scalar copy has no data", what);
    cr_assert(memcmp(r->dl_tensor.data, v, es) == 0, "%s", what);
    r->deleter(r);
  }
}

Test(strided, zero_size_tensors_copy_to_null_data) {
  struct {
    int32_t ndim;
    int64_t shape[3];
    int64_t strides[3];
    int null_strides;
  } cases[] = {
    {1, {0}, {1}, 1},
    {2, {0, 5}, {5, 1}, 1},
    {3, {5, 0, 3}, {3, 3, 1}, 1},
    {2, {4, 0}, {-7, 99}, 0},          /* strides of an empty tensor are never used */
    {3, {0, 2, 2}, {INT64_MAX, 1, 0}, 0},
    /* the other dims of an empty tensor may be huge: their product is never
     * taken, and must not overflow anywhere */
    {3, {0, (int64_t)1 << 40, (int64_t)1 << 40}, {0}, 1},
    {3, {(int64_t)1 << 40, (int64_t)1 << 40, 0}, {0}, 1},
    {3, {INT64_MAX, 0, INT64_MAX}, {1, 1, 1}, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    for (int with_data = 0; with_data < 2; with_data++) {
      float dummy[4] = {1, 2, 3, 4};
      DLTensor t = {with_data ? dummy : NULL, CPU0, cases[k].ndim, dt(kDLFloat, 32, 1), cases[k].shape,
                    cases[k].null_strides ? NULL : cases[k].strides, 0};
      char what[48];
      snprintf(what, sizeof what, "empty case %zu, data %s", k, with_data ? "set" : "NULL");
      check_copy(&t, dummy, sizeof dummy, what);
      /* a default conversion (a view of a compact one) works too */
      DLManagedTensorVersioned *v = NULL;
      cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &v), AB_OK, "%s: %s", what, ab_last_error());
      cr_assert_eq(numel_of(v->dl_tensor.ndim, v->dl_tensor.shape), 0, "%s", what);
      v->deleter(v);
      ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
      DLManagedTensorVersioned *r = NULL;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      cr_assert_null(r->dl_tensor.data, "%s", what);
      cr_assert_eq(numel_of(r->dl_tensor.ndim, r->dl_tensor.shape), 0, "%s", what);
      cr_assert_eq(r->dl_tensor.ndim, cases[k].ndim, "%s", what);
      for (int32_t i = 0; i < cases[k].ndim; i++)
        cr_assert_eq(r->dl_tensor.shape[i], cases[k].shape[i], "%s: shape[%d]", what, i);
      r->deleter(r);
    }
  }
}

/* DLPack asks for aligned data but producers do not always give it; the
 * vector kernels must cope with any start address. */
Test(strided, unaligned_sources_copy_correctly) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  for (size_t si = 0; si < 5; si++) {
    size_t es = sizes[si];
    for (size_t mis = 1; mis < 4; mis += 2) {
      const int64_t R = 70, C = 67;
      size_t n = (size_t)(R * C) * es + mis;
      char *buf = pattern_buf(n, 1500 + (uint32_t)(si * 8 + mis));
      char what[64];
      int64_t tshape[2] = {C, R}, tst[2] = {1, C};
      DLTensor t = {buf + mis, CPU0, 2, dtype_of_size(es), tshape, tst, 0};
      snprintf(what, sizeof what, "transpose at +%zu, es=%zu", mis, es);
      check_copy(&t, buf, n, what);
      t.data = buf;
      t.byte_offset = mis;
      snprintf(what, sizeof what, "transpose at byte_offset %zu, es=%zu", mis, es);
      check_copy(&t, buf, n, what);
      /* HWC -> CHW with 3 and 4 channels */
      for (int64_t ch = 3; ch <= 4; ch++) {
        int64_t W = R * C / ch / 2;
        int64_t hshape[3] = {ch, 2, W}, hst[3] = {1, W * ch, ch};
        DLTensor h = {buf + mis, CPU0, 3, dtype_of_size(es), hshape, hst, 0};
        snprintf(what, sizeof what, "HWC->CHW C=%lld at +%zu, es=%zu", (long long)ch, mis, es);
        check_copy(&h, buf, n, what);
      }
      free(buf);
    }
  }
}

/* A fixed 5-d permutation with reversed and gapped dims. */
Test(strided, five_d_permuted_reversed_gapped) {
  /* buffer dims (memory order) b0..b4 with sizes 2,3,4,5,6 and a gap of 2
   * on the innermost; the tensor visits them as (b3, b0, b4, b2, b1) with
   * b2 reversed */
  const int64_t bs[5] = {2, 3, 4, 5, 6};
  int64_t bst[5];
  int64_t acc = 2;
  for (int i = 4; i >= 0; i--) {
    bst[i] = acc;
    acc *= bs[i];
  }
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  for (size_t si = 0; si < 5; si++) {
    size_t es = sizes[si], n = (size_t)acc * es;
    char *buf = pattern_buf(n, 1000 + (uint32_t)si);
    static const int perm[5] = {3, 0, 4, 2, 1};
    int64_t shape[5], st[5];
    for (int i = 0; i < 5; i++) {
      shape[i] = bs[perm[i]];
      st[i] = bst[perm[i]];
    }
    st[3] = -st[3];
    DLTensor t = {buf + (size_t)((bs[2] - 1) * bst[2]) * es, CPU0, 5, dtype_of_size(es), shape, st, 0};
    char what[48];
    snprintf(what, sizeof what, "5-d permuted es=%zu", es);
    check_copy(&t, buf, n, what);
    free(buf);
  }
}

/* Random layouts: for each case a random rank (0..6), shape, element size,
 * dim order in memory, gaps between dims, reversed dims, broadcast dims and
 * garbage strides on size-1 dims, placed inside a larger buffer through
 * data and byte_offset. Seeded, so a failure names a case that replays. */
static void random_case(test_rng *g, int case_no) {
  static const size_t sizes[] = {1, 2, 3, 4, 8, 12, 16};
  int32_t ndim = (int32_t)rng_between(g, 0, 6);
  size_t es = sizes[rng_between(g, 0, 6)];
  int64_t shape[6], st[6];
  int perm[6];
  for (int i = 0; i < ndim; i++) {
    shape[i] = rng_between(g, 1, ndim >= 5 ? 5 : 9);
    if (rng_between(g, 0, 60) == 0) shape[i] = 0;
    perm[i] = i;
  }
  for (int i = ndim - 1; i > 0; i--) { /* Fisher-Yates */
    int j = (int)rng_between(g, 0, i);
    int tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  int use_gaps = rng_between(g, 0, 2) != 0;
  int64_t acc = use_gaps ? rng_between(g, 1, 3) : 1;
  for (int k = ndim - 1; k >= 0; k--) { /* perm[ndim-1] is innermost */
    int d = perm[k];
    st[d] = acc;
    acc *= shape[d] > 0 ? shape[d] : 1;
    if (use_gaps && rng_between(g, 0, 3) == 0) acc = acc * 2 + rng_between(g, 0, 2);
  }
  for (int i = 0; i < ndim; i++) {
    int64_t roll = rng_between(g, 0, 9);
    if (roll < 3) st[i] = -st[i];
    else if (roll == 3) st[i] = 0;
    if (shape[i] == 1 && rng_between(g, 0, 1)) st[i] = (int64_t)rng_next(g);
  }
  int null_strides = rng_between(g, 0, 9) == 0;
  if (null_strides) {
    int64_t a = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      st[i] = a;
      a *= shape[i];
    }
  }
  int64_t numel = numel_of(ndim, shape), lo = 0, hi = 0;
  for (int i = 0; i < ndim && numel > 0; i++) {
    if (shape[i] <= 1) continue;
    int64_t span = (shape[i] - 1) * st[i];
    if (span < 0) lo += span;
    else hi += span;
  }
  int64_t pad_lo = rng_between(g, 0, 3), pad_hi = rng_between(g, 0, 3);
  size_t nelem = (size_t)(hi - lo + 1 + pad_lo + pad_hi);
  size_t n = nelem * es;
  char *buf = pattern_buf(n, 5000u + (uint32_t)case_no);
  size_t start = (size_t)(pad_lo - lo) * es; /* byte position of element 0 */
  size_t in_ptr = (size_t)rng_between(g, 0, (int64_t)start);
  DLTensor t = {buf + in_ptr, CPU0, ndim, dtype_of_size(es), ndim ? shape : NULL,
                null_strides ? NULL : st, start - in_ptr};
  if (numel == 0 && rng_between(g, 0, 1)) {
    t.data = NULL;
    t.byte_offset = 0;
  }
  char what[160];
  int m = snprintf(what, sizeof what, "random case %d: es=%zu shape(", case_no, es);
  for (int i = 0; i < ndim && m < (int)sizeof what; i++)
    m += snprintf(what + m, sizeof what - (size_t)m, "%lld:%lld ", (long long)shape[i],
                  null_strides ? 0LL : (long long)st[i]);
  if (m < (int)sizeof what) snprintf(what + m, sizeof what - (size_t)m, ")");
  check_copy(&t, buf, n, what);
  /* A default conversion gives the same bytes whether it views or copies. */
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &r), AB_OK, "%s: %s", what, ab_last_error());
  if (r->flags & DLPACK_FLAG_BITMASK_IS_COPIED) {
    int64_t diff = first_diff_vs_reference(&t, r);
    cr_assert_eq(diff, -1, "%s (default opts): byte %lld differs", what, (long long)diff);
  } else {
    cr_assert_eq(r->dl_tensor.data, t.data, "%s: view moved data", what);
    cr_assert_eq(r->dl_tensor.byte_offset, t.byte_offset, "%s: view moved byte_offset", what);
  }
  r->deleter(r);
  free(buf);
}

Test(strided, random_layouts_up_to_rank_6_match_reference) {
  test_rng g = {0x5eed0001u};
  for (int k = 0; k < 400; k++) random_case(&g, k);
}

/* The largest rank DLPack producers may send here: 64 dims, ten of them
 * of size 2 at random positions and in random memory order. */
Test(strided, rank_64_random_layouts_match_reference) {
  test_rng g = {0x5eed0064u};
  for (int rep = 0; rep < 20; rep++) {
    int64_t shape[AB_MAX_NDIM], st[AB_MAX_NDIM];
    int big[AB_MAX_NDIM] = {0};
    for (int i = 0; i < AB_MAX_NDIM; i++) {
      shape[i] = 1;
      st[i] = (int64_t)rng_next(&g); /* garbage, never used */
    }
    int placed = 0;
    while (placed < 10) {
      int i = (int)rng_between(&g, 0, AB_MAX_NDIM - 1);
      if (!big[i]) big[i] = 1, shape[i] = 2, placed++;
    }
    /* memory order: a random permutation of the ten big dims */
    int order[10], m = 0;
    for (int i = 0; i < AB_MAX_NDIM; i++)
      if (big[i]) order[m++] = i;
    for (int i = 9; i > 0; i--) {
      int j = (int)rng_between(&g, 0, i);
      int tmp = order[i];
      order[i] = order[j];
      order[j] = tmp;
    }
    int64_t acc = 1, lo = 0;
    for (int k = 9; k >= 0; k--) {
      st[order[k]] = rng_between(&g, 0, 1) ? acc : -acc;
      if (st[order[k]] < 0) lo -= acc;
      acc *= 2;
    }
    size_t es = (size_t)1 << rng_between(&g, 0, 4), n = (size_t)acc * es;
    char *buf = pattern_buf(n, 6000u + (uint32_t)rep);
    DLTensor t = {buf + (size_t)(-lo) * es, CPU0, AB_MAX_NDIM, dtype_of_size(es), shape, st, 0};
    char what[48];
    snprintf(what, sizeof what, "rank-64 case %d es=%zu", rep, es);
    check_copy(&t, buf, n, what);
    free(buf);
  }
}
