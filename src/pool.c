/* Per-device caching pools: size classes, reuse, statistics, limits, trim
 * and the OOM sequence. Backends only allocate and free raw blocks.
 *
 * Thread caches: in front of each pool, every thread that allocates from it
 * keeps a few blocks of up to 256 KiB and one larger block (see "thread
 * caches" below), so that the common alloc-free cycle of threads
 * converting at once takes no shared lock and writes no shared cache line.
 *
 * Locking: one mutex per pool, held only for bookkeeping. Backend calls,
 * host allocations of descriptors and OOM callbacks run with no pool lock
 * held, so a callback may delete tensors (whose deleters take the lock) and
 * a slow driver free (cudaFree synchronises) does not stall other threads.
 * Pools live in a fixed table of atomic pointers indexed by device type and
 * id, created with a compare-and-swap. The one lock shared across devices
 * is the registry of thread caches ("thread caches" below), taken off the
 * fast paths only: when a cache is made or leaves, by statistics, trim and
 * the OOM sequence, and when a large allocation misses the shared cache. */
#define _GNU_SOURCE 1 /* PTHREAD_MUTEX_ADAPTIVE_NP */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pool.h"

/* ---- size classes --------------------------------------------------------
 * Up to 4 KiB: multiples of 256 B (16 classes; the allocation alignment, so
 * rounding costs nothing in alignment). Up to 32 MiB: 8 classes per power of
 * two, so rounding wastes at most 12.5% (never the 2x of power-of-two
 * rounding, PyTorch issue 95823). Above: multiples of 2 MiB, cached in one
 * list and reused best-fit when the waste stays under 12.5%. Blocks are not
 * split: a cached block serves one size class, which keeps free/alloc O(1)
 * and device memory free of unsplittable-segment fragmentation; the OOM
 * sequence returns cached blocks to the driver before failing. */
#define SMALL_STEP ((size_t)256)
#define SMALL_MAX ((size_t)4096)
#define SMALL_CLASSES 16
#define GEO_MAX ((size_t)32 << 20)
#define GEO_FIRST_LOG 12 /* 2^12 < size <= 2^13 is the first geometric octave */
#define GEO_LAST_LOG 24  /* 2^24 < size <= 2^25 the last */
#define NCLASSES (SMALL_CLASSES + (GEO_LAST_LOG - GEO_FIRST_LOG + 1) * 8)
#define LARGE_STEP ((size_t)2 << 20)

static int log2_floor(size_t x) { return 63 - __builtin_clzll((unsigned long long)x); }

size_t ab__pool_round(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= SMALL_MAX) return (bytes + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP;
  if (bytes <= GEO_MAX) {
    int k = log2_floor(bytes - 1); /* 2^k < bytes <= 2^(k+1) */
    size_t step = (size_t)1 << (k - 3);
    return (bytes + step - 1) / step * step;
  }
  if (bytes > SIZE_MAX - LARGE_STEP) return 0;
  return (bytes + LARGE_STEP - 1) / LARGE_STEP * LARGE_STEP;
}

/* Bin of a rounded size, or -1 for the large list. */
static int class_index(size_t size) {
  if (size <= SMALL_MAX) return (int)(size / SMALL_STEP) - 1;
  if (size > GEO_MAX) return -1;
  int k = log2_floor(size - 1);
  size_t step = (size_t)1 << (k - 3);
  int j = (int)((size - ((size_t)1 << k)) / step); /* 1..8 */
  return SMALL_CLASSES + (k - GEO_FIRST_LOG) * 8 + (j - 1);
}

/* ---- pools ------------------------------------------------------------- */

struct ab__pool {
  pthread_mutex_t lock;
  const struct ab_backend *be;
  DLDevice dev;
  uint64_t gen;            /* unique per pool ever made: thread caches' key */
  struct ab_pool_stats st; /* guarded by lock; its in_use_bytes and
                            * requested_bytes are kept in use/req below */
  ab__block *bins[NCLASSES];
  ab__block *large;      /* newest first */
  uint64_t large_bytes;  /* the sizes of the blocks in `large` */
  bool host_ram;         /* its memory is the host's RAM (keep_large) */
  uint64_t keep_peak;    /* use_peak's highest since a trim (keep_large) */
  uint64_t trim_peak;    /* use_peak when trimmed: no new peak while it is the same */
  /* Left behind by ab_shutdown while tensors still held blocks: out of the
   * table (a fresh pool serves the device after re-initialisation), its
   * blocks go back to the driver as they are freed, and the last one
   * destroys it. Listed in `orphans` (registry lock) until then. */
  bool orphaned;
  struct ab__pool *orphan_next;
  struct tcache *caches; /* the threads' caches of this pool (registry lock) */
  /* Bytes that grows in progress reserved against the limit, not yet in
   * reserved_bytes (the driver has not answered). Under lock. */
  uint64_t pending;
  /* The in-use and requested gauges at pool level: blocks out of the
   * shared cache, whether held by tensors or idle in a thread cache, and
   * what was last asked of them. Atomic: thread-cache hits read them (and
   * raise the peaks) without the pool lock. */
  _Atomic uint64_t use, use_peak, req, req_peak;
};

#define MAX_TYPES AB__TYPE_SLOTS /* indexed by ab__type_slot */
#define MAX_IDS AB__MAX_IDS
static _Atomic(struct ab__pool *) table[MAX_TYPES][MAX_IDS];
static struct ab__pool *orphans; /* registry lock */

static atomic_uint_fast64_t next_gen = 1;

static void raise_peak(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

/* ---- AB_MEMORY_LIMIT ------------------------------------------------------ */

struct limit_rule {
  int type;   /* DLDeviceType */
  int32_t id; /* -1 = every device of the type */
  uint64_t bytes;
};
#define MAX_RULES 64
static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
/* The thread caches' list and the table's changes (fork_prepare, below). */
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER; /* the OOM callbacks (below) */
static pthread_once_t tc_once = PTHREAD_ONCE_INIT; /* the thread caches' key */
static void tc_init(void);
static unsigned env_generation; /* of the rules; 0: never parsed */
static bool env_stale;          /* ab_shutdown asks for a new read */
static int nrules;
static struct limit_rule rules[MAX_RULES];
static char env_error[256];

/* "512MiB", "8GiB", "2GB", "1048576": binary (KiB..TiB, also K/M/G/T) and
 * decimal (KB..TB) suffixes, optional "B". */
bool ab__parse_size(const char *s, size_t n, uint64_t *out) {
  static const struct { const char *suffix; uint64_t mult; } units[] = {
    {"", 1}, {"B", 1},
    {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
    {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
    {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
    {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
  };
  size_t i = 0;
  uint64_t v = 0;
  if (n == 0 || s[0] < '0' || s[0] > '9') return false;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
      return false;
  }
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    size_t len = strlen(units[u].suffix);
    if (len == n - i && strncmp(s + i, units[u].suffix, len) == 0)
      return !__builtin_mul_overflow(v, units[u].mult, out);
  }
  return false;
}

ab_status ab_parse_size(const char *text, uint64_t *bytes) {
  char q[AB__QUOTED];
  uint64_t v;
  if (text == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "size text is NULL");
  if (bytes == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "bytes is NULL");
  if (!ab__parse_size(text, strlen(text), &v)) {
    ab__quote(text, q, sizeof q);
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "size \"%s\" is not a byte count: digits, then B, K/KiB, M/MiB, G/GiB, T/TiB (binary) or KB, "
                   "MB, GB, TB (decimal), below 2^64",
                   q);
  }
  *bytes = v;
  return AB_OK;
}

static int type_from_name(const char *s, size_t n) {
  for (int t = 1; t < MAX_TYPES; t++) {
    const char *name = ab_device_type_name(ab__slot_type(t));
    if (strcmp(name, "unknown") != 0 && strlen(name) == n && strncasecmp(name, s, n) == 0)
      return (int)ab__slot_type(t);
  }
  return -1;
}

/* The n bytes at p as ab__quote writes a text: at most 40 characters,
 * unprintable ones as '?' (an entry of a variable, for a message). */
static const char *quoted_part(const char *p, size_t n, char q[AB__QUOTED]) {
  char part[48];
  const size_t k = n < sizeof part - 1 ? n : sizeof part - 1;
  memcpy(part, p, k);
  part[k] = '\0';
  ab__quote(part, q, AB__QUOTED);
  return q;
}

/* Parses "type[:id]=size,..." into rules, or fills env_error. */
static void parse_env(const char *v) {
  nrules = 0;
  env_error[0] = '\0';
  if (v == NULL || *v == '\0') return;
  /* one comma at either end is a separator left over from building the
   * list (",cpu=1GiB", "cpu=1GiB,"); an empty entry between two is not */
  const char *p = *v == ',' ? v + 1 : v;
  char qe[AB__QUOTED], qp[AB__QUOTED]; /* an entry and a part of it, for a message */
  while (*p) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', n), *colon = memchr(p, ':', n);
    struct limit_rule r = {0, -1, 0};
    if (eq == NULL) {
      snprintf(env_error, sizeof env_error, "AB_MEMORY_LIMIT entry \"%s\" has no '=' (want type[:id]=size, e.g. cuda:0=8GiB)",
               quoted_part(p, n, qe));
      return;
    }
    if (colon != NULL && colon > eq) colon = NULL;
    r.type = type_from_name(p, (size_t)((colon ? colon : eq) - p));
    if (r.type < 0) {
      snprintf(env_error, sizeof env_error, "AB_MEMORY_LIMIT entry \"%s\": unknown device type \"%s\" (cpu, cuda, cuda_host, opencl, ...)",
               quoted_part(p, n, qe), quoted_part(p, (size_t)((colon ? colon : eq) - p), qp));
      return;
    }
    if (colon != NULL) {
      char *e;
      char idbuf[16];
      size_t idlen = (size_t)(eq - colon - 1);
      long id = -1;
      if (idlen > 0 && idlen < sizeof idbuf) {
        memcpy(idbuf, colon + 1, idlen);
        idbuf[idlen] = '\0';
        id = strtol(idbuf, &e, 10);
        if (*e != '\0' || idbuf[0] < '0' || idbuf[0] > '9') id = -1; /* digits only: strtol skips blanks, takes signs */
      }
      if (id < 0 || id >= MAX_IDS) {
        snprintf(env_error, sizeof env_error, "AB_MEMORY_LIMIT entry \"%s\": device id must be 0..%d", quoted_part(p, n, qe),
                 MAX_IDS - 1);
        return;
      }
      r.id = (int32_t)id;
    }
    if (!ab__parse_size(eq + 1, (size_t)(p + n - eq - 1), &r.bytes)) {
      snprintf(env_error, sizeof env_error, "AB_MEMORY_LIMIT entry \"%s\": size \"%s\" is not a byte count like 512MiB, 8GiB or 1000000",
               quoted_part(p, n, qe), quoted_part(eq + 1, (size_t)(p + n - eq - 1), qp));
      return;
    }
    if (nrules == MAX_RULES) {
      snprintf(env_error, sizeof env_error, "AB_MEMORY_LIMIT has more than %d entries", MAX_RULES);
      return;
    }
    rules[nrules++] = r;
    p += n + (end != NULL);
  }
}

/* The limit for dev from AB_MEMORY_LIMIT (later entries win), read when
 * a pool is created: once, and again after ab_shutdown or ab__env_reload. */
static ab_status env_limit(DLDevice dev, uint64_t *out) {
  pthread_mutex_lock(&env_lock);
  const unsigned gen = ab__env_generation();
  if (env_generation != gen || env_stale) {
    parse_env(ab__env_str("AB_MEMORY_LIMIT"));
    env_generation = gen;
    env_stale = false;
    if (env_error[0]) AB_LOG(AB_LOG_ERROR, "%s", env_error);
  }
  *out = 0;
  for (int i = 0; i < nrules; i++)
    if (rules[i].type == (int)dev.device_type && (rules[i].id < 0 || rules[i].id == dev.device_id))
      *out = rules[i].bytes;
  bool bad = env_error[0] != '\0';
  pthread_mutex_unlock(&env_lock);
  if (bad) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "%s", env_error);
  return AB_OK;
}

static void env_reread(void) {
  pthread_mutex_lock(&env_lock);
  env_stale = true;
  pthread_mutex_unlock(&env_lock);
}

/* Where dev's pool is kept, or NULL for a device no pool can cover. */
static _Atomic(struct ab__pool *) *pool_slot(DLDevice dev) {
  const int ts = ab__type_slot((int)dev.device_type);
  if (ts < 0 || dev.device_id < 0 || dev.device_id >= MAX_IDS) return NULL;
  return &table[ts][dev.device_id];
}

/* The pool of a checked device, created on first use. */
static ab_status pool_get(const struct ab_backend *be, DLDevice dev, struct ab__pool **out) {
  _Atomic(struct ab__pool *) *slot = pool_slot(dev);
  if (slot == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "%s:%" PRId32 ": pools cover device ids 0..%d only",
                   ab_device_type_name(dev.device_type), dev.device_id, MAX_IDS - 1);
  struct ab__pool *p = atomic_load_explicit(slot, memory_order_acquire);
  if (AB_LIKELY(p != NULL)) {
    *out = p;
    return AB_OK;
  }
  uint64_t limit;
  AB_FORWARD(env_limit(dev, &limit));
  p = ab__calloc(1, sizeof *p);
  if (p == NULL)
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory for the pool of %s:%" PRId32,
                   sizeof *p, ab_device_type_name(dev.device_type), dev.device_id);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
  /* The critical sections are a few dozen ns: spin briefly before sleeping
   * in the kernel, so two threads hitting the cache do not pay a futex
   * round trip each time (bench_pool, two threads). */
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
  pthread_mutex_init(&p->lock, &attr);
  pthread_mutexattr_destroy(&attr);
  p->be = be;
  p->dev = dev;
  p->gen = atomic_fetch_add_explicit(&next_gen, 1, memory_order_relaxed);
  p->st.device = dev;
  p->st.limit_bytes = limit;
  p->host_ram = (be->caps & AB_CAP_HOST_ACCESSIBLE) || (ab__dev_caps(be, dev.device_id) & AB_CAP_UNIFIED_MEMORY);
  struct ab__pool *expected = NULL;
  pthread_mutex_lock(&registry); /* so that a fork's prepare handler sees every pool it must lock */
  const bool won =
      atomic_compare_exchange_strong_explicit(slot, &expected, p, memory_order_acq_rel, memory_order_acquire);
  pthread_mutex_unlock(&registry);
  if (!won) {
    pthread_mutex_destroy(&p->lock); /* another thread won the race */
    ab__free(p);
    p = expected;
  }
  *out = p;
  return AB_OK;
}

/* ---- cache ---------------------------------------------------------------- */

/* Takes a cached block for a rounded size, under the lock. With `most`
 * (the OOM path) the smallest block of `size` to `most` bytes will do,
 * whatever its class; with 0 only the size's own class, or for the large
 * list a best fit within 12.5%. */
static ab__block *take_cached(struct ab__pool *p, size_t size, size_t most) {
  const bool any_fit = most != 0;
  int c = class_index(size);
  ab__block *b = NULL, **link = NULL;
  if (c >= 0) {
    for (int i = c; i < NCLASSES && (i == c || any_fit); i++) {
      if (p->bins[i] != NULL) {
        if (i == c || p->bins[i]->size <= most) link = &p->bins[i];
        break;
      }
    }
  }
  if (link == NULL && (c < 0 || any_fit)) {
    size_t best = SIZE_MAX, bound = any_fit ? most : size + size / 8;
    for (ab__block **l = &p->large; *l != NULL; l = &(*l)->next) {
      if ((*l)->size >= size && (*l)->size <= bound && (*l)->size < best) {
        best = (*l)->size;
        link = l;
      }
    }
  }
  if (link == NULL) return NULL;
  b = *link;
  *link = b->next;
  b->next = NULL;
  p->st.cached_blocks--;
  if (class_index(b->size) < 0) p->large_bytes -= b->size;
  b->reused = true;
  return b;
}

static void put_cached(struct ab__pool *p, ab__block *b) {
  int c = class_index(b->size);
  ab__block **head = c >= 0 ? &p->bins[c] : &p->large;
  b->next = *head;
  *head = b;
  p->st.cached_blocks++;
  if (c < 0) p->large_bytes += b->size;
}

/* Large blocks of host RAM kept cached: four times the most the pool has
 * ever had in use, and at least LARGE_KEEP bytes. Sizes above 32 MiB are
 * reused only within 12.5%, so a stream of requests of ever new sizes
 * (crops of a volume of varying depth, say) makes a new block for most of
 * them; on a device the OOM sequence gives them back when memory runs
 * short, but host RAM seldom fails an allocation (the kernel's OOM killer
 * acts first), so without a bound the cache grew with every new size (a
 * pyclesperanto pipeline's probe: 2.3 GiB cached, 196 MiB in use at most).
 * Four times, not less: sizes taken in turn (five frame sizes of 40-100
 * MiB, one at a time) are a working set of several times the peak, and a
 * bound below it gives each back just before it is asked for again (a
 * review measured 62 of 100 such requests reaching the driver with twice
 * the peak). Past the bound, the oldest block that was never served from
 * the cache goes first, and the oldest of all only where every block was,
 * so that the sizes a pipeline keeps using outlast the new ones (each
 * eviction ages the oldest spared block). The peak is the pool's own, not
 * the one ab_pool_reset_peak restarts for a phase; ab_pool_trim restarts
 * it from what is in use, so that one large tensor of the past does not
 * keep the bound high for good. Device memory keeps every block, as CUDA's
 * caching allocators do. */
#define LARGE_KEEP ((uint64_t)512 << 20)

/* use_peak into keep_peak where it moved since the last trim. Under the
 * lock. */
static void fold_peak(struct ab__pool *p) {
  const uint64_t peak = atomic_load_explicit(&p->use_peak, memory_order_relaxed);
  if (peak != p->trim_peak && peak > p->keep_peak) p->keep_peak = peak;
}

/* Unlinks large blocks of a host-RAM pool past that bound into *out,
 * counted as given back; in_use: the pool's use with the block just freed
 * still counted. Under the lock; the caller gives them to the driver
 * after it (free_blocks). */
static void keep_large(struct ab__pool *p, ab__block **out, uint64_t in_use) {
  fold_peak(p);
  if (in_use > p->keep_peak) p->keep_peak = in_use; /* use_peak may not have moved since a trim */
  const uint64_t keep = p->keep_peak > LARGE_KEEP / 4 ? 4 * p->keep_peak : LARGE_KEEP;
  while (p->host_ram && p->large_bytes > keep) {
    ab__block **oldest = NULL, **oldest_unused = NULL; /* the list is newest first */
    for (ab__block **l = &p->large; *l != NULL; l = &(*l)->next) {
      oldest = l;
      if (!(*l)->reused) oldest_unused = l;
    }
    if (oldest == NULL) break; /* none: large_bytes counts the list's, so never */
    ab__block **at = oldest_unused != NULL ? oldest_unused : oldest, *b = *at;
    /* A second chance, not a pass for good: the oldest block, spared for
     * having been reused, loses its mark, so that the sizes of a phase
     * that ended go once the next phase's sizes recur (a review: phase-one
     * blocks kept, every phase-two block given back, 44 of 100 requests
     * to the driver). */
    if (*oldest != b) (*oldest)->reused = false;
    *at = b->next;
    p->large_bytes -= b->size;
    p->st.cached_blocks--;
    p->st.reserved_bytes.current -= b->size;
    p->st.backend_frees++;
    b->next = *out;
    *out = b;
  }
}

/* Gives blocks unlinked from a pool of backend `be`, device `id`, back to
 * the driver. Not under the lock (the pool's fields are read under it). */
static void free_blocks(const struct ab_backend *be, int32_t id, ab__block *list) {
  while (list != NULL) {
    ab__block *next = list->next;
    ab__dev_free(be, id, list->ptr, list->size);
    ab__free(list);
    list = next;
  }
}

/* ---- thread caches -----------------------------------------------------
 * A thread that allocates from a pool gets a cache of its own for it: up to
 * TC_PER_CLASS blocks per size class, TC_MAX_IDLE bytes in all, of blocks
 * up to TC_MAX_SIZE, and a slot (`big`) for one larger block. A free puts
 * the block there when the freeing thread has a cache for the pool and it
 * has room, and an allocation of that class takes it back, under the
 * cache's own lock only (uncontended but when a trim, a stats read, the
 * OOM sequence, ab_shutdown or another thread's steal visits). The rest is
 * the shared path above; AB_POOL_THREAD_CACHE=0 turns the caches off.
 *
 * Large blocks (over TC_MAX_SIZE): two threads each allocating and freeing
 * a 4 MiB or 256 MiB block took 270-620 ns a cycle through the pool mutex,
 * 2-5 times one thread's (bench_pool, Intel Xeon VM, 2 cores,
 * bench/results/2026-11-26-pool-large-slots.md). A thread's slot holds
 * the last one it freed (the one before goes to the shared cache). Such a
 * block is device memory that another thread may want, so an allocation
 * that misses the shared cache looks in the other threads' slots
 * (steal_big) before asking the driver; a block that leaves a slot for the
 * shared cache while that allocation is between the two looks (its thread
 * exits, say) is missed, as a block freed a moment later would be. Trim
 * and the OOM sequence take the slots back as they take the rest of a
 * cache.
 *
 * Accounting: the pool-level gauges count a block idle in a thread cache as
 * out of the pool (in use); the cache counts its idle bytes, slot included
 * (and what was last requested of them). A read sums: current = pool level
 * minus every cache's idle bytes, exact. A peak is raised by the thread
 * that changes a gauge, from the pool level minus its own idle bytes:
 * exact while one thread at a time keeps a cache of the pool; with
 * several, it may overstate the true peak by the bytes idle in the other
 * threads' caches at that moment (at most TC_MAX_IDLE and one large block
 * each), never understate it. Exact peaks across threads would need every
 * allocation and free to write one shared counter: kept beside
 * the pool's use for the large blocks, it cost two threads 320 ns per
 * 4 MiB allocation and free, against 75 for one (bench_pool, the same VM).
 * Counters (allocations, frees, hits) are kept per cache and summed when
 * read.
 *
 * Lifetime: a cache is the owner thread's memory; the owner frees it at
 * thread exit (a pthread key destructor, after giving its blocks back) or
 * when it finds it detached. ab_shutdown detaches every cache of a pool
 * (blocks back to the pool, `pool` set to NULL) before the pool goes.
 *
 * Lock order: registry, then a cache's lock, then the pool's lock. The
 * owner's hit and free paths take only its cache's lock; the shared path
 * takes only the pool's, but for a large miss, which takes the registry
 * and the other caches' locks to steal (steal_big); nothing holds a
 * cache's lock across the shared path or a backend call. */
#define TC_MAX_SIZE ((size_t)256 << 10)
#define TC_CLASSES 64 /* class_index(TC_MAX_SIZE) + 1 */
#define TC_PER_CLASS 8
#define TC_MAX_IDLE ((uint64_t)1 << 20)

/* A cache's lock: held for a few dozen ns, almost always by its owner
 * alone (others take it only to trim, read statistics, run the OOM
 * sequence, steal its large block, shut down or fork),
 * so a flag and a yield beat a mutex: one atomic exchange to take it and a
 * plain store to give it back, where pthread_mutex_lock and _unlock were
 * two atomic operations and two calls (16% of a 4 KiB conversion, perf). */
typedef atomic_flag tc_lock_t;
static void tc_lock(tc_lock_t *l) {
  while (atomic_flag_test_and_set_explicit(l, memory_order_acquire)) sched_yield();
}
static void tc_unlock(tc_lock_t *l) { atomic_flag_clear_explicit(l, memory_order_release); }

/* Two cache lines: CPUs fetch them in pairs (the adjacent-line prefetch). */
#define TC_ALIGN 128

struct tcache {
  tc_lock_t lock;
  struct ab__pool *pool;      /* NULL once detached */
  uint64_t gen;               /* the pool's gen; owner's lookup key */
  struct tcache *next, *prev; /* in pool->caches, under the registry lock */
  struct tcache *tnext;       /* the owner's list; owner only */
  /* The rest under lock; idle and idle_req atomic so that their owner can
   * read them without it (for the peaks). */
  _Atomic uint64_t idle;     /* bytes of the blocks in bins and big */
  _Atomic uint64_t idle_req; /* what was last requested of them */
  uint64_t nblocks, allocations, hits, frees; /* nblocks: bins and big */
  uint8_t count[TC_CLASSES];
  ab__block *bins[TC_CLASSES];
  ab__block *big; /* one idle block over TC_MAX_SIZE, or NULL */
};

static pthread_key_t tc_key;
static atomic_bool tc_key_ok;
static _Thread_local struct tcache *my_caches, *my_last;

static bool tc_enabled(void) {
  static ab__env_cache cache;
  return ab__env_switch(&cache, "AB_POOL_THREAD_CACHE", 1);
}

static uint64_t relaxed(_Atomic uint64_t *a) { return atomic_load_explicit(a, memory_order_relaxed); }
static void set_relaxed(_Atomic uint64_t *a, uint64_t v) { atomic_store_explicit(a, v, memory_order_relaxed); }

/* Raises the pool's peaks from its level minus the caller's own idle bytes
 * (see the accounting note above). */
static void note_peaks(struct ab__pool *p, struct tcache *own) {
  uint64_t idle = own != NULL ? relaxed(&own->idle) : 0;
  uint64_t idle_req = own != NULL ? relaxed(&own->idle_req) : 0;
  uint64_t use = relaxed(&p->use), req = relaxed(&p->req);
  raise_peak(&p->use_peak, use > idle ? use - idle : 0);
  raise_peak(&p->req_peak, req > idle_req ? req - idle_req : 0);
}

/* Takes the block out of a cache's slot for large blocks, into the
 * caller's hands (still counted in use at pool level). Under tc->lock. */
static ab__block *big_out(struct tcache *tc) {
  ab__block *b = tc->big;
  tc->big = NULL;
  tc->nblocks--;
  set_relaxed(&tc->idle, relaxed(&tc->idle) - b->size);
  set_relaxed(&tc->idle_req, relaxed(&tc->idle_req) - b->requested);
  return b;
}

/* Whether a block of `have` bytes serves a request rounded to `size`, as
 * take_cached would take it without any_fit: its own class, or for the
 * large list a fit within 12.5%. */
static bool big_fits(size_t have, size_t size) {
  return class_index(size) >= 0 ? have == size : have >= size && have <= size + size / 8;
}

/* Gives a cache's blocks and counts to its pool. Under tc->lock. */
static void tc_flush(struct tcache *tc) {
  struct ab__pool *p = tc->pool;
  pthread_mutex_lock(&p->lock);
  if (tc->big != NULL) { /* its bytes are in idle, subtracted below */
    put_cached(p, tc->big);
    tc->big = NULL;
  }
  for (int c = 0; c < TC_CLASSES; c++) {
    while (tc->bins[c] != NULL) {
      ab__block *b = tc->bins[c];
      tc->bins[c] = b->next;
      put_cached(p, b);
    }
    tc->count[c] = 0;
  }
  atomic_fetch_sub_explicit(&p->use, relaxed(&tc->idle), memory_order_relaxed);
  atomic_fetch_sub_explicit(&p->req, relaxed(&tc->idle_req), memory_order_relaxed);
  p->st.allocations += tc->allocations;
  p->st.cache_hits += tc->hits;
  p->st.frees += tc->frees;
  pthread_mutex_unlock(&p->lock);
  set_relaxed(&tc->idle, 0);
  set_relaxed(&tc->idle_req, 0);
  tc->nblocks = tc->allocations = tc->hits = tc->frees = 0;
}

/* Flushes a cache and takes it off its pool. Under the registry and
 * tc->lock. */
static void tc_detach(struct tcache *tc) {
  struct ab__pool *p = tc->pool;
  tc_flush(tc);
  if (tc->prev != NULL) tc->prev->next = tc->next;
  else p->caches = tc->next;
  if (tc->next != NULL) tc->next->prev = tc->prev;
  tc->next = tc->prev = NULL;
  tc->pool = NULL;
}

/* Thread exit: every cache of the thread back to its pool, then freed. */
static void tc_thread_exit(void *head) {
  struct tcache *next;
  for (struct tcache *tc = head; tc != NULL; tc = next) {
    next = tc->tnext;
    pthread_mutex_lock(&registry);
    tc_lock(&tc->lock);
    if (tc->pool != NULL) tc_detach(tc);
    tc_unlock(&tc->lock);
    pthread_mutex_unlock(&registry);
    free(tc);
  }
  my_caches = my_last = NULL;
}

/* fork: no lock of the pools may be held by a thread the child will not
 * have (the child would wait for it for ever). The prepare handler takes
 * them all, in the order every path takes them: the registry, each
 * cache's lock, each pool's lock (the pools in the table: one is added,
 * and taken out at shutdown, under the registry), then the leaf locks
 * (the environment's, the callbacks'), which are never held while
 * another is taken. The pools ab_shutdown orphaned (tensors of them still
 * alive) are out of the table, in `orphans`: their locks are taken too. */
static void each_cache(bool lock) {
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++) {
      struct ab__pool *p = atomic_load_explicit(&table[t][i], memory_order_acquire);
      for (struct tcache *tc = p != NULL ? p->caches : NULL; tc != NULL; tc = tc->next) {
        if (lock) tc_lock(&tc->lock);
        else tc_unlock(&tc->lock);
      }
    }
}
static void lock_or_unlock(struct ab__pool *p, bool lock) {
  if (lock) pthread_mutex_lock(&p->lock);
  else pthread_mutex_unlock(&p->lock);
}
static void each_pool(bool lock) {
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++) {
      struct ab__pool *p = atomic_load_explicit(&table[t][i], memory_order_acquire);
      if (p != NULL) lock_or_unlock(p, lock);
    }
  for (struct ab__pool *p = orphans; p != NULL; p = p->orphan_next) lock_or_unlock(p, lock);
}
static void fork_prepare(void) {
  pthread_mutex_lock(&registry);
  each_cache(true);
  each_pool(true);
  pthread_mutex_lock(&env_lock);
  pthread_mutex_lock(&cb_lock);
}
static void fork_done(void) {
  pthread_mutex_unlock(&cb_lock);
  pthread_mutex_unlock(&env_lock);
  each_pool(false);
  each_cache(false);
  pthread_mutex_unlock(&registry);
}

/* The child has only the forking thread: a grow in progress was another
 * thread's, and its reservation would count against the limit for ever. */
static void fork_child(void) {
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++) {
      struct ab__pool *p = atomic_load_explicit(&table[t][i], memory_order_acquire);
      if (p != NULL) p->pending = 0; /* an orphaned pool never grows */
    }
  fork_done();
}

/* Registered as the library is loaded: see "fork" in lifetime.c. */
__attribute__((constructor)) static void fork_register(void) { ab__atfork(fork_prepare, fork_done, fork_child, "the pools' locks"); }

static void tc_init(void) { tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0; }

/* At dlclose (or exit): no thread-exit destructor may run into unloaded
 * code afterwards; the caches of threads still running are left (memory,
 * not a crash). */
__attribute__((destructor)) static void tc_unload(void) {
  if (tc_key_ok) pthread_key_delete(tc_key);
  tc_key_ok = false;
}

/* Frees the calling thread's caches that ab_shutdown detached (all of
 * them, when called at its end), rather than leaving them for the
 * thread's next allocation from a pool: after a dlclose that never comes,
 * and each load of a plugin lost them (a probe: 0.8 KB a load for each
 * pool the thread used). Other threads free theirs in tc_get or at exit. */
static void tc_free_own(void) {
  for (struct tcache **link = &my_caches; *link != NULL;) {
    struct tcache *old = *link;
    tc_lock(&old->lock);
    const bool dead = old->pool == NULL;
    tc_unlock(&old->lock);
    if (!dead) {
      link = &old->tnext;
      continue;
    }
    *link = old->tnext;
    if (my_last == old) my_last = NULL;
    free(old);
  }
  if (tc_key_ok) pthread_setspecific(tc_key, my_caches); /* the list's head for tc_thread_exit */
}

/* The caller's cache of p: found, made (when `create`), or NULL (off, no
 * memory, no thread key). */
static struct tcache *tc_get(struct ab__pool *p, bool create) {
  struct tcache *tc = my_last;
  if (AB_LIKELY(tc != NULL && tc->gen == p->gen)) return tc;
  for (tc = my_caches; tc != NULL; tc = tc->tnext)
    if (tc->gen == p->gen) return my_last = tc;
  if (!create) return NULL;
  pthread_once(&tc_once, tc_init);
  if (!tc_key_ok) return NULL;
  tc_free_own(); /* the caches ab_shutdown detached, while the list is walked anyway */
  /* Not ab__calloc: a cache is the thread's, not a tracked library block,
   * and a failure here only means the shared path. On lines of its own
   * (TC_ALIGN): its lock and counts are written at every hit, and two
   * threads' caches side by side in malloc's memory made each hit wait for
   * the other core's line (bench_pool, AMD EPYC (Zen 5) VM, 256 B, two
   * threads: 47.7-48.9 ns a pair per thread against 21.5-25.5 on one; on
   * lines of their own 20.5-20.7 against 19.9-20.9;
   * bench/results/2026-12-03-zen5-recheck.md). */
  void *mem = NULL;
  if (posix_memalign(&mem, TC_ALIGN, (sizeof *tc + TC_ALIGN - 1) / TC_ALIGN * TC_ALIGN) != 0) return NULL;
  tc = memset(mem, 0, sizeof *tc);
  atomic_flag_clear(&tc->lock);
  tc->gen = p->gen;
  tc->pool = p;
  tc->tnext = my_caches;
  if (pthread_setspecific(tc_key, tc) != 0) {
    free(tc);
    return NULL;
  }
  my_caches = tc;
  pthread_mutex_lock(&registry);
  tc->next = p->caches;
  if (p->caches != NULL) p->caches->prev = tc;
  p->caches = tc;
  pthread_mutex_unlock(&registry);
  return my_last = tc;
}

/* An allocation from the caller's cache, or NULL. */
static ab__block *tc_take(struct tcache *tc, struct ab__pool *p, size_t size, size_t bytes) {
  ab__block *b = NULL;
  tc_lock(&tc->lock);
  if (tc->pool != p) {
    /* detached: the shared path */
  } else if (size > TC_MAX_SIZE) {
    if (tc->big != NULL && big_fits(tc->big->size, size)) b = big_out(tc);
  } else {
    const int c = class_index(size);
    b = tc->bins[c];
    if (b != NULL) {
      tc->bins[c] = b->next;
      b->next = NULL;
      tc->count[c]--;
      tc->nblocks--;
      set_relaxed(&tc->idle, relaxed(&tc->idle) - b->size);
      set_relaxed(&tc->idle_req, relaxed(&tc->idle_req) - b->requested);
    }
  }
  if (b != NULL) {
    b->reused = true;
    tc->allocations++;
    tc->hits++;
    if (bytes != b->requested) /* modular: a decrease wraps back */
      atomic_fetch_add_explicit(&p->req, (uint64_t)bytes - b->requested, memory_order_relaxed);
    b->requested = bytes;
    note_peaks(p, tc);
  }
  tc_unlock(&tc->lock);
  return b;
}

/* b into tc's counts as an idle block (its place, bin or slot, is the
 * caller's). Under tc->lock. */
static void tc_count_in(struct tcache *tc, const ab__block *b) {
  tc->nblocks++;
  set_relaxed(&tc->idle, relaxed(&tc->idle) + b->size);
  set_relaxed(&tc->idle_req, relaxed(&tc->idle_req) + b->requested);
  tc->frees++;
}

/* A free into the caller's cache. Returns false when it has none or no
 * room; true when it took b. */
static bool tc_put(ab__block *b) {
  struct ab__pool *p = b->pool;
  if (!tc_enabled()) return false;
  struct tcache *tc = tc_get(p, false);
  if (tc == NULL) return false;
  bool kept = false;
  tc_lock(&tc->lock);
  if (b->size > TC_MAX_SIZE) {
    ab__block *gone = NULL; /* past keep_large's bound, for the driver */
    const struct ab_backend *be = p->be;
    const int32_t id = p->dev.device_id;
    /* The slot keeps the last large block freed: a thread that moves on
     * to another size keeps the new one at hand. */
    if (tc->pool == p) {
      /* The block it held goes to the shared cache before this cache's
       * lock is given up, so that a statistics read, a trim or the OOM
       * sequence finds it idle in one of the two, never in neither (it
       * left the slot's idle bytes; its free was counted going in). The
       * pool is not orphaned: ab_shutdown detaches every cache, under
       * its lock, before it orphans a pool. */
      if (tc->big != NULL) {
        ab__block *old = big_out(tc);
        pthread_mutex_lock(&p->lock);
        atomic_fetch_sub_explicit(&p->use, old->size, memory_order_relaxed);
        atomic_fetch_sub_explicit(&p->req, old->requested, memory_order_relaxed);
        put_cached(p, old);
        if (AB_UNLIKELY(p->large_bytes > LARGE_KEEP)) keep_large(p, &gone, relaxed(&p->use) + old->size);
        pthread_mutex_unlock(&p->lock);
      }
      tc->big = b;
      tc_count_in(tc, b);
      kept = true;
    }
    tc_unlock(&tc->lock);
    free_blocks(be, id, gone);
    return kept;
  }
  const int c = class_index(b->size);
  const uint64_t small_idle = relaxed(&tc->idle) - (tc->big != NULL ? tc->big->size : 0);
  if (tc->pool == p && tc->count[c] < TC_PER_CLASS && small_idle + b->size <= TC_MAX_IDLE) {
    b->next = tc->bins[c];
    tc->bins[c] = b;
    tc->count[c]++;
    tc_count_in(tc, b);
    kept = true;
  }
  tc_unlock(&tc->lock);
  return kept;
}

/* Every cache of p back to p (and, with `detach`, off it). */
static void flush_caches(struct ab__pool *p, bool detach) {
  pthread_mutex_lock(&registry);
  struct tcache *next;
  for (struct tcache *tc = p->caches; tc != NULL; tc = next) {
    next = tc->next;
    tc_lock(&tc->lock);
    if (detach) tc_detach(tc);
    else tc_flush(tc);
    tc_unlock(&tc->lock);
  }
  pthread_mutex_unlock(&registry);
}

/* A consistent reading of p's statistics, its caches summed in. */
static void read_stats(struct ab__pool *p, struct ab_pool_stats *s, bool reset_peaks) {
  pthread_mutex_lock(&registry);
  for (struct tcache *tc = p->caches; tc != NULL; tc = tc->next) tc_lock(&tc->lock);
  pthread_mutex_lock(&p->lock);
  *s = p->st;
  uint64_t idle = 0, idle_req = 0;
  for (struct tcache *tc = p->caches; tc != NULL; tc = tc->next) {
    idle += relaxed(&tc->idle);
    idle_req += relaxed(&tc->idle_req);
    s->cached_blocks += tc->nblocks;
    s->allocations += tc->allocations;
    s->cache_hits += tc->hits;
    s->frees += tc->frees;
  }
  s->in_use_bytes.current = relaxed(&p->use) - idle;
  s->requested_bytes.current = relaxed(&p->req) - idle_req;
  if (reset_peaks) {
    fold_peak(p); /* keep_large's, before it restarts */
    p->trim_peak = UINT64_MAX;
    p->st.reserved_bytes.peak = p->st.reserved_bytes.current;
    set_relaxed(&p->use_peak, s->in_use_bytes.current);
    set_relaxed(&p->req_peak, s->requested_bytes.current);
  }
  s->reserved_bytes.peak = p->st.reserved_bytes.peak;
  s->in_use_bytes.peak = relaxed(&p->use_peak);
  s->requested_bytes.peak = relaxed(&p->req_peak);
  if (s->in_use_bytes.peak < s->in_use_bytes.current) s->in_use_bytes.peak = s->in_use_bytes.current;
  if (s->requested_bytes.peak < s->requested_bytes.current) s->requested_bytes.peak = s->requested_bytes.current;
  pthread_mutex_unlock(&p->lock);
  for (struct tcache *tc = p->caches; tc != NULL; tc = tc->next) tc_unlock(&tc->lock);
  pthread_mutex_unlock(&registry);
}

/* Returns every cached block, the threads' caches' too, to the backend;
 * the bookkeeping under the lock, the driver calls after it. Returns the
 * bytes released. */
static uint64_t release_cache(struct ab__pool *p, bool detach_caches) {
  ab__block *list = NULL;
  uint64_t bytes = 0, n = 0;
  flush_caches(p, detach_caches);
  pthread_mutex_lock(&p->lock);
  for (int i = 0; i <= NCLASSES; i++) {
    ab__block **head = i < NCLASSES ? &p->bins[i] : &p->large;
    while (*head != NULL) {
      ab__block *b = *head;
      *head = b->next;
      b->next = list;
      list = b;
      bytes += b->size;
      n++;
    }
  }
  p->st.cached_blocks = 0;
  p->large_bytes = 0;
  p->st.reserved_bytes.current -= bytes;
  p->st.backend_frees += n;
  p->st.trims++;
  pthread_mutex_unlock(&p->lock);
  free_blocks(p->be, p->dev.device_id, list);
  return bytes;
}

/* ---- growing ------------------------------------------------------------- */

/* A block goes to a caller: under the lock. `own` is the caller's cache
 * of p, if it has one (for the peaks). */
static void account_use(struct ab__pool *p, ab__block *b, size_t bytes, struct tcache *own) {
  b->requested = bytes;
  p->st.allocations++;
  atomic_fetch_add_explicit(&p->use, b->size, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->req, bytes, memory_order_relaxed);
  note_peaks(p, own);
}

/* Why the last grow attempt failed, for the final OOM message. */
struct grow_fail {
  bool over_limit;
  char driver[200];
};

/* A new block of `size` from the backend, within the limit, for a request
 * of `bytes` (accounted as in use as it is counted reserved, so that a
 * statistics read never finds it in one and not the other; `own` as for
 * account_use). Statuses: AB_OK, AB_ERR_OUT_OF_MEMORY (limit or driver;
 * retryable), AB_ERR_UNSUPPORTED (the driver refused the size itself: not
 * retried at it), or another backend error (not retried). */
static ab_status grow(struct ab__pool *p, size_t size, size_t bytes, struct tcache *own, ab__block **out,
                      struct grow_fail *why) {
  ab__block *b = ab__malloc(sizeof *b);
  if (b == NULL) {
    why->over_limit = false;
    snprintf(why->driver, sizeof why->driver, "no host memory for a %zu-byte block descriptor", sizeof *b);
    return AB_ERR_OUT_OF_MEMORY;
  }
  /* Reserve first, so that concurrent growers cannot pass the limit: as
   * pending until the driver has answered, reserved from then on. */
  pthread_mutex_lock(&p->lock);
  uint64_t limit = p->st.limit_bytes, reserved = p->st.reserved_bytes.current + p->pending;
  if (limit != 0 && (reserved > limit || size > limit - reserved)) {
    pthread_mutex_unlock(&p->lock);
    ab__free(b);
    why->over_limit = true;
    return AB_ERR_OUT_OF_MEMORY;
  }
  p->pending += size;
  pthread_mutex_unlock(&p->lock);

  /* The driver's out-of-memory or size message goes into why (the final
   * message quotes it); the thread's message is put back, so that a call
   * the sequence (or a block of the request's own size) then rescues
   * succeeds with the message unchanged, as successful calls leave it.
   * Other failures end the call with it. */
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  void *ptr = NULL;
  ab_status st = ab__dev_alloc(p->be, p->dev.device_id, size, &ptr);
  if (st == AB_OK) {
    memset(b, 0, sizeof *b);
    b->ptr = ptr;
    b->size = size;
    b->pool = p;
  }
  pthread_mutex_lock(&p->lock);
  p->pending -= size;
  if (st == AB_OK) {
    p->st.backend_allocs++;
    p->st.reserved_bytes.current += size;
    if (p->st.reserved_bytes.current > p->st.reserved_bytes.peak)
      p->st.reserved_bytes.peak = p->st.reserved_bytes.current;
    account_use(p, b, bytes, own);
  }
  pthread_mutex_unlock(&p->lock);
  if (st != AB_OK) {
    ab__free(b);
    why->over_limit = false;
    snprintf(why->driver, sizeof why->driver, "%s", ab_last_error());
    if (st == AB_ERR_OUT_OF_MEMORY || st == AB_ERR_UNSUPPORTED) ab__restore_error(saved);
    return st;
  }
  *out = b;
  return AB_OK;
}

/* ---- OOM callbacks ------------------------------------------------------- */

struct callback {
  ab_oom_callback fn;
  void *user;
};
static struct callback callbacks[AB_OOM_MAX_CALLBACKS];
static int ncallbacks;

ab_status ab_register_oom_callback(ab_oom_callback fn, void *user) {
  ab_status st = AB_OK;
  if (fn == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "fn is NULL");
  pthread_mutex_lock(&cb_lock);
  for (int i = 0; i < ncallbacks; i++)
    if (callbacks[i].fn == fn && callbacks[i].user == user)
      st = AB_FAIL(AB_ERR_INVALID_ARGUMENT, "this OOM callback is already registered with this user pointer");
  if (st == AB_OK && ncallbacks == AB_OOM_MAX_CALLBACKS)
    st = AB_FAIL(AB_ERR_UNSUPPORTED, "already %d OOM callbacks registered (AB_OOM_MAX_CALLBACKS)",
                 AB_OOM_MAX_CALLBACKS);
  if (st == AB_OK) callbacks[ncallbacks++] = (struct callback){fn, user};
  pthread_mutex_unlock(&cb_lock);
  return st;
}

ab_status ab_unregister_oom_callback(ab_oom_callback fn, void *user) {
  pthread_mutex_lock(&cb_lock);
  for (int i = 0; i < ncallbacks; i++) {
    if (callbacks[i].fn == fn && callbacks[i].user == user) {
      memmove(&callbacks[i], &callbacks[i + 1], (size_t)(ncallbacks - i - 1) * sizeof callbacks[0]);
      ncallbacks--;
      pthread_mutex_unlock(&cb_lock);
      return AB_OK;
    }
  }
  pthread_mutex_unlock(&cb_lock);
  return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "this OOM callback is not registered with this user pointer");
}

/* Runs every callback once, in registration order, on a snapshot taken
 * under the lock and called without it. Returns the bytes they report;
 * *called is how many ran. */
static uint64_t run_callbacks(DLDevice dev, size_t requested, int *called) {
  struct callback snap[AB_OOM_MAX_CALLBACKS];
  int n;
  uint64_t freed = 0;
  pthread_mutex_lock(&cb_lock);
  n = ncallbacks;
  *called = n;
  memcpy(snap, callbacks, (size_t)n * sizeof snap[0]);
  pthread_mutex_unlock(&cb_lock);
  for (int i = 0; i < n; i++) {
    size_t f = snap[i].fn(dev, requested, snap[i].user);
    freed = f > UINT64_MAX - freed ? UINT64_MAX : freed + f;
  }
  return freed;
}

/* ---- allocation ----------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t len, uint64_t b) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}; /* UINT64_MAX is 16 EiB */
  double v = (double)b;
  int i = 0;
  while (v >= 1024.0 && i < 6) {
    v /= 1024.0;
    i++;
  }
  if (i == 0) snprintf(buf, len, "%" PRIu64 " B", b);
  else snprintf(buf, len, "%.1f %s", v, u[i]);
}

/* The allocation was counted as a miss in ab__pool_alloc; served from the
 * cache after all, it is a hit instead (each allocation counts once, so
 * hits + misses stays the number of allocations asked of the pool). Under
 * the lock. */
static void count_late_hit(struct ab__pool *p) {
  p->st.cache_misses--;
  p->st.cache_hits++;
}

/* Any idle block of `size` to `most` bytes, in the shared cache or in a
 * thread's (they are flushed to it first: a block a thread or a callback
 * freed into its own cache counts as cached here too), as a late hit,
 * accounted for a request of `bytes`; or NULL. */
static ab__block *take_any_fit(struct ab__pool *p, size_t size, size_t most, size_t bytes, struct tcache *own) {
  flush_caches(p, false);
  pthread_mutex_lock(&p->lock);
  ab__block *b = take_cached(p, size, most);
  if (b != NULL) {
    count_late_hit(p);
    account_use(p, b, bytes, own);
  }
  pthread_mutex_unlock(&p->lock);
  return b;
}

/* The block a request of `bytes` rounded to `size` takes where `size`
 * itself does not fit: above 32 MiB the 2 MiB rounding alone can be what
 * does not fit (a limit, or a device's largest allocation, that is not a
 * multiple of 2 MiB), so the request's own size in 256 B steps, which the
 * large list holds as well as any other; below, `size`. */
static size_t own_size(size_t bytes, size_t size) {
  return size > GEO_MAX ? (bytes + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP : size;
}

/* Whether a request of `size` fits p's limit once every cached block is
 * released: what is in use, and being grown, plus it within the limit
 * (not where the limit was lowered below what is in use). */
static bool fits_once_released(struct ab__pool *p, size_t size) {
  struct ab_pool_stats s;
  read_stats(p, &s, false);
  pthread_mutex_lock(&p->lock);
  const uint64_t used = s.in_use_bytes.current + p->pending;
  pthread_mutex_unlock(&p->lock);
  return s.limit_bytes != 0 && used <= s.limit_bytes && size <= s.limit_bytes - used;
}

/* Steps 1-4 of the OOM sequence (see the public header). */
static ab_status oom_sequence(struct ab__pool *p, size_t bytes, size_t size, struct tcache *own,
                              ab__block **out, struct grow_fail *why) {
  int retries = 0, rounds = 0;
  ab_status st = AB_ERR_OUT_OF_MEMORY;
  const size_t least = own_size(bytes, size);
  /* Where the limit refused the request and releasing the cache makes
   * room for it, a cached block more than twice its size goes back to the
   * driver with the rest of the cache instead of serving it, so that a
   * small tensor does not hold a large block the next requests need
   * (another thread growing meanwhile can still take that room). Where
   * the driver refused, or the limit was lowered below what is in use,
   * any block that fits serves: a release may not help. */
  const size_t most =
      why->over_limit && least <= SIZE_MAX / 2 && fits_once_released(p, least) ? 2 * least : SIZE_MAX;

  for (;;) {
    /* A cached block that fits, whatever its class, before anything else
     * (the first time, within `most`). */
    ab__block *b = take_any_fit(p, least, retries == 0 ? most : SIZE_MAX, bytes, own);
    if (b != NULL) {
      *out = b;
      return AB_OK;
    }
    if (retries > 0) {
      /* Retried after a cache release already: ask the callbacks. */
      if (rounds == AB_OOM_MAX_CALLBACK_ROUNDS) break;
      int called;
      uint64_t freed = run_callbacks(p->dev, bytes, &called);
      if (called == 0) break; /* none registered: no round ran */
      rounds++;
      if (freed == 0) break;
      /* What they freed may have come back to this cache: look again. */
      b = take_any_fit(p, least, SIZE_MAX, bytes, own);
      if (b != NULL) {
        *out = b;
        return AB_OK;
      }
    }
    release_cache(p, false);
    retries++;
    pthread_mutex_lock(&p->lock);
    p->st.oom_retries++;
    pthread_mutex_unlock(&p->lock);
    st = grow(p, size, bytes, own, out, why);
    if ((st == AB_ERR_OUT_OF_MEMORY || st == AB_ERR_UNSUPPORTED) && least < size)
      st = grow(p, least, bytes, own, out, why);
    if (st != AB_ERR_OUT_OF_MEMORY) return st;
  }

  uint64_t dfree, dtotal;
  ab__dev_meminfo(p->be, p->dev.device_id, &dfree, &dtotal);
  pthread_mutex_lock(&p->lock);
  p->st.oom_failures++;
  pthread_mutex_unlock(&p->lock);
  struct ab_pool_stats s;
  read_stats(p, &s, false);
  char req[24], blk[24], used[24], res[24], lim[24], fr[24], tot[24];
  fmt_bytes(req, sizeof req, bytes);
  fmt_bytes(blk, sizeof blk, size);
  fmt_bytes(used, sizeof used, s.in_use_bytes.current);
  fmt_bytes(res, sizeof res, s.reserved_bytes.current);
  if (s.limit_bytes) fmt_bytes(lim, sizeof lim, s.limit_bytes);
  else snprintf(lim, sizeof lim, "none");
  /* 0 is also what a device that cannot tell reports (OpenCL has no
   * free-memory query): not to be read as "full" */
  if (dfree) fmt_bytes(fr, sizeof fr, dfree);
  else snprintf(fr, sizeof fr, dtotal ? "0 B or unreported" : "unknown");
  if (dtotal) fmt_bytes(tot, sizeof tot, dtotal);
  else snprintf(tot, sizeof tot, "unknown");
  return AB_FAIL(AB_ERR_OUT_OF_MEMORY,
                 "%s:%" PRId32 ": out of memory allocating %zu bytes (%s, block %s): %s; in use %s, "
                 "reserved %s, limit %s, device free %s of %s; %d retr%s after releasing the cache, "
                 "%d callback round%s",
                 ab_device_type_name(p->dev.device_type), p->dev.device_id, bytes, req, blk,
                 why->over_limit ? "the memory limit would be exceeded" : why->driver, used, res, lim,
                 fr, tot, retries, retries == 1 ? "y" : "ies", rounds, rounds == 1 ? "" : "s");
}

/* A large block that fits `size`, taken from another thread's slot (see
 * "thread caches") for a request of `bytes` and accounted as a hit of the
 * miss already counted, or NULL. Called on a miss of the shared cache,
 * before the pool grows; the caller's own slot (`own`) was looked at
 * already. All of it under the registry, so that a statistics read sees
 * the block either idle or allocated. */
static ab__block *steal_big(struct ab__pool *p, size_t size, size_t bytes, struct tcache *own) {
  ab__block *b = NULL;
  pthread_mutex_lock(&registry);
  for (struct tcache *tc = p->caches; tc != NULL && b == NULL; tc = tc->next) {
    if (tc == own) continue;
    tc_lock(&tc->lock);
    if (tc->pool == p && tc->big != NULL && big_fits(tc->big->size, size)) b = big_out(tc);
    tc_unlock(&tc->lock);
  }
  if (b != NULL) {
    b->reused = true;
    pthread_mutex_lock(&p->lock);
    count_late_hit(p);
    p->st.allocations++;
    if (bytes != b->requested) /* modular: a decrease wraps back */
      atomic_fetch_add_explicit(&p->req, (uint64_t)bytes - b->requested, memory_order_relaxed);
    b->requested = bytes;
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&registry);
  return b;
}

ab_status ab__pool_alloc(const struct ab_backend *be, DLDevice dev, size_t bytes, ab__block **out) {
  struct ab__pool *p;
  size_t size = ab__pool_round(bytes);
  if (size == 0)
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "%s:%" PRId32 ": cannot allocate %zu bytes: too large",
                   ab_device_type_name(dev.device_type), dev.device_id, bytes);
  AB_FORWARD(pool_get(be, dev, &p));

  /* The caller's own cache first: its lock only. */
  struct tcache *tc = tc_enabled() ? tc_get(p, true) : NULL;
  ab__block *b = tc != NULL ? tc_take(tc, p, size, bytes) : NULL;
  if (b != NULL) {
    *out = b;
    return AB_OK;
  }

  /* The shared hit path takes the pool lock once: find, unlink, account. */
  pthread_mutex_lock(&p->lock);
  b = take_cached(p, size, 0);
  if (b != NULL) {
    p->st.cache_hits++;
    account_use(p, b, bytes, tc);
    pthread_mutex_unlock(&p->lock);
    *out = b;
    return AB_OK;
  }
  p->st.cache_misses++;
  pthread_mutex_unlock(&p->lock);

  /* An idle large block on another thread before a new one. */
  if (size > TC_MAX_SIZE && tc_enabled() && (b = steal_big(p, size, bytes, tc)) != NULL) {
    note_peaks(p, tc);
    *out = b;
    return AB_OK;
  }

  struct grow_fail why = {false, ""};
  ab_status st = grow(p, size, bytes, tc, &b, &why);
  /* The driver refused the size itself (AB_ERR_UNSUPPORTED: past OpenCL's
   * largest buffer): no release or callback can make room for it, so the
   * OOM sequence does not empty the cache and ask the callbacks for
   * nothing. A cached block that fits is taken (one of the request's own
   * size, made before: where the driver's largest buffer is not a multiple
   * of the class, every such request came to this path and none was
   * reused), else a request whose size class alone is past it takes its
   * own size at once. */
  const size_t least = own_size(bytes, size);
  if (st == AB_ERR_UNSUPPORTED && (b = take_any_fit(p, least, SIZE_MAX, bytes, tc)) != NULL) st = AB_OK;
  else if (st == AB_ERR_UNSUPPORTED && least < size) st = grow(p, least, bytes, tc, &b, &why);
  if (st == AB_ERR_OUT_OF_MEMORY) st = oom_sequence(p, bytes, size, tc, &b, &why);
  if (st == AB_ERR_UNSUPPORTED) {
    pthread_mutex_lock(&p->lock);
    p->st.oom_failures++;
    pthread_mutex_unlock(&p->lock);
    char req[24], blk[24];
    fmt_bytes(req, sizeof req, bytes);
    fmt_bytes(blk, sizeof blk, least);
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY,
                   "%s:%" PRId32 ": out of memory allocating %zu bytes (%s, block %s): %s; no release or callback "
                   "can make room for it, so none ran",
                   ab_device_type_name(dev.device_type), dev.device_id, bytes, req, blk, why.driver);
  }
  if (st != AB_OK) return st;
  *out = b;
  return AB_OK;
}

void ab__pool_free(ab__block *b) {
  struct ab__pool *p = b->pool;
  if (tc_put(b)) return;
  pthread_mutex_lock(&p->lock);
  p->st.frees++;
  atomic_fetch_sub_explicit(&p->use, b->size, memory_order_relaxed);
  atomic_fetch_sub_explicit(&p->req, b->requested, memory_order_relaxed);
  if (AB_LIKELY(!p->orphaned)) {
    put_cached(p, b);
    ab__block *old = NULL;
    if (AB_UNLIKELY(p->large_bytes > LARGE_KEEP)) keep_large(p, &old, relaxed(&p->use) + b->size);
    const struct ab_backend *be = p->be;
    const int32_t id = p->dev.device_id;
    pthread_mutex_unlock(&p->lock);
    free_blocks(be, id, old);
    return;
  }
  p->st.reserved_bytes.current -= b->size;
  p->st.backend_frees++;
  bool last = relaxed(&p->use) == 0;
  /* Read before unlocking: once unlocked, the thread freeing the last
   * block may destroy the pool. */
  const struct ab_backend *be = p->be;
  int32_t id = p->dev.device_id;
  pthread_mutex_unlock(&p->lock);
  ab__dev_free(be, id, b->ptr, b->size);
  ab__free(b);
  if (last) {
    pthread_mutex_lock(&registry);
    struct ab__pool **l = &orphans;
    while (*l != p) l = &(*l)->orphan_next;
    *l = p->orphan_next;
    pthread_mutex_unlock(&registry);
    pthread_mutex_destroy(&p->lock);
    ab__free(p);
  }
}

/* ---- public API ------------------------------------------------------------ */

/* ---- running out at first use (pool.h) ----------------------------------- */

/* The device's pool where it has one (none is made here). */
static struct ab__pool *existing_pool(DLDevice dev) {
  _Atomic(struct ab__pool *) *slot = pool_slot(dev);
  return slot == NULL ? NULL : atomic_load_explicit(slot, memory_order_acquire);
}

bool ab__pool_relieve(DLDevice dev, size_t bytes, struct ab__relief *r) {
  struct ab__pool *p = existing_pool(dev);
  if (p == NULL) return false;
  /* The cache once (thread caches flushed into it by the release): each
   * failed try gives its block back to it, so again would be for ever. */
  bool retry = false;
  if (!r->cache_released) {
    r->cache_released = true;
    retry = release_cache(p, false) > 0;
  }
  if (!retry && r->rounds < AB_OOM_MAX_CALLBACK_ROUNDS) {
    int called;
    const uint64_t freed = run_callbacks(dev, bytes, &called);
    if (called > 0) r->rounds++;
    if (called > 0 && freed > 0) {
      release_cache(p, false); /* what they freed may sit in the cache */
      retry = true;
    }
  }
  if (retry) { /* counted as the sequence counts its retries */
    pthread_mutex_lock(&p->lock);
    p->st.oom_retries++;
    pthread_mutex_unlock(&p->lock);
  }
  return retry;
}

void ab__pool_count_oom_failure(DLDevice dev) {
  struct ab__pool *p = existing_pool(dev);
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  p->st.oom_failures++;
  pthread_mutex_unlock(&p->lock);
}

static ab_status pool_of(DLDevice dev, struct ab__pool **out) {
  const struct ab_backend *be;
  AB_FORWARD(ab__check_device(dev, "device", false, &dev, &be));
  return pool_get(be, dev, out);
}

uint64_t ab__pool_pending(DLDevice dev) {
  struct ab__pool *p = NULL;
  if (pool_of(dev, &p) != AB_OK) return 0;
  pthread_mutex_lock(&p->lock);
  uint64_t v = p->pending;
  pthread_mutex_unlock(&p->lock);
  return v;
}

ab_status ab_pool_stats(DLDevice dev, struct ab_pool_stats *out) {
  struct ab__pool *p;
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  if (out->size < sizeof out->size) /* not even the size field itself */
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out->size is %" PRIu32 "; set it to sizeof(struct ab_pool_stats)",
                   out->size);
  AB_FORWARD(pool_of(dev, &p));
  struct ab_pool_stats s;
  read_stats(p, &s, false);
  size_t n = out->size < sizeof s ? out->size : sizeof s;
  s.size = (uint32_t)n;
  memcpy(out, &s, n);
  return AB_OK;
}

ab_status ab_pool_reset_peak(DLDevice dev) {
  struct ab__pool *p = NULL; /* set when pool_of succeeds; gcc -O3 cannot tell */
  AB_FORWARD(pool_of(dev, &p));
  struct ab_pool_stats s;
  read_stats(p, &s, true);
  return AB_OK;
}

ab_status ab_pool_summary(DLDevice dev, char *buf, size_t len) {
  struct ab_pool_stats s = {.size = sizeof s};
  if (buf == NULL || len == 0) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "buf is NULL or len is 0");
  AB_FORWARD(ab_pool_stats(dev, &s));
  char cur[24], peak[24], lim[24];
  size_t off = 0;
  int n;
#define AB_APPEND_(...)                                                   \
  do {                                                                    \
    n = snprintf(buf + off, len - off, __VA_ARGS__);                      \
    if (n < 0 || (size_t)n >= len - off) return AB_OK; /* truncated */    \
    off += (size_t)n;                                                     \
  } while (0)
  if (s.limit_bytes) fmt_bytes(lim, sizeof lim, s.limit_bytes);
  else snprintf(lim, sizeof lim, "none");
  AB_APPEND_("arraybridge pool %s:%" PRId32 " (limit %s)\n", ab_device_type_name(s.device.device_type),
             s.device.device_id, lim);
  AB_APPEND_("  %-16s %14s %14s\n", "", "current", "peak");
#define AB_GAUGE_ROW_(name)                                                \
  fmt_bytes(cur, sizeof cur, s.name.current);                              \
  fmt_bytes(peak, sizeof peak, s.name.peak);                               \
  AB_APPEND_("  %-16s %14s %14s\n", #name, cur, peak);
  AB_POOL_GAUGE_FIELDS(AB_GAUGE_ROW_)
#undef AB_GAUGE_ROW_
  fmt_bytes(cur, sizeof cur, s.reserved_bytes.current - s.in_use_bytes.current);
  AB_APPEND_("  %-16s %14s   in %" PRIu64 " blocks\n", "cached", cur, s.cached_blocks);
  uint64_t asked = s.cache_hits + s.cache_misses;
  AB_APPEND_("  cache hit rate   %13.1f%%\n", asked ? 100.0 * (double)s.cache_hits / (double)asked : 0.0);
#define AB_COUNTER_ROW_(name) AB_APPEND_("  %-16s %14" PRIu64 "\n", #name, s.name);
  AB_POOL_COUNTER_FIELDS(AB_COUNTER_ROW_)
#undef AB_COUNTER_ROW_
#undef AB_APPEND_
  return AB_OK;
}

/* ab_pool_trim's: every cached block back, and keep_large's peak from
 * what is in use now (blocks idle in thread caches counted, as use_peak
 * counts them). */
static void trim(struct ab__pool *p) {
  release_cache(p, false);
  pthread_mutex_lock(&p->lock);
  p->keep_peak = relaxed(&p->use);
  p->trim_peak = relaxed(&p->use_peak);
  pthread_mutex_unlock(&p->lock);
}

ab_status ab_pool_trim(DLDevice dev) {
  struct ab__pool *p = NULL; /* set when pool_of succeeds; gcc -O3 cannot tell */
  AB_FORWARD(pool_of(dev, &p));
  trim(p);
  return AB_OK;
}

void ab_pool_trim_all(void) {
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++) {
      struct ab__pool *p = atomic_load_explicit(&table[t][i], memory_order_acquire);
      if (p != NULL) trim(p);
    }
}

ab_status ab_set_memory_limit(DLDevice dev, size_t bytes) {
  struct ab__pool *p = NULL; /* set when pool_of succeeds; gcc -O3 cannot tell */
  AB_FORWARD(pool_of(dev, &p));
  pthread_mutex_lock(&p->lock);
  p->st.limit_bytes = bytes;
  pthread_mutex_unlock(&p->lock);
  return AB_OK;
}

void ab__pool_shutdown(void) {
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++) {
      struct ab__pool *p = atomic_load_explicit(&table[t][i], memory_order_acquire);
      if (p == NULL) continue;
      release_cache(p, true);
      pthread_mutex_lock(&registry); /* out of the table as a fork's prepare handler walks it */
      pthread_mutex_lock(&p->lock);
      uint64_t in_use = relaxed(&p->use);
      /* Live tensors still point at the pool: it outlives the table, and
       * their deleters release its blocks and then the pool. */
      if (in_use != 0) {
        p->orphaned = true;
        p->orphan_next = orphans;
        orphans = p;
      }
      atomic_store_explicit(&table[t][i], NULL, memory_order_release);
      pthread_mutex_unlock(&p->lock);
      pthread_mutex_unlock(&registry);
      if (in_use != 0) {
        AB_LOG(AB_LOG_WARN, "ab_shutdown: %s:%d still has %" PRIu64 " bytes in use; they are released when deleted",
               ab_device_type_name(ab__slot_type(t)), i, in_use);
        continue;
      }
      pthread_mutex_destroy(&p->lock);
      ab__free(p);
    }
  tc_free_own();
  env_reread();
}

long ab__alloc_live_settled(void) {
  long pools = 0;
  ab_pool_trim_all();
  for (int t = 0; t < MAX_TYPES; t++)
    for (int i = 0; i < MAX_IDS; i++)
      if (atomic_load_explicit(&table[t][i], memory_order_acquire) != NULL) pools++;
  return ab__alloc_live() - pools;
}
