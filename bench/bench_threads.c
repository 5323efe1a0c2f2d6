/* Large host moves on one thread and on all of them (src/parallel.c), in
 * the same run: a compact copy, a 2-D float32 transpose, a 2-D uint8
 * transpose of the same bytes and a float32 -> float16 cast, 256 KiB to
 * 64 MiB, each against single-thread memcpy of the same bytes. Prints the
 * best of 15 calls of ab_convert_memory (alloc + move + deleter from a
 * warm pool), calls back to back.
 *
 *   bench_threads            (AB_NUM_THREADS, else the online cores, for the "all" column) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arraybridge/arraybridge.h"
#include "parallel.h"

static volatile float sink; /* what the baselines read back */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double best_convert(const DLTensor *src, const ab_convert_opts *o) {
  double best = 1e30;
  for (int rep = 0; rep < 15; rep++) {
    DLManagedTensorVersioned *r;
    double t0 = now();
    if (ab_convert_memory(src, (DLDevice){kDLCPU, 0}, o, &r) != AB_OK) {
      fprintf(stderr, "bench_threads: %s\n", ab_last_error());
      exit(1);
    }
    double dt = now() - t0;
    r->deleter(r);
    if (dt < best) best = dt;
  }
  return best;
}

static void threads(const char *n) {
  if (n != NULL) setenv("AB_NUM_THREADS", n, 1);
  else unsetenv("AB_NUM_THREADS");
  ab__env_reload();
}

int main(void) {
  const char *given = getenv("AB_NUM_THREADS");
  char *keep = given ? strdup(given) : NULL;
  threads(keep);
  printf("arraybridge %s host moves on 1 and %d threads (AB_PARALLEL_MIN %zu bytes), best of 15\n\n",
         ab_version_string(), ab__num_threads(), ab__parallel_min());
  printf("%-8s %-11s %12s %12s %12s %10s %10s\n", "size", "move", "memcpy GB/s", "1 thr GB/s", "all GB/s",
         "all/1", "all/memcpy");
  for (int kb = 256; kb <= 64 << 10; kb *= 2) {
    const int64_t n = (int64_t)kb << 8; /* float32 elements */
    float *buf = malloc((size_t)n * 4), *dst = malloc((size_t)n * 4);
    if (buf == NULL || dst == NULL) return 1;
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(i % 1000) * 0.5f;
    double mc = 1e30;
    for (int rep = 0; rep < 15; rep++) {
      double t0 = now();
      memcpy(dst, buf, (size_t)n * 4);
      sink += dst[n / 2]; /* read, so that no compiler drops the copy (clang did) */
      double dt = now() - t0;
      if (dt < mc) mc = dt;
    }
    int64_t side = 1;
    while (side * side * 4 <= n) side *= 2; /* side x (n / side), near square */
    int64_t side8 = 1;
    while (side8 * side8 * 4 <= n * 4) side8 *= 2; /* the same bytes as uint8 */
    int64_t sh1[1] = {n}, sh2[2] = {side, n / side}, st2[2] = {1, side};
    int64_t sh8[2] = {side8, n * 4 / side8}, st8[2] = {1, side8};
    DLTensor c = {buf, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, sh1, NULL, 0};
    DLTensor t = {buf, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, sh2, st2, 0};
    DLTensor t8 = {buf, {kDLCPU, 0}, 2, {kDLUInt, 8, 1}, sh8, st8, 0};
    ab_convert_opts copy = AB_CONVERT_OPTS_INIT, half = AB_CONVERT_OPTS_INIT;
    copy.copy = AB_COPY_ALWAYS;
    half.dtype = (DLDataType){kDLFloat, 16, 1};
    const char *names[4] = {"copy", "transpose", "u8 transp.", "f32->f16"};
    const DLTensor *srcs[4] = {&c, &t, &t8, &c};
    const ab_convert_opts *opts[4] = {&copy, &copy, &copy, &half};
    for (int k = 0; k < 4; k++) {
      threads("1");
      double one = best_convert(srcs[k], opts[k]);
      threads(keep);
      double all = best_convert(srcs[k], opts[k]);
      const double bytes = (double)n * 4;
      printf("%5d KiB %-11s %12.2f %12.2f %12.2f %9.2fx %9.2fx\n", kb, names[k], bytes / mc / 1e9, bytes / one / 1e9,
             bytes / all / 1e9, one / all, mc / all);
    }
    free(buf);
    free(dst);
  }
  free(keep);
  return 0;
}
