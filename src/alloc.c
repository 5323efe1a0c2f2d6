/* The one host allocation hook of the library, and the fault injector that
 * lets tests fail the N-th allocation (host or device), as SQLite's malloc
 * tests do. */
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

/* A fault site: a countdown to the failing call, and whether it keeps
 * failing afterwards. Two sites: allocations, and backend transfers. */
struct fault_site {
  atomic_long countdown; /* 0 = disarmed */
  atomic_bool persistent; /* keep failing once triggered */
  atomic_bool tripped;
  atomic_long hits;
};
static struct fault_site alloc_site, transfer_site;

/* The live-block count is striped over cache lines, a stripe per thread
 * (round-robin), so that threads allocating at once do not bounce one
 * counter between cores; the count is the sum over stripes (a block freed
 * on another thread than it was allocated on moves between stripes). */
#define LIVE_STRIPES 64
static struct {
  _Alignas(64) atomic_long n;
} live[LIVE_STRIPES];
static atomic_uint next_stripe;
static _Thread_local int my_stripe = -1;

static atomic_long *live_slot(void) {
  if (AB_UNLIKELY(my_stripe < 0))
    my_stripe = (int)(atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) % LIVE_STRIPES);
  return &live[my_stripe].n;
}

static bool site_check(struct fault_site *f) {
  long n = atomic_load_explicit(&f->countdown, memory_order_relaxed);
  if (AB_LIKELY(n == 0)) {
    if (AB_UNLIKELY(atomic_load_explicit(&f->tripped, memory_order_relaxed))) {
      atomic_fetch_add(&f->hits, 1);
      return true;
    }
    return false;
  }
  /* Count down; the caller that takes it from 1 to 0 fails. */
  while (n > 0) {
    if (atomic_compare_exchange_weak(&f->countdown, &n, n - 1)) {
      if (n == 1) {
        if (atomic_load(&f->persistent)) atomic_store(&f->tripped, true);
        atomic_fetch_add(&f->hits, 1);
        return true;
      }
      return false;
    }
  }
  return false;
}

static void site_arm(struct fault_site *f, long nth, bool persistent) {
  atomic_store(&f->countdown, 0);
  atomic_store(&f->tripped, false);
  atomic_store(&f->hits, 0);
  atomic_store(&f->persistent, persistent);
  atomic_store(&f->countdown, nth < 0 ? 0 : nth);
}

#ifdef AB_FAULT_INJECTION
bool ab__fault_check(void) { return site_check(&alloc_site); }
bool ab__fault_transfer_check(void) { return site_check(&transfer_site); }
#else
/* The checks are inline `false` (internal.h); arming is then a no-op. */
static inline void unused_site_check(void) { (void)site_check; }
#endif
static void arm(long nth, bool persistent) { site_arm(&alloc_site, nth, persistent); }
void ab__fault_arm_transfer(long nth) { site_arm(&transfer_site, nth, false); }
long ab__fault_transfer_injected(void) { return atomic_load(&transfer_site.hits); }
void ab__fault_arm(long nth) { arm(nth, false); }
void ab__fault_arm_persistent(long nth) { arm(nth, true); }

long ab__fault_injected(void) { return atomic_load(&alloc_site.hits); }

long ab__alloc_live(void) {
  long sum = 0;
  for (int i = 0; i < LIVE_STRIPES; i++) sum += atomic_load(&live[i].n);
  return sum;
}

static void *counted(void *p) {
  if (p != NULL) atomic_fetch_add_explicit(live_slot(), 1, memory_order_relaxed);
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
  if (posix_memalign(&p, align, n ? n : 1) != 0) return NULL;
  return counted(p);
}

void ab__free(void *p) {
  if (p == NULL) return;
  atomic_fetch_sub_explicit(live_slot(), 1, memory_order_relaxed);
  free(p);
}
