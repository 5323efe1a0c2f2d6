/* Status codes and the thread-local detail message. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Thread_local char errbuf[AB_ERRBUF_SIZE];
static _Thread_local bool first_use_noted; /* the message in errbuf says so (internal.h) */
static _Thread_local DLDevice first_use_dev;

void ab__note_first_use_oom(DLDevice dev) {
  first_use_noted = true;
  first_use_dev = dev;
}

bool ab__first_use_oom(DLDevice *dev) {
  if (!first_use_noted) return false;
  first_use_noted = false;
  *dev = first_use_dev;
  return true;
}

const char *ab_status_str(ab_status status) {
  switch (status) {
#define AB_STATUS_STR_(name, value, msg) case AB_##name: return msg;
    AB_STATUS_MAP(AB_STATUS_STR_)
#undef AB_STATUS_STR_
  }
  return "unknown status";
}

const char *ab_status_name(ab_status status) {
  switch (status) {
#define AB_STATUS_NAME_(name, value, msg) case AB_##name: return "AB_" #name;
    AB_STATUS_MAP(AB_STATUS_NAME_)
#undef AB_STATUS_NAME_
  }
  return "AB_UNKNOWN_STATUS";
}

const char *ab_last_error(void) { return errbuf; }

void ab__quote(const char *text, char *buf, size_t len) {
  size_t n = 0;
  for (; text[n] != '\0' && n + 4 < len && n < 40; n++) {
    const unsigned char c = (unsigned char)text[n];
    buf[n] = isprint(c) && c != '"' ? (char)c : '?';
  }
  if (text[n] != '\0') {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
}

void ab__save_error(char saved[AB_ERRBUF_SIZE]) { memcpy(saved, errbuf, AB_ERRBUF_SIZE); }
void ab__restore_error(const char saved[AB_ERRBUF_SIZE]) {
  memcpy(errbuf, saved, AB_ERRBUF_SIZE);
  first_use_noted = false;
}

ab_status ab__fail_at(const char *file, int line, ab_status status,
                      const char *fmt, ...) {
  first_use_noted = false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
#ifdef AB_DEBUG
  AB_LOG(AB_LOG_DEBUG, "%s:%d: %s: %s", file, line, ab_status_name(status), errbuf);
#else
  (void)file;
  (void)line;
#endif
  AB_LOG(AB_LOG_INFO, "%s: %s", ab_status_name(status), errbuf);
  return status;
}

_Noreturn void ab__assume_failed(const char *file, int line, const char *cond) {
  fprintf(stderr, "arraybridge: internal invariant broken at %s:%d: %s\n", file, line, cond);
  abort();
}

void ab__trace(const char *file, int line, ab_status status) {
#ifdef AB_DEBUG
  AB_LOG(AB_LOG_DEBUG, "  forwarded %s at %s:%d", ab_status_name(status), file, line);
#else
  (void)file;
  (void)line;
  (void)status;
#endif
}
