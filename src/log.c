/* Logging to stderr, level from the AB_LOG_LEVEL environment variable. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static atomic_int level_cache = -1;

static int parse_level(const char *s) {
  static const char *names[] = {"off", "error", "warn", "info", "debug"};
  if (s == NULL || *s == '\0') return AB_LOG_WARN;
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (strcmp(s, names[i]) == 0) return i;
  if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
  fprintf(stderr, "arraybridge: AB_LOG_LEVEL=\"%s\" is not one of off, error, warn, info, debug (0-4); using warn\n", s);
  return AB_LOG_WARN;
}

int ab__log_level(void) {
  int lv = atomic_load_explicit(&level_cache, memory_order_relaxed);
  if (AB_LIKELY(lv >= 0)) return lv;
  lv = parse_level(getenv("AB_LOG_LEVEL"));
  atomic_store_explicit(&level_cache, lv, memory_order_relaxed);
  return lv;
}

void ab__log(int level, const char *fmt, ...) {
  static const char *tags[] = {"", "error", "warn", "info", "debug"};
  char line[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "arraybridge %s: %s\n", tags[level], line);
}
