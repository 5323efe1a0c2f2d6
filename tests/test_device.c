/* Device strings (ab_parse_device) and the best-device choice
 * (ab_best_device), as Python's "cuda:1" and "cuda if available else cpu"
 * need them. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static DLDevice parse_ok(const char *s) {
  DLDevice d = {(DLDeviceType)99, 99};
  ab_status st = ab_parse_device(s, &d);
  cr_assert_eq(st, AB_OK, "\"%s\": %s (%s)", s, ab_status_name(st), ab_last_error());
  return d;
}

static void parse_bad(const char *s, const char *word) {
  DLDevice d = {(DLDeviceType)99, 99};
  ab_status st = ab_parse_device(s, &d);
  cr_assert_eq(st, AB_ERR_INVALID_ARGUMENT, "\"%s\" was accepted as %d:%d", s ? s : "(null)", (int)d.device_type,
               (int)d.device_id);
  cr_assert(d.device_type == (DLDeviceType)99 && d.device_id == 99, "\"%s\": out written on failure", s);
  cr_assert_not_null(strstr(ab_last_error(), word), "\"%s\": message \"%s\" lacks \"%s\"", s ? s : "(null)",
                     ab_last_error(), word);
}

Test(device, strings_name_every_type_with_an_optional_id) {
  const DLDeviceType types[] = {kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLCUDAManaged, kDLROCM, kDLVulkan};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    char s[64];
    const char *name = ab_device_type_name(types[i]);
    DLDevice d = parse_ok(name);
    cr_assert(d.device_type == types[i] && d.device_id == 0, "\"%s\" -> %d:%d", name, d.device_type, d.device_id);
    snprintf(s, sizeof s, "%s:17", name);
    d = parse_ok(s);
    cr_assert(d.device_type == types[i] && d.device_id == 17, "\"%s\"", s);
  }
  DLDevice d = parse_ok("CUDA:3");
  cr_assert(d.device_type == kDLCUDA && d.device_id == 3, "case-insensitive type");
  d = parse_ok("cuda:auto");
  cr_assert_eq(d.device_id, AB_DEVICE_AUTO);
  d = parse_ok("opencl:2147483647");
  cr_assert_eq(d.device_id, 2147483647);
}

Test(device, malformed_strings_are_refused_with_the_reason) {
  parse_bad(NULL, "NULL");
  parse_bad("", "unknown device type");
  parse_bad("gpu", "unknown device type");
  parse_bad("cuda_", "unknown device type");
  parse_bad(":0", "unknown device type");
  parse_bad(" cpu", "unknown device type");
  parse_bad("unknown", "unknown device type");
  parse_bad("cuda:", "nothing after ':'");
  parse_bad("cuda:-1", "decimal");
  parse_bad("cuda:+1", "decimal");
  parse_bad("cuda:1 ", "decimal");
  parse_bad("cuda:1:2", "decimal");
  parse_bad("cuda:0x1", "decimal");
  parse_bad("opencl:2147483648", "larger than");
  parse_bad("opencl:99999999999999999999999", "larger than");
  /* The message quotes the string, cut and made printable. */
  parse_bad("cu\x01" "da", "\"cu?da\"");
  char longs[200];
  memset(longs, 'x', sizeof longs - 1);
  longs[sizeof longs - 1] = '\0';
  parse_bad(longs, "...");
  cr_assert_lt(strlen(ab_last_error()), 200, "the message quotes a cut string");
  DLDevice d;
  cr_assert_eq(ab_parse_device("cpu", NULL), AB_ERR_INVALID_ARGUMENT);
  (void)d;
}

/* Sizes are read as AB_MEMORY_LIMIT reads them, so that abtool and
 * applications with size settings of their own spell them alike. */
Test(device, sizes_take_the_memory_limit_suffixes_and_nothing_else) {
  static const struct { const char *text; uint64_t bytes; } ok[] = {
    {"0", 0}, {"4096", 4096}, {"4096B", 4096}, {"4K", 4096}, {"4KiB", 4096}, {"4KB", 4000},
    {"1M", 1u << 20}, {"1MB", 1000000}, {"3GiB", 3ull << 30}, {"2GB", 2000000000ull},
    {"1T", 1ull << 40}, {"1TB", 1000000000000ull}, {"18446744073709551615", UINT64_MAX},
    {"16777215TiB", 16777215ull << 40},
  };
  for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
    uint64_t v = 7;
    cr_assert_eq(ab_parse_size(ok[k].text, &v), AB_OK, "%s: %s", ok[k].text, ab_last_error());
    cr_assert_eq(v, ok[k].bytes, "%s: %" PRIu64, ok[k].text, v);
  }
  static const char *const bad[] = {"",     "K",   "-1",   "+1",  " 1",  "1 ",  "4k",  "4kb", "4Kb",
                                    "4iB",  "4KiBB", "1P",  "1.5M", "0x10", "4096iB",
                                    "18446744073709551616", "16777216TiB"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    uint64_t v = 7;
    cr_assert_eq(ab_parse_size(bad[k], &v), AB_ERR_INVALID_ARGUMENT, "\"%s\" is no size", bad[k]);
    cr_assert_eq(v, 7, "bytes untouched");
    cr_assert(strstr(ab_last_error(), "is not a byte count") != NULL, "%s", ab_last_error());
  }
  uint64_t v;
  cr_assert_eq(ab_parse_size(NULL, &v), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_parse_size("4K", NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_parse_size("4\x01K", &v), AB_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(ab_last_error(), "\"4?K\"") != NULL, "quoted printable: %s", ab_last_error());
}

Test(device, types_list_every_type_with_devices_once_cpu_first) {
  DLDeviceType types[32];
  const int n = ab_device_types(types, 32);
  cr_assert(n >= 1 && n <= 32, "%d types", n);
  cr_assert_eq(ab_device_types(NULL, 0), n, "counting alone gives another number");
  cr_assert_eq(types[0], kDLCPU);
  DLDeviceType two[2] = {0, 0};
  cr_assert_eq(ab_device_types(two, 1), n);
  cr_assert(two[0] == kDLCPU && two[1] == 0, "max 1 wrote more than one type");
  for (int k = 0; k < n; k++) {
    cr_assert_neq(types[k], AB_DEVICE_OPENCL_HOST, "a staging-only type is listed");
    cr_assert_str_neq(ab_device_type_name(types[k]), "unknown");
    for (int j = 0; j < k; j++) cr_assert_neq(types[j], types[k], "%s is listed twice", ab_device_type_name(types[k]));
  }
  /* Every type with a device is listed. */
  for (int t = 1; t < 32; t++) {
    if (ab_device_count((DLDeviceType)t) == 0) continue;
    int listed = 0;
    for (int k = 0; k < n; k++) listed |= types[k] == (DLDeviceType)t;
    cr_assert(listed, "%s has %d devices but is not listed", ab_device_type_name((DLDeviceType)t),
              (int)ab_device_count((DLDeviceType)t));
  }
}

Test(device, private_types_are_staging_memory_no_tensor_may_name) {
  /* The library's range outside DLPack's numbering: AB_DEVICE_OPENCL_HOST
   * and the rest, named or not, are never a tensor's device. */
  cr_assert_str_eq(ab_device_type_name(AB_DEVICE_OPENCL_HOST), "opencl_host");
  cr_assert_str_eq(ab_device_type_name((DLDeviceType)0x10005), "unknown");
  float x = 1;
  int64_t shape[1] = {1};
  const DLDeviceType types[] = {AB_DEVICE_OPENCL_HOST, (DLDeviceType)0x10005, (DLDeviceType)0x1000f};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    DLTensor t = {&x, {types[k], 0}, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
    cr_assert_eq(ab_tensor_validate(&t), AB_ERR_INVALID_ARGUMENT, "type %#x", (unsigned)types[k]);
    cr_assert(strstr(ab_last_error(), "staging memory") != NULL, "%s", ab_last_error());
    /* the unused types are not called staging memory, only the range
     * kept for it (opencl_host is, where the OpenCL backend is built in) */
    if (k > 0) {
      cr_assert_null(strstr(ab_last_error(), "is the library's own staging memory"), "%s", ab_last_error());
      cr_assert_not_null(strstr(ab_last_error(), "in the range the library keeps"), "%s", ab_last_error());
    }
  }
  /* A target of AB_DEVICE_AUTO is named as device strings spell it. */
  DLTensor src = {&x, {kDLCPU, 0}, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *out = NULL;
  cr_assert_eq(ab_convert_memory(&src, (DLDevice){AB_DEVICE_OPENCL_HOST, AB_DEVICE_AUTO}, NULL, &out),
               AB_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(ab_last_error(), "opencl_host:auto ") != NULL, "%s", ab_last_error());
  if (ab_device_count(kDLCUDA) == 0) {
    cr_assert_eq(ab_convert_memory(&src, (DLDevice){kDLCUDA, AB_DEVICE_AUTO}, NULL, &out), AB_ERR_NO_DEVICE);
    cr_assert(strstr(ab_last_error(), "cuda:auto: no cuda") != NULL, "%s", ab_last_error());
    /* ... but a negative id where a device is named is a wrong argument,
     * whether or not the type has devices (the header's promise) */
    struct ab_device_info info;
    cr_assert_eq(ab_device_info((DLDevice){kDLCUDA, AB_DEVICE_AUTO}, &info), AB_ERR_INVALID_ARGUMENT, "%s",
                 ab_last_error());
    cr_assert_eq(ab_device_info((DLDevice){kDLCUDA, -7}, &info), AB_ERR_INVALID_ARGUMENT, "%s", ab_last_error());
    cr_assert_eq(ab_convert_memory(&src, (DLDevice){kDLCUDA, -7}, NULL, &out), AB_ERR_INVALID_ARGUMENT);
  }
  struct ab_device_info info;
  cr_assert_eq(ab_device_info((DLDevice){kDLCPU, -1}, &info), AB_ERR_INVALID_ARGUMENT);
  cr_assert_null(out);
  /* Past the range: not a device type at all. */
  DLTensor t = {&x, {(DLDeviceType)0x10010, 0}, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_tensor_validate(&t), AB_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(ab_last_error(), "not a DLPack device type") != NULL, "%s", ab_last_error());
}

Test(device, best_device_prefers_an_existing_choice_then_accelerators_then_cpu) {
  unsetenv("AB_DEFAULT_DEVICE");
  DLDevice best = ab_best_device();
  if (ab_device_count(kDLCUDA) > 0) {
    cr_assert_eq(best.device_type, kDLCUDA, "a CUDA device exists but %s was chosen",
                 ab_device_type_name(best.device_type));
  } else {
    /* PoCL's devices are the host's RAM: not accelerators. */
    int discrete = 0;
    for (int32_t i = 0; i < ab_device_count(kDLOpenCL); i++) {
      struct ab_device_info info;
      cr_assert_eq(ab_device_info((DLDevice){kDLOpenCL, i}, &info), AB_OK);
      discrete |= !info.unified_memory;
    }
    cr_assert_eq(best.device_type, discrete ? kDLOpenCL : kDLCPU, "chose %s", ab_device_type_name(best.device_type));
  }
  /* The environment wins when it names a device that exists, and leaves no
   * message behind when it does not. */
  setenv("AB_DEFAULT_DEVICE", "cpu:0", 1);
  best = ab_best_device();
  cr_assert(best.device_type == kDLCPU && best.device_id == 0);
  if (ab_device_count(kDLOpenCL) >= 2) {
    setenv("AB_DEFAULT_DEVICE", "opencl:1", 1);
    best = ab_best_device();
    cr_assert(best.device_type == kDLOpenCL && best.device_id == 1, "got %s:%d",
              ab_device_type_name(best.device_type), (int)best.device_id);
  }
  /* opencl_host is the library's staging memory, which no tensor may name
   * (where the OpenCL backend is built, the device exists). */
  const char *bad[] = {"cuda:99", "opencl:99", "nonsense", "cpu:1", "opencl_host:0", "opencl_host:1", "opencl_host:auto"};
  unsetenv("AB_DEFAULT_DEVICE");
  DLDevice plain = ab_best_device();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("AB_DEFAULT_DEVICE", bad[i], 1);
    float x = 1;
    DLTensor t = {&x, CPU0, 0, dt(kDLFloat, 32, 1), NULL, NULL, 0};
    cr_assert_eq(ab_tensor_validate(&t), AB_OK);
    /* a known message before the call */
    DLDevice ignored;
    cr_assert_eq(ab_parse_device("marker-type", &ignored), AB_ERR_INVALID_ARGUMENT);
    char before[512];
    snprintf(before, sizeof before, "%s", ab_last_error());
    best = ab_best_device();
    cr_assert(best.device_type == plain.device_type && best.device_id == plain.device_id,
              "AB_DEFAULT_DEVICE=%s changed the choice", bad[i]);
    cr_assert_str_eq(ab_last_error(), before, "AB_DEFAULT_DEVICE=%s left a message", bad[i]);
  }
  unsetenv("AB_DEFAULT_DEVICE");
}

Test(device, peer_access_is_itself_or_a_backend_answer) {
  int can = -1;
  cr_assert_eq(ab_peer_access(CPU0, CPU0, &can), AB_OK, "%s", ab_last_error());
  cr_assert_eq(can, 1, "a device reaches its own memory");
  cr_assert_eq(ab_peer_access(CPU0, CPU0, NULL), AB_ERR_INVALID_ARGUMENT);
  can = -1;
  cr_assert_eq(ab_peer_access(CPU0, (DLDevice){kDLCPU, 2}, &can), AB_ERR_NO_DEVICE);
  cr_assert_eq(can, -1, "written on failure");
  if (ab_device_count(kDLOpenCL) >= 2) {
    /* OpenCL has no peer notion: its devices meet through a context copy
     * or the host, never "directly" in this sense. */
    cr_assert_eq(ab_peer_access((DLDevice){kDLOpenCL, 0}, (DLDevice){kDLOpenCL, 1}, &can), AB_OK);
    cr_assert_eq(can, 0);
    cr_assert_eq(ab_peer_access(CPU0, (DLDevice){kDLOpenCL, 1}, &can), AB_OK);
    cr_assert_eq(can, 0, "different backends");
  }
  for (int32_t i = 0; i < ab_device_count(kDLCUDA); i++) {
    cr_assert_eq(ab_peer_access((DLDevice){kDLCUDA, i}, (DLDevice){kDLCUDA, i}, &can), AB_OK);
    cr_assert_eq(can, 1);
  }
}

/* cpu:0 names its model and vendor as /proc/cpuinfo's first processor
 * does (the vendor explains vendor-dependent host kernel choices, as the
 * blocks' prefetches; see docs/performance.md), and "" for a vendor it lacks. */
Test(device, cpu_info_names_the_model_and_vendor) {
  char model[128], vendor[64];
  cpuinfo_value("model name", model, sizeof model);
  cpuinfo_value("vendor_id", vendor, sizeof vendor);
  struct ab_device_info info;
  memset(&info, 0x5a, sizeof info);
  cr_assert_eq(ab_device_info(CPU0, &info), AB_OK, "%s", ab_last_error());
  cr_assert_str_eq(info.backend, "host");
  cr_assert_str_eq(info.vendor, vendor, "vendor \"%s\", /proc/cpuinfo says \"%s\"", info.vendor, vendor);
  if (model[0] != '\0') cr_assert_str_eq(info.name, model);
  else cr_assert_str_eq(info.name, "host CPU");
}
