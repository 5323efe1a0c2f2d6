/* Two copies of the shared library in one process (a plain program):
 *
 *   two_copies PATH-TO-A-SECOND-COPY-OF-libarraybridge.so
 *
 * This program links the library (copy A); it then dlopens a second file
 * of it (copy B) with RTLD_LOCAL, as a plugin that bundles its own
 * arraybridge would. Each copy has its own pools, devices and error
 * messages, and a function of B that calls another exported function
 * internally (ab_pool_summary calls ab_pool_stats; failures record
 * ab_last_error) must reach B's, not A's: ELF resolves a library's calls to
 * its own exported functions through the process's global scope first,
 * where A's come before B's, unless the library was linked to bind them to
 * itself (-Bsymbolic-functions). Bound to A, B's summary would report A's
 * pool (no allocation) and B's error message would land in A.
 * Prints "N passed, M failed". */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arraybridge/arraybridge.h"

typedef ab_status (*alloc_fn)(DLDevice, int32_t, const int64_t *, DLDataType, DLManagedTensorVersioned **);
typedef ab_status (*summary_fn)(DLDevice, char *, size_t);
typedef ab_status (*stats_fn)(DLDevice, struct ab_pool_stats *);
typedef const char *(*last_error_fn)(void);
typedef ab_status (*convert_fn)(const DLTensor *, DLDevice, const ab_convert_opts *, DLManagedTensorVersioned **);

static int failures, passes;

static void check(int ok, const char *what) {
  if (ok) passes++;
  else {
    failures++;
    fprintf(stderr, "two_copies: FAILED: %s\n", what);
  }
}

/* The number on the summary's "allocations" row; -1 if there is none. */
static long long allocations_in(const char *summary) {
  const char *row = strstr(summary, "allocations");
  if (row == NULL) return -1;
  return strtoll(row + strlen("allocations"), NULL, 10);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: two_copies PATH-TO-A-SECOND-COPY-OF-libarraybridge.so\n");
    return 2;
  }
  void *b = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (b == NULL) {
    fprintf(stderr, "two_copies: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  alloc_fn b_alloc = (alloc_fn)dlsym(b, "ab_tensor_alloc");
  summary_fn b_summary = (summary_fn)dlsym(b, "ab_pool_summary");
  stats_fn b_stats = (stats_fn)dlsym(b, "ab_pool_stats");
  last_error_fn b_last_error = (last_error_fn)dlsym(b, "ab_last_error");
  convert_fn b_convert = (convert_fn)dlsym(b, "ab_convert_memory");
  if (!b_alloc || !b_summary || !b_stats || !b_last_error || !b_convert) {
    fprintf(stderr, "two_copies: a symbol is missing from %s\n", argv[1]);
    return 1;
  }
  check((void *)b_stats != (void *)ab_pool_stats, "dlopen gave a second copy, not the linked one again");

  const DLDevice cpu = {kDLCPU, 0};
  const int64_t shape[1] = {1 << 20};
  DLManagedTensorVersioned *t = NULL;
  check(b_alloc(cpu, 1, shape, (DLDataType){kDLUInt, 8, 1}, &t) == AB_OK && t != NULL, "copy B allocates");

  struct ab_pool_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
  check(b_stats(cpu, &sb) == AB_OK && sb.allocations >= 1, "copy B's own stats count its allocation");
  ab_status st_a = ab_pool_stats(cpu, &sa);
  check(st_a != AB_OK || sa.allocations == 0, "copy A's pool saw nothing of copy B's allocation");

  char summary[2048] = "";
  check(b_summary(cpu, summary, sizeof summary) == AB_OK, "copy B summarises its pool");
  long long n = allocations_in(summary);
  if (n != (long long)sb.allocations)
    fprintf(stderr, "two_copies: copy B's summary says %lld allocations, its stats %" PRIu64 ":\n%s", n,
            sb.allocations, summary);
  check(n == (long long)sb.allocations, "copy B's summary reads copy B's pool (its internal calls bind to itself)");

  /* A failure inside B is reported by B. ab_pool_summary of a device
   * type that does not exist fails in its call to ab_pool_stats. */
  const DLDevice nowhere = {(DLDeviceType)12345, 0};
  ab_status st = b_summary(nowhere, summary, sizeof summary);
  const char *msg = b_last_error();
  check(st != AB_OK, "copy B refuses a device type that does not exist");
  check(msg != NULL && msg[0] != '\0', "copy B's ab_last_error holds the reason for its own failure");
  if (msg != NULL && msg[0] == '\0') fprintf(stderr, "two_copies: copy B's ab_last_error is empty\n");

  /* Tensors pass between the copies: B views and copies one of A's, and
   * each deleter returns its block to the pool of the copy that made it. */
  DLManagedTensorVersioned *ta = NULL, *view = NULL, *copy = NULL;
  const int64_t small[2] = {64, 48};
  check(ab_tensor_alloc(cpu, 2, small, (DLDataType){kDLFloat, 32, 1}, &ta) == AB_OK, "copy A allocates");
  if (ta != NULL) {
    float *px = ta->dl_tensor.data;
    for (int i = 0; i < 64 * 48; i++) px[i] = (float)i;
    ab_convert_opts copy_always = AB_CONVERT_OPTS_INIT;
    copy_always.copy = AB_COPY_ALWAYS;
    check(b_convert(&ta->dl_tensor, cpu, NULL, &view) == AB_OK && view != NULL &&
              view->dl_tensor.data == ta->dl_tensor.data,
          "copy B views copy A's tensor");
    check(b_convert(&ta->dl_tensor, cpu, &copy_always, &copy) == AB_OK && copy != NULL &&
              copy->dl_tensor.data != ta->dl_tensor.data &&
              memcmp(copy->dl_tensor.data, ta->dl_tensor.data, 64 * 48 * sizeof(float)) == 0,
          "copy B copies copy A's tensor");
    if (view != NULL) view->deleter(view);
    if (copy != NULL) copy->deleter(copy);
    ta->deleter(ta);
  }
  if (t != NULL) t->deleter(t);
  sa = (struct ab_pool_stats){.size = sizeof sa};
  sb = (struct ab_pool_stats){.size = sizeof sb};
  check(ab_pool_stats(cpu, &sa) == AB_OK && sa.allocations >= 1 && sa.frees == sa.allocations &&
            sa.in_use_bytes.current == 0,
        "copy A's pool has its tensor back");
  check(b_stats(cpu, &sb) == AB_OK && sb.allocations >= 2 && sb.frees == sb.allocations &&
            sb.in_use_bytes.current == 0,
        "copy B's pool has its tensors back");
  printf("%d passed, %d failed\n", passes, failures);
  /* B is left loaded: dlclose is unload's subject. */
  return failures ? 1 : 0;
}
