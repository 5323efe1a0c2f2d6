/* The AB_* environment variables, read the same way everywhere: unset and
 * empty are alike, sizes take the suffixes of ab__parse_size, and a
 * malformed value is logged once a generation in one form ("NAME=\"value\"
 * ignored: want ...; using ...", the value cut at 40 characters and made
 * printable by ab__quote), however many threads or caches read it, and
 * replaced by the default, never a failure.
 * Exceptions, each documented where the variable is: a malformed
 * AB_MEMORY_LIMIT fails every allocation (pools.md), a malformed
 * AB_OPENCL_DEVICE_TYPE leaves no OpenCL device (guide.md), a refused
 * AB_DEFAULT_DEVICE is logged with the device's reason (device.c),
 * AB_LOG_LEVEL is read by log.c (its message has its own words), and the
 * Python module reads AB_UNPICKLE_MISSING_DEVICE itself. Users cache what
 * they read against ab__env_generation(), so that one call,
 * ab__env_reload() (the tests'), makes every one of them read its
 * variables again on next use. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static atomic_uint generation = 1;

/* The lines logged so far, each as a hash of the line and the generation
 * it was logged in, so that threads whose first use of a setting comes at
 * once (the workers of one host move, say), or two caches of one
 * variable, log a malformed value once a generation. Slots are claimed
 * with a compare-and-swap, no lock (a fork never finds one held); once
 * all WARNED are taken, lines are logged as they come. */
#define WARNED 64
static _Atomic uint64_t warned[WARNED];

bool ab__env_first_line(const char *line) {
  uint64_t h = 0xcbf29ce484222325ull ^ ab__env_generation(); /* FNV-1a */
  for (const char *c = line; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
  h |= 1; /* 0 marks a free slot */
  for (int i = 0; i < WARNED; i++) {
    uint64_t seen = 0;
    if (atomic_compare_exchange_strong_explicit(&warned[i], &seen, h, memory_order_relaxed, memory_order_relaxed))
      return true; /* claimed: the first */
    if (seen == h) return false;
  }
  return true;
}

__attribute__((format(printf, 1, 2))) static void warn_once(const char *fmt, ...) {
  if (ab__log_level() < AB_LOG_ERROR) return;
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (ab__env_first_line(line)) AB_LOG(AB_LOG_ERROR, "%s", line);
}

unsigned ab__env_generation(void) { return atomic_load_explicit(&generation, memory_order_acquire); }

void ab__env_reload(void) { atomic_fetch_add_explicit(&generation, 1, memory_order_acq_rel); }

const char *ab__env_str(const char *name) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? v : NULL;
}

const struct ab__env_choice ab__env_on_off[] = {{"1", 1}, {"on", 1}, {"0", 0}, {"off", 0}, {NULL, 0}};

int ab__env_choice(const char *name, const struct ab__env_choice *choices, int dflt, const char *want) {
  const char *v = ab__env_str(name);
  if (v == NULL) return dflt;
  for (const struct ab__env_choice *c = choices; c->name != NULL; c++)
    if (strcmp(v, c->name) == 0) return c->value;
  const char *dname = "the default";
  for (const struct ab__env_choice *c = choices; c->name != NULL; c++)
    if (c->value == dflt) {
      dname = c->name;
      break;
    }
  char q[AB__QUOTED];
  ab__quote(v, q, sizeof q);
  warn_once("%s=\"%s\" ignored: want %s; using %s", name, q, want, dname);
  return dflt;
}

uint64_t ab__env_size(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi, const char *example) {
  const char *v = ab__env_str(name);
  uint64_t x;
  if (v == NULL) return dflt;
  if (!ab__parse_size(v, strlen(v), &x) || x < lo || x > hi) {
    char q[AB__QUOTED];
    ab__quote(v, q, sizeof q);
    if (dflt < lo) /* a default outside the range: the caller's own choice */
      warn_once("%s=\"%s\" ignored: want a size from %llu to %llu bytes (e.g. %s); using the default",
             name, q, (unsigned long long)lo, (unsigned long long)hi, example);
    else
      warn_once("%s=\"%s\" ignored: want a size from %llu to %llu bytes (e.g. %s); using %llu", name, q,
             (unsigned long long)lo, (unsigned long long)hi, example, (unsigned long long)dflt);
    return dflt;
  }
  return x;
}

long ab__env_int(const char *name, long dflt, long lo, long hi) {
  const char *v = ab__env_str(name);
  if (v == NULL) return dflt;
  char *end;
  /* digits alone (strtol would skip leading blanks and take a sign, so
   * " 4" was read and "4 " refused) */
  const bool digits = (v[0] >= '0' && v[0] <= '9') || (lo < 0 && v[0] == '-' && v[1] >= '0' && v[1] <= '9');
  long x = strtol(v, &end, 10);
  if (!digits || *end != '\0' || x < lo || x > hi) {
    char q[AB__QUOTED];
    ab__quote(v, q, sizeof q);
    warn_once("%s=\"%s\" ignored: want %ld..%ld; using %ld", name, q, lo, hi, dflt);
    return dflt;
  }
  return x;
}
