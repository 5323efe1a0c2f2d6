/* Legacy DLPack (DLManagedTensor) <-> versioned wrappers: no data copied,
 * ownership moves only on success, every original deleter runs exactly
 * once, and ping-pong between the two stays one wrapper deep. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "support.h"

/* ---- counted producers ---------------------------------------------------- */

struct producer {
  int deleted; /* times the original deleter ran */
  float data[6];
  int64_t shape[2];
  int64_t strides[2];
};

static void legacy_deleter(DLManagedTensor *self) {
  struct producer *p = self->manager_ctx;
  p->deleted++;
}

static void versioned_deleter(DLManagedTensorVersioned *self) {
  struct producer *p = self->manager_ctx;
  p->deleted++;
}

static void producer_init(struct producer *p) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < 6; i++) p->data[i] = (float)i + 0.25f;
  p->shape[0] = 2;
  p->shape[1] = 3;
  p->strides[0] = 3;
  p->strides[1] = 1;
}

static DLManagedTensor make_legacy(struct producer *p) {
  DLManagedTensor l;
  memset(&l, 0, sizeof l);
  l.dl_tensor = (DLTensor){p->data, CPU0, 2, dt(kDLFloat, 32, 1), p->shape, p->strides, 0};
  l.manager_ctx = p;
  l.deleter = legacy_deleter;
  return l;
}

static DLManagedTensorVersioned make_versioned(struct producer *p) {
  DLManagedTensorVersioned v;
  memset(&v, 0, sizeof v);
  v.version.major = 1;
  v.version.minor = 0;
  v.dl_tensor = (DLTensor){p->data, CPU0, 2, dt(kDLFloat, 32, 1), p->shape, p->strides, 0};
  v.manager_ctx = p;
  v.deleter = versioned_deleter;
  return v;
}

static void assert_same_tensor(const DLTensor *a, const DLTensor *b, const char *what) {
  cr_assert_eq(a->data, b->data, "%s: data copied", what);
  cr_assert_eq(a->shape, b->shape, "%s: shape array not shared", what);
  cr_assert_eq(a->strides, b->strides, "%s: strides array not shared", what);
  cr_assert_eq(a->ndim, b->ndim, "%s", what);
  cr_assert_eq(a->byte_offset, b->byte_offset, "%s", what);
  cr_assert_eq(a->device.device_type, b->device.device_type, "%s", what);
  cr_assert_eq(a->device.device_id, b->device.device_id, "%s", what);
  cr_assert(a->dtype.code == b->dtype.code && a->dtype.bits == b->dtype.bits && a->dtype.lanes == b->dtype.lanes,
            "%s: dtype", what);
}

/* ---- from legacy ------------------------------------------------------- */

Test(legacy, from_legacy_shares_everything_and_its_deleter_runs_the_original_once) {
  struct producer p;
  producer_init(&p);
  DLManagedTensor l = make_legacy(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *v = NULL;
  cr_assert_eq(ab_from_legacy(&l, &v), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(v);
  cr_assert_neq((void *)v, (void *)&l);
  assert_same_tensor(&v->dl_tensor, &l.dl_tensor, "from_legacy");
  cr_assert_eq(v->version.major, 1);
  cr_assert_eq(v->flags, 0);
  cr_assert_not_null(v->deleter);
  cr_assert_eq(p.deleted, 0, "the original was deleted by wrapping it");
  cr_assert_eq(((float *)v->dl_tensor.data)[4], 4.25f);
  v->deleter(v);
  cr_assert_eq(p.deleted, 1, "original deleter ran %d times", p.deleted);
  cr_assert_eq(ab__alloc_live_settled(), live, "the wrapper leaked");
}

Test(legacy, to_legacy_shares_everything_and_its_deleter_runs_the_original_once) {
  struct producer p;
  producer_init(&p);
  DLManagedTensorVersioned v = make_versioned(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensor *l = NULL;
  cr_assert_eq(ab_to_legacy(&v, &l), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(l);
  cr_assert_neq((void *)l, (void *)&v);
  assert_same_tensor(&l->dl_tensor, &v.dl_tensor, "to_legacy");
  cr_assert_not_null(l->deleter);
  cr_assert_eq(p.deleted, 0);
  l->deleter(l);
  cr_assert_eq(p.deleted, 1, "original deleter ran %d times", p.deleted);
  cr_assert_eq(ab__alloc_live_settled(), live, "the wrapper leaked");
}

/* ---- round trips -------------------------------------------------------- */

Test(legacy, legacy_to_versioned_to_legacy_gives_back_the_original) {
  struct producer p;
  producer_init(&p);
  DLManagedTensor l = make_legacy(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *v = NULL;
  DLManagedTensor *back = NULL;
  cr_assert_eq(ab_from_legacy(&l, &v), AB_OK, "%s", ab_last_error());
  v->dl_tensor.byte_offset = 4; /* a consumer's view of the data from element 1 */
  cr_assert_eq(ab_to_legacy(v, &back), AB_OK, "%s", ab_last_error());
  cr_assert_eq(back, &l, "round trip gave %p, not the original %p", (void *)back, (void *)&l);
  cr_assert_eq(back->dl_tensor.byte_offset, 4, "unwrapping lost the wrapper's DLTensor (byte_offset %llu)",
               (unsigned long long)back->dl_tensor.byte_offset);
  cr_assert_eq(back->deleter, legacy_deleter, "the original's deleter was replaced");
  cr_assert_eq(p.deleted, 0, "unwrapping ran the deleter");
  cr_assert_eq(ab__alloc_live_settled(), live, "the unwrapped wrapper was not freed");
  back->deleter(back);
  cr_assert_eq(p.deleted, 1);
}

Test(legacy, versioned_to_legacy_to_versioned_gives_back_the_original) {
  struct producer p;
  producer_init(&p);
  DLManagedTensorVersioned v = make_versioned(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensor *l = NULL;
  DLManagedTensorVersioned *back = NULL;
  cr_assert_eq(ab_to_legacy(&v, &l), AB_OK, "%s", ab_last_error());
  l->dl_tensor.byte_offset = 4; /* a consumer's view of the data from element 1 */
  cr_assert_eq(ab_from_legacy(l, &back), AB_OK, "%s", ab_last_error());
  cr_assert_eq(back, &v, "round trip gave %p, not the original %p", (void *)back, (void *)&v);
  cr_assert_eq(back->dl_tensor.byte_offset, 4, "unwrapping lost the wrapper's DLTensor (byte_offset %llu)",
               (unsigned long long)back->dl_tensor.byte_offset);
  cr_assert_eq(back->deleter, versioned_deleter);
  cr_assert_eq(p.deleted, 0);
  cr_assert_eq(ab__alloc_live_settled(), live);
  back->deleter(back);
  cr_assert_eq(p.deleted, 1);
}

/* Many hops stay one level deep: the final object's deleter runs the
 * original exactly once, and at most one wrapper is alive at a time. */
Test(legacy, ping_pong_stays_one_level_deep) {
  struct producer p;
  producer_init(&p);
  DLManagedTensor l = make_legacy(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *v = NULL;
  DLManagedTensor *cur = &l;
  for (int hop = 0; hop < 10; hop++) {
    cr_assert_eq(ab_from_legacy(cur, &v), AB_OK, "hop %d: %s", hop, ab_last_error());
    cr_assert_eq(ab__alloc_live_settled(), live + 1, "hop %d: %ld wrappers alive", hop, ab__alloc_live_settled() - live);
    cr_assert_eq(ab_to_legacy(v, &cur), AB_OK, "hop %d: %s", hop, ab_last_error());
    cr_assert_eq(cur, &l, "hop %d: not unwrapped", hop);
    cr_assert_eq(ab__alloc_live_settled(), live);
  }
  cr_assert_eq(ab_from_legacy(cur, &v), AB_OK);
  v->deleter(v);
  cr_assert_eq(p.deleted, 1, "original deleter ran %d times", p.deleted);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* ---- failures leave ownership with the caller ------------------------- */

Test(legacy, null_arguments_are_invalid_and_keep_ownership) {
  struct producer p;
  producer_init(&p);
  DLManagedTensor l = make_legacy(&p);
  DLManagedTensorVersioned v = make_versioned(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensorVersioned *vo = SENTINEL_OUT;
  DLManagedTensor *lo = (DLManagedTensor *)(uintptr_t)0x5e41e100u;
  cr_assert_eq(ab_from_legacy(NULL, &vo), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "NULL"), "%s", ab_last_error());
  cr_assert_eq(vo, SENTINEL_OUT);
  cr_assert_eq(ab_from_legacy(&l, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "out"), "%s", ab_last_error());
  cr_assert_eq(ab_to_legacy(NULL, &lo), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "NULL"), "%s", ab_last_error());
  cr_assert_eq((uintptr_t)lo, 0x5e41e100u);
  cr_assert_eq(ab_to_legacy(&v, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "out"), "%s", ab_last_error());
  cr_assert_eq(p.deleted, 0, "a failed call ran a deleter");
  cr_assert_eq(ab__alloc_live_settled(), live);
  /* the caller still owns both and can still convert them */
  cr_assert_eq(ab_from_legacy(&l, &vo), AB_OK);
  vo->deleter(vo);
  cr_assert_eq(p.deleted, 1);
}

Test(legacy, to_legacy_refuses_read_only_and_other_major_versions) {
  struct producer p;
  producer_init(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensor *lo = (DLManagedTensor *)(uintptr_t)0x5e41e100u;

  DLManagedTensorVersioned ro = make_versioned(&p);
  ro.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  cr_assert_eq(ab_to_legacy(&ro, &lo), AB_ERR_UNSUPPORTED);
  cr_assert_not_null(strstr(ab_last_error(), "read-only"), "%s", ab_last_error());
  cr_assert_eq((uintptr_t)lo, 0x5e41e100u, "*out written on failure");

  static const uint32_t majors[] = {0, 2, 7};
  for (int k = 0; k < 3; k++) {
    DLManagedTensorVersioned v2 = make_versioned(&p);
    v2.version.major = majors[k];
    cr_assert_eq(ab_to_legacy(&v2, &lo), AB_ERR_UNSUPPORTED, "major %u accepted", majors[k]);
    cr_assert_not_null(strstr(ab_last_error(), "version"), "%s", ab_last_error());
    cr_assert_eq((uintptr_t)lo, 0x5e41e100u, "*out written on failure");
  }
  cr_assert_eq(p.deleted, 0, "a refused tensor was deleted");
  cr_assert_eq(ab__alloc_live_settled(), live);
  /* still the caller's: deleting it is the caller's job and works */
  ro.deleter(&ro);
  cr_assert_eq(p.deleted, 1);

  /* a READ_ONLY tensor from ab_convert_memory is refused too, and stays
   * deletable by its owner */
  float buf[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {buf, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS, .flags = AB_CONVERT_READ_ONLY};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(ab_to_legacy(r, &lo), AB_ERR_UNSUPPORTED);
  r->deleter(r);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

Test(legacy, null_original_deleters_are_allowed) {
  struct producer p;
  producer_init(&p);
  long live = ab__alloc_live_settled();
  DLManagedTensor l = make_legacy(&p);
  l.deleter = NULL;
  DLManagedTensorVersioned *v = NULL;
  cr_assert_eq(ab_from_legacy(&l, &v), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(v->deleter, "the wrapper needs a deleter of its own");
  assert_same_tensor(&v->dl_tensor, &l.dl_tensor, "from_legacy, NULL deleter");
  v->deleter(v);
  cr_assert_eq(ab__alloc_live_settled(), live, "wrapper leaked");

  DLManagedTensorVersioned vv = make_versioned(&p);
  vv.deleter = NULL;
  DLManagedTensor *lo = NULL;
  cr_assert_eq(ab_to_legacy(&vv, &lo), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(lo->deleter);
  lo->deleter(lo);
  cr_assert_eq(ab__alloc_live_settled(), live, "wrapper leaked");
  cr_assert_eq(p.deleted, 0);
}

/* ---- with the library's own tensors ----------------------------------- */

Test(legacy, converted_tensor_exported_as_legacy_frees_everything) {
  long live = ab__alloc_live_settled();
  double buf[12];
  for (int i = 0; i < 12; i++) buf[i] = i * 0.5;
  int64_t shape[2] = {4, 3}, strides[2] = {1, 4};
  DLTensor t = {buf, CPU0, 2, dt(kDLFloat, 64, 1), shape, strides, 0};
  for (int copy = 0; copy < 2; copy++) {
    ab_convert_opts o = {.copy = copy ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED,
                         .flags = copy ? 0u : AB_CONVERT_ALLOW_STRIDED_VIEW};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    DLManagedTensor *l = NULL;
    cr_assert_eq(ab_to_legacy(r, &l), AB_OK, "%s", ab_last_error());
    assert_same_tensor(&l->dl_tensor, &r->dl_tensor, "converted -> legacy");
    if (copy) {
      cr_assert_eq(first_diff_vs_reference(&t, r), -1);
    } else {
      cr_assert_eq(l->dl_tensor.data, (void *)buf);
    }
    l->deleter(l);
    cr_assert_eq(ab__alloc_live_settled(), live, "copy=%d: %ld blocks left", copy, ab__alloc_live_settled() - live);
  }
  /* and back: legacy of a converted tensor, re-imported, is the tensor */
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *r = NULL, *again = NULL;
  DLManagedTensor *l = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(ab_to_legacy(r, &l), AB_OK);
  cr_assert_eq(ab_from_legacy(l, &again), AB_OK);
  cr_assert_eq(again, r, "re-import did not unwrap");
  again->deleter(again);
  cr_assert_eq(ab__alloc_live_settled(), live);
}

/* A legacy tensor from another producer goes through ab_convert_memory
 * like any DLTensor once wrapped. */
Test(legacy, wrapped_legacy_tensor_converts_like_any_other) {
  struct producer p;
  producer_init(&p);
  p.strides[0] = 1; /* view the 2 x 3 data as its 3 x 2 transpose */
  p.strides[1] = 3;
  p.shape[0] = 3;
  p.shape[1] = 2;
  DLManagedTensor l = make_legacy(&p);
  DLManagedTensorVersioned *v = NULL, *r = NULL;
  cr_assert_eq(ab_from_legacy(&l, &v), AB_OK);
  cr_assert_eq(ab_convert_memory(&v->dl_tensor, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(first_diff_vs_reference(&v->dl_tensor, r), -1);
  const float *o = r->dl_tensor.data;
  cr_assert(o[0] == p.data[0] && o[1] == p.data[3] && o[2] == p.data[1] && o[5] == p.data[5]);
  r->deleter(r);
  v->deleter(v);
  cr_assert_eq(p.deleted, 1);
}
