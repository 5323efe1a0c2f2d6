/* The CUDA backend. Built wherever the toolkit is (CI has it, without a
 * GPU or driver): there the absence tests run for real and every device
 * test skips, saying why. On a machine with a GPU the same binary runs
 * them all. Built again as test_cuda_sim against simcuda (tests/simcuda),
 * a simulated runtime: there the device tests run too, except those of
 * the kernels, and AB_TEST_SIMCUDA adds the runtime-failure sweep. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef AB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core.h"
#include "internal.h"
#include "support.h"

#define CUDA(i) ((DLDevice){kDLCUDA, (i)})
#define PINNED ((DLDevice){kDLCUDAHost, 0})
#define MANAGED ((DLDevice){kDLCUDAManaged, 0})

static void need_devices(int n) {
#ifndef AB_HAVE_CUDA
  cr_skip_test("this build has no CUDA backend (toolkit not found at configure time)");
#endif
  need_devices_of(kDLCUDA, n);
}

/* The tests of work placed on the GPU: without the kernels (no nvcc at
 * configure time, or the simcuda build) the host's route does it. */
static void need_kernels(void) {
  need_devices(1);
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time, or the simcuda build)");
#endif
}

/* ---- without a device ------------------------------------------------- */

Test(cuda, no_device_means_zero_devices_and_the_runtime_reason) {
#ifndef AB_HAVE_CUDA
  cr_skip_test("this build has no CUDA backend (toolkit not found at configure time)");
#endif
  if (ab_device_count(kDLCUDA) > 0) cr_skip_test("a CUDA device is present: absence cannot be tested here");
  cr_assert_eq(ab_device_count(kDLCUDAHost), 0, "pinned memory without a device");
  cr_assert_eq(ab_device_count(kDLCUDAManaged), 0, "managed memory without a device");

  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  const DLDevice targets[] = {CUDA(0), CUDA(AB_DEVICE_AUTO), PINNED, MANAGED};
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    DLManagedTensorVersioned *r = (DLManagedTensorVersioned *)(uintptr_t)0x1;
    ab_status st = ab_convert_memory(&t, targets[i], NULL, &r);
    cr_assert_eq(st, AB_ERR_NO_DEVICE, "target %d:%d: %s", targets[i].device_type, (int)targets[i].device_id,
                 ab_status_name(st));
    cr_assert_eq((uintptr_t)r, 0x1, "out was written on failure");
    /* The message carries cudart's own words, so a user can tell "no
     * driver" from "no device". */
    cr_assert_not_null(strstr(ab_last_error(), "cudaGetDeviceCount"), "message: %s", ab_last_error());
    cr_assert_not_null(strstr(ab_last_error(), "cudaError"), "message: %s", ab_last_error());
  }
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CUDA(0), &info), AB_ERR_NO_DEVICE);
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(PINNED, 1, shape, dt(kDLFloat, 32, 1), &r), AB_ERR_NO_DEVICE);
  cr_assert_null(r);

  /* A source that claims to be on a missing GPU is refused before its data
   * pointer is looked at. */
  DLTensor g = {(void *)(uintptr_t)0xdead0000, CUDA(0), 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_convert_memory(&g, CPU0, NULL, &r), AB_ERR_NO_DEVICE);
  cr_assert_null(r);

  /* Host work is unaffected and leaves no CUDA error in the message. */
  r = convert_ok(&t, CPU0, AB_COPY_ALWAYS, NULL);
  cr_assert(memcmp(r->dl_tensor.data, x, sizeof x) == 0);
  r->deleter(r);
}

Test(cuda, three_memory_spaces_are_registered_under_one_family) {
#ifndef AB_HAVE_CUDA
  cr_skip_test("this build has no CUDA backend (toolkit not found at configure time)");
#else
  const struct ab_backend *d = ab__backend_for(kDLCUDA), *h = ab__backend_for(kDLCUDAHost),
                          *m = ab__backend_for(kDLCUDAManaged);
  cr_assert(d && h && m, "a CUDA memory space has no backend");
  cr_assert(ab__same_family(d, h) && ab__same_family(d, m), "a cudaStream_t must reach every CUDA space");
  cr_assert(!ab__same_family(d, ab__backend_for(kDLCPU)));
  cr_assert(h->caps & AB_CAP_HOST_ACCESSIBLE, "pinned memory is host memory");
  cr_assert(m->caps & AB_CAP_HOST_ACCESSIBLE, "managed memory is host-addressable");
  cr_assert(!(d->caps & AB_CAP_HOST_ACCESSIBLE), "device memory is not host memory");
#endif
}

/* ---- with a device -------------------------------------------------------- */

Test(cuda, device_info_names_the_gpu) {
  need_devices(1);
  for (int32_t i = 0; i < ab_device_count(kDLCUDA); i++) {
    struct ab_device_info info;
    cr_assert_eq(ab_device_info(CUDA(i), &info), AB_OK, "%s", ab_last_error());
    cr_assert_str_eq(info.backend, "cuda");
    cr_assert_neq(info.name[0], '\0');
    cr_assert_geq(info.compute_capability, 50, "compute capability %d", info.compute_capability);
    cr_assert_neq(info.pci_bus_id[0], '\0');
    cr_assert_gt(info.total_memory, 0);
    cr_assert_gt(info.free_memory, 0);
    cr_assert_leq(info.free_memory, info.total_memory);
    cr_assert_eq(info.host_accessible, 0);
  }
}

Test(cuda, best_device_is_the_gpu_with_most_free_memory) {
  need_devices(1);
  unsetenv("AB_DEFAULT_DEVICE");
  uint64_t most = 0;
  for (int32_t i = 0; i < ab_device_count(kDLCUDA); i++) {
    struct ab_device_info info;
    cr_assert_eq(ab_device_info(CUDA(i), &info), AB_OK, "%s", ab_last_error());
    if (info.free_memory > most) most = info.free_memory;
  }
  const DLDevice best = ab_best_device();
  cr_assert_eq(best.device_type, kDLCUDA, "a CUDA device exists but %s was chosen",
               ab_device_type_name(best.device_type));
  struct ab_device_info chosen;
  cr_assert_eq(ab_device_info(best, &chosen), AB_OK);
  cr_assert_eq(chosen.free_memory, most, "cuda:%d has %llu bytes free, another has %llu", (int)best.device_id,
               (unsigned long long)chosen.free_memory, (unsigned long long)most);
}

#ifdef AB_HAVE_CUDA
static int current_device(void) {
  int d = -1;
  cr_assert_eq(cudaGetDevice(&d), cudaSuccess);
  return d;
}
#endif

Test(cuda, same_device_view_and_copy) {
  need_devices(1);
  int32_t x[1000];
  int64_t shape[1] = {1000};
  fill_pattern(x, sizeof x, 3);
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *v = convert_ok(&g->dl_tensor, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(v->dl_tensor.data, g->dl_tensor.data, "same device, same dtype: a view");
  cr_assert_eq(v->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0);
  DLManagedTensorVersioned *c = convert_ok(&g->dl_tensor, CUDA(0), AB_COPY_ALWAYS, NULL);
  cr_assert_neq(c->dl_tensor.data, g->dl_tensor.data);
  g->deleter(g);
  DLManagedTensorVersioned *back = convert_ok(&c->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0);
  back->deleter(back);
  c->deleter(c);
  v->deleter(v);
  assert_pool_clean(CUDA(0));
}

Test(cuda, pinned_and_managed_memory_are_sources_and_targets) {
  need_devices(1);
  double x[777];
  int64_t shape[1] = {777};
  fill_pattern(x, sizeof x, 5);
  DLTensor h = {x, CPU0, 1, dt(kDLFloat, 64, 1), shape, NULL, 0};
  /* cpu -> pinned -> cuda -> managed -> cpu; pinned and managed data are
   * host pointers, checked directly. */
  DLManagedTensorVersioned *p = convert_ok(&h, PINNED, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(p->dl_tensor.data, x, sizeof x) == 0);
  DLManagedTensorVersioned *g = convert_ok(&p->dl_tensor, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *m = convert_ok(&g->dl_tensor, MANAGED, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(m->dl_tensor.data, x, sizeof x) == 0);
  DLManagedTensorVersioned *back = convert_ok(&m->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0);
  DLManagedTensorVersioned *g2 = convert_ok(&m->dl_tensor, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *p2 = convert_ok(&g2->dl_tensor, PINNED, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(p2->dl_tensor.data, x, sizeof x) == 0);
  DLManagedTensorVersioned *all[] = {p, g, m, back, g2, p2};
  for (int i = 0; i < 6; i++) all[i]->deleter(all[i]);
  assert_pool_clean(PINNED);
  assert_pool_clean(MANAGED);
  assert_pool_clean(CUDA(0));
}

Test(cuda, the_callers_current_device_and_stream_are_respected) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  const int n = ab_device_count(kDLCUDA);
  const int mine = n - 1;
  cr_assert_eq(cudaSetDevice(mine), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
  float x[256];
  int64_t shape[1] = {256};
  fill_pattern(x, sizeof x, 9);
  DLTensor h = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  for (int d = 0; d < n; d++) {
    /* On a one-device machine this still proves the stream path. */
    DLManagedTensorVersioned *g = convert_ok(&h, CUDA(d), AB_COPY_IF_NEEDED, d == mine ? (void *)s : NULL);
    cr_assert_eq(current_device(), mine, "the library left cuda:%d current", current_device());
    DLManagedTensorVersioned *back = convert_ok(&g->dl_tensor, CPU0, AB_COPY_IF_NEEDED, d == mine ? (void *)s : NULL);
    cr_assert_eq(current_device(), mine);
    cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0);
    back->deleter(back);
    g->deleter(g);
  }
  /* DLPack's stream values 1 (legacy default) and 2 (per-thread default). */
  for (uintptr_t v = 1; v <= 2; v++) {
    DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, (void *)v);
    DLManagedTensorVersioned *back = convert_ok(&g->dl_tensor, CPU0, AB_COPY_IF_NEEDED, (void *)v);
    cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0, "stream value %u", (unsigned)v);
    back->deleter(back);
    g->deleter(g);
  }
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
#endif
}

#ifdef AB_HAVE_CUDA
/* A stream held shut by a host function that spins until the test opens
 * it, or until `patience_ms` have passed (then by_watchdog is set): work
 * queued behind it cannot run, and a call that waits for that work
 * returns late instead of hanging. */
struct gate {
  atomic_bool opened, by_watchdog;
  int patience_ms;
};

static void CUDART_CB gate_fn(void *arg) {
  struct gate *g = arg;
  for (int ms = 0; ms < g->patience_ms && !atomic_load(&g->opened); ms += 1)
    nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
  if (!atomic_exchange(&g->opened, true)) atomic_store(&g->by_watchdog, true);
}

static void gate_close(struct gate *g, cudaStream_t s, int patience_ms) {
  atomic_store(&g->opened, false);
  atomic_store(&g->by_watchdog, false);
  g->patience_ms = patience_ms;
  cr_assert_eq(cudaLaunchHostFunc(s, gate_fn, g), cudaSuccess);
}
#endif

Test(cuda, an_early_return_leaves_the_work_queued_on_the_callers_stream) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s; /* non-blocking: work misplaced on the legacy stream is not ordered with it */
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float x[4096];
  int64_t shape[1] = {4096};
  fill_pattern(x, sizeof x, 12);
  DLTensor h = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *p = convert_ok(&h, PINNED, AB_COPY_IF_NEEDED, NULL);
  fill_pattern(x, sizeof x, 13); /* the bytes the sources get behind the gate */
  /* On the GPU: a copy between two host memories (pinned to pinned) would
   * be synchronous, and wait for the gate. */
  DLManagedTensorVersioned *fresh = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  o.flags = AB_CONVERT_ASYNC;
  o.stream = s;
  struct gate gt;
  gate_close(&gt, s, 20000);
  /* Queued behind the gate: both sources are overwritten. Work that went
   * on any stream but s would run first and see the old bytes. */
  cr_assert_eq(cudaMemcpyAsync(g->dl_tensor.data, fresh->dl_tensor.data, sizeof x, cudaMemcpyDefault, s), cudaSuccess);
  cr_assert_eq(cudaMemcpyAsync(p->dl_tensor.data, fresh->dl_tensor.data, sizeof x, cudaMemcpyDefault, s), cudaSuccess);
  DLManagedTensorVersioned *r[3] = {NULL, NULL, NULL};
  cr_assert_eq(ab_convert_memory(&g->dl_tensor, CUDA(0), &o, &r[0]), AB_OK, "device copy: %s", ab_last_error());
  cr_assert_eq(ab_convert_memory(&p->dl_tensor, CUDA(0), &o, &r[1]), AB_OK, "pinned upload: %s", ab_last_error());
  cr_assert_eq(ab_convert_memory(&g->dl_tensor, PINNED, &o, &r[2]), AB_OK, "pinned download: %s", ab_last_error());
  const cudaError_t q = cudaStreamQuery(s);
  atomic_store(&gt.opened, true);
  cr_assert_eq(ab_synchronize(CUDA(0), s), AB_OK, "%s", ab_last_error());
  cr_assert_not(atomic_load(&gt.by_watchdog), "a call with AB_CONVERT_ASYNC waited for its queued work");
  cr_assert_eq(q, cudaErrorNotReady, "the stream ran while the gate was shut: the test proves nothing");
  for (int i = 0; i < 2; i++) {
    DLManagedTensorVersioned *back = convert_ok(&r[i]->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0, "queued result %d is wrong", i);
    back->deleter(back);
  }
  cr_assert(memcmp(r[2]->dl_tensor.data, x, sizeof x) == 0, "the queued download is wrong");

  /* Into pageable memory the call completes before it returns, flag or
   * not: with the gate shut it returns only after the gate gives up. */
  gate_close(&gt, s, 200);
  DLManagedTensorVersioned *down = NULL;
  cr_assert_eq(ab_convert_memory(&g->dl_tensor, CPU0, &o, &down), AB_OK, "%s", ab_last_error());
  cr_assert(atomic_load(&gt.by_watchdog), "the pageable download returned before its stream ran");
  cr_assert(memcmp(down->dl_tensor.data, x, sizeof x) == 0);
  down->deleter(down);
  for (int i = 0; i < 3; i++) r[i]->deleter(r[i]);
  fresh->deleter(fresh);
  p->deleter(p);
  g->deleter(g);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  assert_pool_clean(CUDA(0));
  assert_pool_clean(PINNED);
#endif
}

Test(cuda, host_reads_of_pinned_and_managed_memory_wait_for_the_callers_stream) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int32_t x[2048];
  int64_t shape[1] = {2048};
  fill_pattern(x, sizeof x, 30);
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  const DLDevice spaces[] = {PINNED, MANAGED};
  for (int k = 0; k < 2; k++) {
    DLManagedTensorVersioned *old = NULL;
    fill_pattern(x, sizeof x, 31 + k);
    old = convert_ok(&h, spaces[k], AB_COPY_ALWAYS, NULL);
    /* The caller's stream is about to overwrite the memory with g's bytes
     * (held back by a gate); a host read on that stream must wait. */
    struct gate gt;
    gate_close(&gt, s, 300);
    cr_assert_eq(cudaMemcpyAsync(old->dl_tensor.data, g->dl_tensor.data, sizeof x, cudaMemcpyDefault, s), cudaSuccess);
    DLManagedTensorVersioned *back = convert_ok(&old->dl_tensor, CPU0, AB_COPY_ALWAYS, s);
    cr_assert(atomic_load(&gt.by_watchdog), "space %d: the host read did not wait for the stream", k);
    fill_pattern(x, sizeof x, 30);
    cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0, "space %d: read before the stream's copy ran", k);
    back->deleter(back);
    old->deleter(old);
  }
  g->deleter(g);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  assert_pool_clean(CUDA(0));
#endif
}

/* Without a stream, a host read of pinned or managed memory waits for the
 * legacy default stream, and so for the device's blocking streams: the
 * runtime documents that an operation issued to the legacy stream first
 * waits for all blocking streams, but says of cudaStreamSynchronize only
 * that it waits for the stream's own operations (simcuda takes that strict
 * reading), so the backend must issue something there and wait for it. */
Test(cuda, host_reads_without_a_stream_wait_for_blocking_streams) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess); /* blocking */
  int32_t x[2048];
  int64_t shape[1] = {2048};
  fill_pattern(x, sizeof x, 40);
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  const DLDevice spaces[] = {PINNED, MANAGED};
  for (int k = 0; k < 2; k++) {
    fill_pattern(x, sizeof x, 41 + k);
    DLManagedTensorVersioned *old = convert_ok(&h, spaces[k], AB_COPY_ALWAYS, NULL);
    struct gate gt;
    gate_close(&gt, s, 300);
    cr_assert_eq(cudaMemcpyAsync(old->dl_tensor.data, g->dl_tensor.data, sizeof x, cudaMemcpyDefault, s), cudaSuccess);
    DLManagedTensorVersioned *back = convert_ok(&old->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
    cr_assert(atomic_load(&gt.by_watchdog), "space %d: the host read did not wait for the blocking stream", k);
    fill_pattern(x, sizeof x, 40);
    cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0, "space %d: read before the blocking stream's copy ran", k);
    back->deleter(back);
    old->deleter(old);
  }
  g->deleter(g);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  assert_pool_clean(CUDA(0));
#endif
}

Test(cuda, a_crop_with_a_pitch_past_the_gpus_limit_is_copied_row_by_row) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  /* Rows of 100 bytes, cudaDevAttrMaxPitch + 4 KiB apart: more than
   * cudaMemcpy2DAsync takes, both for the download and the copy on the GPU. */
  int max = 0;
  cr_assert_eq(cudaDeviceGetAttribute(&max, cudaDevAttrMaxPitch, 0), cudaSuccess);
  const int64_t pitch = (int64_t)max + 4096, rows = 3, width = 100;
  int64_t span[1] = {2 * pitch + width};
  DLManagedTensorVersioned *big = NULL;
  ab_status st = ab_tensor_alloc(CUDA(0), 1, span, dt(kDLUInt, 8, 1), &big);
  if (st == AB_ERR_OUT_OF_MEMORY) cr_skip_test("cuda:0 cannot hold %lld bytes: %s", (long long)span[0], ab_last_error());
  cr_assert_eq(st, AB_OK, "%s", ab_last_error());
  unsigned char want[3][100];
  for (int r = 0; r < rows; r++) {
    fill_pattern(want[r], (size_t)width, 40 + r);
    cr_assert_eq(cudaMemcpy((char *)big->dl_tensor.data + r * pitch, want[r], (size_t)width, cudaMemcpyHostToDevice),
                 cudaSuccess);
  }
  int64_t shape[2] = {rows, width}, strides[2] = {pitch, 1};
  DLTensor crop = {big->dl_tensor.data, CUDA(0), 2, dt(kDLUInt, 8, 1), shape, strides, 0};
  DLManagedTensorVersioned *down = convert_ok(&crop, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(down->dl_tensor.data, want, sizeof want) == 0, "the download differs");
  DLManagedTensorVersioned *copy = convert_ok(&crop, CUDA(0), AB_COPY_ALWAYS, NULL);
  DLManagedTensorVersioned *back = convert_ok(&copy->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(back->dl_tensor.data, want, sizeof want) == 0, "the copy on the GPU differs");
  back->deleter(back);
  copy->deleter(copy);
  down->deleter(down);
  big->deleter(big);
  assert_pool_clean(CUDA(0));
#endif
}

Test(cuda, copies_between_two_gpus) {
  need_devices(2);
  int64_t shape[2] = {300, 301};
  uint8_t *x = malloc(300 * 301);
  fill_pattern(x, 300 * 301, 21);
  DLTensor h = {x, CPU0, 2, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *b = convert_ok(&a->dl_tensor, CUDA(1), AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(b->dl_tensor.device.device_id, 1);
  DLManagedTensorVersioned *back = convert_ok(&b->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(first_diff_vs_reference(&h, back), -1);
  /* A row-strided view on cuda:0 to cuda:1 (through the host). */
  int64_t vshape[2] = {100, 301}, vstrides[2] = {3 * 301, 1};
  DLTensor v = a->dl_tensor;
  v.shape = vshape;
  v.strides = vstrides;
  DLTensor hv = h;
  hv.shape = vshape;
  hv.strides = vstrides;
  DLManagedTensorVersioned *c = convert_ok(&v, CUDA(1), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *cb = convert_ok(&c->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(first_diff_vs_reference(&hv, cb), -1);
#ifdef AB_HAVE_CUDA
  /* On the caller's stream (non-blocking, on the target cuda:1, as the
   * header asks): the peer copy is ordered after the stream's own work,
   * which rewrites the source behind a gate; a copy on any other stream
   * would read the old bytes. */
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  uint8_t *y = malloc(300 * 301);
  fill_pattern(y, 300 * 301, 22);
  DLTensor hy = {y, CPU0, 2, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *fresh = convert_ok(&hy, PINNED, AB_COPY_ALWAYS, NULL);
  struct gate gt;
  gate_close(&gt, s, 300);
  cr_assert_eq(cudaMemcpyAsync(a->dl_tensor.data, fresh->dl_tensor.data, 300 * 301, cudaMemcpyDefault, s), cudaSuccess);
  DLManagedTensorVersioned *d = convert_ok(&a->dl_tensor, CUDA(1), AB_COPY_IF_NEEDED, s);
  cr_assert_eq(current_device(), 0);
  DLManagedTensorVersioned *db = convert_ok(&d->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(first_diff_vs_reference(&hy, db), -1, "the peer copy did not wait for the caller's stream");
  cr_assert(atomic_load(&gt.by_watchdog), "the gate opened early: the test proves nothing");
  DLManagedTensorVersioned *more[] = {fresh, d, db};
  for (int i = 0; i < 3; i++) more[i]->deleter(more[i]);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  free(y);
#endif
  DLManagedTensorVersioned *all[] = {a, b, back, c, cb};
  for (int i = 0; i < 5; i++) all[i]->deleter(all[i]);
  free(x);
  assert_pool_clean(CUDA(0));
  assert_pool_clean(CUDA(1));
}

/* The DLPack stream values 1 (legacy) and 2 (per-thread), and a stream of
 * the target: a peer copy must not read the source before the work queued
 * for it on the source GPU's legacy stream (here a rewrite held behind a
 * gate). cudaMemcpyPeerAsync alone is ordered only after the destination's
 * stream: with 1 and 2 it read the old bytes (review finding 7). */
Test(cuda, peer_copies_on_any_stream_wait_for_the_source_gpu) {
  need_devices(2);
#ifdef AB_HAVE_CUDA
  uint8_t x[8192], y[8192];
  int64_t shape[1] = {8192};
  fill_pattern(x, sizeof x, 50);
  fill_pattern(y, sizeof y, 51);
  DLTensor hx = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0}, hy = hx;
  hy.data = y;
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cudaStream_t mine;
  cr_assert_eq(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  void *const streams[] = {(void *)(uintptr_t)1, (void *)(uintptr_t)2, mine};
  for (int k = 0; k < 3; k++) {
    DLManagedTensorVersioned *src = convert_ok(&hx, CUDA(0), AB_COPY_ALWAYS, NULL);
    DLManagedTensorVersioned *fresh = convert_ok(&hy, CUDA(0), AB_COPY_ALWAYS, NULL);
    struct gate gt;
    gate_close(&gt, NULL, 300); /* cuda:0's legacy stream */
    cr_assert_eq(cudaMemcpyAsync(src->dl_tensor.data, fresh->dl_tensor.data, sizeof x, cudaMemcpyDefault, NULL),
                 cudaSuccess);
    DLManagedTensorVersioned *r = convert_ok(&src->dl_tensor, CUDA(1), AB_COPY_ALWAYS, streams[k]);
    cr_assert_eq(current_device(), 0);
    DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
    cr_assert(atomic_load(&gt.by_watchdog), "stream %d: the gate opened early: the test proves nothing", k);
    cr_assert_eq(first_diff_vs_reference(&hy, back), -1, "stream %d: the peer copy read the source too early", k);
    DLManagedTensorVersioned *all[] = {src, fresh, r, back};
    for (int i = 0; i < 4; i++) all[i]->deleter(all[i]);
  }
  cr_assert_eq(cudaStreamDestroy(mine), cudaSuccess);
  assert_pool_clean(CUDA(0));
  assert_pool_clean(CUDA(1));
#endif
}

/* The runtime's rule the peer-copy wait rests on (cudaStreamWaitEvent:
 * the wait is for the work the event captured when the wait was queued),
 * checked on the runtime itself: recording the event again afterwards, on
 * an idle stream, does not release the wait. */
Test(cuda, a_stream_wait_is_for_the_record_it_saw) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a, b, c;
  cr_assert_eq(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ev;
  cr_assert_eq(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  struct gate gt;
  gate_close(&gt, a, 20000);
  cr_assert_eq(cudaEventRecord(ev, a), cudaSuccess); /* behind the gate */
  cr_assert_eq(cudaStreamWaitEvent(c, ev, 0), cudaSuccess);
  cr_assert_eq(cudaEventRecord(ev, b), cudaSuccess); /* runs at once */
  cr_assert_eq(cudaStreamSynchronize(b), cudaSuccess);
  nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  cr_assert_eq(cudaStreamQuery(c), cudaErrorNotReady, "the wait was released by a later record");
  atomic_store(&gt.opened, true);
  cr_assert_eq(cudaStreamSynchronize(c), cudaSuccess);
  cr_assert(!atomic_load(&gt.by_watchdog));
  cr_assert_eq(cudaEventDestroy(ev), cudaSuccess);
  cudaStream_t all[] = {a, b, c};
  for (int i = 0; i < 3; i++) cr_assert_eq(cudaStreamDestroy(all[i]), cudaSuccess);
#endif
}

/* ab_synchronize(cuda:0, NULL) is documented to wait for the legacy stream
 * and so for the device's blocking streams; cudaStreamSynchronize(0) is
 * documented to wait only for the legacy stream's own work (finding 8). */
Test(cuda, synchronize_without_a_stream_waits_for_blocking_streams) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess); /* blocking */
  struct gate gt;
  gate_close(&gt, s, 300);
  cr_assert_eq(ab_synchronize(CUDA(0), NULL), AB_OK, "%s", ab_last_error());
  cr_assert(atomic_load(&gt.by_watchdog), "ab_synchronize returned before the blocking stream's work ran");
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
#endif
}

#ifdef AB_TEST_SIMCUDA
#include "simcuda/simcuda.h"

/* One compact cuda:0 -> cuda:1 conversion; the peer copies it made. */
static void one_peer_copy(long *direct, long *staged) {
  int64_t shape[1] = {4096};
  uint8_t *x = malloc(4096);
  fill_pattern(x, 4096, 5);
  DLTensor h = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  long d0, s0;
  simcuda_peer_copies(&d0, &s0);
  DLManagedTensorVersioned *b = convert_ok(&a->dl_tensor, CUDA(1), AB_COPY_IF_NEEDED, NULL);
  simcuda_peer_copies(direct, staged);
  *direct -= d0;
  *staged -= s0;
  DLManagedTensorVersioned *back = convert_ok(&b->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(first_diff_vs_reference(&h, back), -1);
  DLManagedTensorVersioned *all[] = {a, b, back};
  for (int i = 0; i < 3; i++) all[i]->deleter(all[i]);
  free(x);
}

/* ab_best_device (and cuda:auto) ranks GPUs by free memory, and
 * cudaMemGetInfo needs the GPU's primary context: the documented cost is
 * that context on every GPU, once (review finding 6), and no more: a
 * second call makes none, and nothing else in the ranking makes one. */
Test(cuda, best_device_costs_each_gpu_its_context_once) {
  need_devices(2);
  const int n = ab_device_count(kDLCUDA);
  int had = 0;
  for (int d = 0; d < n; d++) had += simcuda_context_active(d);
  long made0, info0, made1, info1, made2, info2;
  simcuda_contexts(&made0, &info0);
  const DLDevice b = ab_best_device();
  simcuda_contexts(&made1, &info1);
  cr_assert_eq(b.device_type, kDLCUDA);
  cr_assert_eq(made1 - made0, n - had, "%ld contexts made for %d GPUs, %d of which had one", made1 - made0, n, had);
  cr_assert_eq(info1 - info0, n, "%ld cudaMemGetInfo calls for %d GPUs", info1 - info0, n);
  for (int d = 0; d < n; d++) cr_assert(simcuda_context_active(d));
  const DLDevice again = ab_best_device();
  simcuda_contexts(&made2, &info2);
  cr_assert_eq(made2, made1, "a second ab_best_device made %ld contexts", made2 - made1);
  cr_assert_eq(again.device_id, b.device_id);
}

/* Where a GPU lacks concurrent managed access (WSL2, Windows), the CPU may
 * touch no managed memory while any GPU work is in flight, on any stream:
 * host code reads a managed source and writes a managed result only with
 * every GPU idle (review finding 12). A non-blocking stream, which neither
 * the legacy stream nor host reads otherwise wait for, is held behind a
 * gate with a copy into managed memory; reading that memory back, and
 * converting host data into a new managed result, must both wait. */
Test(cuda, without_concurrent_managed_access_host_code_waits_for_idle_gpus) {
  setenv("AB_SIMCUDA_CONCURRENT_MANAGED", "0", 1); /* read when simcuda starts, below */
  need_devices(1);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int32_t x[2048];
  int64_t shape[1] = {2048};
  fill_pattern(x, sizeof x, 70);
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  fill_pattern(x, sizeof x, 71);
  DLManagedTensorVersioned *m = convert_ok(&h, MANAGED, AB_COPY_ALWAYS, NULL);
  struct gate gt;
  gate_close(&gt, s, 300);
  cr_assert_eq(cudaMemcpyAsync(m->dl_tensor.data, g->dl_tensor.data, sizeof x, cudaMemcpyDefault, s), cudaSuccess);
  DLManagedTensorVersioned *back = convert_ok(&m->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
  cr_assert(atomic_load(&gt.by_watchdog), "a host read of managed memory ran while a GPU had work in flight");
  fill_pattern(x, sizeof x, 70);
  cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0, "read before the stream's copy ran");
  /* a write: host data into a new managed result while the gate (work of
   * the GPU's, touching no managed memory) holds the stream */
  gate_close(&gt, s, 300);
  DLManagedTensorVersioned *w = convert_ok(&h, MANAGED, AB_COPY_ALWAYS, NULL);
  cr_assert(atomic_load(&gt.by_watchdog), "host code wrote managed memory while a GPU had work in flight");
  DLManagedTensorVersioned *all[] = {g, m, back, w};
  for (int i = 0; i < 4; i++) all[i]->deleter(all[i]);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
}

/* simcuda counts a peer copy as direct only when the destination GPU was
 * given access to the source's memory: the backend must enable it, in the
 * right direction, from the right current device. */
/* ab_peer_access(cuda:from -> cuda:to): 0 or 1. */
static int peer_answer(int32_t from, int32_t to) {
  int can = -1;
  cr_assert_eq(ab_peer_access(CUDA(from), CUDA(to), &can), AB_OK, "%s", ab_last_error());
  return can;
}

Test(cuda, peer_copies_are_direct_where_the_gpus_allow_it) {
  need_devices(2);
  const char *mode = getenv("AB_SIMCUDA_PEER");
  const bool can = mode == NULL || strcmp(mode, "none") != 0; /* all, or pairs (0 and 1 are one) */
  cr_assert_eq(peer_answer(0, 1), can, "before the first copy");
  long direct, staged;
  one_peer_copy(&direct, &staged);
  cr_assert_eq(direct + staged, 1, "one peer copy, not %ld", direct + staged);
  cr_assert_eq(direct, can ? 1 : 0, "AB_SIMCUDA_PEER=%s: %ld direct, %ld staged", mode ? mode : "(all)", direct, staged);
  cr_assert_eq(peer_answer(0, 1), can, "after it");
}

/* one_peer_copy with cudaDeviceEnablePeerAccess failing once with e
 * (skipped where simcuda gives no pair peer access to enable). */
static void copy_with_enable_failing(cudaError_t e, long *direct, long *staged) {
  need_devices(2);
  const char *mode = getenv("AB_SIMCUDA_PEER");
  if (mode != NULL && strcmp(mode, "none") == 0) cr_skip_test("AB_SIMCUDA_PEER=none: no peer access to enable");
  simcuda_fail_call("cudaDeviceEnablePeerAccess", e);
  one_peer_copy(direct, staged);
}

/* ab_peer_access answers whether copies go directly, so a pair whose
 * enable was refused says 0 once the refusal is known (found by a probe
 * with eight GPUs: abtool info showed such pairs as P2P). */
Test(cuda, a_pair_refused_peer_access_is_not_reported_direct) {
  long direct, staged;
  copy_with_enable_failing(cudaErrorPeerAccessUnsupported, &direct, &staged);
  cr_assert_eq(staged, 1, "the copy was not staged: %ld direct, %ld staged", direct, staged);
  cr_assert_eq(peer_answer(0, 1), 0);
}

/* A failure to enable peer access that may pass is not kept for good: the
 * next copy asks again (a refusal is, as AB_CUDA_PEER=0 is). The runtime
 * API documents that cudaDeviceEnablePeerAccess "may also return error
 * codes from previous, asynchronous launches" (section 6.14): such an error
 * says nothing about the two GPUs. */
Test(cuda, a_transient_peer_enable_failure_is_tried_again) {
  long direct, staged;
  copy_with_enable_failing(cudaErrorLaunchOutOfResources, &direct, &staged);
  cr_assert_eq(simcuda_failures(), 1, "the enable was not asked");
  cr_assert_eq(staged, 1, "the first copy, without access, is staged");
  one_peer_copy(&direct, &staged);
  cr_assert_eq(direct, 1, "the second copy did not try again: %ld direct, %ld staged", direct, staged);
}

/* ab_synchronize without a stream records an event on the legacy stream
 * and waits for it; where the event cannot be made or recorded it fails,
 * but only after waiting for the stream's own work: a caller told of the
 * failure frees its buffers next (found by a threaded soak). */
Test(cuda, a_failed_synchronize_still_waits_for_the_stream) {
  need_devices(1);
#ifdef AB_HAVE_CUDA
  enum { N = 64, BYTES = 4096 };
  const char *calls[2] = {"cudaEventCreateWithFlags", "cudaEventRecord"};
  unsigned char *want = malloc(BYTES), *got = malloc((size_t)N * BYTES);
  cr_assert(want && got);
  fill_pattern(want, BYTES, 17);
  int64_t shape[1] = {BYTES};
  DLTensor h = {want, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  for (int k = 0; k < 2; k++) {
    memset(got, 0, (size_t)N * BYTES);
    /* copies queued on the legacy stream, into pageable memory: simcuda
     * runs them later, one after another */
    for (int i = 0; i < N; i++)
      cr_assert_eq(cudaMemcpyAsync(got + (size_t)i * BYTES, g->dl_tensor.data, BYTES, cudaMemcpyDeviceToHost, NULL),
                   cudaSuccess);
#ifdef AB_TEST_SIMCUDA
    simcuda_fail_call(calls[k], cudaErrorLaunchOutOfResources);
    cr_assert_eq(ab_synchronize(CUDA(0), NULL), AB_ERR_BACKEND, "%s", calls[k]);
    cr_assert_not_null(strstr(ab_last_error(), calls[k]), "%s", ab_last_error());
#else
    cr_assert_eq(ab_synchronize(CUDA(0), NULL), AB_OK, "%s", ab_last_error());
#endif
    for (int i = 0; i < N; i++)
      cr_assert(memcmp(got + (size_t)i * BYTES, want, BYTES) == 0, "%s failed: copy %d had not run", calls[k], i);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "an error was left behind");
  }
  g->deleter(g);
  free(want);
  free(got);
#endif
}

/* A sticky error (cudaErrorIllegalAddress: "any further CUDA work will
 * return the same error ... the process must be terminated and
 * relaunched") is reported, and from then on every CUDA device refuses
 * work at once, cached pool blocks included, while the host goes on. */
static void after_a_sticky_error(cudaError_t sticky) {
  need_devices(2);
  int64_t shape[1] = {4096};
  uint8_t *x = malloc(4096);
  fill_pattern(x, 4096, 9);
  DLTensor h = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL), *t, *r = SENTINEL_OUT;
  cr_assert_eq(ab_tensor_alloc(CUDA(1), 1, shape, dt(kDLUInt, 8, 1), &t), AB_OK);
  t->deleter(t); /* a cached block now waits in cuda:1's pool */

  simcuda_poison(sticky);
  cr_assert_eq(ab_convert_memory(&h, CUDA(0), NULL, &r), AB_ERR_BACKEND);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert(strstr(ab_last_error(), cudaGetErrorName(sticky)) != NULL, "%s", ab_last_error());
  /* cuda:1 did nothing wrong, but the process's CUDA is gone: its cached
   * block is not handed out as a fresh tensor. */
  cr_assert_eq(ab_tensor_alloc(CUDA(1), 1, shape, dt(kDLUInt, 8, 1), &r), AB_ERR_BACKEND);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert(strstr(ab_last_error(), "unusable") != NULL, "%s", ab_last_error());
  cr_assert_eq(ab_convert_memory(&a->dl_tensor, CPU0, NULL, &r), AB_ERR_BACKEND);
  cr_assert_eq(ab_convert_memory(&h, PINNED, NULL, &r), AB_ERR_BACKEND);
  cr_assert_eq(r, SENTINEL_OUT);
  /* The host is untouched. */
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(first_diff_vs_reference(&h, r), -1);
  r->deleter(r);
  a->deleter(a); /* its block goes back without a runtime call; no crash */
  free(x);
}

Test(cuda, after_a_sticky_error_no_cuda_device_is_used_again) { after_a_sticky_error(cudaErrorIllegalAddress); }

/* The first call to meet a sticky error may be the range check of a CUDA
 * source (cudaPointerGetAttributes): that is the process's CUDA gone, not
 * a tensor that is not CUDA memory, and it is recorded as sticky there. */
Test(cuda, a_sticky_error_met_by_the_range_check_is_no_invalid_tensor) {
  need_devices(1);
  int64_t shape[1] = {256};
  uint8_t x[256];
  fill_pattern(x, sizeof x, 3);
  DLTensor h = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL), *r = SENTINEL_OUT;
  simcuda_poison(cudaErrorIllegalAddress);
  cr_assert_eq(ab_convert_memory(&a->dl_tensor, CPU0, NULL, &r), AB_ERR_BACKEND, "%s", ab_last_error());
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "cudaErrorIllegalAddress"), "%s", ab_last_error());
  cr_assert_eq(ab_tensor_alloc(CUDA(0), 1, shape, dt(kDLUInt, 8, 1), &r), AB_ERR_BACKEND);
  cr_assert_not_null(strstr(ab_last_error(), "unusable"), "%s", ab_last_error());
  a->deleter(a);
}

/* The newer codes documented as needing a relaunch, by value as the
 * backend knows them: cudaErrorContained (226) is how Hopper GPUs report
 * a contained hardware error. */
Test(cuda, a_contained_hardware_error_is_sticky_too) {
  cr_assert_str_eq(cudaGetErrorName((cudaError_t)226), "cudaErrorContained");
  after_a_sticky_error((cudaError_t)226);
}

Test(cuda, AB_CUDA_PEER_off_keeps_peer_copies_staged) {
  need_devices(2);
  setenv("AB_CUDA_PEER", "off", 1);
  cr_assert_eq(peer_answer(0, 1), 0, "copies will be staged, not direct");
  long direct, staged;
  one_peer_copy(&direct, &staged);
  cr_assert_eq(direct, 0);
  cr_assert_eq(staged, 1);
  cr_assert_eq(peer_answer(0, 1), 0);
}
#endif

Test(cuda, memory_that_is_not_the_labelled_device_is_refused) {
  need_devices(1);
  float x[16] = {0};
  int64_t shape[1] = {16};
  /* A host array labelled as GPU memory. */
  DLTensor lie = {x, CUDA(0), 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_convert_memory(&lie, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_null(r);
  cr_assert_not_null(strstr(ab_last_error(), "not device memory"), "%s", ab_last_error());
  if (ab_device_count(kDLCUDA) >= 2) {
    DLTensor h = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
    DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
    DLTensor wrong = g->dl_tensor;
    wrong.device = CUDA(1);
    cr_assert_eq(ab_convert_memory(&wrong, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(ab_last_error(), "belongs to cuda:0"), "%s", ab_last_error());
    g->deleter(g);
  }
  {
    /* Device memory whose shape runs far past its allocation: an overrun,
     * not host memory to be labelled kDLCPU. */
    DLTensor h = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
    DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
    int64_t huge[1] = {(int64_t)1 << 40};
    DLTensor past = g->dl_tensor;
    past.shape = huge;
    cr_assert_eq(ab_convert_memory(&past, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
    cr_assert_null(r);
    /* on hardware the far address may be another GPU's memory: that is
     * said instead, and is no host memory either */
    cr_assert(strstr(ab_last_error(), "runs past its allocation") != NULL ||
                  strstr(ab_last_error(), "belongs to cuda:") != NULL,
              "%s", ab_last_error());
    cr_assert_null(strstr(ab_last_error(), "label it"), "%s", ab_last_error());
    g->deleter(g);
  }
  /* Device memory labelled as pinned or managed host memory: host code
   * would read (or write) it and fault; refused, source and target. */
  DLTensor h = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  const DLDeviceType spaces[] = {kDLCUDAHost, kDLCUDAManaged};
  for (int k = 0; k < 2; k++) {
    DLTensor wrong = g->dl_tensor;
    wrong.device = (DLDevice){spaces[k], 0};
    cr_assert_eq(ab_tensor_validate(&wrong), AB_ERR_INVALID_ARGUMENT, "%s", ab_last_error());
    ab_convert_opts always = AB_CONVERT_OPTS_INIT;
    always.copy = AB_COPY_ALWAYS;
    r = SENTINEL_OUT;
    cr_assert_eq(ab_convert_memory(&wrong, CPU0, &always, &r), AB_ERR_INVALID_ARGUMENT);
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "is device memory of cuda:0"), "%s", ab_last_error());
    cr_assert_eq(ab_convert_into(&h, &wrong, NULL), AB_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(ab_last_error(), "label it kDLCUDA"), "%s", ab_last_error());
  }
  g->deleter(g);
}

/* The elements a view `v` of a device copy of host memory addresses, as
 * the host sees them: want[k] is v's k-th in row-major order, read at the
 * same offsets from first_in_x, the host copy of v's first element. */
static void expect_from_view(const int32_t *first_in_x, const DLTensor *v, int32_t *want) {
  int64_t n = numel_of(v->ndim, v->shape), idx[4] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int32_t d = 0; d < v->ndim; d++) off += idx[d] * v->strides[d];
    want[k] = first_in_x[off];
    for (int32_t d = v->ndim - 1; d >= 0 && ++idx[d] == v->shape[d]; d--) idx[d] = 0;
  }
}

Test(cuda, a_view_whose_data_is_element_0_reads_below_it) {
  /* CuPy and the CUDA Array Interface give element 0's address as data,
   * with byte_offset 0: a reversed view (x[::-1, ::-1]) has all its other
   * elements below data. The view is device memory all the same. */
  need_devices(1);
  enum { H = 6, W = 7 };
  int32_t x[H * W], want[H * W], got[H * W];
  fill_pattern(x, sizeof x, 11);
  int64_t shape[2] = {H, W};
  DLTensor h = {x, CPU0, 2, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  int32_t *base = (int32_t *)((char *)g->dl_tensor.data + g->dl_tensor.byte_offset);
  int64_t flip[2] = {-W, -1}, col_shape[1] = {H}, col_stride[1] = {-W}, tshape[2] = {W, H}, tflip[2] = {-1, -W};
  DLTensor views[4] = {
    {base + H * W - 1, CUDA(0), 2, dt(kDLInt, 32, 1), shape, flip, 0},               /* x[::-1, ::-1] */
    {base + (H - 1) * W + 2, CUDA(0), 1, dt(kDLInt, 32, 1), col_shape, col_stride, 0}, /* x[::-1, 2] */
    {base + H * W - 1, CUDA(0), 2, dt(kDLInt, 32, 1), tshape, tflip, 0},              /* x[::-1, ::-1].T */
    {base, CUDA(0), 2, dt(kDLInt, 32, 1), shape, flip, (H * W - 1) * 4},             /* the same by byte_offset */
  };
  const int32_t *first_in_x[4] = {x + H * W - 1, x + (H - 1) * W + 2, x + H * W - 1, x + H * W - 1};
  DLDevice to[6] = {CPU0, CUDA(0), PINNED, MANAGED};
  int nto = 4;
  if (ab_device_count(kDLCUDA) >= 2) to[nto++] = CUDA(1);
  if (ab_device_count(kDLOpenCL) >= 1) to[nto++] = (DLDevice){kDLOpenCL, 0};
  for (int v = 0; v < 4; v++) {
    const DLTensor *f = &views[v];
    const int64_t n = numel_of(f->ndim, f->shape);
    expect_from_view(first_in_x[v], f, want);
    cr_assert_eq(ab_tensor_validate(f), AB_OK, "view %d: %s", v, ab_last_error());
    char plan[512];
    cr_assert_eq(ab_explain_convert(f, CPU0, NULL, plan, sizeof plan), AB_OK, "view %d: %s", v, ab_last_error());
    for (int k = 0; k < nto; k++) {
      DLManagedTensorVersioned *r = convert_ok(f, to[k], AB_COPY_ALWAYS, NULL);
      DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
      cr_assert(memcmp(back->dl_tensor.data, want, (size_t)n * 4) == 0, "view %d to %d:%d: wrong elements", v,
                to[k].device_type, (int)to[k].device_id);
      back->deleter(back);
      r->deleter(r);
    }
    /* cast on the way, and into the caller's memory */
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = dt(kDLFloat, 64, 1);
    DLManagedTensorVersioned *r = convert_ok_with(f, CPU0, &o);
    for (int64_t k = 0; k < n; k++)
      cr_assert_eq(((double *)r->dl_tensor.data)[k], (double)want[k], "view %d cast, element %lld", v, (long long)k);
    r->deleter(r);
    memset(got, 0, sizeof got);
    DLTensor into = {got, CPU0, f->ndim, dt(kDLInt, 32, 1), f->shape, NULL, 0};
    cr_assert_eq(ab_convert_into(f, &into, NULL), AB_OK, "view %d: %s", v, ab_last_error());
    cr_assert(memcmp(got, want, (size_t)n * 4) == 0, "view %d into host memory: wrong elements", v);
    /* a view of it on its own GPU stays the producer's view */
    ab_convert_opts vo = AB_CONVERT_OPTS_INIT;
    vo.flags = AB_CONVERT_ALLOW_STRIDED_VIEW;
    DLManagedTensorVersioned *same = convert_ok_with(f, CUDA(0), &vo);
    cr_assert_eq(same->dl_tensor.data, f->data);
    cr_assert_eq(same->dl_tensor.byte_offset, f->byte_offset);
    cr_assert_eq(same->dl_tensor.strides[0], f->strides[0]);
    cr_assert_eq(same->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0);
    same->deleter(same);
  }
  /* Strides that reach below the allocation are still refused, saying
   * from where they address. */
  int64_t two[1] = {2}, back1[1] = {-1};
  DLTensor under = {base, CUDA(0), 1, dt(kDLInt, 32, 1), two, back1, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&under, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "is cuda:0 memory, but the strides address from 4 bytes below it"), "%s",
                     ab_last_error());
  cr_assert_eq(ab_tensor_validate(&under), AB_ERR_INVALID_ARGUMENT);
#ifdef AB_TEST_SIMCUDA
  /* Rows reversed (row 1 at base, inside) and 4096 elements long, past
   * the allocation's end: the end is what is said, not "below". (simcuda
   * only: on a GPU the bytes past a small block may be another block's,
   * which cudart cannot tell apart.) */
  int64_t wide[2] = {2, 4096}, mixed[2] = {-W, 1};
  DLTensor over = {base + W, CUDA(0), 2, dt(kDLInt, 32, 1), wide, mixed, 0};
  cr_assert_eq(ab_tensor_validate(&over), AB_ERR_INVALID_ARGUMENT);
  cr_assert_null(strstr(ab_last_error(), "below"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "runs past its allocation"), "%s", ab_last_error());
#endif
  g->deleter(g);
  assert_pool_clean(CUDA(0));
}

Test(cuda, convert_into_refuses_gpu_memory_it_also_reads) {
  /* Pointers into one allocation at different addresses (CuPy slices of
   * one array) share bytes by address, as host memory does. */
  need_devices(1);
  int32_t x[64], got[64];
  fill_pattern(x, sizeof x, 5);
  int64_t shape[1] = {64}, half[1] = {32}, rev[1] = {-1};
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  int32_t *base = (int32_t *)((char *)g->dl_tensor.data + g->dl_tensor.byte_offset);
  DLTensor lo = {base, CUDA(0), 1, dt(kDLInt, 32, 1), half, NULL, 0};
  DLTensor mid = {base + 16, CUDA(0), 1, dt(kDLInt, 32, 1), half, NULL, 0};
  DLTensor hi = {base + 32, CUDA(0), 1, dt(kDLInt, 32, 1), half, NULL, 0};
  DLTensor lo_rev = {base + 31, CUDA(0), 1, dt(kDLInt, 32, 1), half, rev, 0};
  const DLTensor *pairs[3][2] = {{&lo, &mid}, {&mid, &lo}, {&lo_rev, &mid}};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ab_convert_into(pairs[k][0], pairs[k][1], NULL), AB_ERR_INVALID_ARGUMENT, "pair %d", k);
    cr_assert_not_null(strstr(ab_last_error(), "share memory"), "pair %d: %s", k, ab_last_error());
  }
  /* apart, in one allocation: copied */
  cr_assert_eq(ab_convert_into(&lo_rev, &hi, NULL), AB_OK, "%s", ab_last_error());
  DLTensor back = {got, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_convert_into(&g->dl_tensor, &back, NULL), AB_OK, "%s", ab_last_error());
  cr_assert(memcmp(got, x, 32 * 4) == 0, "the half read was changed");
  for (int i = 0; i < 32; i++) cr_assert_eq(got[32 + i], x[31 - i], "element %d", 32 + i);
  g->deleter(g);
}

#ifdef AB_HAVE_CUDA
struct fresh_thread_case {
  const DLTensor *t;
  bool validate_only; /* ab_tensor_validate, else a conversion to the host */
  ab_status st;
  int device_after;
  char msg[256];
};

/* Checks or converts c->t from a thread that never used CUDA. */
static void *on_a_fresh_thread(void *arg) {
  struct fresh_thread_case *c = arg;
  DLManagedTensorVersioned *r = NULL;
  c->st = c->validate_only ? ab_tensor_validate(c->t) : ab_convert_memory(c->t, CPU0, NULL, &r);
  snprintf(c->msg, sizeof c->msg, "%s", c->st == AB_OK ? "" : ab_last_error());
  if (r != NULL) r->deleter(r);
  c->device_after = -1;
  if (cudaGetDevice(&c->device_after) != cudaSuccess) c->device_after = -2;
  return NULL;
}

/* A process whose CUDA work so far is all on cuda:1 (torch.cuda.set_device(1)
 * on its main thread): its device memory as `label` says, with t's
 * elements, run through `c` on a worker thread, whose current device is 0
 * and has no context. Without one the runtime's pointer query says
 * cudaErrorInvalidValue for cuda:1's memory too (CuPy issue 3991). */
static void run_on_a_fresh_thread(DLDeviceType label, struct fresh_thread_case *c) {
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  int32_t x[256];
  int64_t shape[1] = {256};
  fill_pattern(x, sizeof x, 9);
  DLTensor h = {x, CPU0, 1, dt(kDLInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(1), AB_COPY_ALWAYS, NULL);
  DLTensor t = g->dl_tensor;
  t.device = (DLDevice){label, label == kDLCUDA ? 1 : 0};
#ifdef AB_TEST_SIMCUDA
  cr_assert(!simcuda_context_active(0), "the test's premise: nothing made a context on cuda:0");
#endif
  c->t = &t;
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, on_a_fresh_thread, c), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(c->device_after, 0, "the thread's current device was left at %d", c->device_after);
  g->deleter(g);
}

#endif

Test(cuda, a_thread_whose_current_gpu_has_no_context_still_knows_device_memory) {
  need_devices(2);
#ifdef AB_HAVE_CUDA
  struct fresh_thread_case c = {NULL, false, AB_ERR_BACKEND, -1, ""};
  run_on_a_fresh_thread(kDLCUDA, &c);
  cr_assert_eq(c.st, AB_OK, "%s", c.msg);
#endif
}

/* Device memory labelled pinned or managed would be read by host code (a
 * segmentation fault): refused on such a thread as on any other. */
static void refused_on_a_fresh_thread(DLDeviceType label, bool validate_only) {
  need_devices(2);
#ifdef AB_HAVE_CUDA
  struct fresh_thread_case c = {NULL, validate_only, AB_OK, -1, ""};
  run_on_a_fresh_thread(label, &c);
  cr_assert_eq(c.st, AB_ERR_INVALID_ARGUMENT, "%s", ab_status_name(c.st));
  cr_assert_not_null(strstr(c.msg, "is device memory of cuda:1"), "%s", c.msg);
#else
  (void)label, (void)validate_only;
#endif
}

Test(cuda, a_thread_whose_current_gpu_has_no_context_refuses_device_memory_labelled_managed) {
  refused_on_a_fresh_thread(kDLCUDAManaged, false);
}

Test(cuda, a_thread_whose_current_gpu_has_no_context_refuses_device_memory_labelled_pinned) {
  refused_on_a_fresh_thread(kDLCUDAHost, true);
}

Test(cuda, out_of_memory_is_reported_and_recovered_from) {
  need_devices(1);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CUDA(0), &info), AB_OK);
  /* More than the device has: cudaMalloc fails, the pool's retry runs, the
   * error names the device and sizes, and the next allocation works (the
   * runtime's error state was cleared). */
  int64_t shape[1] = {(int64_t)(info.total_memory * 2)};
  DLManagedTensorVersioned *r = NULL;
  ab_status st = ab_tensor_alloc(CUDA(0), 1, shape, dt(kDLUInt, 8, 1), &r);
  cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY, "%s: %s", ab_status_name(st), ab_last_error());
  cr_assert_null(r);
  cr_assert_not_null(strstr(ab_last_error(), "cuda:0"), "%s", ab_last_error());
  shape[0] = 4096;
  cr_assert_eq(ab_tensor_alloc(CUDA(0), 1, shape, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  /* A limit is honoured the same way. */
  cr_assert_eq(ab_set_memory_limit(CUDA(0), (size_t)1 << 20), AB_OK);
  shape[0] = (int64_t)4 << 20;
  cr_assert_eq(ab_tensor_alloc(CUDA(0), 1, shape, dt(kDLUInt, 8, 1), &r), AB_ERR_OUT_OF_MEMORY);
  cr_assert_eq(ab_set_memory_limit(CUDA(0), 0), AB_OK);
  assert_pool_clean(CUDA(0));
}

Test(cuda, cached_blocks_are_given_back_when_the_gpu_runs_out) {
  need_devices(1);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CUDA(0), &info), AB_OK, "%s", ab_last_error());
  /* 60% of the free memory, freed into the pool's cache, then 70%: the
   * device cannot hold both, so cudaMalloc fails until the pool releases
   * its cache and retries. */
  int64_t first[1] = {(int64_t)(info.free_memory / 10 * 6)}, second[1] = {(int64_t)(info.free_memory / 10 * 7)};
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  cr_assert_eq(ab_pool_stats(CUDA(0), &before), AB_OK);
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(CUDA(0), 1, first, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  cr_assert_eq(ab_tensor_alloc(CUDA(0), 1, second, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  cr_assert_eq(ab_pool_stats(CUDA(0), &after), AB_OK);
  cr_assert_gt(after.oom_retries, before.oom_retries, "the second allocation needed no retry: the test proves nothing");
  cr_assert_eq(after.oom_failures, before.oom_failures);
  assert_pool_clean(CUDA(0));
}

Test(cuda, auto_picks_an_existing_gpu) {
  need_devices(1);
  int64_t shape[1] = {10};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(CUDA(AB_DEVICE_AUTO), 1, shape, dt(kDLInt, 64, 1), &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(r->dl_tensor.device.device_type, kDLCUDA);
  cr_assert(r->dl_tensor.device.device_id >= 0 && r->dl_tensor.device.device_id < ab_device_count(kDLCUDA));
  r->deleter(r);
}

Test(cuda, to_and_from_opencl_through_the_host) {
  need_devices(1);
  if (ab_device_count(kDLOpenCL) < 1) cr_skip_test("needs an OpenCL device as well: %d", ab_device_count(kDLOpenCL));
  int16_t x[4000];
  int64_t shape[2] = {40, 100};
  fill_pattern(x, sizeof x, 13);
  DLTensor h = {x, CPU0, 2, dt(kDLInt, 16, 1), shape, NULL, 0};
  DLManagedTensorVersioned *g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *c = convert_ok(&g->dl_tensor, (DLDevice){kDLOpenCL, 0}, AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *g2 = convert_ok(&c->dl_tensor, CUDA(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *back = convert_ok(&g2->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert(memcmp(back->dl_tensor.data, x, sizeof x) == 0);
  DLManagedTensorVersioned *all[] = {g, c, g2, back};
  for (int i = 0; i < 4; i++) all[i]->deleter(all[i]);
}

/* ---- random routes ------------------------------------------------------------ */

#ifdef AB_HAVE_CUDA
/* A random view into a buffer of `cap` elements: 1- to 4-D, each axis 1 to
 * 9 long (now and then 0), strides a random order of the compact ones,
 * sometimes stepped or reversed, placed at a random offset. */
static void random_view(test_rng *rng, int32_t *ndim, int64_t *shape, int64_t *strides, uint64_t *offset_elems,
                        int64_t cap) {
  for (;;) {
    *ndim = (int32_t)rng_between(rng, 1, 4);
    for (int32_t i = 0; i < *ndim; i++) shape[i] = rng_between(rng, 0, 40) == 0 ? 0 : rng_between(rng, 1, 9);
    int32_t order[4] = {0, 1, 2, 3};
    for (int32_t i = *ndim - 1; i > 0; i--) {
      int32_t j = (int32_t)rng_between(rng, 0, i), t = order[i];
      order[i] = order[j], order[j] = t;
    }
    const int style = (int)rng_between(rng, 0, 3); /* compact, permuted, stepped, reversed */
    int64_t step = 1;
    for (int32_t k = *ndim - 1; k >= 0; k--) {
      const int32_t i = style == 0 ? k : order[k];
      int64_t m = style >= 2 && rng_between(rng, 0, 1) ? 2 : 1;
      strides[i] = step * m * (style == 3 && rng_between(rng, 0, 1) ? -1 : 1);
      step *= shape[i] * m + (style >= 2 ? rng_between(rng, 0, 2) : 0);
      if (step == 0) step = 1;
    }
    int64_t lo = 0, hi = 0;
    for (int32_t i = 0; i < *ndim; i++) {
      if (shape[i] == 0) continue;
      if (strides[i] < 0) lo += strides[i] * (shape[i] - 1);
      else hi += strides[i] * (shape[i] - 1);
    }
    if (hi - lo + 1 > cap) continue;
    *offset_elems = (uint64_t)(-lo + rng_between(rng, 0, cap - (hi - lo + 1)));
    return;
  }
}

#endif

Test(cuda, random_layouts_and_routes_match_the_host) {
  /* Every place a tensor can be (host, pinned, managed, each GPU, an OpenCL
   * device) to every other, random views and options: the result, brought
   * back to the host, equals the same conversion done on the host. */
  need_devices(1);
#ifdef AB_HAVE_CUDA
  enum { CAP = 6000 };
  const DLDataType types[] = {{kDLUInt, 8, 1}, {kDLInt, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1},
                              {kDLComplex, 64, 1}};
  DLDevice places[8] = {CPU0, PINNED, MANAGED};
  int nplaces = 3;
  for (int32_t i = 0; i < ab_device_count(kDLCUDA) && i < 2; i++) places[nplaces++] = CUDA(i);
  if (ab_device_count(kDLOpenCL) > 0) places[nplaces++] = (DLDevice){kDLOpenCL, 0};
  /* A caller's stream per GPU, used when the work runs on that GPU (the
   * target, or the source when the target is cpu), now and then with an
   * early return and the wait after. */
  cudaStream_t streams[2] = {NULL, NULL};
  for (int32_t i = 0; i < ab_device_count(kDLCUDA) && i < 2; i++) {
    cr_assert_eq(cudaSetDevice(i), cudaSuccess);
    cr_assert_eq(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), cudaSuccess);
  }
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  test_rng rng = {2026};
  int trials = 0, copies = 0, asked_early = 0;
  for (int trial = 0; trial < 400; trial++) {
    const DLDataType type = types[rng_between(&rng, 0, 4)];
    const size_t es = elsize_of(type);
    unsigned char *buf = malloc(CAP * es);
    cr_assert_not_null(buf);
    fill_pattern(buf, CAP * es, (uint32_t)trial + 1);
    int32_t ndim;
    int64_t shape[4], strides[4];
    uint64_t off;
    random_view(&rng, &ndim, shape, strides, &off, CAP);
    const DLDevice from = places[rng_between(&rng, 0, nplaces - 1)], to = places[rng_between(&rng, 0, nplaces - 1)];
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    int32_t perm[4];
    o.copy = rng_between(&rng, 0, 1) ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED;
    if (type.code != kDLComplex && rng_between(&rng, 0, 3) == 0) o.dtype = dt(kDLFloat, 32, 1);
    if (rng_between(&rng, 0, 3) == 0) {
      for (int32_t i = 0; i < ndim; i++) perm[i] = ndim - 1 - i;
      o.permute = perm;
    }
    DLTensor hv = {buf, CPU0, ndim, type, shape, strides, off * es};
    DLManagedTensorVersioned *want = NULL, *whole = NULL, *got = NULL, *back = NULL;
    cr_assert_eq(ab_convert_memory(&hv, CPU0, &o, &want), AB_OK, "trial %d reference: %s", trial, ab_last_error());
    /* The source: the whole buffer placed at `from`, viewed the same way. */
    int64_t all[1] = {CAP * (int64_t)es};
    DLTensor raw = {buf, CPU0, 1, dt(kDLUInt, 8, 1), all, NULL, 0};
    whole = convert_ok(&raw, from, AB_COPY_ALWAYS, NULL);
    DLTensor src = hv;
    src.data = whole->dl_tensor.data;
    src.device = whole->dl_tensor.device;
    /* The GPU the work runs on: the target, or the source when the target
     * is host memory (cpu, pinned or managed). */
    const bool to_host = to.device_type == kDLCPU || to.device_type == kDLCUDAHost ||
                         to.device_type == kDLCUDAManaged;
    int32_t gpu = to.device_type == kDLCUDA ? to.device_id
                  : to_host && from.device_type == kDLCUDA ? from.device_id : -1;
    if (gpu >= 0 && rng_between(&rng, 0, 1)) {
      o.stream = streams[gpu];
      if (rng_between(&rng, 0, 1)) o.flags |= AB_CONVERT_ASYNC;
    }
    ab_status st = ab_convert_memory(&src, to, &o, &got);
    cr_assert_eq(st, AB_OK, "trial %d: %s:%d -> %s:%d: %s (%s)", trial, ab_device_type_name(from.device_type),
                 (int)from.device_id, ab_device_type_name(to.device_type), (int)to.device_id, ab_status_name(st),
                 ab_last_error());
    if (o.flags & AB_CONVERT_ASYNC) {
      cr_assert_eq(ab_synchronize(CUDA(gpu), o.stream), AB_OK, "%s", ab_last_error());
      asked_early++;
    }
    cr_assert(got->dl_tensor.device.device_type == to.device_type && got->dl_tensor.device.device_id == to.device_id,
              "trial %d: the result is on %s:%d", trial, ab_device_type_name(got->dl_tensor.device.device_type),
              (int)got->dl_tensor.device.device_id);
    copies += (got->flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0;
    back = convert_ok(&got->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL); /* compact, on the host */
    const int64_t n = numel_of(want->dl_tensor.ndim, want->dl_tensor.shape);
    const size_t wes = elsize_of(want->dl_tensor.dtype);
    const DLDataType bt = back->dl_tensor.dtype, wt = want->dl_tensor.dtype;
    cr_assert(bt.code == wt.code && bt.bits == wt.bits && bt.lanes == wt.lanes, "trial %d: dtype", trial);
    cr_assert_eq(back->dl_tensor.ndim, want->dl_tensor.ndim, "trial %d", trial);
    for (int32_t i = 0; i < want->dl_tensor.ndim; i++)
      cr_assert_eq(back->dl_tensor.shape[i], want->dl_tensor.shape[i], "trial %d axis %d", trial, i);
    unsigned char *w = malloc((size_t)n * wes + 1);
    cr_assert_not_null(w);
    reference_gather(&want->dl_tensor, w);
    cr_assert(n == 0 || memcmp(back->dl_tensor.data, w, (size_t)n * wes) == 0,
              "trial %d: %s:%d -> %s:%d, %d-D, differs from the host's conversion", trial,
              ab_device_type_name(from.device_type), (int)from.device_id, ab_device_type_name(to.device_type),
              (int)to.device_id, (int)ndim);
    free(w);
    back->deleter(back);
    got->deleter(got);
    whole->deleter(whole);
    want->deleter(want);
    free(buf);
    trials++;
  }
  cr_assert_eq(trials, 400);
  cr_assert_gt(copies, 100, "hardly any copies: the test proves little");
  cr_assert_gt(asked_early, 10, "hardly any calls asked for an early return");
  for (int i = 0; i < 2; i++)
    if (streams[i] != NULL) cr_assert_eq(cudaStreamDestroy(streams[i]), cudaSuccess);
  for (int i = 0; i < nplaces; i++)
    if (places[i].device_type != kDLCPU) assert_pool_clean(places[i]);
#endif
}

/* ---- runtime failures (simcuda only) --------------------------------------- */

#ifdef AB_TEST_SIMCUDA
#include "simcuda/simcuda.h"

struct sim_case {
  const char *name;
  DLDevice make_on, to; /* the source is made on make_on from the host pattern */
  int view;             /* 0 compact, 1 a crop (rectangle), 2 a transpose */
  bool cast;            /* to float16, in axis order (1, 0) */
};

/* For n = 1, 2, ... the n-th runtime call of the conversion fails, until a
 * run makes fewer calls. Each run either fails with a status and a message
 * naming the runtime's error, *out untouched, or (the failure absorbed: a
 * pool's retry, an attribute with a fallback) gives the right data; either
 * way every pool is back where it was, the caller's device is current and
 * no runtime error is left for the caller. */
static int runtime_sweep(const struct sim_case *c, cudaError_t error) {
  enum { R = 96, C = 160 };
  static float host[R * C];
  fill_pattern(host, sizeof host, 77);
  int64_t whole[2] = {R, C}, crop[2] = {R / 2, C / 2}, crop_st[2] = {C, 1}, tr[2] = {C, R}, tr_st[2] = {1, C};
  DLTensor h = {host, CPU0, 2, dt(kDLFloat, 32, 1), whole, NULL, 0};
  DLManagedTensorVersioned *made = convert_ok(&h, c->make_on, AB_COPY_ALWAYS, NULL);
  DLTensor src = made->dl_tensor, ref = h;
  if (c->view == 1) src.shape = ref.shape = crop, src.strides = ref.strides = crop_st;
  if (c->view == 2) src.shape = ref.shape = tr, src.strides = ref.strides = tr_st;
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  static const int32_t perm[2] = {1, 0};
  o.copy = AB_COPY_ALWAYS;
  if (c->cast) o.dtype = dt(kDLFloat, 16, 1), o.permute = perm;
  DLManagedTensorVersioned *want = NULL;
  cr_assert_eq(ab_convert_memory(&ref, CPU0, &o, &want), AB_OK, "%s", ab_last_error());
  const size_t bytes = (size_t)numel_of(want->dl_tensor.ndim, want->dl_tensor.shape) * (c->cast ? 2 : 4);

  const DLDevice spaces[] = {CPU0, CUDA(0), CUDA(1), PINNED, MANAGED};
  uint64_t before[5];
  for (int k = 0; k < 5; k++) before[k] = pool_in_use(spaces[k]);
  const long live = ab__alloc_live_settled();
  int n = 1, failed_runs = 0;
  for (;; n++) {
    cr_assert_lt(n, 400, "%s: the sweep does not end", c->name);
    DLManagedTensorVersioned *out = (DLManagedTensorVersioned *)(uintptr_t)0x7;
    simcuda_fail_nth(n, error);
    ab_status st = ab_convert_memory(&src, c->to, &o, &out);
    const long hit = simcuda_failures();
    const char *call = simcuda_failed_call();
    simcuda_fail_nth(0, cudaSuccess);
    const cudaError_t left = cudaGetLastError();
    cr_assert_eq(left, cudaSuccess, "%s, call %d (%s): %s left for the caller", c->name, n, call,
                 cudaGetErrorName(left));
    if (strcmp(call, "cudaSetDevice") == 0 && current_device() != 0) {
      /* The restore itself failed (logged): nothing else could be done. */
      cr_assert_eq(cudaSetDevice(0), cudaSuccess);
    }
    cr_assert_eq(current_device(), 0, "%s, call %d (%s): the caller's device changed", c->name, n, call);
    if (st == AB_OK) {
      DLManagedTensorVersioned *got = convert_ok(&out->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
      cr_assert(memcmp(got->dl_tensor.data, want->dl_tensor.data, bytes) == 0, "%s, call %d (%s): wrong data", c->name, n,
                call);
      got->deleter(got);
      out->deleter(out);
    } else {
      cr_assert(hit, "%s, call %d: %s without a failure: %s", c->name, n, ab_status_name(st), ab_last_error());
      cr_assert_eq((uintptr_t)out, 0x7, "%s, call %d (%s): *out written", c->name, n, call);
      cr_assert_not_null(strstr(ab_last_error(), cudaGetErrorName(error)), "%s, call %d (%s): %s", c->name, n,
                         call, ab_last_error());
      /* the runtime failed, not the caller: never the caller's tensor */
      cr_assert_neq(st, AB_ERR_INVALID_ARGUMENT, "%s, call %d (%s): blamed on the caller: %s", c->name, n, call,
                    ab_last_error());
      failed_runs++;
    }
    for (int k = 0; k < 5; k++)
      cr_assert_eq(pool_in_use(spaces[k]), before[k], "%s, call %d (%s): %s:%d blocks kept", c->name, n, call,
                   ab_device_type_name(spaces[k].device_type), (int)spaces[k].device_id);
    cr_assert_eq(ab__alloc_live_settled(), live, "%s, call %d (%s): host blocks leaked", c->name, n, call);
    if (!hit) break;
  }
  cr_assert_gt(failed_runs, 0, "%s: no runtime failure was reported", c->name);
  want->deleter(want);
  made->deleter(made);
  return n - 1;
}

/* A copy to cuda:1 on a stream of cuda:1, the caller on cuda:1: the copy
 * first waits for cuda:0 from cuda:0. Whichever call fails, the caller is
 * on cuda:1 afterwards, unless the failed call was the library's last, a
 * cudaSetDevice back to it (logged; nothing more can be done). A failed
 * switch back from cuda:0 in that wait left the caller on cuda:0. */
Test(cuda, a_failed_peer_wait_leaves_the_callers_device_current) {
  need_devices(2);
  static uint8_t x[8192];
  int64_t shape[1] = {sizeof x};
  DLTensor h = {x, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *src = convert_ok(&h, CUDA(0), AB_COPY_ALWAYS, NULL);
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  o.stream = s;
  int failed_runs = 0;
  for (long n = 1;; n++) {
    cr_assert_lt(n, 200, "the sweep does not end");
    cr_assert_eq(cudaSetDevice(1), cudaSuccess);
    DLManagedTensorVersioned *out = NULL;
    simcuda_fail_nth(n, cudaErrorNotSupported);
    const ab_status st = ab_convert_memory(&src->dl_tensor, CUDA(1), &o, &out);
    const long hit = simcuda_failures(), calls = simcuda_calls();
    const char *call = simcuda_failed_call();
    simcuda_fail_nth(0, cudaSuccess);
    (void)cudaGetLastError();
    const bool last_restore = hit && n == calls && strcmp(call, "cudaSetDevice") == 0;
    cr_assert(current_device() == 1 || last_restore, "call %ld (%s of %ld): cuda:%d left current", n, call, calls,
              current_device());
    if (st == AB_OK) out->deleter(out);
    else failed_runs++;
    if (!hit) break;
  }
  cr_assert_gt(failed_runs, 0);
  cr_assert_eq(cudaSetDevice(1), cudaSuccess);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  src->deleter(src);
}

Test(cuda, every_runtime_failure_is_reported_and_cleaned_up) {
  need_devices(2);
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  const struct sim_case cases[] = {
    {"cpu -> cuda:0", CPU0, CUDA(0), 0, false},
    {"cpu crop -> cuda:0", CPU0, CUDA(0), 1, false},
    {"cuda:0 -> cpu", CUDA(0), CPU0, 0, false},
    {"cuda:0 crop -> cpu", CUDA(0), CPU0, 1, false},
    {"cuda:0 transpose -> cpu", CUDA(0), CPU0, 2, false},
    {"pinned -> cuda:0", PINNED, CUDA(0), 0, false},
    {"cuda:0 -> managed", CUDA(0), MANAGED, 0, false},
    {"cuda:0 -> cuda:0", CUDA(0), CUDA(0), 0, false},
    {"cuda:0 crop -> cuda:0", CUDA(0), CUDA(0), 1, false},
    {"cuda:0 -> cuda:1", CUDA(0), CUDA(1), 0, false},
    {"cuda:0 transpose -> cuda:1", CUDA(0), CUDA(1), 2, false},
    {"cuda:0 -> cuda:0 as float16, transposed", CUDA(0), CUDA(0), 0, true},
    {"cpu -> cuda:1 as float16, transposed", CPU0, CUDA(1), 0, true},
  };
  /* Errors a call can return without ruining the context (sticky errors
   * leave nothing to recover). */
  const cudaError_t errors[] = {cudaErrorNotSupported, cudaErrorMemoryAllocation};
  for (size_t e = 0; e < 2; e++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const int calls = runtime_sweep(&cases[i], errors[e]);
      cr_log_info("%s (%s): %d runtime calls", cases[i].name, cudaGetErrorName(errors[e]), calls);
    }
  assert_pool_clean(CUDA(0));
  assert_pool_clean(CUDA(1));
}
#endif

/* ---- the gather kernel's mapping, on the host ---------------------------- */

#ifdef AB_HAVE_CUDA_KERNELS
#include "converters/cuda/convert.h"
#include "converters/cuda/gather.h"
#include "converters/host/gather.h"
#include "element.h"

/* Runs the kernel's per-element mapping (ab__cuda_gather_emulate, the same
 * code nvcc compiles for the device) over a host tensor, after the dim
 * merge the backend does, and compares with the reference gather. */
static void check_emulated(const DLTensor *t, const char *what) {
  const size_t es = elsize_of(t->dtype);
  const int64_t n = numel_of(t->ndim, t->shape);
  int64_t bytes[AB_MAX_NDIM], shape[AB_MAX_NDIM], stride[AB_MAX_NDIM];
  for (int32_t i = 0; i < t->ndim; i++) bytes[i] = t->shape[i] == 1 ? 0 : t->strides[i] * (int64_t)es;
  int nd = ab__merge_dims(t->ndim, t->shape, bytes, shape, stride);
  unsigned char *want = malloc((size_t)n * es + 1), *got = malloc((size_t)n * es + 1);
  reference_gather(t, want);
  memset(got, 0xab, (size_t)n * es);
  ab__cuda_gather_emulate(got, (const char *)t->data + t->byte_offset, nd, shape, stride, es);
  cr_assert(memcmp(got, want, (size_t)n * es) == 0, "%s: the kernel's mapping differs from the reference", what);
  free(want);
  free(got);
}
#endif

Test(cuda, gather_kernel_mapping_matches_the_reference) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  static unsigned char buf[1 << 16];
  fill_pattern(buf, sizeof buf, 77);
  /* element sizes 1, 2, 3 (u8 x3), 4, 8, 16 (f64 x2) */
  const DLDataType types[] = {dt(kDLUInt, 8, 1), dt(kDLInt, 16, 1), dt(kDLUInt, 8, 3),
                              dt(kDLFloat, 32, 1), dt(kDLFloat, 64, 1), dt(kDLFloat, 64, 2)};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    char what[96];
    int64_t e = (int64_t)elsize_of(types[k]);
    /* transpose of 13 x 17 */
    int64_t s2[2] = {17, 13}, t2[2] = {1, 17};
    DLTensor t = {buf, CPU0, 2, types[k], s2, t2, 0};
    snprintf(what, sizeof what, "transpose, elsize %lld", (long long)e);
    check_emulated(&t, what);
    /* odd byte offset: forces the narrowest words */
    t.byte_offset = 1;
    snprintf(what, sizeof what, "transpose at byte 1, elsize %lld", (long long)e);
    check_emulated(&t, what);
    /* negative strides (flip both axes), starting at the last element */
    int64_t n2[2] = {-1, -17};
    t.strides = n2;
    t.byte_offset = (uint64_t)((12 * 17 + 16) * e);
    snprintf(what, sizeof what, "flipped, elsize %lld", (long long)e);
    check_emulated(&t, what);
    /* broadcast middle dim, 4-D with a size-1 dim and a channel slice */
    int64_t s4[4] = {3, 5, 1, 2}, t4[4] = {40, 0, 999, 3};
    DLTensor b = {buf, CPU0, 4, types[k], s4, t4, (uint64_t)(2 * e)};
    snprintf(what, sizeof what, "broadcast 4-D, elsize %lld", (long long)e);
    check_emulated(&b, what);
  }
  /* bad arguments queue nothing and say so */
  int64_t one = 1, zero = 0;
  cr_assert_eq(ab__cuda_gather(buf, buf, AB_CUDA_GATHER_MAX_DIMS + 1, &one, &zero, 1, NULL), cudaErrorInvalidValue);
  cr_assert_eq(ab__cuda_gather(buf, buf, 1, &one, &zero, 0, NULL), cudaErrorInvalidValue);
#endif
}

/* ---- conversions on the device (converters/cuda/convert.cu) -------------- */

static const DLDataType conv_from[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1},   {kDLUInt, 16, 1},  {kDLInt, 16, 1},
                                       {kDLBool, 8, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
static const double conv_scale[4] = {1 / 58.395, 1 / 57.12, 1 / 57.375, 3.0}, conv_off[4] = {-2.1, -2.03, -1.8, 0.5};

/* A random conversion of trial `trial` of source dtype `from`: shape (2- to
 * 5-D), axis order, and none / per-tensor / per-channel affine. */
static void conv_case(test_rng *rng, int trial, int32_t *ndim, int64_t *shape, int32_t *perm, ab_convert_opts *o) {
  *ndim = 2 + trial % 4;
  for (int32_t i = 0; i < *ndim; i++) {
    shape[i] = rng_between(rng, 1, *ndim > 3 ? 5 : 17);
    perm[i] = (i + 1 + trial) % *ndim; /* a rotation by trial + 1 (not the identity for the trials used) */
  }
  int32_t chan = (int32_t)rng_between(rng, 0, *ndim - 1);
  shape[chan] = rng_between(rng, 1, 4);
  *o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o->dtype = dt(kDLFloat, 32, 1);
  o->permute = perm;
  if (trial % 3 == 1) {
    o->flags = AB_CONVERT_AFFINE;
    o->scale = 1.0 / 255.0;
    o->offset = -0.5;
  } else if (trial % 3 == 2) {
    o->flags = AB_CONVERT_PER_CHANNEL;
    o->channel_axis = chan;
    o->channel_scale = conv_scale;
    o->channel_offset = trial % 2 ? conv_off : NULL;
  }
}

/* Random bits with float edge values sprinkled in. */
static void conv_fill(void *v, int64_t n, DLDataType d, test_rng *rng) {
  fill_pattern(v, (size_t)n * (d.bits / 8u), (uint32_t)rng_next(rng));
  if (d.code == kDLFloat && d.bits == 32) {
    static const uint32_t edge[] = {0x7fc00000u, 0xff800000u, 0x7f800000u, 0x80000000u, 0, 1, 0x807fffffu, 0x7f7fffffu};
    for (int64_t i = 0; i < n && i < 8; i++) memcpy((char *)v + (i * 7 % n) * 4, &edge[i], 4);
  } else if (d.bits == 16 && (d.code == kDLFloat || d.code == kDLBfloat)) {
    static const uint16_t edge[] = {0x7e00, 0xfc00, 0x7c00, 0x8000, 0, 1, 0x83ff, 0x7bff, 0x0200, 0x7f80};
    for (int64_t i = 0; i < n && i < 10; i++) memcpy((char *)v + (i * 7 % n) * 2, &edge[i], 2);
  }
}

#ifdef AB_HAVE_CUDA_KERNELS
/* The args the core builds for a compact source of dtype `from` converted
 * as `o` says (permute, affine, per-channel). */
static void compact_args(int32_t ndim, const int64_t *shape, const int32_t *perm, DLDataType from,
                         const ab_convert_opts *o, ab__convert_args *a) {
  memset(a, 0, sizeof *a);
  int64_t st[5], acc = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    st[i] = shape[i] == 1 ? 0 : acc;
    acc *= shape[i];
  }
  a->ndim = ndim;
  a->op.from = from;
  a->op.to = o->dtype;
  a->op.affine = (o->flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)) != 0;
  a->op.scale = o->scale;
  a->op.offset = o->offset;
  a->op.channel_dim = -1;
  a->op.channel_scale = o->channel_scale;
  a->op.channel_offset = o->channel_offset;
  for (int32_t i = 0; i < ndim; i++) {
    a->shape[i] = shape[perm[i]];
    a->stride[i] = st[perm[i]];
    if ((o->flags & AB_CONVERT_PER_CHANNEL) && perm[i] == o->channel_axis) a->op.channel_dim = i;
  }
}
#endif

#ifdef AB_HAVE_CUDA_KERNELS
/* Converts the compact host source `v` (dtype from, ndim dims of shape) as
 * `o` says, once by the library on the host and once by the kernel's
 * per-element code (ab__cuda_convert_emulate, the same source nvcc
 * compiles for the device), and asserts that they agree element by
 * element: in every bit without a map (NaNs included: the guide's rule),
 * and with one up to which NaN (a GPU's arithmetic picks its own). */
static void check_emulation(const void *v, DLDataType from, int32_t ndim, int64_t *shape, const int32_t *perm,
                            const ab_convert_opts *o, const char *what) {
  const bool mapped = (o->flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)) != 0;
  DLTensor h = {(void *)v, CPU0, ndim, from, shape, NULL, 0};
  DLManagedTensorVersioned *want = NULL;
  cr_assert_eq(ab_convert_memory(&h, CPU0, o, &want), AB_OK, "%s: %s", what, ab_last_error());
  ab__convert_args a;
  compact_args(ndim, shape, perm, from, o, &a);
  cr_assert(ab__cuda_convert_supported(&a), "%s: not supported", what);
  const int64_t n = numel_of(ndim, shape);
  const size_t os = o->dtype.bits / 8u;
  unsigned char *got = malloc((size_t)n * os + 1);
  ab__cuda_convert_emulate(got, v, &a);
  const unsigned char *w = want->dl_tensor.data;
  for (int64_t i = 0; i < n; i++)
    cr_assert(memcmp(w + i * os, got + i * os, os) == 0 || (mapped && same_element(o->dtype, w + i * os, got + i * os)),
              "%s: element %lld differs from the host's", what, (long long)i);
  free(got);
  want->deleter(want);
}
#endif

/* The guide: a float16 or bfloat16 NaN widened by the device kernels
 * keeps its payload, quieted. The kernel code kept a signalling one
 * signalling (float16 0x7c01 -> 0x7f802000, bfloat16 0x7f81 ->
 * 0x7f810000); the device runs the same bit operations as this. */
Test(cuda, float16_and_bfloat16_nans_widen_quiet_in_the_kernel_code) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  static const uint16_t f16[] = {0x7c01, 0xfd23, 0x7e00, 0x7fff, 0x7c00, 0xfc00, 0x3c00, 0x0001};
  static const uint16_t bf16[] = {0x7f81, 0xff81, 0x7fc1, 0x7fff, 0x7f80, 0xff80, 0x3f80, 0x0001};
  static const float f16_finite[] = {0, 0, 0, 0, __builtin_inff(), -__builtin_inff(), 1.0f, 0x1p-24f};
  for (int kind = 0; kind < 2; kind++) {
    const uint16_t *bits = kind == 0 ? f16 : bf16;
    int64_t shape[1] = {8};
    const int32_t perm[1] = {0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = dt(kDLFloat, 32, 1);
    ab__convert_args a;
    compact_args(1, shape, perm, kind == 0 ? dt(kDLFloat, 16, 1) : dt(kDLBfloat, 16, 1), &o, &a);
    cr_assert(ab__cuda_convert_supported(&a));
    uint32_t got[8];
    ab__cuda_convert_emulate(got, bits, &a);
    for (int i = 0; i < 8; i++) {
      uint32_t want;
      if (kind == 1) want = (uint32_t)bits[i] << 16;
      else if ((bits[i] & 0x7c00u) == 0x7c00u && (bits[i] & 0x3ffu) != 0)
        want = ((uint32_t)(bits[i] & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(bits[i] & 0x3ffu) << 13);
      else memcpy(&want, &f16_finite[i], 4);
      if ((want & 0x7fffffffu) > 0x7f800000u) want |= 0x00400000u; /* quiet, the payload kept */
      cr_assert_eq(got[i], want, "%s 0x%04x -> 0x%08x, want 0x%08x", kind == 0 ? "float16" : "bfloat16", bits[i],
                   got[i], want);
    }
  }
#endif
}

/* And narrowed: a float32 NaN into float16 or bfloat16 is the host's,
 * quiet with its sign and its payload's top bits. The kernel code went
 * through a conversion to double, which on the host keeps a NaN's payload
 * (so the old code passed this too) but on a GPU was never checked; it
 * now takes the NaN's own bits. This checks those bits in the kernel's
 * code compiled for the host; what a GPU gives has not been run. */
Test(cuda, float32_nans_narrow_as_on_the_host_in_the_kernel_code) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  static const uint32_t f32[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000,
                                 0xff812345, 0x7fffffff, 0x7f800000, 0x3f800000};
  for (int kind = 0; kind < 2; kind++) {
    int64_t shape[1] = {8};
    const int32_t perm[1] = {0};
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.dtype = kind == 0 ? dt(kDLFloat, 16, 1) : dt(kDLBfloat, 16, 1);
    ab__convert_args a;
    compact_args(1, shape, perm, dt(kDLFloat, 32, 1), &o, &a);
    cr_assert(ab__cuda_convert_supported(&a));
    uint16_t got[8];
    ab__cuda_convert_emulate(got, f32, &a);
    static const uint16_t finite[2][2] = {{0x7c00, 0x3c00}, {0x7f80, 0x3f80}}; /* infinity, 1 */
    for (int i = 0; i < 8; i++) {
      const uint32_t u = f32[i];
      uint16_t want;
      if (i >= 6) want = finite[kind][i - 6];
      else if (kind == 0) want = (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
      else want = (uint16_t)((u >> 16) | 0x40u);
      cr_assert_eq(got[i], want, "float32 0x%08x -> %s 0x%04x, want 0x%04x", u, kind == 0 ? "float16" : "bfloat16",
                   got[i], want);
    }
  }
#endif
}

Test(cuda, conversion_kernel_matches_the_host_converter) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  /* The kernel's per-element code (the same source nvcc compiles for the
   * device) against the library's host conversion, through
   * ab_convert_memory to cpu:0. */
  test_rng rng = {7};
  int checked = 0;
  for (size_t f = 0; f < sizeof conv_from / sizeof conv_from[0]; f++) {
    for (int trial = 0; trial < 12; trial++) {
      int32_t ndim, perm[5];
      int64_t shape[5];
      ab_convert_opts o;
      conv_case(&rng, trial, &ndim, shape, perm, &o);
      const int64_t n = numel_of(ndim, shape);
      void *v = malloc((size_t)n * 4 + 4);
      conv_fill(v, n, conv_from[f], &rng);
      char what[64];
      snprintf(what, sizeof what, "dtype %zu trial %d", f, trial);
      check_emulation(v, conv_from[f], ndim, shape, perm, &o, what);
      checked++;
      free(v);
    }
  }
  cr_assert_eq(checked, 96);
  /* what the kernels do not take */
  ab__convert_args a;
  memset(&a, 0, sizeof a);
  a.ndim = 1;
  a.shape[0] = 4;
  a.stride[0] = 1;
  a.op.from = dt(kDLComplex, 64, 1);
  a.op.to = dt(kDLComplex, 128, 1);
  a.op.channel_dim = -1;
  cr_assert(!ab__cuda_convert_supported(&a), "complex is the host's");
  a.op.from = dt(kDLFloat, 32, 2);
  a.op.to = dt(kDLFloat, 16, 2);
  cr_assert(!ab__cuda_convert_supported(&a), "lanes > 1");
  a.op.from = dt(kDLFloat, 16, 1);
  a.op.to = dt(kDLFloat, 16, 1);
  cr_assert(!ab__cuda_convert_supported(&a), "a float16 permutation is the host's gather");
  a.op.from = a.op.to = dt(kDLBfloat, 16, 1);
  cr_assert(!ab__cuda_convert_supported(&a), "a bfloat16 permutation is the host's gather");
  a.op.from = dt(kDLUInt, 8, 1);
  a.op.affine = true;
  a.op.channel_dim = 0;
  a.shape[0] = 17;
  cr_assert(!ab__cuda_convert_supported(&a), "17 channels");
  cr_assert_eq(ab__cuda_convert(NULL, NULL, &a, NULL), cudaErrorInvalidValue);
#endif
}

/* ---- into float16 and bfloat16 ------------------------------------------- */

#ifdef AB_HAVE_CUDA_KERNELS
/* conv_fill, with float32 sources probing the 16-bit roundings. */
static void half_fill(void *v, int64_t n, DLDataType d, test_rng *rng) {
  conv_fill(v, n, d, rng);
  if (d.code == kDLFloat && d.bits == 32) fill_half_probes(v, n, rng);
}

static const DLDataType half_to[] = {{kDLFloat, 16, 1}, {kDLBfloat, 16, 1}};
#endif

Test(cuda, float16_and_bfloat16_results_match_the_host_converter) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  test_rng rng = {23};
  int checked = 0;
  for (size_t f = 0; f < sizeof conv_from / sizeof conv_from[0]; f++) {
    for (size_t t = 0; t < 2; t++) {
      for (int trial = 0; trial < 6; trial++) {
        int32_t ndim, perm[5];
        int64_t shape[5];
        ab_convert_opts o;
        conv_case(&rng, trial, &ndim, shape, perm, &o);
        o.dtype = half_to[t];
        if (o.flags == 0 && conv_from[f].code == half_to[t].code && conv_from[f].bits == 16) {
          o.flags = AB_CONVERT_AFFINE; /* a bare permutation is the gather's */
          o.scale = 3.0;
        }
        const int64_t n = numel_of(ndim, shape);
        void *v = malloc((size_t)n * 4 + 4);
        half_fill(v, n, conv_from[f], &rng);
        char what[64];
        snprintf(what, sizeof what, "dtype %zu -> %s trial %d", f, t == 0 ? "f16" : "bf16", trial);
        check_emulation(v, conv_from[f], ndim, shape, perm, &o, what);
        checked++;
        free(v);
      }
    }
  }
  cr_assert_eq(checked, 8 * 2 * 6);
#endif
}

/* ---- narrowing: into 8- and 16-bit integers ---------------------------- */

static const DLDataType narrow_to[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1}, {kDLUInt, 16, 1}, {kDLInt, 16, 1}};

/* A narrowing case: conv_case's shape and axis order, and maps that put
 * values on ties and past both ends of every target type. */
static void narrow_case(test_rng *rng, int trial, DLDataType to, int32_t *ndim, int64_t *shape, int32_t *perm,
                        ab_convert_opts *o) {
  static const double scale[4] = {0.5, -2.0, 1.5, 257.0}, off[4] = {0.5, -0.25, 1e5, -3e4};
  conv_case(rng, trial, ndim, shape, perm, o);
  o->dtype = to;
  if (trial % 3 == 1) {
    o->scale = trial % 2 ? 2.0 : 0.5; /* x.25 * 2 and x.0 * 0.5 land on ties */
    o->offset = trial % 2 ? 0.5 : -0.5;
  } else if (trial % 3 == 2) {
    o->channel_scale = scale;
    o->channel_offset = trial % 2 ? off : NULL;
  }
}

/* Floats on ties, near and past the integer ranges, NaN and infinities
 * among random bits; integers as random bits. */
static void narrow_fill(void *v, int64_t n, DLDataType d, test_rng *rng) {
  static const double vals[] = {0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.5, 128.5, -128.5, -129.5, 254.5, 255.5, 256.0,
                                32767.5, -32768.5, 65534.5, 65535.5, 65536.0, 1e9, -1e9, 0.25, -0.75, 3.0, -7.0};
  fill_pattern(v, (size_t)n * (d.bits / 8u), (uint32_t)rng_next(rng));
  for (int64_t i = 0; i < n; i++) {
    const uint64_t pick = rng_next(rng) % 32;
    double x = pick < 24 ? vals[pick] : pick == 24 ? NAN : pick == 25 ? INFINITY : pick == 26 ? -INFINITY : 0;
    if (pick > 26) continue; /* keep the random bits */
    if (d.code == kDLFloat && d.bits == 32) {
      float f = (float)x;
      memcpy((char *)v + i * 4, &f, 4);
    } else if (d.code == kDLFloat && d.bits == 16) {
      uint16_t h = ab__half_from_double(x);
      memcpy((char *)v + i * 2, &h, 2);
    } else if (d.code == kDLBfloat) {
      uint16_t h = ab__bf16_from_double(x);
      memcpy((char *)v + i * 2, &h, 2);
    }
  }
}

Test(cuda, narrowing_kernel_matches_the_host_converter) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  /* Every source the kernels take into every integer result, through the
   * kernel's per-element code on the host, against the host converter. */
  test_rng rng = {17};
  int checked = 0;
  for (size_t f = 0; f < sizeof conv_from / sizeof conv_from[0]; f++) {
    for (size_t t = 0; t < sizeof narrow_to / sizeof narrow_to[0]; t++) {
      for (int trial = 0; trial < 6; trial++) {
        int32_t ndim, perm[5];
        int64_t shape[5];
        ab_convert_opts o;
        narrow_case(&rng, trial, narrow_to[t], &ndim, shape, perm, &o);
        const int64_t n = numel_of(ndim, shape);
        void *v = malloc((size_t)n * 4 + 4);
        narrow_fill(v, n, conv_from[f], &rng);
        char what[64];
        snprintf(what, sizeof what, "dtype %zu -> %zu trial %d", f, t, trial);
        check_emulation(v, conv_from[f], ndim, shape, perm, &o, what);
        checked++;
        free(v);
      }
    }
  }
  cr_assert_eq(checked, 8 * 4 * 6);
#endif
}

Test(cuda, every_cast_pair_matches_the_host_converter) {
#ifndef AB_HAVE_CUDA_KERNELS
  cr_skip_test("this build has no CUDA kernels (nvcc not found at configure time)");
#else
  /* All 13 x 13 one-lane dtype pairs (the three families: float32,
   * integers, float64), each with no map, a per-tensor and a per-channel
   * map, through the kernels' per-element code on the host. */
  test_rng rng = {29};
  int checked = 0;
  for (size_t f = 0; f < CAST_NKINDS; f++) {
    for (int trial = 0; trial < 3; trial++) {
      int32_t ndim, perm[4], chan;
      int64_t shape[4], n;
      void *v = cast_source(&rng, cast_kinds[f], &ndim, shape, perm, &chan, &n);
      for (size_t t = 0; t < CAST_NKINDS; t++) {
        ab_convert_opts o;
        const int mode = (trial + (int)t) % 3;
        cast_opts(mode, cast_kinds[f], cast_kinds[t], chan, perm, &o);
        char what[64];
        snprintf(what, sizeof what, "kind %zu -> %zu mode %d", f, t, mode);
        check_emulation(v, cast_kinds[f], ndim, shape, perm, &o, what);
        checked++;
      }
      free(v);
    }
  }
  cr_assert_eq(checked, CAST_NKINDS * CAST_NKINDS * 3);
#endif
}

Test(cuda, narrowing_runs_on_the_gpu_before_the_download) {
  need_kernels();
  setenv("AB_CONVERT_PLACE", "device", 1);
  ab__env_reload();
  test_rng rng = {19};
  const DLDataType f32 = dt(kDLFloat, 32, 1);
  for (size_t t = 0; t < sizeof narrow_to / sizeof narrow_to[0]; t++) {
    for (int trial = 0; trial < 6; trial++) {
      int32_t ndim, perm[5];
      int64_t shape[5];
      ab_convert_opts o;
      narrow_case(&rng, trial, narrow_to[t], &ndim, shape, perm, &o);
      const int64_t n = numel_of(ndim, shape);
      void *v = malloc((size_t)n * 4 + 4);
      narrow_fill(v, n, f32, &rng);
      DLTensor h = {v, CPU0, ndim, f32, shape, NULL, 0};
      DLManagedTensorVersioned *want = NULL, *g = NULL, *got = NULL;
      cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &want), AB_OK, "%s", ab_last_error());
      g = convert_ok(&h, CUDA(0), AB_COPY_IF_NEEDED, NULL);
      struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
      ab_pool_stats(CUDA(0), &before);
      cr_assert_eq(ab_convert_memory(&g->dl_tensor, CPU0, &o, &got), AB_OK, "%s", ab_last_error());
      ab_pool_stats(CUDA(0), &after);
      cr_assert_eq(after.allocations - before.allocations, 1, "to %zu trial %d: not narrowed on the GPU", t, trial);
      cr_assert(memcmp(want->dl_tensor.data, got->dl_tensor.data, (size_t)n * (narrow_to[t].bits / 8u)) == 0,
                "to %zu trial %d: the GPU differs from the host", t, trial);
      got->deleter(got);
      g->deleter(g);
      want->deleter(want);
      free(v);
    }
  }
  unsetenv("AB_CONVERT_PLACE");
  ab__env_reload();
  assert_pool_clean(CUDA(0));
}

/* h (host memory) converted as o says on cuda:0 (the source uploaded as
 * it is and converted there by the kernels: two blocks of its pool, or
 * `what` was not converted on the GPU) and brought back as it is: the
 * result in host memory. */
static DLManagedTensorVersioned *converted_on_the_gpu(const DLTensor *h, const ab_convert_opts *o, const char *what) {
  DLManagedTensorVersioned *dev = NULL, *got = NULL;
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  ab_pool_stats(CUDA(0), &before);
  cr_assert_eq(ab_convert_memory(h, CUDA(0), o, &dev), AB_OK, "%s: %s", what, ab_last_error());
  ab_pool_stats(CUDA(0), &after);
  cr_assert_eq(after.allocations - before.allocations, 2, "%s: not converted on the GPU", what);
  cr_assert_eq(ab_convert_memory(&dev->dl_tensor, CPU0, NULL, &got), AB_OK, "%s: %s", what, ab_last_error());
  dev->deleter(dev);
  return got;
}

/* float16 and bfloat16 NaNs (signalling, quiet, payloads, both signs)
 * and edge values widened on the GPU into float32 and float64: the
 * host's bits, NaNs included (docs/guide.md: quiet, sign and payload
 * kept). Into float64 the kernels build the double from the bits, since
 * a GPU's float -> double may return its own NaN. */
Test(cuda, float16_and_bfloat16_nans_widen_on_the_gpu_as_on_the_host) {
  need_kernels();
  setenv("AB_CONVERT_PLACE", "device", 1);
  ab__env_reload();
  static const uint16_t bits[2][12] = {
      {0x7c01, 0xfd23, 0x7e00, 0x7fff, 0xfe00, 0x7c00, 0xfc00, 0x0001, 0x8000, 0x3c00, 0x83ff, 0x7bff},
      {0x7f81, 0xff81, 0x7fc1, 0x7fff, 0xffc0, 0x7f80, 0xff80, 0x0001, 0x8000, 0x3f80, 0x807f, 0x7f7f}};
  int64_t shape[1] = {12};
  for (int kind = 0; kind < 2; kind++)
    for (int wide = 0; wide < 2; wide++) {
      DLTensor h = {(void *)bits[kind], CPU0, 1, dt(kind ? kDLBfloat : kDLFloat, 16, 1), shape, NULL, 0};
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = dt(kDLFloat, wide ? 64 : 32, 1);
      DLManagedTensorVersioned *want = NULL;
      cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &want), AB_OK, "%s", ab_last_error());
      char what[32];
      snprintf(what, sizeof what, "%s -> float%d", kind ? "bfloat16" : "float16", wide ? 64 : 32);
      DLManagedTensorVersioned *got = converted_on_the_gpu(&h, &o, what);
      const size_t es = wide ? 8 : 4;
      for (int i = 0; i < 12; i++) {
        uint64_t a = 0, b = 0;
        memcpy(&a, (const char *)want->dl_tensor.data + es * (size_t)i, es);
        memcpy(&b, (const char *)got->dl_tensor.data + es * (size_t)i, es);
        cr_assert_eq(a, b, "%s 0x%04x -> float%d: host 0x%llx, GPU 0x%llx", kind ? "bfloat16" : "float16",
                     bits[kind][i], wide ? 64 : 32, (unsigned long long)a, (unsigned long long)b);
      }
      got->deleter(got);
      want->deleter(want);
    }
  unsetenv("AB_CONVERT_PLACE");
  ab__env_reload();
  assert_pool_clean(CUDA(0));
}

Test(cuda, conversions_to_float32_run_on_the_gpu_bit_exact_with_the_host) {
  need_kernels();
  setenv("AB_CONVERT_PLACE", "device", 1);
  ab__env_reload();
  test_rng rng = {11};
  for (size_t f = 0; f < sizeof conv_from / sizeof conv_from[0]; f++) {
    for (int trial = 0; trial < 6; trial++) {
      int32_t ndim, perm[5];
      int64_t shape[5];
      ab_convert_opts o;
      conv_case(&rng, trial, &ndim, shape, perm, &o);
      const int64_t n = numel_of(ndim, shape);
      void *v = malloc((size_t)n * 4 + 4);
      conv_fill(v, n, conv_from[f], &rng);
      DLTensor h = {v, CPU0, ndim, conv_from[f], shape, NULL, 0};
      DLManagedTensorVersioned *want = NULL;
      cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &want), AB_OK, "%s", ab_last_error());
      char what[32];
      snprintf(what, sizeof what, "dtype %zu trial %d", f, trial);
      DLManagedTensorVersioned *got = converted_on_the_gpu(&h, &o, what);
      const float *a = want->dl_tensor.data, *b = got->dl_tensor.data;
      for (int64_t i = 0; i < n; i++)
        cr_assert(same_f32(a[i], b[i], (o.flags & (AB_CONVERT_AFFINE | AB_CONVERT_PER_CHANNEL)) != 0),
                  "dtype %zu trial %d element %lld: host %a, GPU %a", f, trial, (long long)i, (double)a[i],
                  (double)b[i]);
      got->deleter(got);
      want->deleter(want);
      free(v);
    }
  }
  unsetenv("AB_CONVERT_PLACE");
  ab__env_reload();
}
