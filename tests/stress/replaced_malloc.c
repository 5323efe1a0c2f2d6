/* The library under a replacement malloc (tests/stress/malloc_shim.c,
 * LD_PRELOADed by the test as jemalloc or tcmalloc are under many
 * programs): opening the OpenCL drivers with RTLD_DEEPBIND would bind
 * their free to libc's, and PoCL's initialisers would abort the process
 * on the first OpenCL call. The library must see the replacement and leave
 * the drivers to the ICD loader: the devices are there, and a tensor makes
 * the round trip through each.
 *
 *   replaced_malloc          (exits 0 when all passed, 77 when the shim is
 *                             not in the process or there is no OpenCL
 *                             device and none is expected)
 *   replaced_malloc FAKE_LLVM [drivers-first]
 *
 * With FAKE_LLVM (tests/stress/fake_llvm.c, a library that defines the
 * symbol of LLVM's the check looks for) loaded RTLD_GLOBAL first, as
 * TensorFlow's LLVM would be: the drivers could be opened neither with
 * RTLD_DEEPBIND (the malloc) nor without it (PoCL's clang would bind to the
 * other LLVM and crash), so the library must refuse OpenCL with a status
 * and a message that says why, and the host must still work. With
 * drivers-first, the drivers of the vendors folder are opened before the
 * other LLVM (as pyclesperanto imported first opens them): then nothing is
 * refused, even with a stale .icd entry of a driver not installed beside
 * them (the test points OCL_ICD_VENDORS at such a folder).
 *
 * AB_TEST_EXPECT_OPENCL=N (make test sets it) makes fewer than N devices a
 * failure. */
#define _GNU_SOURCE 1
#include <dirent.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arraybridge/arraybridge.h"

/* Opens every driver the vendors folder names, as a library loaded
 * before the other LLVM (pyclesperanto, imported first) would have. */
static void open_drivers_first(void) {
  const char *dir = getenv("OCL_ICD_VENDORS");
  DIR *d = opendir(dir != NULL ? dir : "/etc/OpenCL/vendors");
  struct dirent *e;
  while (d != NULL && (e = readdir(d)) != NULL) {
    char path[4096], lib[4096];
    const size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 4, ".icd") != 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir != NULL ? dir : "/etc/OpenCL/vendors", e->d_name);
    FILE *f = fopen(path, "r");
    if (f != NULL && fgets(lib, sizeof lib, f) != NULL) {
      lib[strcspn(lib, "\r\n")] = '\0';
      (void)dlopen(lib, RTLD_NOW | RTLD_LOCAL); /* a stale entry fails: as the ICD loader's would */
    }
    if (f != NULL) fclose(f);
  }
  if (d != NULL) closedir(d);
}

/* The other LLVM loaded: OpenCL refused with the reason, the host works.
 * With the drivers opened first, nothing is refused. */
static int refused(const char *fake, bool drivers_first) {
  if (drivers_first) open_drivers_first();
  if (dlopen(fake, RTLD_NOW | RTLD_GLOBAL) == NULL) {
    fprintf(stderr, "replaced_malloc: cannot load %s: %s\n", fake, dlerror());
    return 1;
  }
  const char *want = getenv("AB_TEST_EXPECT_OPENCL");
  const int expect = want != NULL ? atoi(want) : 0;
  if (drivers_first) {
    const int n = ab_device_count(kDLOpenCL);
    if (n == 0 && expect == 0) {
      fprintf(stderr, "replaced_malloc: SKIP: no OpenCL device (%s)\n", ab_last_error());
      return 77;
    }
    printf("replaced_malloc: drivers opened before another LLVM: %d OpenCL devices%s\n", n,
           n < (expect > 0 ? expect : 1) ? " (FAILED)" : "");
    if (n < (expect > 0 ? expect : 1)) fprintf(stderr, "replaced_malloc: %s\n", ab_last_error());
    return n < (expect > 0 ? expect : 1);
  }
  int failed = 0;
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor src = {v, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  DLManagedTensorVersioned *out = NULL;
  ab_status st = ab_convert_memory(&src, (DLDevice){kDLOpenCL, 0}, NULL, &out);
  if (st == AB_ERR_NO_DEVICE && strstr(ab_last_error(), "another LLVM") == NULL && expect == 0) {
    fprintf(stderr, "replaced_malloc: SKIP: no OpenCL driver to refuse (%s)\n", ab_last_error());
    return 77;
  }
  if (st != AB_ERR_NO_DEVICE || out != NULL || strstr(ab_last_error(), "another LLVM") == NULL) {
    fprintf(stderr, "replaced_malloc: to opencl:0 beside another LLVM: %s, %s (want AB_ERR_NO_DEVICE and why)\n",
            ab_status_name(st), ab_last_error());
    failed++;
  }
  if (ab_device_count(kDLOpenCL) != 0) {
    fprintf(stderr, "replaced_malloc: OpenCL devices counted beside another LLVM\n");
    failed++;
  }
  ab_convert_opts opts = AB_CONVERT_OPTS_INIT;
  opts.copy = AB_COPY_ALWAYS;
  if (ab_convert_memory(&src, (DLDevice){kDLCPU, 0}, &opts, &out) != AB_OK ||
      memcmp(out->dl_tensor.data, v, sizeof v) != 0) {
    fprintf(stderr, "replaced_malloc: a host copy failed beside another LLVM: %s\n", ab_last_error());
    failed++;
  }
  if (out != NULL) out->deleter(out);
  printf("replaced_malloc: beside another LLVM, OpenCL %s\n", failed ? "FAILED" : "refused with the reason");
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  atomic_ulong *calls = (atomic_ulong *)dlsym(RTLD_DEFAULT, "ab_test_shim_calls");
  if (calls == NULL) {
    fprintf(stderr, "replaced_malloc: the malloc shim is not preloaded (LD_PRELOAD): nothing to test\n");
    return 77;
  }
  if (argc > 1) return refused(argv[1], argc > 2 && strcmp(argv[2], "drivers-first") == 0);
  unsigned long before = atomic_load(calls);
  int n = ab_device_count(kDLOpenCL);
  const char *want = getenv("AB_TEST_EXPECT_OPENCL");
  int expect = want != NULL ? atoi(want) : 0;
  if (n < expect) {
    fprintf(stderr, "replaced_malloc: %d OpenCL devices, %d expected: %s\n", n, expect, ab_last_error());
    return 1;
  }
  if (n == 0) {
    fprintf(stderr, "replaced_malloc: SKIP: no OpenCL device (%s)\n", ab_last_error());
    return 77;
  }
  int failed = 0;
  for (int id = 0; id < n; id++) {
    float v[64];
    for (int k = 0; k < 64; k++) v[k] = (float)(k * 3 + id);
    int64_t shape[2] = {8, 8};
    DLTensor src = {v, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    DLManagedTensorVersioned *on = NULL, *back = NULL;
    if (ab_convert_memory(&src, (DLDevice){kDLOpenCL, id}, NULL, &on) != AB_OK ||
        ab_convert_memory(&on->dl_tensor, (DLDevice){kDLCPU, 0}, NULL, &back) != AB_OK) {
      fprintf(stderr, "replaced_malloc: opencl:%d round trip: %s\n", id, ab_last_error());
      failed++;
    } else if (memcmp(back->dl_tensor.data, v, sizeof v) != 0) {
      fprintf(stderr, "replaced_malloc: opencl:%d round trip changed the values\n", id);
      failed++;
    }
    if (back != NULL) back->deleter(back);
    if (on != NULL) on->deleter(on);
  }
  if (atomic_load(calls) == before) {
    fprintf(stderr, "replaced_malloc: the shim served no allocation: the test proved nothing\n");
    failed++;
  }
  printf("replaced_malloc: %d OpenCL devices, %s\n", n, failed ? "FAILED" : "all round trips passed");
  return failed ? 1 : 0;
}
