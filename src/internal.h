/* Internal declarations shared by the core (src/), the backends and the
 * converters. Names start with ab__. Never installed. */
#ifndef AB_INTERNAL_H
#define AB_INTERNAL_H

#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "arraybridge/arraybridge.h"

#if defined(__GNUC__)
#  define AB_PRINTF(f, a) __attribute__((format(printf, f, a)))
#  define AB_LIKELY(x) __builtin_expect(!!(x), 1)
#  define AB_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define AB_PRINTF(f, a)
#  define AB_LIKELY(x) (x)
#  define AB_UNLIKELY(x) (x)
#endif

/* Seconds on the monotonic clock, for the one-time trials that time the
 * host kernels (converters/host/gather.c) and the thread split
 * (parallel.c). */
static inline double ab__seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- device types as small indexes ------------------------------------- */

/* Tables indexed by device type (the pools, name lookups) use slots:
 * DLPack's types 1..AB__DLPACK_SLOTS-1 are their own slot, and the
 * library's private types (a backend's staging memory, outside DLPack's
 * numbering: AB_DEVICE_OPENCL_HOST is 0x10004) take the slots after them:
 * the range [AB__PRIVATE_TYPE_BASE, AB__PRIVATE_TYPE_BASE +
 * AB__PRIVATE_TYPES) is arraybridge's. -1 for any other value. */
#define AB__DLPACK_SLOTS 32
#define AB__PRIVATE_TYPE_BASE 0x10000
#define AB__PRIVATE_TYPES 16
#define AB__TYPE_SLOTS (AB__DLPACK_SLOTS + AB__PRIVATE_TYPES)
/* Device ids 0..AB__MAX_IDS-1 of each type: what the pools' table holds,
 * and so what the library uses of a backend that has more (ab__dev_count
 * counts no further; ab__dev_init logs it when the backend starts). */
#define AB__MAX_IDS 128
static inline bool ab__is_private_type(int type) {
  return type >= AB__PRIVATE_TYPE_BASE && type < AB__PRIVATE_TYPE_BASE + AB__PRIVATE_TYPES;
}
static inline int ab__type_slot(int type) {
  if (type > 0 && type < AB__DLPACK_SLOTS) return type;
  return ab__is_private_type(type) ? AB__DLPACK_SLOTS + (type - AB__PRIVATE_TYPE_BASE) : -1;
}
static inline DLDeviceType ab__slot_type(int slot) {
  return slot >= AB__DLPACK_SLOTS ? (DLDeviceType)(AB__PRIVATE_TYPE_BASE + slot - AB__DLPACK_SLOTS) : (DLDeviceType)slot;
}

/* ---- errors (error.c) ------------------------------------------------- */

/* Records the detail message for ab_last_error() and returns `status`, so a
 * failure reads `return AB_FAIL(AB_ERR_..., "fmt", ...)`. In debug builds
 * (AB_DEBUG) the file and line are logged too. */
ab_status ab__fail_at(const char *file, int line, ab_status status,
                      const char *fmt, ...) AB_PRINTF(4, 5);
#ifndef __clang_analyzer__
#define AB_FAIL(status, ...) ab__fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)
#else
/* For clang's static analyzer (make test-analyze), which cannot see across
 * files that ab__fail_at returns `status`: the same call, then `status`
 * itself, so a path through AB_FAIL is known to return the failure. */
#define AB_FAIL(status, ...) (ab__fail_at(__FILE__, __LINE__, (status), __VA_ARGS__), (status))
#endif

/* Writes `text` into buf (len >= 4) for a message: at most 40 characters,
 * "..." where it is cut, anything unprintable, and the double quote that
 * messages put around it, as '?'. AB__QUOTED holds the longest (40 + 3 +
 * the NUL), with room to spare. */
void ab__quote(const char *text, char *buf, size_t len);
#define AB__QUOTED 48

/* An invariant the code relies on and no input can break (validation has
 * run before). Debug builds check it and abort with file and line; for
 * clang's static analyzer (make test-analyze) a path that breaks it ends
 * there, as the analyzer cannot see what validation in another file
 * guarantees; release builds compile it to nothing. */
#if defined(AB_DEBUG) || defined(__clang_analyzer__)
#define AB_ASSUME(cond) ((cond) ? (void)0 : ab__assume_failed(__FILE__, __LINE__, #cond))
#else
#define AB_ASSUME(cond) ((void)0)
#endif
_Noreturn void ab__assume_failed(const char *file, int line, const char *cond);

/* Forwards a non-OK status to the caller; the message is already set. */
#define AB_FORWARD(expr)                                   \
  do {                                                     \
    ab_status ab__fwd_ = (expr);                           \
    if (AB_UNLIKELY(ab__fwd_ != AB_OK)) {                  \
      ab__trace(__FILE__, __LINE__, ab__fwd_);             \
      return ab__fwd_;                                     \
    }                                                      \
  } while (0)

void ab__trace(const char *file, int line, ab_status status);

/* For internal calls that may fail without the public call failing: keep
 * the caller-visible message across them. */
#define AB_ERRBUF_SIZE 512
void ab__save_error(char saved[AB_ERRBUF_SIZE]);
void ab__restore_error(const char saved[AB_ERRBUF_SIZE]);

/* The thread's last failure was a device's memory running out at a
 * buffer's first use (pool.h says why that matters): the backend notes
 * it right after failing so; any later failure (or restored message)
 * forgets it, so a note is never stale. ab__first_use_oom takes it. */
void ab__note_first_use_oom(DLDevice dev);
bool ab__first_use_oom(DLDevice *dev);

/* ---- logging (log.c) -------------------------------------------------- */

enum ab__log_level { AB_LOG_OFF = 0, AB_LOG_ERROR, AB_LOG_WARN, AB_LOG_INFO, AB_LOG_DEBUG };
/* Level from AB_LOG_LEVEL (off, error, warn, info, debug), read once. */
int ab__log_level(void);
void ab__log(int level, const char *fmt, ...) AB_PRINTF(2, 3);
#define AB_LOG(level, ...) \
  do { if (ab__log_level() >= (level)) ab__log((level), __VA_ARGS__); } while (0)

/* ---- host allocation hook (alloc.c) ----------------------------------- */

/* Every host allocation of the library goes through these, so the fault
 * hook below sees it and the live count stays true. */
void *ab__malloc(size_t n);
void *ab__calloc(size_t count, size_t n);
/* `align` is a power of two >= sizeof(void *). Free with ab__free. For the
 * host backend's data blocks: it does not consult the fault injector, which
 * ab__dev_alloc has already asked, so one block is one fault point. */
void *ab__aligned_alloc(size_t align, size_t n);
void ab__free(void *p);

/* Fault injection, shared by host and device allocations: every allocation
 * point calls ab__fault_check() first and fails as out of memory when it
 * returns true. Test-only control below; zero cost beyond one atomic load
 * when disarmed. */
#ifdef AB_FAULT_INJECTION
bool ab__fault_check(void);
#else
/* Compiled out (a Release build without the tests): never fails. */
static inline bool ab__fault_check(void) { return false; }
#endif
/* Make the nth allocation from now fail (1 = the next); 0 disarms. */
void ab__fault_arm(long nth);
/* The same, but every allocation from the nth on fails until disarmed. */
void ab__fault_arm_persistent(long nth);
/* How many faults were injected since the last ab__fault_arm. */
long ab__fault_injected(void);
/* The same for backend transfers and synchronisations (copies, reads,
 * writes, staged chunks, fences, host syncs): each such call checks
 * ab__fault_transfer_check() first and fails as AB_ERR_BACKEND ("injected
 * transfer fault") when it returns true. Transient only. */
#ifdef AB_FAULT_INJECTION
bool ab__fault_transfer_check(void);
#else
static inline bool ab__fault_transfer_check(void) { return false; }
#endif
void ab__fault_arm_transfer(long nth);
long ab__fault_transfer_injected(void);
/* Host blocks currently allocated through ab__malloc & co. */
long ab__alloc_live(void);
/* The same after returning every pool's cached blocks to its backend, not
 * counting the pools themselves (pool.c): what a leak check compares. */
long ab__alloc_live_settled(void);

/* A byte count from an environment variable (pool.c): "512MiB", "8GiB",
 * "2GB", "1048576" (binary and decimal suffixes, optional "B"), n chars of
 * s. False when malformed or overflowing. */
bool ab__parse_size(const char *s, size_t n, uint64_t *out);

/* ---- settings from the environment (env.c) ---------------------------- */

/* Every AB_* variable is read through these. Unset and empty are alike; a
 * malformed value is logged and the default used. Users cache what they
 * read, together with ab__env_generation() at the time, and read again
 * when it has changed: ab__env_reload() (tests) changes it. */
unsigned ab__env_generation(void);
void ab__env_reload(void);
/* The value, or NULL when unset or empty (not copied: read it before any
 * setenv). */
const char *ab__env_str(const char *name);
/* The value of the choice whose name the variable holds; dflt when unset;
 * logged ("want <want>") and dflt when it is none of them. `choices` ends
 * with a NULL name. */
struct ab__env_choice {
  const char *name;
  int value;
};
int ab__env_choice(const char *name, const struct ab__env_choice *choices, int dflt, const char *want);
/* The choices of a switch: 1 or on (1), 0 or off (0). */
extern const struct ab__env_choice ab__env_on_off[];
/* A byte count ("4MiB", ab__parse_size) within [lo, hi]; dflt otherwise. */
uint64_t ab__env_size(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi, const char *example);
/* A decimal integer within [lo, hi]; dflt otherwise. */
long ab__env_int(const char *name, long dflt, long lo, long hi);
/* Whether this line about a malformed variable is the first of its
 * generation (a set of the lines logged, src/env.c): false for a repeat,
 * which is not logged again. */
bool ab__env_first_line(const char *line);
/* A small setting cached with the generation it was read at, in one word
 * (generation << 32 | value), for readers on hot paths: ab__env_cached
 * gives the value while the generation holds, ab__env_keep stores a value
 * just read. */
typedef _Atomic uint64_t ab__env_cache;
static inline bool ab__env_cached(ab__env_cache *c, uint32_t *value) {
  const uint64_t w = atomic_load_explicit(c, memory_order_relaxed);
  if ((uint32_t)(w >> 32) != ab__env_generation()) return false;
  *value = (uint32_t)w;
  return true;
}
static inline uint32_t ab__env_keep(ab__env_cache *c, uint32_t value) {
  atomic_store_explicit(c, (uint64_t)ab__env_generation() << 32 | value, memory_order_relaxed);
  return value;
}
/* A kept word back as the int it was kept from (negative ones too),
 * without relying on how the compiler converts an unsigned value above
 * INT_MAX. */
_Static_assert(INT_MAX == 0x7fffffff, "ab__env_int_of keeps ints in 32 bits");
static inline int ab__env_int_of(uint32_t v) { return v <= (uint32_t)INT_MAX ? (int)v : -(int)(UINT32_MAX - v) - 1; }
/* A choice (ab__env_choice, dflt when unset) read through such a cache:
 * the first call of a generation reads the variable, every later one the
 * cache. resolve, where not NULL, turns the value read into the one kept
 * (an "auto" worked out from cpuid or sysfs), so that is done once a
 * generation too. */
static inline int ab__env_choice_cached(ab__env_cache *c, const char *name, const struct ab__env_choice *choices,
                                        int dflt, const char *want, int (*resolve)(int)) {
  uint32_t v;
  if (AB_LIKELY(ab__env_cached(c, &v))) return ab__env_int_of(v);
  int x = ab__env_choice(name, choices, dflt, want);
  if (resolve != NULL) x = resolve(x);
  return ab__env_int_of(ab__env_keep(c, (uint32_t)x));
}
/* A switch (ab__env_on_off) read through such a cache: dflt when unset. */
static inline bool ab__env_switch(ab__env_cache *c, const char *name, int dflt) {
  return ab__env_choice_cached(c, name, ab__env_on_off, dflt, "1 or 0", NULL) != 0;
}

/* AB_HOST_HUGEPAGES (on unless 0): whether large host blocks are offered
 * to the kernel for transparent huge pages (backends/host/host.c). */
bool ab__host_hugepages(void);

/* pthread_atfork, logged where it refuses (src/lifetime.c, "fork"); `what`
 * names the locks the handlers guard. */
void ab__atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), const char *what);

/* Signals 1 up to this (not included): the standard ones (Linux numbers
 * them 1-31 on every CPU; the real-time ones above are the C library's
 * and the program's). */
#define AB__STD_SIGNALS 32
/* Whether sig is one a fault raises in the thread that made it (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS; and SIGABRT, abort's). */
bool ab__fault_signal(int sig);
/* Blocks, in the calling thread, every signal but a fault's, saving the
 * mask in *old; threads started until the mask is put back
 * (pthread_sigmask(SIG_SETMASK, old, NULL)) take it (src/lifetime.c,
 * "signals"). */
void ab__block_async_signals(sigset_t *old);

/* ---- checked arithmetic ----------------------------------------------- */

static inline bool ab__mul_overflow_i64(int64_t a, int64_t b, int64_t *r) {
  return __builtin_mul_overflow(a, b, r);
}
static inline bool ab__add_overflow_i64(int64_t a, int64_t b, int64_t *r) {
  return __builtin_add_overflow(a, b, r);
}

#endif /* AB_INTERNAL_H */
