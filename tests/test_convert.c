/* ab_convert_memory's contract on the host: when it views and when it
 * copies, what a view and a copy look like, the options struct and its
 * growth rule, tensor allocation, device queries, status strings and the
 * version. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "core.h"
#include "plan.h"
#include "support.h"

static int dtype_eq(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* A 4 x 6 float32 tensor inside a larger buffer, at byte_offset 8. */
struct fixture {
  float buf[2 + 24];
  int64_t shape[2];
  DLTensor t;
};

static void fixture_init(struct fixture *f) {
  for (int i = 0; i < 26; i++) f->buf[i] = (float)i * 1.5f - 7.0f;
  f->shape[0] = 4;
  f->shape[1] = 6;
  f->t = (DLTensor){f->buf, CPU0, 2, dt(kDLFloat, 32, 1), f->shape, NULL, 2 * sizeof(float)};
}

/* Checks that r is a view of src: same bytes, its own metadata. */
static void assert_view_of(const DLManagedTensorVersioned *r, const DLTensor *src, const char *what) {
  const DLTensor *v = &r->dl_tensor;
  cr_assert_eq(r->version.major, 1, "%s: version.major %u", what, r->version.major);
  cr_assert_eq(v->data, src->data, "%s: view data %p != src data %p", what, v->data, src->data);
  cr_assert_eq(v->byte_offset, src->byte_offset, "%s: byte_offset", what);
  cr_assert_eq(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0, "%s: a view is marked IS_COPIED", what);
  cr_assert_eq(v->ndim, src->ndim, "%s", what);
  cr_assert(dtype_eq(v->dtype, src->dtype), "%s: dtype", what);
  cr_assert_eq(v->device.device_type, src->device.device_type, "%s", what);
  cr_assert_eq(v->device.device_id, src->device.device_id, "%s", what);
  if (src->ndim > 0) {
    cr_assert_not_null(v->shape, "%s", what);
    cr_assert_not_null(v->strides, "%s: a view must carry strides", what);
    cr_assert_neq(v->shape, src->shape, "%s: view shares the source's shape array", what);
    cr_assert_neq((void *)v->strides, (void *)src->strides, "%s: view shares the source's strides", what);
    cr_assert_neq((void *)v->strides, (void *)v->shape, "%s", what);
    for (int32_t i = 0; i < src->ndim; i++) cr_assert_eq(v->shape[i], src->shape[i], "%s: shape[%d]", what, i);
  }
  cr_assert_not_null(r->deleter, "%s", what);
}

static void assert_compact_strides(const DLTensor *v, const char *what) {
  int64_t acc = 1;
  for (int32_t i = v->ndim - 1; i >= 0; i--) {
    if (v->shape[i] != 1) cr_assert_eq(v->strides[i], acc, "%s: strides[%d] = %lld, want %lld", what, i,
                                       (long long)v->strides[i], (long long)acc);
    acc *= v->shape[i];
  }
}

/* ---- view or copy ------------------------------------------------------ */

Test(convert, if_needed_on_compact_cpu_tensor_returns_a_view) {
  struct fixture f;
  fixture_init(&f);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *r = NULL;
  ab_convert_opts o = {.copy = AB_COPY_IF_NEEDED};
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  assert_view_of(r, &f.t, "compact, NULL strides");
  assert_compact_strides(&r->dl_tensor, "compact, NULL strides");
  cr_assert_eq(r->flags, 0, "flags 0x%llx", (unsigned long long)r->flags);
  /* the view reads the source's bytes */
  cr_assert_eq(((float *)r->dl_tensor.data)[2 + 5], f.buf[7]);
  /* the view's metadata belongs to the view: changing src's shape later
   * does not change it */
  f.shape[0] = 99;
  cr_assert_eq(r->dl_tensor.shape[0], 4);
  f.shape[0] = 4;
  r->deleter(r);
  /* deleting the view freed the view and nothing of the source */
  cr_assert_eq(ab__alloc_live_settled(), live);
  float *heap = malloc(24 * sizeof(float));
  cr_assert_not_null(heap);
  for (int i = 0; i < 24; i++) heap[i] = (float)i;
  DLTensor h = {heap, CPU0, 2, dt(kDLFloat, 32, 1), f.shape, NULL, 0};
  cr_assert_eq(ab_convert_memory(&h, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  /* still ours: writable and intact (ASan reports a use after free here if
   * the view's deleter freed it) */
  for (int i = 0; i < 24; i++) cr_assert_eq(heap[i], (float)i);
  heap[0] = 1.0f;
  free(heap);
}

Test(convert, compact_explicit_strides_also_give_a_view_with_own_strides) {
  struct fixture f;
  fixture_init(&f);
  int64_t strides[2] = {6, 1};
  f.t.strides = strides;
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  assert_view_of(r, &f.t, "compact, explicit strides");
  assert_compact_strides(&r->dl_tensor, "compact, explicit strides");
  r->deleter(r);
  /* a size-1 dim with an odd stride is still compact */
  int64_t shape1[3] = {4, 1, 6}, strides1[3] = {6, -777, 1};
  DLTensor t1 = {f.buf, CPU0, 3, dt(kDLFloat, 32, 1), shape1, strides1, 0};
  cr_assert_eq(ab_convert_memory(&t1, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  assert_view_of(r, &t1, "compact with a size-1 dim");
  r->deleter(r);
}

Test(convert, copy_always_returns_an_owned_aligned_compact_copy) {
  struct fixture f;
  fixture_init(&f);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *r = NULL;
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(is_compact_copy_of(r, &f.t));
  cr_assert_eq(r->flags, DLPACK_FLAG_BITMASK_IS_COPIED, "flags 0x%llx", (unsigned long long)r->flags);
  cr_assert_eq((uintptr_t)r->dl_tensor.data % 256, 0, "data %p is not 256-byte aligned", r->dl_tensor.data);
  cr_assert_eq(r->dl_tensor.byte_offset, 0);
  cr_assert_neq(r->dl_tensor.data, (void *)f.buf);
  cr_assert(memcmp(r->dl_tensor.data, f.buf + 2, 24 * sizeof(float)) == 0);
  cr_assert_eq(r->dl_tensor.device.device_type, kDLCPU);
  cr_assert_eq(r->dl_tensor.device.device_id, 0);
  cr_assert(dtype_eq(r->dl_tensor.dtype, f.t.dtype));
  /* independent of the source in both directions */
  f.buf[2] = 12345.0f;
  cr_assert_neq(((float *)r->dl_tensor.data)[0], 12345.0f);
  memset(r->dl_tensor.data, 0, 24 * sizeof(float));
  cr_assert_eq(f.buf[3], 1.5f * 3 - 7.0f);
  r->deleter(r);
  cr_assert_eq(ab__alloc_live_settled(), live, "the copy's deleter leaked");
}

/* A copy's header lives in its pooled block's descriptor up to 4 dims and
 * is allocated on its own beyond (and for empty tensors): each way the
 * result carries its own shape and canonical strides, two live copies
 * share nothing, a header reused with its block is rewritten, and the
 * deleters leave nothing behind. */
Test(convert, copies_of_any_rank_own_their_headers) {
  float v[8 + 128]; /* b's 2^7 elements start at v + 8 */
  for (int i = 0; i < 8 + 128; i++) v[i] = (float)i;
  long live = ab__alloc_live_settled();
  for (int32_t nd = 0; nd <= 8; nd++) {
    int64_t shape[8], shape2[8];
    for (int32_t i = 0; i < nd; i++) {
      shape[i] = i < 3 ? 2 : 1;        /* 8 elements at most */
      shape2[i] = i == nd - 1 ? 1 : 2; /* another shape, as many dims */
    }
    DLTensor a = {v, CPU0, nd, dt(kDLFloat, 32, 1), shape, NULL, 0};
    DLTensor b = {v + 8, CPU0, nd, dt(kDLFloat, 32, 1), shape2, NULL, 0};
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *ra, *rb;
    cr_assert_eq(ab_convert_memory(&a, CPU0, &o, &ra), AB_OK, "%d dims: %s", nd, ab_last_error());
    cr_assert_eq(ab_convert_memory(&b, CPU0, &o, &rb), AB_OK, "%d dims: %s", nd, ab_last_error());
    cr_assert(is_compact_copy_of(ra, &a), "%d dims", nd);
    cr_assert(is_compact_copy_of(rb, &b), "%d dims", nd);
    cr_assert_neq((void *)ra, (void *)rb);
    cr_assert_neq(ra->dl_tensor.data, rb->dl_tensor.data);
    cr_assert_eq(ra->manager_ctx != NULL, true);
    if (nd > 0) cr_assert_neq(ra->dl_tensor.shape, rb->dl_tensor.shape);
    assert_compact_strides(&ra->dl_tensor, "ra");
    assert_compact_strides(&rb->dl_tensor, "rb");
    /* a's block (and, up to 4 dims, its header) goes back and serves the
     * next copy of the same size: the header must be b's shape now */
    ra->deleter(ra);
    DLManagedTensorVersioned *rc;
    cr_assert_eq(ab_convert_memory(&b, CPU0, &o, &rc), AB_OK, "%d dims: %s", nd, ab_last_error());
    cr_assert(is_compact_copy_of(rc, &b), "%d dims: a reused header kept the old shape", nd);
    cr_assert_eq(rc->flags, DLPACK_FLAG_BITMASK_IS_COPIED);
    for (int32_t i = 0; i < nd; i++) cr_assert_eq(rc->dl_tensor.shape[i], shape2[i], "%d dims: shape[%d]", nd, i);
    rb->deleter(rb);
    rc->deleter(rc);
  }
  /* an empty copy has no block: its header is its own */
  int64_t empty_shape[2] = {3, 0};
  DLTensor e = {v, CPU0, 2, dt(kDLFloat, 32, 1), empty_shape, NULL, 0};
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *re;
  cr_assert_eq(ab_convert_memory(&e, CPU0, &o, &re), AB_OK, "%s", ab_last_error());
  cr_assert_eq(re->dl_tensor.shape[0], 3);
  cr_assert_eq(re->dl_tensor.shape[1], 0);
  re->deleter(re);
  cr_assert_eq(ab__alloc_live_settled(), live, "the copies' deleters leaked");
}

Test(convert, non_compact_source_with_if_needed_is_copied) {
  struct fixture f;
  fixture_init(&f);
  int64_t shape[2] = {6, 4}, strides[2] = {1, 6}; /* the transpose */
  DLTensor t = {f.buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 0};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  cr_assert(is_compact_copy_of(r, &t));
  cr_assert_neq(r->dl_tensor.data, (void *)f.buf);
  cr_assert_eq(first_diff_vs_reference(&t, r), -1);
  r->deleter(r);
}

Test(convert, allow_strided_view_keeps_the_source_strides) {
  struct fixture f;
  fixture_init(&f);
  int64_t shape[2] = {6, 4}, strides[2] = {1, 6};
  DLTensor t = {f.buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 4};
  for (int mode = 0; mode < 2; mode++) {
    ab_convert_opts o = {.copy = mode ? AB_COPY_NEVER : AB_COPY_IF_NEEDED, .flags = AB_CONVERT_ALLOW_STRIDED_VIEW};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    assert_view_of(r, &t, mode ? "strided view, COPY_NEVER" : "strided view, COPY_IF_NEEDED");
    cr_assert_eq(r->dl_tensor.strides[0], 1);
    cr_assert_eq(r->dl_tensor.strides[1], 6);
    r->deleter(r);
  }
  /* ALWAYS still copies */
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS, .flags = AB_CONVERT_ALLOW_STRIDED_VIEW};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(is_compact_copy_of(r, &t));
  cr_assert_eq(first_diff_vs_reference(&t, r), -1);
  r->deleter(r);
}

Test(convert, copy_never_on_non_compact_fails_with_copy_required_and_leaves_out) {
  struct fixture f;
  fixture_init(&f);
  int64_t shape[2] = {6, 4}, strides[2] = {1, 6};
  DLTensor t = {f.buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 0};
  long live = ab__alloc_live_settled();
  ab_convert_opts o = {.copy = AB_COPY_NEVER};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_ERR_COPY_REQUIRED);
  cr_assert_eq(r, SENTINEL_OUT, "*out was written on failure");
  cr_assert_not_null(strstr(ab_last_error(), "compact"), "message: %s", ab_last_error());
  cr_assert_eq(ab__alloc_live_settled(), live);
  /* on a compact source COPY_NEVER is a view */
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  assert_view_of(r, &f.t, "COPY_NEVER on compact");
  r->deleter(r);
}

Test(convert, read_only_flag_marks_views_and_copies) {
  struct fixture f;
  fixture_init(&f);
  for (int copy = 0; copy < 2; copy++) {
    ab_convert_opts o = {.copy = copy ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED, .flags = AB_CONVERT_READ_ONLY};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert(r->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "READ_ONLY missing (copy=%d)", copy);
    cr_assert_eq(!!(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED), copy, "IS_COPIED wrong (copy=%d)", copy);
    r->deleter(r);
  }
  /* without the flag, neither is read-only */
  for (int copy = 0; copy < 2; copy++) {
    ab_convert_opts o = {.copy = copy ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert_eq(r->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
    r->deleter(r);
  }
}

/* ---- options ----------------------------------------------------------- */

Test(convert, null_opts_mean_the_same_as_zeroed_opts) {
  struct fixture f;
  fixture_init(&f);
  int64_t shape[2] = {6, 4}, strides[2] = {1, 6};
  DLTensor strided = {f.buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 0};
  const DLTensor *srcs[2] = {&f.t, &strided};
  for (int k = 0; k < 2; k++) {
    ab_convert_opts zero;
    memset(&zero, 0, sizeof zero);
    DLManagedTensorVersioned *a = NULL, *b = NULL;
    cr_assert_eq(ab_convert_memory(srcs[k], CPU0, NULL, &a), AB_OK, "%s", ab_last_error());
    cr_assert_eq(ab_convert_memory(srcs[k], CPU0, &zero, &b), AB_OK, "%s", ab_last_error());
    cr_assert_eq(a->flags, b->flags, "case %d: flags differ", k);
    cr_assert_eq(a->dl_tensor.data == srcs[k]->data, b->dl_tensor.data == srcs[k]->data,
                 "case %d: one is a view, the other a copy", k);
    cr_assert_eq(a->dl_tensor.byte_offset, b->dl_tensor.byte_offset);
    for (int i = 0; i < 2; i++) cr_assert_eq(a->dl_tensor.strides[i], b->dl_tensor.strides[i]);
    cr_assert(memcmp((char *)a->dl_tensor.data + a->dl_tensor.byte_offset,
                     (char *)b->dl_tensor.data + b->dl_tensor.byte_offset, 24 * sizeof(float)) == 0);
    a->deleter(a);
    b->deleter(b);
  }
}

Test(convert, opts_size_zero_or_sizeof_is_accepted_and_too_small_is_invalid) {
  struct fixture f;
  fixture_init(&f);
  ab_convert_opts init = AB_CONVERT_OPTS_INIT;
  cr_assert_eq(init.size, sizeof(ab_convert_opts));
  /* 0, the layout before `threads`, and the whole struct */
  const uint32_t ok_sizes[] = {0, offsetof(ab_convert_opts, threads), sizeof(ab_convert_opts)};
  for (int k = 0; k < 3; k++) {
    ab_convert_opts o = {.size = ok_sizes[k], .copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "size %u: %s", ok_sizes[k], ab_last_error());
    /* the fields were read: ALWAYS made a copy */
    cr_assert(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, "size %u: copy mode ignored", ok_sizes[k]);
    r->deleter(r);
  }
  const uint32_t bad_sizes[] = {1, 4, offsetof(ab_convert_opts, threads) + 2, sizeof(ab_convert_opts) - 1};
  for (int k = 0; k < 4; k++) {
    ab_convert_opts o = {.size = bad_sizes[k]};
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_ERR_INVALID_ARGUMENT, "size %u accepted", bad_sizes[k]);
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "size"), "message: %s", ab_last_error());
  }
  /* the version 0.1 layout has no scale or channel fields: a map asked for
   * there is refused, not applied with zeros */
  const uint32_t maps[] = {AB_CONVERT_AFFINE, AB_CONVERT_PER_CHANNEL};
  for (int k = 0; k < 2; k++) {
    ab_convert_opts o = {.size = 0, .flags = maps[k]};
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_ERR_INVALID_ARGUMENT, "flags %u with size 0 accepted",
                 maps[k]);
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "AB_CONVERT_OPTS_INIT"), "message: %s", ab_last_error());
  }
}

/* A caller compiled against a newer header passes a bigger struct: fine
 * while the fields this version does not know are zero, refused otherwise. */
Test(convert, opts_from_a_newer_header_need_a_zero_tail) {
  struct fixture f;
  fixture_init(&f);
  enum { EXTRA = 24 };
  union {
    ab_convert_opts o;
    unsigned char bytes[sizeof(ab_convert_opts) + EXTRA];
  } big;
  memset(&big, 0, sizeof big);
  big.o.size = sizeof big.bytes;
  big.o.copy = AB_COPY_ALWAYS;
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, &big.o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, "known fields of a bigger struct were not read");
  r->deleter(r);
  for (size_t k = 0; k < EXTRA; k += 7) {
    big.bytes[sizeof(ab_convert_opts) + k] = 1;
    r = SENTINEL_OUT;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &big.o, &r), AB_ERR_UNSUPPORTED,
                 "non-zero unknown byte %zu accepted", k);
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "byte"), "message: %s", ab_last_error());
    big.bytes[sizeof(ab_convert_opts) + k] = 0;
  }
  /* a size no struct will ever have is garbage, refused before anything
   * past the struct is read (here: nothing readable is there to read) */
  const uint32_t garbage[] = {4097, 0x10000, 0xdeadbeef, 0xffffffff};
  for (size_t k = 0; k < sizeof garbage / sizeof garbage[0]; k++) {
    big.o.size = garbage[k];
    r = SENTINEL_OUT;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &big.o, &r), AB_ERR_INVALID_ARGUMENT, "size %#x: %s", garbage[k],
                 ab_last_error());
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "AB_CONVERT_OPTS_INIT"), "message: %s", ab_last_error());
  }
  /* bytes beyond `size` are never read, whatever they hold */
  big.o.size = sizeof(ab_convert_opts) + 8;
  big.bytes[sizeof(ab_convert_opts) + 8] = 0xff;
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, &big.o, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
}

Test(convert, target_auto_on_cpu_resolves_to_cpu_0) {
  struct fixture f;
  fixture_init(&f);
  DLDevice autodev = {kDLCPU, AB_DEVICE_AUTO};
  for (int copy = 0; copy < 2; copy++) {
    ab_convert_opts o = {.copy = copy ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&f.t, autodev, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert_eq(r->dl_tensor.device.device_type, kDLCPU);
    cr_assert_eq(r->dl_tensor.device.device_id, 0, "AUTO left device_id %d", r->dl_tensor.device.device_id);
    cr_assert_eq(r->dl_tensor.data == (void *)f.buf, !copy, "copy=%d", copy);
    r->deleter(r);
  }
}

/* DLPack says a CPU tensor's device_id is 0; JAX's CPU client with several
 * devices exports its device's index there. Such memory is host memory: a
 * view (on cpu:0), a copy with a cast, a strided gather, a destination of
 * ab_convert_into and ab_tensor_validate all take it, and nothing leaks. */
Test(convert, a_cpu_tensor_with_another_device_id_is_host_memory) {
  long live = ab__alloc_live_settled();
  for (int32_t id = 1; id <= 3; id += 2) {
    struct fixture f;
    fixture_init(&f);
    f.t.device = (DLDevice){kDLCPU, id};
    cr_assert_eq(ab_tensor_validate(&f.t), AB_OK, "cpu:%d: %s", id, ab_last_error());
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, NULL, &r), AB_OK, "cpu:%d: %s", id, ab_last_error());
    cr_assert_eq(r->dl_tensor.data, (void *)f.buf, "cpu:%d: not a view", id);
    cr_assert(r->dl_tensor.device.device_type == kDLCPU && r->dl_tensor.device.device_id == 0,
              "cpu:%d: the view is on %d:%d", id, r->dl_tensor.device.device_type, r->dl_tensor.device.device_id);
    r->deleter(r);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = dt(kDLFloat, 64, 1);
    o.permute = (const int32_t[]){1, 0};
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "cpu:%d: %s", id, ab_last_error());
    cr_assert(r->dl_tensor.device.device_type == kDLCPU && r->dl_tensor.device.device_id == 0);
    const double *d = r->dl_tensor.data;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 6; j++)
        cr_assert_eq(d[j * 4 + i], (double)f.buf[2 + i * 6 + j], "cpu:%d: [%d][%d]", id, j, i);
    r->deleter(r);
    float into[24] = {0};
    DLTensor dst = {into, {kDLCPU, id + 1}, 2, dt(kDLFloat, 32, 1), f.shape, NULL, 0};
    f.t.device = CPU0;
    cr_assert_eq(ab_convert_into(&f.t, &dst, NULL), AB_OK, "into cpu:%d: %s", id + 1, ab_last_error());
    cr_assert_eq(memcmp(into, f.buf + 2, sizeof into), 0, "into cpu:%d", id + 1);
    /* a target is a device the library makes memory on: cpu:0 alone */
    cr_assert_eq(ab_convert_memory(&f.t, (DLDevice){kDLCPU, id}, NULL, &r), AB_ERR_NO_DEVICE);
  }
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* ---- ab_tensor_alloc ----------------------------------------------------- */

Test(convert, tensor_alloc_gives_a_writable_compact_aligned_tensor) {
  long live = ab__alloc_live_settled();
  int64_t shape[3] = {3, 4, 5};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(CPU0, 3, shape, dt(kDLFloat, 32, 1), &r), AB_OK, "%s", ab_last_error());
  const DLTensor *t = &r->dl_tensor;
  cr_assert_eq(r->version.major, 1);
  cr_assert_eq(r->flags, 0);
  cr_assert_eq(t->ndim, 3);
  cr_assert_neq(t->shape, shape, "shares the caller's shape array");
  for (int i = 0; i < 3; i++) cr_assert_eq(t->shape[i], shape[i]);
  cr_assert_not_null(t->strides);
  assert_compact_strides(t, "ab_tensor_alloc");
  cr_assert_not_null(t->data);
  cr_assert_eq((uintptr_t)t->data % 256, 0, "data %p not 256-byte aligned", t->data);
  cr_assert_eq(t->byte_offset, 0);
  cr_assert(dtype_eq(t->dtype, dt(kDLFloat, 32, 1)));
  cr_assert_eq(t->device.device_type, kDLCPU);
  cr_assert_eq(t->device.device_id, 0);
  /* all 60 elements writable (ASan checks the bounds) */
  float *p = t->data;
  for (int i = 0; i < 60; i++) p[i] = (float)i;
  for (int i = 0; i < 60; i++) cr_assert_eq(p[i], (float)i);
  shape[0] = 7; /* the tensor keeps its own copy */
  cr_assert_eq(t->shape[0], 3);
  r->deleter(r);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

Test(convert, tensor_alloc_handles_empty_scalar_and_auto_device) {
  long live = ab__alloc_live_settled();
  int64_t shape[2] = {4, 0};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(CPU0, 2, shape, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
  cr_assert_null(r->dl_tensor.data, "an empty tensor got data %p", r->dl_tensor.data);
  cr_assert_eq(r->dl_tensor.shape[0], 4);
  cr_assert_eq(r->dl_tensor.shape[1], 0);
  cr_assert_not_null(r->dl_tensor.strides);
  r->deleter(r);
  /* an empty tensor whose other dims multiply past int64 */
  int64_t huge[3] = {(int64_t)1 << 40, 0, (int64_t)1 << 40};
  cr_assert_eq(ab_tensor_alloc(CPU0, 3, huge, dt(kDLFloat, 64, 1), &r), AB_OK, "%s", ab_last_error());
  cr_assert_null(r->dl_tensor.data);
  cr_assert_eq(r->dl_tensor.shape[0], huge[0]);
  cr_assert_eq(r->dl_tensor.shape[2], huge[2]);
  cr_assert_eq(r->dl_tensor.strides[2], 1);
  r->deleter(r);
  /* a scalar: ndim 0, shape may be NULL, one element */
  cr_assert_eq(ab_tensor_alloc(CPU0, 0, NULL, dt(kDLComplex, 128, 1), &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(r->dl_tensor.ndim, 0);
  cr_assert_not_null(r->dl_tensor.data);
  memset(r->dl_tensor.data, 0xa5, 16);
  r->deleter(r);
  /* AB_DEVICE_AUTO resolves */
  int64_t one[1] = {10};
  cr_assert_eq(ab_tensor_alloc((DLDevice){kDLCPU, AB_DEVICE_AUTO}, 1, one, dt(kDLInt, 64, 1), &r), AB_OK, "%s",
               ab_last_error());
  cr_assert_eq(r->dl_tensor.device.device_id, 0);
  r->deleter(r);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* ---- devices ----------------------------------------------------------- */

Test(convert, device_count_is_one_cpu_and_zero_for_types_not_built_in) {
  cr_assert_eq(ab_device_count(kDLCPU), 1);
  for (int type = 0; type <= 40; type++) {
    if (type == kDLCPU || ab__backend_for((DLDeviceType)type) != NULL) continue;
    cr_assert_eq(ab_device_count((DLDeviceType)type), 0, "type %d has devices without a backend", type);
  }
  cr_assert_eq(ab_device_count((DLDeviceType)-1), 0);
}

Test(convert, device_info_describes_the_cpu) {
  struct ab_device_info info;
  memset(&info, 0, sizeof info);
  cr_assert_eq(ab_device_info(CPU0, &info), AB_OK, "%s", ab_last_error());
  cr_assert_eq(info.device.device_type, kDLCPU);
  cr_assert_eq(info.device.device_id, 0);
  cr_assert_neq(info.name[0], '\0', "empty CPU name");
  cr_assert_neq(memchr(info.name, '\0', sizeof info.name), NULL, "name not terminated");
  cr_assert_str_eq(info.backend, "host");
  cr_assert_gt(info.total_memory, 0);
  cr_assert(info.host_accessible);
}

Test(convert, device_info_for_absent_devices_fails_and_leaves_out) {
  struct ab_device_info info, before;
  memset(&info, 0x5a, sizeof info);
  before = info;
  cr_assert_eq(ab_device_info((DLDevice){kDLCUDA, 0}, &info), AB_ERR_NO_DEVICE);
  cr_assert_not_null(strstr(ab_last_error(), "cuda"), "message: %s", ab_last_error());
  cr_assert(memcmp(&info, &before, sizeof info) == 0, "out written on failure");
  cr_assert_eq(ab_device_info((DLDevice){kDLCPU, 1}, &info), AB_ERR_NO_DEVICE);
  cr_assert_not_null(strstr(ab_last_error(), "cpu:1"), "message: %s", ab_last_error());
  cr_assert_eq(ab_device_info((DLDevice){(DLDeviceType)99, 0}, &info), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "99"), "message: %s", ab_last_error());
  cr_assert(memcmp(&info, &before, sizeof info) == 0, "out written on failure");
  cr_assert_eq(ab_device_info(CPU0, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "NULL"), "message: %s", ab_last_error());
}

Test(convert, device_type_names) {
  cr_assert_str_eq(ab_device_type_name(kDLCPU), "cpu");
  cr_assert_str_eq(ab_device_type_name(kDLCUDA), "cuda");
  cr_assert_str_eq(ab_device_type_name(kDLCUDAHost), "cuda_host");
  cr_assert_str_eq(ab_device_type_name(kDLOpenCL), "opencl");
  cr_assert_str_eq(ab_device_type_name(kDLVulkan), "vulkan");
  cr_assert_str_eq(ab_device_type_name((DLDeviceType)5), "unknown");
  cr_assert_str_eq(ab_device_type_name((DLDeviceType)99), "unknown");
}

/* ab_shutdown drops the global state; the next call starts it again. */
Test(convert, shutdown_then_reuse_reinitialises) {
  struct fixture f;
  fixture_init(&f);
  long live = ab__alloc_live_settled();
  for (int round = 0; round < 3; round++) {
    DLManagedTensorVersioned *r = NULL;
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    cr_assert_eq(ab_convert_memory(&f.t, CPU0, &o, &r), AB_OK, "round %d: %s", round, ab_last_error());
    cr_assert(memcmp(r->dl_tensor.data, f.buf + 2, 24 * sizeof(float)) == 0);
    r->deleter(r);
    ab_shutdown();
    cr_assert_eq(ab_device_count(kDLCPU), 1, "round %d: no cpu after shutdown", round);
    ab_shutdown();
  }
  ab_shutdown(); /* twice in a row is harmless */
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* ---- status strings, errors, version --------------------------------- */

Test(convert, status_str_and_name_cover_every_status) {
  struct { ab_status s; const char *name, *msg; } all[] = {
#define ROW_(name, value, msg) {AB_##name, "AB_" #name, msg},
    AB_STATUS_MAP(ROW_)
#undef ROW_
  };
  size_t n = sizeof all / sizeof all[0];
  for (size_t i = 0; i < n; i++) {
    cr_assert_str_eq(ab_status_name(all[i].s), all[i].name);
    cr_assert_str_eq(ab_status_str(all[i].s), all[i].msg);
    for (size_t j = 0; j < i; j++) {
      cr_assert_neq((int)all[i].s, (int)all[j].s, "%s and %s share a value", all[i].name, all[j].name);
      cr_assert_str_neq(ab_status_str(all[i].s), ab_status_str(all[j].s));
    }
  }
  cr_assert_str_eq(ab_status_name(AB_ERR_OUT_OF_MEMORY), "AB_ERR_OUT_OF_MEMORY");
  cr_assert_str_eq(ab_status_str(AB_OK), "success");
  cr_assert_str_eq(ab_status_str((ab_status)99), "unknown status");
  cr_assert_str_eq(ab_status_name((ab_status)99), "AB_UNKNOWN_STATUS");
  cr_assert_str_eq(ab_status_str((ab_status)-1), "unknown status");
  cr_assert_str_eq(ab_status_name((ab_status)-1), "AB_UNKNOWN_STATUS");
}

static void *first_message(void *arg) {
  (void)arg;
  return strdup(ab_last_error()); /* the thread's own buffer dies with it */
}

Test(convert, last_error_is_empty_until_a_failure_and_kept_by_successes) {
  /* a new thread has seen no failure */
  pthread_t th;
  void *msg0 = NULL;
  cr_assert_eq(pthread_create(&th, NULL, first_message, NULL), 0);
  cr_assert_eq(pthread_join(th, &msg0), 0);
  cr_assert_not_null(msg0);
  cr_assert_eq(*(const char *)msg0, '\0', "fresh thread has message \"%s\"", (const char *)msg0);
  free(msg0);
  struct fixture f;
  fixture_init(&f);
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, NULL, NULL), AB_ERR_INVALID_ARGUMENT);
  char msg[512];
  strncpy(msg, ab_last_error(), sizeof msg - 1);
  msg[sizeof msg - 1] = '\0';
  cr_assert_not_null(strstr(msg, "out"), "message: %s", msg);
  cr_assert_eq(ab_convert_memory(&f.t, CPU0, NULL, &r), AB_OK);
  r->deleter(r);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CPU0, &info), AB_OK);
  cr_assert_str_eq(ab_last_error(), msg, "a successful call changed the message");
}

Test(convert, version_string_matches_the_header) {
  cr_assert_str_eq(ab_version_string(), AB_VERSION_STRING);
  cr_assert_eq(ab_version_number(), AB_VERSION_NUMBER);
}

Test(convert, a_permutation_of_size_one_dims_still_permutes_the_shape) {
  float x[5] = {1, 2, 3, 4, 5};
  int64_t shape[2] = {1, 5};
  DLTensor t = {x, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  static const int32_t perm[2] = {1, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.permute = perm;
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(r->dl_tensor.shape[0] == 5 && r->dl_tensor.shape[1] == 1, "shape (%lld, %lld)",
            (long long)r->dl_tensor.shape[0], (long long)r->dl_tensor.shape[1]);
  cr_assert(memcmp(r->dl_tensor.data, x, sizeof x) == 0);
  r->deleter(r);
  o.copy = AB_COPY_NEVER; /* a new shape is a new tensor */
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_ERR_COPY_REQUIRED);
}

/* A copy of no elements moves nothing (ab__run_copy runs no step), and
 * ab_explain_convert says so rather than listing a copy of 0 bytes; a view
 * of no elements is still a view. */
Test(convert, the_explanation_of_an_empty_copy_lists_no_step) {
  int64_t shape[2] = {0, 8};
  DLTensor t = {NULL, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  char plan[512];
  cr_assert_eq(ab_explain_convert(&t, CPU0, &o, plan, sizeof plan), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(plan, "0 steps"), "%s", plan);
  cr_assert_not_null(strstr(plan, "nothing moves; the result is an empty tensor on cpu:0"), "%s", plan);
  cr_assert_null(strstr(plan, "1."), "a step is listed: %s", plan);
  o.copy = AB_COPY_IF_NEEDED;
  cr_assert_eq(ab_explain_convert(&t, CPU0, &o, plan, sizeof plan), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(plan, "1. view"), "%s", plan);
}

/* ab_convert_memory decides a view from its checks (ab__route_view, fed
 * the conversion's `active`) before it plans; ab__prepare, what
 * ab_explain runs, plans the whole route. The two must agree on every
 * request: no dtype, the same one or another; no permutation, the
 * identity, one that moves only a size-1 dim, a real one; a map; strided
 * views allowed or not; read-only; each copy mode; a compact source and a
 * strided one. */
Test(convert, a_view_exactly_where_the_planner_plans_one) {
  float data[24];
  for (int i = 0; i < 24; i++) data[i] = (float)i;
  int64_t shape[3] = {4, 1, 6}, strided[3] = {1, 1, 4};
  static const int32_t ident[3] = {0, 1, 2}, ones[3] = {1, 0, 2}, real[3] = {2, 1, 0};
  const int32_t *perms[4] = {NULL, ident, ones, real};
  const DLDataType dts[3] = {{0, 0, 0}, dt(kDLFloat, 32, 1), dt(kDLFloat, 64, 1)};
  const uint32_t flags[4] = {0, AB_CONVERT_AFFINE, AB_CONVERT_ALLOW_STRIDED_VIEW, AB_CONVERT_READ_ONLY};
  const ab_copy_mode copies[3] = {AB_COPY_IF_NEEDED, AB_COPY_ALWAYS, AB_COPY_NEVER};
  int views = 0, copied = 0, refused = 0;
  for (int lay = 0; lay < 2; lay++)
    for (int d = 0; d < 3; d++)
      for (int p = 0; p < 4; p++)
        for (int f = 0; f < 4; f++)
          for (int c = 0; c < 3; c++) {
            DLTensor t = {data, CPU0, 3, dt(kDLFloat, 32, 1), shape, lay ? strided : NULL, 0};
            ab_convert_opts o = AB_CONVERT_OPTS_INIT;
            o.dtype = dts[d];
            o.permute = perms[p];
            o.flags = flags[f];
            o.scale = 1.0;
            o.copy = copies[c];
            char what[96];
            snprintf(what, sizeof what, "%s source, dtype %d, permutation %d, flags 0x%x, copy %d",
                     lay ? "strided" : "compact", d, p, (unsigned)flags[f], (int)copies[c]);
            ab__prepared pr;
            const ab_status planned = ab__prepare(&t, CPU0, &o, NULL, &pr);
            const bool plan_view = planned == AB_OK && pr.plan.steps[0].kind == AB_STEP_VIEW;
            DLManagedTensorVersioned *m = NULL;
            const ab_status st = ab_convert_memory(&t, CPU0, &o, &m);
            cr_assert_eq(st, planned, "%s: ab_convert_memory %s, the planner %s", what, ab_status_name(st),
                         ab_status_name(planned));
            if (st != AB_OK) {
              refused++;
              continue;
            }
            const bool view = m->dl_tensor.data == (void *)data && !(m->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
            cr_assert_eq(view, plan_view, "%s: a %s where the planner has a %s", what, view ? "view" : "copy",
                         plan_view ? "view" : "copy");
            view ? views++ : copied++;
            m->deleter(m);
          }
  cr_assert(views > 0 && copied > 0 && refused > 0, "%d views, %d copies, %d refused", views, copied, refused);
}
