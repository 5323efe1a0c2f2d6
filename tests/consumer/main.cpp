// The same conversion from C++: the public header must compile as C++
// (-std=c++11, -Wall -Wextra -pedantic -Wshadow -Wold-style-cast -Werror),
// as frameworks' extensions that include it are C++, and link with the C
// library unchanged. The header's macros and same-named struct and
// function (ab_pool_stats) are used too.
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
  bool ok = std::memcmp(r->dl_tensor.data, want, sizeof want) == 0;
  r->deleter(r);
  struct ab_pool_stats stats = {}; // "struct": the function ab_pool_stats hides the name
  stats.size = sizeof stats;
  ok = ok && ab_pool_stats(cpu, &stats) == AB_OK && stats.allocations > 0;
  ok = ok && (opts.flags & ~AB_CONVERT_KNOWN_FLAGS) == 0;
  DLDevice pinned = {AB_DEVICE_OPENCL_HOST, 0};
  ok = ok && std::strcmp(ab_device_type_name(pinned.device_type), "opencl_host") == 0;
  std::printf("consumer (C++): arraybridge %s, transposed copy %s\n", ab_version_string(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
