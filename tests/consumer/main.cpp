// The same conversion from C++: the public header must compile as C++
// (-std=c++11, -Wall -Wextra -pedantic -Werror), as frameworks' extensions
// that include it are C++, and link with the C library unchanged.
#include <arraybridge/arraybridge.h>

#include <cstdio>
#include <cstring>

int main() {
  int32_t v[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3}, strides[2] = {1, 2}; // a transposed view
  DLTensor t = {v, {kDLCPU, 0}, 2, {kDLInt, 32, 1}, shape, strides, 0};
  ab_convert_opts opts = AB_CONVERT_OPTS_INIT;
  DLManagedTensorVersioned *r = nullptr;
  DLDevice cpu = {kDLCPU, 0};
  if (ab_convert_memory(&t, cpu, &opts, &r) != AB_OK) {
    std::fprintf(stderr, "consumer (C++): %s\n", ab_last_error());
    return 1;
  }
  const int32_t want[6] = {1, 3, 5, 2, 4, 6};
  const bool ok = std::memcmp(r->dl_tensor.data, want, sizeof want) == 0;
  r->deleter(r);
  std::printf("consumer (C++): arraybridge %s, transposed copy %s\n", ab_version_string(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
