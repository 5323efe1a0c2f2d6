/* Large transposes with streaming stores and without (AB_HOST_STREAMING
 * forces each; auto measures which this CPU prefers): the same bytes. Each
 * test runs in a process of its own, so the variable is read afresh. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "converters/host/gather.h"
#include "support.h"

/* A 2048 x 1030 float32 transpose (8 MiB out, above the streaming
 * threshold; 1030 leaves a ragged edge), and a strided one of float64,
 * against the reference gather. */
static void transposes_match(void) {
  static float a[2048 * 1030];
  static double b[1024 * 1030];
  fill_pattern(a, sizeof a, 3);
  fill_pattern(b, sizeof b, 4);
  int64_t shape[2] = {1030, 2048}, st[2] = {1, 1030};
  DLTensor t = {a, CPU0, 2, {kDLFloat, 32, 1}, shape, st, 0};
  int64_t shape2[2] = {1030, 1024}, st2[2] = {1, 1030};
  DLTensor u = {b, CPU0, 2, {kDLFloat, 64, 1}, shape2, st2, 0};
  const DLTensor *cases[2] = {&t, &u};
  for (int k = 0; k < 2; k++) {
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.copy = AB_COPY_ALWAYS;
    o.threads = 1; /* the whole output in one call: the streaming threshold applies */
    DLManagedTensorVersioned *r;
    cr_assert_eq(ab_convert_memory(cases[k], CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert_eq(first_diff_vs_reference(cases[k], r), -1, "case %d differs", k);
    r->deleter(r);
  }
}

Test(streaming, forced_on_gives_the_reference_bytes) {
  setenv("AB_HOST_STREAMING", "1", 1);
  transposes_match();
  cr_assert_eq(ab__host_streaming(), 1);
}

Test(streaming, forced_off_gives_the_reference_bytes) {
  setenv("AB_HOST_STREAMING", "0", 1);
  transposes_match();
  cr_assert_eq(ab__host_streaming(), 0);
}

Test(streaming, measured_gives_the_reference_bytes_and_a_stable_choice) {
  unsetenv("AB_HOST_STREAMING");
  transposes_match();
  const int m = ab__host_streaming();
  cr_assert(m == 0 || m == 1);
  cr_assert_eq(ab__host_streaming(), m, "the measured choice changed");
}
