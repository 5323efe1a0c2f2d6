/* The one host allocation hook of the library, and the fault injector that
 * lets tests fail the N-th allocation (host or device), as SQLite's malloc
 * tests do. */
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

static atomic_long fault_countdown; /* 0 = disarmed */
static atomic_long fault_hits;
static atomic_long live_blocks;

bool ab__fault_check(void) {
  long n = atomic_load_explicit(&fault_countdown, memory_order_relaxed);
  if (AB_LIKELY(n == 0)) return false;
  /* Count down; the caller that takes it from 1 to 0 fails. */
  while (n > 0) {
    if (atomic_compare_exchange_weak(&fault_countdown, &n, n - 1)) {
      if (n == 1) {
        atomic_fetch_add(&fault_hits, 1);
        return true;
      }
      return false;
    }
  }
  return false;
}

void ab__fault_arm(long nth) {
  atomic_store(&fault_hits, 0);
  atomic_store(&fault_countdown, nth < 0 ? 0 : nth);
}

long ab__fault_injected(void) { return atomic_load(&fault_hits); }

long ab__alloc_live(void) { return atomic_load(&live_blocks); }

static void *counted(void *p) {
  if (p != NULL) atomic_fetch_add_explicit(&live_blocks, 1, memory_order_relaxed);
  return p;
}

void *ab__malloc(size_t n) {
  if (ab__fault_check()) return NULL;
  return counted(malloc(n ? n : 1));
}

void *ab__calloc(size_t count, size_t n) {
  if (ab__fault_check()) return NULL;
  return counted(calloc(count ? count : 1, n ? n : 1));
}

void *ab__aligned_alloc(size_t align, size_t n) {
  void *p = NULL;
  if (ab__fault_check()) return NULL;
  if (posix_memalign(&p, align, n ? n : 1) != 0) return NULL;
  return counted(p);
}

void ab__free(void *p) {
  if (p == NULL) return;
  atomic_fetch_sub_explicit(&live_blocks, 1, memory_order_relaxed);
  free(p);
}
