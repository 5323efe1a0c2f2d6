/* The staging ring (src/staging.c) against a simulated backend whose
 * "DMA" really is asynchronous: queued transfers run only when a fence is
 * waited on (or a synchronous call drains the queue). A ring that reused a
 * chunk before its transfer completed, or read a chunk before it arrived,
 * would move the wrong bytes here, so the ordering is checked for real,
 * without a GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "internal.h"
#include "parallel.h"
#include "pool.h"
#include "support.h"

/* ---- the simulated backend ------------------------------------------------ */

enum { OP_COPY, OP_FENCE };
struct op {
  int kind;
  void *dst;
  const void *src;
  size_t len;
  int fence; /* OP_FENCE: which */
  unsigned char data_at_queue[8]; /* first bytes of src when queued */
};

#define MAX_OPS 4096
#define MAX_FENCES 64
static struct op queue[MAX_OPS];
static size_t nqueued, ndone;
static int fences_live, fences_made;
static int async_calls, direct_calls, fail_async_at; /* fail the nth async call (1-based), 0 never */
static int max_in_flight;
static const void *staged_region; /* host_is_staged says yes inside it */
static size_t staged_len;

static void run_until(size_t end) {
  for (; ndone < end; ndone++)
    if (queue[ndone].kind == OP_COPY) memcpy(queue[ndone].dst, queue[ndone].src, queue[ndone].len);
}

static int in_flight(void) {
  int n = 0;
  for (size_t i = ndone; i < nqueued; i++) n += queue[i].kind == OP_COPY;
  return n;
}

static ab_status push_copy(void *dst, const void *src, size_t len) {
  async_calls++;
  if (fail_async_at && async_calls == fail_async_at) return AB_FAIL(AB_ERR_BACKEND, "sim: injected transfer failure");
  cr_assert_lt(nqueued, MAX_OPS);
  queue[nqueued++] = (struct op){.kind = OP_COPY, .dst = dst, .src = src, .len = len};
  if (in_flight() > max_in_flight) max_in_flight = in_flight();
  return AB_OK;
}

static ab_status sim_write_async(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes,
                                 void *stream) {
  (void)id, (void)stream;
  return push_copy((char *)handle + offset, src, bytes);
}

static ab_status sim_read_async(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes,
                                void *stream) {
  (void)id, (void)stream;
  return push_copy(dst, (const char *)handle + offset, bytes);
}

static ab_status sim_write(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  (void)id, (void)stream;
  direct_calls++;
  run_until(nqueued);
  memcpy((char *)handle + offset, src, bytes);
  return AB_OK;
}

static ab_status sim_read(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  (void)id, (void)stream;
  direct_calls++;
  run_until(nqueued);
  memcpy(dst, (const char *)handle + offset, bytes);
  return AB_OK;
}

static ab_status sim_fence_new(int32_t id, void **fence) {
  (void)id;
  cr_assert_lt(fences_made, MAX_FENCES);
  fences_live++;
  *fence = (void *)(intptr_t)(++fences_made);
  return AB_OK;
}

static ab_status sim_fence_record(int32_t id, void *fence, void *stream) {
  (void)id, (void)stream;
  cr_assert_lt(nqueued, MAX_OPS);
  queue[nqueued++] = (struct op){.kind = OP_FENCE, .fence = (int)(intptr_t)fence};
  return AB_OK;
}

/* Completes everything up to the fence's last recording. */
static ab_status sim_fence_wait(void *fence) {
  for (size_t i = nqueued; i-- > ndone;)
    if (queue[i].kind == OP_FENCE && queue[i].fence == (int)(intptr_t)fence) {
      run_until(i + 1);
      break;
    }
  return AB_OK;
}

static void sim_fence_free(void *fence) {
  (void)fence;
  fences_live--;
}

static int stream_syncs;
static void sim_stream_sync(int32_t id, void *stream) {
  (void)id, (void)stream;
  stream_syncs++;
  run_until(nqueued);
}

static bool sim_host_is_staged(const void *p) {
  return staged_region != NULL && (const char *)p >= (const char *)staged_region &&
         (const char *)p < (const char *)staged_region + staged_len;
}

static const struct ab_backend sim = {
  .device_type = kDLExtDev,
  .name = "sim",
  .staging = kDLCPU, /* chunks from the host pool */
  .write = sim_write,
  .read = sim_read,
  .write_async = sim_write_async,
  .read_async = sim_read_async,
  .fence_new = sim_fence_new,
  .fence_record = sim_fence_record,
  .fence_wait = sim_fence_wait,
  .fence_free = sim_fence_free,
  .host_is_staged = sim_host_is_staged,
  .stream_sync = sim_stream_sync,
};

static long live_at_start;
static uint64_t host_in_use_at_start;

static uint64_t host_in_use(void) {
  struct ab_pool_stats s = {.size = sizeof s};
  cr_assert_eq(ab_pool_stats(CPU0, &s), AB_OK);
  return s.in_use_bytes.current;
}

static void setup(void) {
  setenv("AB_STAGING_CHUNK", "64KiB", 1);
  setenv("AB_STAGING_CHUNKS", "3", 1);
  setenv("AB_STAGING_MIN", "1", 1);
  ab__env_reload();
  nqueued = ndone = 0;
  fences_live = fences_made = async_calls = direct_calls = fail_async_at = max_in_flight = stream_syncs = 0;
  staged_region = NULL;
  staged_len = 0;
  host_in_use_at_start = host_in_use();
  live_at_start = ab__alloc_live_settled();
}

/* Nothing of the ring outlives a call: fences freed, chunks back in the
 * pool, nothing still queued, no host block leaked. */
static void assert_ring_closed(void) {
  cr_assert_eq(fences_live, 0, "%d fences not freed", fences_live);
  cr_assert_eq(ndone, nqueued, "transfers still queued when the call returned");
  cr_assert_eq(host_in_use(), host_in_use_at_start, "staging chunks not returned");
  cr_assert_eq(ab__alloc_live_settled(), live_at_start, "host blocks leaked");
}

TestSuite(staging, .init = setup);

Test(staging, writes_arrive_whole_through_a_reused_ring) {
  /* 1 MiB + 5 bytes in 64 KiB chunks through 3 slots: 17 chunks, each slot
   * reused five or six times, the last chunk short. */
  const size_t n = ((size_t)1 << 20) + 5;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 1);
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_OK, "%s", ab_last_error());
  cr_assert(memcmp(dev, src, n) == 0, "device bytes differ: a chunk was reused before its transfer completed");
  cr_assert_eq(async_calls, 17);
  cr_assert_eq(direct_calls, 0);
  cr_assert_eq(max_in_flight, 3, "the ring should keep all 3 slots busy (max %d)", max_in_flight);
  assert_ring_closed();
  free(src);
  free(dev);
}

Test(staging, reads_arrive_whole_and_in_place) {
  const size_t n = ((size_t)700 << 10) + 3, off = 4096 + 7;
  unsigned char *dev = malloc(n + off), *dst = malloc(n);
  fill_pattern(dev, n + off, 2);
  memset(dst, 0, n);
  cr_assert_eq(ab__staged_read(&sim, 0, dev, off, dst, n, NULL, false), AB_OK, "%s", ab_last_error());
  cr_assert(memcmp(dst, dev + off, n) == 0, "host bytes differ: a chunk was read before it arrived");
  cr_assert_eq(async_calls, 11); /* ceil(700 KiB + 3 / 64 KiB) */
  cr_assert_eq(max_in_flight, 3);
  assert_ring_closed();
  free(dev);
  free(dst);
}

Test(staging, a_short_transfer_is_cut_to_overlap_and_a_tiny_one_goes_direct) {
  /* 96 KiB is less than the ring: three 64 KiB-minimum pieces -> two
   * chunks (64 + 32), still asynchronous. */
  const size_t n = 96 << 10;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 3);
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_OK);
  cr_assert(memcmp(dev, src, n) == 0);
  cr_assert_eq(async_calls, 2);
  assert_ring_closed();
  /* Below AB_STAGING_MIN: direct. */
  setenv("AB_STAGING_MIN", "1MiB", 1);
  ab__env_reload();
  async_calls = 0;
  memset(dev, 0, n);
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_OK);
  cr_assert(memcmp(dev, src, n) == 0);
  cr_assert_eq(async_calls, 0);
  cr_assert_eq(direct_calls, 1);
  assert_ring_closed();
  free(src);
  free(dev);
}

Test(staging, memory_that_already_is_staging_memory_goes_direct) {
  const size_t n = 300 << 10;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 4);
  staged_region = src;
  staged_len = n;
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_OK);
  cr_assert(memcmp(dev, src, n) == 0);
  cr_assert_eq(async_calls, 0);
  cr_assert_eq(direct_calls, 1);
  fill_pattern(dev, n, 44);
  cr_assert_eq(ab__staged_read(&sim, 0, dev, 0, src, n, NULL, false), AB_OK); /* into the staged buffer */
  cr_assert(memcmp(dev, src, n) == 0);
  cr_assert_eq(async_calls, 0);
  cr_assert_eq(direct_calls, 2);
  assert_ring_closed();
  free(src);
  free(dev);
}

Test(staging, an_early_return_leaves_a_transfer_of_staging_memory_queued) {
  /* AB_CONVERT_ASYNC: from or into memory that already is staging memory,
   * the transfer is queued as one async call and nothing waits for it. */
  const size_t n = 300 << 10;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 8);
  staged_region = src;
  staged_len = n;
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, true), AB_OK, "%s", ab_last_error());
  cr_assert_eq(async_calls, 1);
  cr_assert_eq(direct_calls, 0);
  cr_assert_eq(nqueued - ndone, 1, "the write should still be queued");
  cr_assert_eq(dev[0], 0, "the write ran before the stream did");
  sim_stream_sync(0, NULL);
  cr_assert(memcmp(dev, src, n) == 0);
  fill_pattern(dev, n, 88);
  cr_assert_eq(ab__staged_read(&sim, 0, dev, 0, src, n, NULL, true), AB_OK, "%s", ab_last_error());
  cr_assert_eq(async_calls, 2);
  cr_assert_eq(nqueued - ndone, 1, "the read should still be queued");
  sim_stream_sync(0, NULL);
  cr_assert(memcmp(dev, src, n) == 0);
  /* Pageable memory takes the ring, complete on return, flag or not. */
  staged_region = NULL;
  async_calls = 0;
  fill_pattern(src, n, 9);
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, true), AB_OK, "%s", ab_last_error());
  cr_assert_gt(async_calls, 1, "pageable memory should go through the ring");
  cr_assert(memcmp(dev, src, n) == 0);
  assert_ring_closed();
  free(src);
  free(dev);
}

Test(staging, a_queued_transfer_that_fails_drains_the_stream) {
  const size_t n = 64 << 10;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 10);
  staged_region = src;
  staged_len = n;
  fail_async_at = 1;
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, true), AB_ERR_BACKEND);
  cr_assert_not_null(strstr(ab_last_error(), "injected transfer failure"), "%s", ab_last_error());
  cr_assert_eq(stream_syncs, 1, "a failed queued transfer waits for the stream before the caller frees buffers");
  async_calls = 0; /* the read fails the same way */
  cr_assert_eq(ab__staged_read(&sim, 0, dev, 0, src, n, NULL, true), AB_ERR_BACKEND);
  cr_assert_eq(stream_syncs, 2, "a failed queued read waits for the stream too");
  assert_ring_closed();
  free(src);
  free(dev);
}

Test(staging, no_staging_memory_means_a_direct_transfer_not_a_failure) {
  /* Allocations fail from the first, second, third... on (persistently, or
   * the pool's own retry would absorb the fault): the ring gives back the
   * chunks it had and the transfer goes direct, correctly, with no error
   * message left behind. */
  const size_t n = 500 << 10;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 5);
  for (long nth = 1; nth <= 3; nth++) {
    memset(dev, 0, n);
    ab_pool_trim(CPU0); /* no cached chunk: each slot is a real allocation */
    DLDevice ignored;
    (void)ab_parse_device("marker", &ignored);
    char before[512];
    snprintf(before, sizeof before, "%s", ab_last_error());
    direct_calls = 0;
    ab__fault_arm_persistent(nth);
    ab_status st = ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false);
    long injected = ab__fault_injected();
    ab__fault_arm(0);
    cr_assert_eq(st, AB_OK, "chunk %ld failing: %s", nth, ab_last_error());
    cr_assert_geq(injected, 1, "allocation %ld: no fault was injected", nth);
    cr_assert_eq(direct_calls, 1, "chunk %ld failing: not a direct transfer", nth);
    cr_assert(memcmp(dev, src, n) == 0);
    cr_assert_str_eq(ab_last_error(), before, "the chunk failure leaked into the message");
    assert_ring_closed();
  }
  free(src);
  free(dev);
}

Test(staging, a_failing_transfer_is_reported_after_the_ring_drains) {
  const size_t n = 1 << 20;
  unsigned char *src = malloc(n), *dev = calloc(1, n);
  fill_pattern(src, n, 6);
  for (int at = 1; at <= 16; at += 5) {
    nqueued = ndone = 0;
    async_calls = 0;
    fail_async_at = at;
    stream_syncs = 0;
    cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_ERR_BACKEND, "failing transfer %d", at);
    cr_assert_not_null(strstr(ab_last_error(), "injected transfer failure"), "%s", ab_last_error());
    cr_assert_eq(stream_syncs, 1, "a failed ring drains the stream before returning its chunks");
    assert_ring_closed();
    nqueued = ndone = 0;
    async_calls = 0;
    cr_assert_eq(ab__staged_read(&sim, 0, src, 0, dev, n, NULL, false), AB_ERR_BACKEND, "failing read %d", at);
    assert_ring_closed();
  }
  free(src);
  free(dev);
}

/* Unset, AB_STAGING_CHUNK is 1 MiB for every thread the call may use
 * (each thread then copies a part of every chunk), 4 to 64 MiB. */
static int chunks_of_a_write(size_t n, const char *threads, uint32_t call_threads) {
  setenv("AB_NUM_THREADS", threads, 1);
  ab__env_reload();
  unsigned char *src = calloc(1, n), *dev = malloc(n);
  cr_assert(src != NULL && dev != NULL);
  async_calls = 0;
  const uint32_t prev = ab__parallel_call_threads(call_threads);
  cr_assert_eq(ab__staged_write(&sim, 0, dev, 0, src, n, NULL, false), AB_OK, "%s", ab_last_error());
  ab__parallel_call_threads(prev);
  cr_assert(memcmp(dev, src, n) == 0);
  assert_ring_closed();
  free(src);
  free(dev);
  return async_calls;
}

Test(staging, the_default_chunk_grows_with_the_threads) {
  unsetenv("AB_STAGING_CHUNK");
  setenv("AB_PARALLEL_MIN", "1MiB", 1);
  const size_t n = (size_t)48 << 20;
  cr_assert_eq(chunks_of_a_write(n, "2", 0), 12, "2 threads: 4 MiB chunks");
  cr_assert_eq(chunks_of_a_write(n, "8", 0), 6, "8 threads: 8 MiB chunks");
  cr_assert_eq(chunks_of_a_write(n, "8", 1), 12, "a call capped at 1 thread: 4 MiB chunks");
  cr_assert_eq(chunks_of_a_write(n, "64", 0), 3, "64 threads: 64 MiB, cut in 3 pieces of 16 MiB");
  setenv("AB_PARALLEL_MIN", "256KiB", 1); /* splits chunks finer, does not shrink them */
  cr_assert_eq(chunks_of_a_write(n, "6", 0), 8, "6 threads: 6 MiB chunks");
  unsetenv("AB_NUM_THREADS");
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
}

Test(staging, settings_come_from_the_environment_and_bad_values_keep_the_defaults) {
  setenv("AB_STAGING_CHUNK", "8MiB", 1);
  setenv("AB_STAGING_CHUNKS", "4", 1);
  setenv("AB_STAGING_MIN", "256KiB", 1);
  ab__env_reload();
  struct ab__staging_config c = ab__staging_config();
  cr_assert_eq(c.chunk, (size_t)8 << 20);
  cr_assert_eq(c.count, 4);
  cr_assert_eq(c.min, (size_t)256 << 10);
  setenv("AB_STAGING_CHUNK", "lots", 1);
  setenv("AB_STAGING_CHUNKS", "1", 1);  /* below 2 */
  setenv("AB_STAGING_MIN", "-5", 1);
  ab__env_reload();
  c = ab__staging_config();
  cr_assert_eq(c.chunk, 0); /* the ring's own choice */
  cr_assert_eq(c.count, 3);
  cr_assert_eq(c.min, (size_t)1 << 20);
}
