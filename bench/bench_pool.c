/* Pool benchmark: alloc + free latency of a pool hit against malloc/free
 * and against the raw backend allocation, at 256 B, 64 KiB, 4 MiB and
 * 256 MiB, on one thread and on two threads at once. Medians of several
 * runs; ratios against the baselines measured in the same run.
 *
 *   bench_pool [--quick]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#include "core.h"
#include "pool.h"

enum kind { POOL, TENSOR, MALLOC, RAW };
static const char *kind_name[] = {"pool hit (ab__pool_alloc+free)", "ab_tensor_alloc + deleter",
                                  "malloc + free", "raw backend alloc + free"};
static const DLDevice cpu = {kDLCPU, 0};

struct job {
  enum kind kind;
  size_t size;
  long iters;
  double ns; /* out: per alloc+free pair */
  unsigned sink; /* out: what was read, so that the reads stay */
};

/* Each thread reads into a local sum and stores it once at the end: a
 * shared `sink` written every iteration by both threads put one cache line
 * between the two cores, and the two-thread figures measured that line
 * (glibc malloc itself went from 7.6 to 21 ns per pair), not the pool. */
static volatile unsigned char sink;

static void *run(void *arg) {
  struct job *j = arg;
  const struct ab_backend *be = ab__backend_for(kDLCPU);
  int64_t shape[1] = {(int64_t)j->size};
  DLDataType u8 = {kDLUInt, 8, 1};
  unsigned acc = 0;
  double t0 = bench_now();
  for (long i = 0; i < j->iters; i++) {
    switch (j->kind) {
    case POOL: {
      ab__block *b;
      if (ab__pool_alloc(be, cpu, j->size, &b) != AB_OK) abort();
      acc += *(volatile unsigned char *)b->ptr;
      ab__pool_free(b);
      break;
    }
    case TENSOR: {
      DLManagedTensorVersioned *t;
      if (ab_tensor_alloc(cpu, 1, shape, u8, &t) != AB_OK) abort();
      acc += *(volatile unsigned char *)t->dl_tensor.data;
      t->deleter(t);
      break;
    }
    case MALLOC: {
      unsigned char *p = malloc(j->size);
      if (p == NULL) abort();
      ((volatile unsigned char *)p)[0] = 1; /* touch, as the others' first byte is readable */
      acc += ((volatile unsigned char *)p)[0];
      free(p);
      break;
    }
    case RAW: {
      void *p;
      if (ab__dev_alloc(be, 0, j->size, &p) != AB_OK) abort();
      ((volatile unsigned char *)p)[0] = 1;
      acc += ((volatile unsigned char *)p)[0];
      ab__dev_free(be, 0, p, j->size);
      break;
    }
    }
  }
  j->ns = (bench_now() - t0) / (double)j->iters * 1e9;
  j->sink = acc;
  return NULL;
}

/* Median ns per pair over `reps` runs with `threads` threads at once (the
 * per-thread figure; with no collapse it stays near the one-thread one). */
static double measure(enum kind k, size_t size, long iters, int threads, int reps) {
  double v[32];
  for (int r = 0; r < reps; r++) {
    struct job jobs[2];
    pthread_t th[2];
    for (int t = 0; t < threads; t++) {
      jobs[t] = (struct job){k, size, iters, 0};
      pthread_create(&th[t], NULL, run, &jobs[t]);
    }
    double sum = 0;
    for (int t = 0; t < threads; t++) {
      pthread_join(th[t], NULL);
      sum += jobs[t].ns;
      sink = (unsigned char)(sink + jobs[t].sink);
    }
    v[r] = sum / threads;
  }
  return bench_median(v, reps);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  int reps = quick ? 3 : 9;
  const size_t sizes[] = {256, 64 << 10, 4 << 20, (size_t)256 << 20};
  printf("arraybridge %s pool benchmark: cpu:0, ns per alloc+free pair, median of %d runs\n", ab_version_string(),
         reps);
  printf("(2 threads: per-thread figure while both run at once)\n\n");
  printf("%-10s %-8s %14s %14s %14s %14s %10s %10s\n", "size", "threads", "pool hit",
         "tensor", "malloc", "raw backend", "vs malloc", "vs raw");
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t size = sizes[s];
    /* Big blocks: the raw backend (and malloc above glibc's mmap
     * threshold, which grows up to 32 MiB: 256 MiB here) maps and faults
     * fresh pages every time, so fewer iterations. */
    long iters = size >= ((size_t)4 << 20) ? (quick ? 20 : 100) : (quick ? 20000 : 200000);
    for (int threads = 1; threads <= 2; threads++) {
      double pool = measure(POOL, size, iters * 10 > 2000000 ? 2000000 : iters * 10, threads, reps);
      double tensor = measure(TENSOR, size, iters * 10 > 2000000 ? 2000000 : iters * 10, threads, reps);
      double mal = measure(MALLOC, size, iters, threads, reps);
      double raw = measure(RAW, size, iters, threads, reps);
      char label[16];
      if (size >= (1u << 20)) snprintf(label, sizeof label, "%zu MiB", size >> 20);
      else if (size >= 1024) snprintf(label, sizeof label, "%zu KiB", size >> 10);
      else snprintf(label, sizeof label, "%zu B", size);
      printf("%-10s %-8d %14.1f %14.1f %14.1f %14.1f %9.1fx %9.1fx\n", label, threads, pool, tensor, mal, raw,
             mal / pool, raw / pool);
    }
    ab_pool_trim((DLDevice){kDLCPU, 0});
  }
  char summary[2048];
  ab_pool_summary(cpu, summary, sizeof summary);
  printf("\n%s", summary);
  return 0;
}
