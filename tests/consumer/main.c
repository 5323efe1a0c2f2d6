/* Converts a small tensor with an installed arraybridge and checks it. */
#include <stdio.h>
#include <string.h>

#include <arraybridge/arraybridge.h>

int main(void) {
  int32_t v[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3}, strides[2] = {1, 2}; /* a transposed view */
  DLTensor t = {v, {kDLCPU, 0}, 2, {kDLInt, 32, 1}, shape, strides, 0};
  ab_convert_opts opts = AB_CONVERT_OPTS_INIT;
  DLManagedTensorVersioned *r = NULL;
  if (ab_convert_memory(&t, (DLDevice){kDLCPU, 0}, &opts, &r) != AB_OK) {
    fprintf(stderr, "consumer: %s\n", ab_last_error());
    return 1;
  }
  const int32_t want[6] = {1, 3, 5, 2, 4, 6};
  int ok = memcmp(r->dl_tensor.data, want, sizeof want) == 0;
  r->deleter(r);
  printf("consumer: arraybridge %s, transposed copy %s\n", ab_version_string(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
