/* Thread stress, a plain program (no test framework, so it also runs under
 * ThreadSanitizer, where Criterion cannot start):
 *
 *   stress_threads [threads=4] [iterations=2000]
 *
 * N threads convert at once between every available device (cpu:0, each
 * OpenCL device, each CUDA GPU with pinned and managed memory) with mixed options (views, copies, strided sources, bad
 * inputs, AB_DEVICE_AUTO), while the host pool runs under a memory limit so
 * that the OOM sequence runs concurrently, with an OOM callback that
 * trims, and a monitor thread reads the host pool's statistics meanwhile.
 * Every result is checked against a reference gather. At the end
 * every pool must have nothing in use and, after a trim, nothing reserved.
 * Prints "N passed, M failed" and exits non-zero on any failure. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arraybridge/arraybridge.h"

static atomic_int failures, conversions, ooms;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      fprintf(stderr, __VA_ARGS__);       \
      fputc('\n', stderr);                \
      atomic_fetch_add(&failures, 1);     \
    }                                     \
  } while (0)

static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static void gather(const DLTensor *t, uint32_t *out) {
  int64_t n0 = t->shape[0], n1 = t->shape[1];
  const uint32_t *b = (const uint32_t *)((const char *)t->data + t->byte_offset);
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++) out[i * n1 + j] = b[i * t->strides[0] + j * t->strides[1]];
}

static size_t on_oom(DLDevice dev, size_t requested, void *user) {
  (void)requested;
  (void)user;
  ab_pool_trim(dev); /* what an application cache would do: give memory back */
  return 0;
}

struct worker {
  int id, iters;
};

enum { MAX_DEVS = 16 };

/* cpu:0 first, then every device the library sees. */
static int list_devices(DLDevice *devs) {
  int n = 0;
  devs[n++] = (DLDevice){kDLCPU, 0};
  for (int32_t i = 0; i < ab_device_count(kDLOpenCL) && n < MAX_DEVS; i++) devs[n++] = (DLDevice){kDLOpenCL, i};
  for (int32_t i = 0; i < ab_device_count(kDLCUDA) && n < MAX_DEVS; i++) devs[n++] = (DLDevice){kDLCUDA, i};
  if (ab_device_count(kDLCUDAHost) > 0 && n < MAX_DEVS) devs[n++] = (DLDevice){kDLCUDAHost, 0};
  if (ab_device_count(kDLCUDAManaged) > 0 && n < MAX_DEVS) devs[n++] = (DLDevice){kDLCUDAManaged, 0};
  return n;
}

static void *work(void *arg) {
  struct worker *w = arg;
  uint32_t seed = 0x9e3779b9u * (uint32_t)(w->id + 1);
  DLDevice devs[MAX_DEVS];
  const int ndev = list_devices(devs);

  for (int it = 0; it < w->iters; it++) {
    int64_t rows = 1 + rnd(&seed) % 40, cols = 1 + rnd(&seed) % 40;
    uint32_t *buf = malloc((size_t)(rows * cols) * 4), *want = malloc((size_t)(rows * cols) * 4);
    for (int64_t i = 0; i < rows * cols; i++) buf[i] = rnd(&seed);
    int transposed = rnd(&seed) & 1;
    int64_t shape[2] = {transposed ? cols : rows, transposed ? rows : cols};
    int64_t strides[2] = {transposed ? 1 : cols, transposed ? cols : 1};
    DLTensor src = {buf, {kDLCPU, 0}, 2, {kDLUInt, 32, 1}, shape, strides, 0};
    gather(&src, want);

    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.copy = (ab_copy_mode)(rnd(&seed) % 2);
    DLDevice there = devs[rnd(&seed) % ndev];
    if ((there.device_type == kDLOpenCL || there.device_type == kDLCUDA) && rnd(&seed) % 5 == 0)
      there.device_id = AB_DEVICE_AUTO;
    DLManagedTensorVersioned *a = NULL, *b = NULL;
    ab_status st = ab_convert_memory(&src, there, &o, &a);
    if (st == AB_OK) {
      DLDevice next = devs[rnd(&seed) % ndev];
      st = ab_convert_memory(&a->dl_tensor, next, NULL, &b);
      if (st == AB_OK) {
        DLManagedTensorVersioned *c = NULL;
        st = ab_convert_memory(&b->dl_tensor, (DLDevice){kDLCPU, 0}, NULL, &c);
        if (st == AB_OK) {
          uint32_t *got = malloc((size_t)(rows * cols) * 4);
          DLTensor ct = c->dl_tensor;
          int64_t cs[2] = {ct.strides ? ct.strides[0] : shape[1], ct.strides ? ct.strides[1] : 1};
          ct.strides = cs;
          gather(&ct, got);
          CHECK(memcmp(got, want, (size_t)(rows * cols) * 4) == 0, "thread %d iteration %d: wrong data", w->id, it);
          free(got);
          c->deleter(c);
        }
      }
    }
    if (st != AB_OK) {
      CHECK(st == AB_ERR_OUT_OF_MEMORY, "thread %d iteration %d: %s: %s", w->id, it, ab_status_name(st),
            ab_last_error());
      atomic_fetch_add(&ooms, 1);
    }
    if (b) b->deleter(b);
    if (a) a->deleter(a);

    /* a bad input now and then: must fail cleanly on this thread */
    if (rnd(&seed) % 16 == 0) {
      int64_t bad_shape[1] = {-1};
      DLTensor bad = {buf, {kDLCPU, 0}, 1, {kDLUInt, 32, 1}, bad_shape, NULL, 0};
      DLManagedTensorVersioned *r = (DLManagedTensorVersioned *)(uintptr_t)1;
      CHECK(ab_convert_memory(&bad, there, NULL, &r) == AB_ERR_INVALID_ARGUMENT && r == (void *)(uintptr_t)1,
            "thread %d: bad input not refused cleanly", w->id);
      CHECK(strstr(ab_last_error(), "shape") != NULL, "thread %d: message \"%s\"", w->id, ab_last_error());
    }
    free(buf);
    free(want);
    atomic_fetch_add(&conversions, 1);
  }
  return NULL;
}

static void check_pools_empty(void) {
  DLDevice devs[MAX_DEVS];
  const int ndev = list_devices(devs);
  for (int d = 0; d < ndev; d++) {
    struct ab_pool_stats s = {.size = sizeof s};
    CHECK(ab_pool_stats(devs[d], &s) == AB_OK, "stats: %s", ab_last_error());
    CHECK(s.in_use_bytes.current == 0, "%s:%d: %llu bytes still in use", ab_device_type_name(devs[d].device_type),
          (int)devs[d].device_id, (unsigned long long)s.in_use_bytes.current);
    CHECK(s.allocations == s.frees, "%s:%d: %llu allocations, %llu frees", ab_device_type_name(devs[d].device_type),
          (int)devs[d].device_id, (unsigned long long)s.allocations, (unsigned long long)s.frees);
    ab_pool_trim(devs[d]);
    CHECK(ab_pool_stats(devs[d], &s) == AB_OK && s.reserved_bytes.current == 0, "%s:%d: reserved after trim",
          ab_device_type_name(devs[d].device_type), (int)devs[d].device_id);
  }
}

/* Reads the host pool's statistics while the workers run: the summed
 * per-thread caches must always give a consistent picture. A read takes
 * every cache's lock, so it pauses between reads: a reader in a tight
 * loop starves the workers wherever threads do not run truly in parallel
 * (valgrind runs one at a time and hands a just-released lock straight
 * back to the thread that released it, so the run never ended there). */
static atomic_bool workers_done;
static void *monitor(void *arg) {
  (void)arg;
  const DLDevice cpu = {kDLCPU, 0};
  for (unsigned i = 0; !atomic_load(&workers_done); i++) {
    struct ab_pool_stats s = {.size = sizeof s};
    CHECK(ab_pool_stats(cpu, &s) == AB_OK, "monitor stats: %s", ab_last_error());
    CHECK(s.in_use_bytes.current <= s.reserved_bytes.current, "monitor: %llu bytes in use, %llu reserved",
          (unsigned long long)s.in_use_bytes.current, (unsigned long long)s.reserved_bytes.current);
    CHECK(s.in_use_bytes.peak >= s.in_use_bytes.current && s.requested_bytes.peak >= s.requested_bytes.current,
          "monitor: a peak under its current value");
    CHECK(s.frees <= s.allocations && s.allocations <= s.cache_hits + s.cache_misses,
          "monitor: %llu allocations, %llu frees, %llu hits, %llu misses", (unsigned long long)s.allocations,
          (unsigned long long)s.frees, (unsigned long long)s.cache_hits, (unsigned long long)s.cache_misses);
    if (i % 16 == 0) ab_pool_reset_peak(cpu);
    nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int nthreads = argc > 1 ? atoi(argv[1]) : 4, iters = argc > 2 ? atoi(argv[2]) : 2000;
  if (nthreads < 1 || nthreads > 64 || iters < 1) {
    fprintf(stderr, "usage: stress_threads [threads 1-64] [iterations]\n");
    return 2;
  }
  /* Small enough that 4 threads with staging buffers hit it now and then. */
  ab_set_memory_limit((DLDevice){kDLCPU, 0}, 16 << 10);
  ab_register_oom_callback(on_oom, NULL);
  pthread_t th[64];
  struct worker w[64];
  for (int i = 0; i < nthreads; i++) {
    w[i] = (struct worker){i, iters};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  pthread_t mon;
  pthread_create(&mon, NULL, monitor, NULL);
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  atomic_store(&workers_done, true);
  pthread_join(mon, NULL);
  struct ab_pool_stats host = {.size = sizeof host};
  ab_pool_stats((DLDevice){kDLCPU, 0}, &host);
  CHECK(host.oom_retries > 0, "the host pool's memory limit never came into play");
  CHECK(host.reserved_bytes.peak <= 16 << 10, "the host pool reserved %llu bytes, over its limit",
        (unsigned long long)host.reserved_bytes.peak);
  check_pools_empty();
  ab_unregister_oom_callback(on_oom, NULL);
  ab_shutdown();
  int f = atomic_load(&failures);
  printf("stress_threads: %d threads x %d iterations, %d OpenCL devices, %d CUDA devices; host pool: %llu OOM retries, %llu OOM "
         "failures (%d conversions refused)\n",
         nthreads, iters, ab_device_count(kDLOpenCL), ab_device_count(kDLCUDA), (unsigned long long)host.oom_retries,
         (unsigned long long)host.oom_failures, atomic_load(&ooms));
  printf("%d passed, %d failed\n", atomic_load(&conversions) - f, f);
  return f != 0;
}
