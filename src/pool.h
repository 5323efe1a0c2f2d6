/* Per-device caching pools (pool.c): the only way the core allocates device
 * memory. Backends supply raw alloc/free; caching, limits, statistics and
 * the OOM sequence live here, once. */
#ifndef AB_POOL_H
#define AB_POOL_H

#include <stddef.h>

#include "core.h"

struct ab__pool;

/* Bytes of room in a block's descriptor for whoever holds the block. */
#define AB_BLOCK_ROOM 160

/* A block handed out by a pool. `ptr` is the device pointer (or handle);
 * the descriptor is host memory owned by the pool. `room` is the holder's
 * while it holds the block, for a small header of its own (dlpack.c keeps
 * a tensor's there), so a pooled tensor costs no second allocation: a
 * malloc and free were an eighth of a 4 KiB conversion (issue 18). */
typedef struct ab__block {
  void *ptr;
  size_t size;      /* rounded size class, what the backend allocated */
  size_t requested; /* what the caller asked for */
  struct ab__pool *pool;
  struct ab__block *next; /* free-list link while cached */
  bool reused;            /* served from a cache at least once (pool.c's keep_large) */
  _Alignas(max_align_t) unsigned char room[AB_BLOCK_ROOM];
} ab__block;

/* Allocates `bytes` (> 0) on dev from its pool, running the OOM sequence
 * when needed. On failure nothing is allocated and the message is set. */
ab_status ab__pool_alloc(const struct ab_backend *be, DLDevice dev, size_t bytes, ab__block **out);

/* Gives a block back to its pool's cache. Never fails. */
void ab__pool_free(ab__block *b);

/* The size a request is rounded to (its size class). */
size_t ab__pool_round(size_t bytes);

/* Test hook: the bytes dev's pool has reserved against its limit for
 * allocations still waiting on the driver (0 without a pool). */
uint64_t ab__pool_pending(DLDevice dev);

/* A device's memory that ran out at a buffer's first use, where the
 * driver allocates (OpenCL's may: clCreateBuffer succeeds, and the first
 * transfer or kernel gets CL_MEM_OBJECT_ALLOCATION_FAILURE), so that the
 * OOM sequence never saw it at the allocation. The backend notes it with
 * its failure (ab__note_first_use_oom, internal.h); the conversion asks
 * for the note and then has the pool relieve the device as the sequence
 * would: the first call
 * releases the pool's cache where it holds blocks, later ones run the OOM
 * callbacks (r->rounds counts them, up to AB_OOM_MAX_CALLBACK_ROUNDS) and
 * release what they gave back. True where something was freed and the
 * work is worth retrying. r starts zeroed, one per conversion. */
struct ab__relief {
  bool cache_released;
  int rounds;
};
bool ab__pool_relieve(DLDevice dev, size_t bytes, struct ab__relief *r);
/* Counts a conversion that failed so in the pool's oom_failures. */
void ab__pool_count_oom_failure(DLDevice dev);

/* Trims and destroys every pool (ab_shutdown); pools that still have
 * blocks in use are trimmed and kept. */
void ab__pool_shutdown(void);

#endif
