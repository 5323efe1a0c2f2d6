/* Logging to stderr, level from the AB_LOG_LEVEL environment variable. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static ab__env_cache level_cache;

static int parse_level(const char *s) {
  static const char *names[] = {"off", "error", "warn", "info", "debug"};
  if (s == NULL || *s == '\0') return AB_LOG_WARN;
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (strcmp(s, names[i]) == 0) return i;
  if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
  char q[AB__QUOTED], line[160];
  ab__quote(s, q, sizeof q);
  snprintf(line, sizeof line,
           "arraybridge: AB_LOG_LEVEL=\"%s\" is not one of off, error, warn, info, debug (0-4); using warn\n", q);
  if (ab__env_first_line(line)) fputs(line, stderr); /* once a generation, as src/env.c's lines */
  return AB_LOG_WARN;
}

/* Read once, and again after ab__env_reload. Parsed here rather than by
 * ab__env_choice, which logs, and so asks for the level. */
int ab__log_level(void) {
  uint32_t lv;
  if (AB_LIKELY(ab__env_cached(&level_cache, &lv))) return (int)lv;
  return (int)ab__env_keep(&level_cache, (uint32_t)parse_level(ab__env_str("AB_LOG_LEVEL")));
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
