#include <criterion/criterion.h>
#include "support.h"
Test(smoke, copy_contiguous) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  DLTensor t = {a, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert(is_compact_copy_of(r, &t));
  cr_assert_arr_eq(r->dl_tensor.data, a, sizeof a);
  r->deleter(r);
}
