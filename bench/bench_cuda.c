/* CUDA transfer benchmark (needs a GPU; says SKIP and why without one).
 *
 * For H2D and D2H, from pinned and from pageable host memory, and D2D, at
 * 4 KiB .. 1 GiB, in one run:
 *   raw pinned    cudaMemcpyAsync from/to page-locked memory + sync: the ceiling
 *   raw pageable  cudaMemcpy from/to malloc'ed memory
 *   ours          ab_convert_memory on the same memory (result freed each
 *                 time, so the pools' reuse is part of what is timed)
 * Prints GB/s and the ratios the issue targets: ours pinned / raw pinned,
 * ours pageable / raw pinned, ours pageable / raw pageable.
 *
 * Usage: bench_cuda [max_MiB] (default 1024). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arraybridge/arraybridge.h"
#include "bench_util.h"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

enum op { RAW_PINNED_H2D, RAW_PAGE_H2D, OURS_PINNED_H2D, OURS_PAGE_H2D,
          RAW_PINNED_D2H, RAW_PAGE_D2H, OURS_PINNED_D2H, OURS_PAGE_D2H,
          RAW_D2D, OURS_D2D, NOPS };

static const char *names[NOPS] = {"raw pinned H2D", "raw pageable H2D", "ours pinned H2D", "ours pageable H2D",
                                  "raw pinned D2H", "raw pageable D2H", "ours pinned D2H", "ours pageable D2H",
                                  "raw D2D", "ours D2D"};

struct bufs {
  size_t n;
  void *pinned, *pageable, *dev, *dev2;
  cudaStream_t s;
};

static DLTensor tensor(void *data, DLDevice dev, int64_t *shape) {
  DLTensor t = {data, dev, 1, {kDLUInt, 8, 1}, shape, NULL, 0};
  return t;
}

static void convert(const DLTensor *src, DLDevice to, cudaStream_t s) {
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  o.stream = s;
  DLManagedTensorVersioned *r;
  ab_status st = ab_convert_memory(src, to, &o, &r);
  if (st != AB_OK) {
    fprintf(stderr, "ab_convert_memory: %s: %s\n", ab_status_name(st), ab_last_error());
    exit(1);
  }
  r->deleter(r);
}

static void run_op(enum op op, struct bufs *b) {
  int64_t shape[1] = {(int64_t)b->n};
  const DLDevice gpu = {kDLCUDA, 0}, pinned = {kDLCUDAHost, 0}, cpu = {kDLCPU, 0};
  DLTensor t;
  switch (op) {
  case RAW_PINNED_H2D:
    CK(cudaMemcpyAsync(b->dev, b->pinned, b->n, cudaMemcpyHostToDevice, b->s));
    CK(cudaStreamSynchronize(b->s));
    break;
  case RAW_PAGE_H2D: CK(cudaMemcpy(b->dev, b->pageable, b->n, cudaMemcpyHostToDevice)); break;
  case OURS_PINNED_H2D: t = tensor(b->pinned, pinned, shape); convert(&t, gpu, b->s); break;
  case OURS_PAGE_H2D: t = tensor(b->pageable, cpu, shape); convert(&t, gpu, b->s); break;
  case RAW_PINNED_D2H:
    CK(cudaMemcpyAsync(b->pinned, b->dev, b->n, cudaMemcpyDeviceToHost, b->s));
    CK(cudaStreamSynchronize(b->s));
    break;
  case RAW_PAGE_D2H: CK(cudaMemcpy(b->pageable, b->dev, b->n, cudaMemcpyDeviceToHost)); break;
  case OURS_PINNED_D2H: t = tensor(b->dev, gpu, shape); convert(&t, pinned, b->s); break;
  case OURS_PAGE_D2H: t = tensor(b->dev, gpu, shape); convert(&t, cpu, b->s); break;
  case RAW_D2D:
    CK(cudaMemcpyAsync(b->dev2, b->dev, b->n, cudaMemcpyDeviceToDevice, b->s));
    CK(cudaStreamSynchronize(b->s));
    break;
  case OURS_D2D: t = tensor(b->dev, gpu, shape); convert(&t, gpu, b->s); break;
  default: break;
  }
}

/* Median seconds of one op: warm-up, then repeats for ~0.2 s (3..200). */
static double time_op(enum op op, struct bufs *b) {
  double v[200];
  int reps = 0;
  run_op(op, b);
  double start = bench_now();
  while (reps < 200 && (reps < 3 || bench_now() - start < 0.2)) {
    double t0 = bench_now();
    run_op(op, b);
    v[reps++] = bench_now() - t0;
  }
  return bench_median(v, reps);
}

int main(int argc, char **argv) {
  size_t max_mib = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 1024;
  if (ab_device_count(kDLCUDA) == 0) {
    struct ab_device_info info;
    ab_device_info((DLDevice){kDLCUDA, 0}, &info);
    printf("SKIP: bench_cuda needs a CUDA device: %s\n", ab_last_error());
    return 0;
  }
  struct ab_device_info info;
  if (ab_device_info((DLDevice){kDLCUDA, 0}, &info) != AB_OK) return 1;
  printf("device: %s (sm_%d, %s), %.1f GiB free\n", info.name, info.compute_capability, info.pci_bus_id,
         (double)info.free_memory / (1 << 30));
  /* Up to a quarter of free memory per buffer: two device buffers plus the
   * library's results fit. */
  while (max_mib > 1 && ((uint64_t)max_mib << 20) * 4 > info.free_memory) max_mib /= 2;

  struct bufs b;
  size_t cap = max_mib << 20;
  CK(cudaStreamCreate(&b.s));
  CK(cudaHostAlloc(&b.pinned, cap, cudaHostAllocPortable));
  b.pageable = malloc(cap);
  if (b.pageable == NULL) return 1;
  memset(b.pageable, 1, cap); /* fault the pages in before timing */
  memset(b.pinned, 2, cap);
  CK(cudaMalloc(&b.dev, cap));
  CK(cudaMalloc(&b.dev2, cap));

  printf("%10s", "bytes");
  for (int op = 0; op < NOPS; op++) printf(" | %17s", names[op]);
  printf(" | pinned/raw | pageable/raw-pinned | pageable/raw-pageable (H2D; D2H)\n");
  for (size_t n = 4096; n <= cap; n *= 4) {
    double t[NOPS];
    b.n = n;
    for (int op = 0; op < NOPS; op++) t[op] = time_op((enum op)op, &b);
    printf("%10zu", n);
    for (int op = 0; op < NOPS; op++) printf(" | %12.2f GB/s", (double)n / t[op] / 1e9);
    printf(" | %.2f; %.2f | %.2f; %.2f | %.2f; %.2f\n", t[RAW_PINNED_H2D] / t[OURS_PINNED_H2D],
           t[RAW_PINNED_D2H] / t[OURS_PINNED_D2H], t[RAW_PINNED_H2D] / t[OURS_PAGE_H2D],
           t[RAW_PINNED_D2H] / t[OURS_PAGE_D2H], t[RAW_PAGE_H2D] / t[OURS_PAGE_H2D],
           t[RAW_PAGE_D2H] / t[OURS_PAGE_D2H]);
    if (n == cap) break;
    if (n * 4 > cap) n = cap / 4; /* end exactly at cap */
  }
  CK(cudaFree(b.dev));
  CK(cudaFree(b.dev2));
  CK(cudaFreeHost(b.pinned));
  free(b.pageable);
  CK(cudaStreamDestroy(b.s));
  ab_shutdown();
  return 0;
}
