/* The staging ring: pageable host memory <-> device through a few chunks
 * of the backend's staging memory (CUDA: page-locked), so that the host
 * copy of chunk k overlaps the DMA of its neighbours. Without it a
 * transfer from pageable memory is staged by the driver, one bounce buffer
 * at a time, or runs at pageable DMA speed.
 *
 *   write: for chunk k: wait until chunk slot k % K is free (its fence),
 *          memcpy host -> slot, queue the async write, record the fence.
 *   read:  queue the reads of the first K chunks; then for chunk k: wait
 *          for its fence, memcpy slot -> host, queue chunk k + K into it.
 * All transfers go on the caller's stream, in order; the call returns when
 * every byte has arrived. Chunks come from the staging memory's pool (so
 * they are reused across calls) and go back to it only after every
 * transfer that touches them has completed, failure or not.
 *
 * Settings (environment, read once): AB_STAGING_CHUNK (default: 1 MiB
 * for each thread the call may use, from 4 MiB to 64 MiB, so that every
 * thread takes a part of each chunk's host copy),
 * AB_STAGING_CHUNKS (default 3, 2..16), AB_STAGING_MIN (default 1MiB:
 * smaller transfers go direct, where a ring's fences cost more than they
 * save). Measured on an H100 behind PCIe 5 with 16 Xeon cores
 * (bench/results/2026-11-25-gpu-check-h100.md): 1 GiB pageable <-> GPU in
 * chunks of 4 MiB 19-22 GB/s, of 16 MiB 46-52 GB/s (pinned: 55). */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "parallel.h"
#include "pool.h"

#define MAX_CHUNKS 16

static pthread_mutex_t cfg_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned cfg_generation; /* under cfg_lock; 0: never read */
static struct ab__staging_config cfg;

/* fork: a child must not find cfg_lock held by a thread it does not have
 * (a leaf: no other lock is taken while it is held). Registered as the
 * library is loaded: see "fork" in src/lifetime.c. */
static void cfg_fork_prepare(void) { pthread_mutex_lock(&cfg_lock); }
static void cfg_fork_done(void) { pthread_mutex_unlock(&cfg_lock); }
__attribute__((constructor)) static void cfg_fork_register(void) {
  ab__atfork(cfg_fork_prepare, cfg_fork_done, cfg_fork_done, "the staging settings' lock");
}

struct ab__staging_config ab__staging_config(void) {
  pthread_mutex_lock(&cfg_lock);
  const unsigned gen = ab__env_generation();
  if (cfg_generation != gen) {
    cfg.chunk = (size_t)ab__env_size("AB_STAGING_CHUNK", 0, 4096, (uint64_t)1 << 30, "4MiB");
    cfg.count = (size_t)ab__env_int("AB_STAGING_CHUNKS", 3, 2, MAX_CHUNKS);
    cfg.min = (size_t)ab__env_size("AB_STAGING_MIN", (uint64_t)1 << 20, 0, SIZE_MAX, "1MiB");
    cfg_generation = gen;
  }
  struct ab__staging_config c = cfg;
  pthread_mutex_unlock(&cfg_lock);
  return c;
}

/* A chunk's host side, on all cores when it is large (ab__host_run): one
 * thread's memcpy is what limits a ring, not the DMA. On an H100 behind
 * PCIe 5 (Xeon VM, 16 cores, one thread's memcpy 6-10 GB/s) 1 GiB to
 * pageable memory ran 5-7 GB/s through single-threaded chunks against the
 * driver's own 10-14 GB/s (bench/results/2026-11-25-gpu-check-h100.md).
 * The copies split down to RING_PART a thread (or AB_PARALLEL_MIN, if
 * lower): a 4 MiB transfer is three pieces of 1.4 MiB, which at 1 MiB a
 * thread went on one thread (7-8 GB/s there), at 256 KiB on five
 * (12.5-17 GB/s in four runs). */
#define RING_PART ((size_t)256 << 10)
static void host_copy(void *dst, const void *src, size_t n) {
  const int64_t shape[1] = {(int64_t)n}, stride[1] = {1};
  const ab__host_job job = {
      .dst = dst, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1, .min_part = RING_PART};
  ab__host_run(&job);
}

struct ring {
  const struct ab_backend *be;
  int32_t id;
  size_t n;                     /* slots */
  ab__block *chunk[MAX_CHUNKS];
  void *fence[MAX_CHUNKS];
  bool busy[MAX_CHUNKS];        /* a transfer on the slot may be in flight */
};

/* Waits for every slot still in flight (their errors are the transfers'
 * errors: the first one is returned), then gives everything back. After
 * a failure a transfer may be queued without a fence behind it, so the
 * whole stream is drained first: no chunk goes back to the pool while a
 * DMA may still touch it. */
static ab_status ring_close(struct ring *r, ab_status st, void *stream) {
  bool drained = false;
  if (st != AB_OK) {
    ab__dev_stream_sync(r->be, r->id, stream);
    drained = true;
  }
  for (size_t i = 0; i < r->n; i++) {
    if (!r->busy[i]) continue;
    ab_status w = ab__dev_fence_wait(r->be, r->fence[i]);
    if (w != AB_OK && !drained) {
      ab__dev_stream_sync(r->be, r->id, stream); /* a fence we cannot trust: wait for everything */
      drained = true;
    }
    if (st == AB_OK) st = w;
  }
  for (size_t i = 0; i < r->n; i++) {
    if (r->fence[i] != NULL) ab__dev_fence_free(r->be, r->fence[i]);
    if (r->chunk[i] != NULL) ab__pool_free(r->chunk[i]);
  }
  return st;
}

/* The default chunk: 1 MiB for every thread the call may use, 4 MiB to
 * 64 MiB. Each thread copies a part of every chunk (host_copy, down to
 * RING_PART a thread), and fewer, larger chunks wait on fewer
 * fences: on the H100 machine chunks of 4 MiB split 16 ways (AB_PARALLEL_MIN
 * 256 KiB) ran 1 GiB at 16-25 GB/s, of 16 MiB at 41-49. */
static size_t auto_chunk(void) {
  const size_t t = (size_t)ab__parallel_threads();
  return (t < 4 ? 4 : t > 64 ? 64 : t) << 20;
}

/* Sets up the slots; false when the ring cannot be had (no staging memory
 * left, no fences): the caller then transfers directly, which is slower
 * but right, and the thread's message is left as it was. */
static bool ring_open(struct ring *r, const struct ab_backend *be, int32_t id, size_t bytes, size_t *chunk) {
  struct ab__staging_config c = ab__staging_config();
  DLDevice sdev;
  const struct ab_backend *sbe = ab__staging_device(be, id, &sdev) ? ab__backend_for(sdev.device_type) : NULL;
  char saved[AB_ERRBUF_SIZE];
  memset(r, 0, sizeof *r);
  r->be = be;
  r->id = id;
  /* A transfer shorter than the whole ring is cut into `count` pieces (of
   * at least 64 KiB, page-rounded) so that it still overlaps. */
  if (c.chunk == 0) c.chunk = auto_chunk();
  *chunk = c.chunk;
  if (bytes / c.count < c.chunk) {
    size_t piece = (bytes + c.count - 1) / c.count;
    piece = (piece + 4095) & ~(size_t)4095;
    *chunk = piece < ((size_t)64 << 10) ? (size_t)64 << 10 : piece;
    if (*chunk > c.chunk) *chunk = c.chunk;
  }
  r->n = (bytes + *chunk - 1) / *chunk;
  if (r->n > c.count) r->n = c.count;
  if (sbe == NULL) return false;
  ab__save_error(saved);
  for (size_t i = 0; i < r->n; i++) {
    size_t want = bytes < *chunk ? bytes : *chunk;
    if (ab__pool_alloc(sbe, sdev, want, &r->chunk[i]) != AB_OK || ab__dev_fence_new(be, id, &r->fence[i]) != AB_OK) {
      AB_LOG(AB_LOG_DEBUG, "staging ring for %zu bytes not available (%s): direct transfer", bytes, ab_last_error());
      (void)ring_close(r, AB_OK, NULL);
      ab__restore_error(saved);
      return false;
    }
  }
  return true;
}

/* Whether a transfer of `bytes` at host address `host` should take the ring. */
static bool wanted(const struct ab_backend *be, int32_t id, const void *host, size_t bytes) {
  DLDevice sdev;
  if (!ab__dev_has_ring(be) || !ab__staging_device(be, id, &sdev)) return false;
  if (bytes < ab__staging_config().min) return false;
  return !ab__dev_host_is_staged(be, host);
}

bool ab__staged_queueable(const struct ab_backend *be, const void *host, bool async) {
  return async && ab__dev_has_ring(be) && ab__dev_host_is_staged(be, host);
}

/* A queued transfer that failed may have left part of itself in flight:
 * the caller is about to give its buffers back, so wait for the stream. */
static ab_status queued(const struct ab_backend *be, int32_t id, void *stream, ab_status st) {
  if (st != AB_OK) ab__dev_stream_sync(be, id, stream);
  return st;
}

ab_status ab__staged_write(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset, const void *src,
                           size_t bytes, void *stream, bool async) {
  struct ring r;
  size_t chunk;
  if (ab__staged_queueable(be, src, async))
    return queued(be, id, stream, ab__dev_write_async(be, id, handle, offset, src, bytes, stream));
  if (!wanted(be, id, src, bytes) || !ring_open(&r, be, id, bytes, &chunk))
    return ab__dev_write(be, id, handle, offset, src, bytes, stream);
  ab_status st = AB_OK;
  for (size_t done = 0, k = 0; done < bytes && st == AB_OK; k++) {
    const size_t i = k % r.n, len = bytes - done < chunk ? bytes - done : chunk;
    if (r.busy[i]) {
      r.busy[i] = false;
      st = ab__dev_fence_wait(be, r.fence[i]);
      if (st != AB_OK) break;
    }
    host_copy(r.chunk[i]->ptr, (const char *)src + done, len);
    st = ab__dev_write_async(be, id, handle, offset + done, r.chunk[i]->ptr, len, stream);
    if (st == AB_OK) st = ab__dev_fence_record(be, id, r.fence[i], stream);
    r.busy[i] = st == AB_OK; /* otherwise ring_close drains the stream */
    done += len;
  }
  return ring_close(&r, st, stream);
}

ab_status ab__staged_read(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset, void *dst,
                          size_t bytes, void *stream, bool async) {
  struct ring r;
  size_t chunk;
  if (ab__staged_queueable(be, dst, async))
    return queued(be, id, stream, ab__dev_read_async(be, id, handle, offset, dst, bytes, stream));
  if (!wanted(be, id, dst, bytes) || !ring_open(&r, be, id, bytes, &chunk))
    return ab__dev_read(be, id, handle, offset, dst, bytes, stream);
  AB_ASSUME(r.n > 0 || bytes == 0);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  ab_status st = AB_OK;
  /* Chunk k lives in slot k % n; queue_read(k) starts it. */
#define CHUNK_LEN(k) ((k) == nchunks - 1 ? bytes - (k) * chunk : chunk)
  for (size_t k = 0; k < r.n && st == AB_OK; k++) {
    st = ab__dev_read_async(be, id, handle, offset + k * chunk, r.chunk[k]->ptr, CHUNK_LEN(k), stream);
    if (st == AB_OK) st = ab__dev_fence_record(be, id, r.fence[k], stream);
    r.busy[k] = st == AB_OK;
  }
  for (size_t k = 0; k < nchunks && st == AB_OK; k++) {
    const size_t i = k % r.n;
    r.busy[i] = false;
    st = ab__dev_fence_wait(be, r.fence[i]);
    if (st != AB_OK) break;
    host_copy((char *)dst + k * chunk, r.chunk[i]->ptr, CHUNK_LEN(k));
    const size_t next = k + r.n;
    if (next < nchunks) {
      st = ab__dev_read_async(be, id, handle, offset + next * chunk, r.chunk[i]->ptr, CHUNK_LEN(next), stream);
      if (st == AB_OK) st = ab__dev_fence_record(be, id, r.fence[i], stream);
      r.busy[i] = st == AB_OK;
    }
  }
#undef CHUNK_LEN
  return ring_close(&r, st, stream);
}
