/* .npy reading and writing for abtool; see npy.h. The header is a Python
 * dict literal; this parser accepts exactly the three keys NumPy writes
 * ('descr', 'fortran_order', 'shape'), each once, in any order, and
 * nothing else, so a malformed or hostile file gets a precise message
 * instead of a guess. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* realpath */
#endif
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether this host is big-endian: .npy files are written little-endian
 * whatever the host (the same bytes everywhere), and read in either
 * order. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG 1
#else
#define HOST_BIG 0
#endif

static const struct {
  const char *descr; /* as written: little-endian, '|' for one byte */
  uint8_t code, bits;
} types[] = {
  {"|b1", kDLBool, 8},   {"|i1", kDLInt, 8},    {"<i2", kDLInt, 16},   {"<i4", kDLInt, 32},
  {"<i8", kDLInt, 64},   {"|u1", kDLUInt, 8},   {"<u2", kDLUInt, 16},  {"<u4", kDLUInt, 32},
  {"<u8", kDLUInt, 64},  {"<f2", kDLFloat, 16}, {"<f4", kDLFloat, 32}, {"<f8", kDLFloat, 64},
  {"<c8", kDLComplex, 64}, {"<c16", kDLComplex, 128},
};
#define NTYPES (sizeof types / sizeof types[0])

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

_Static_assert(NPY_MAX_NDIM <= AB_MAX_NDIM, "a .npy array must fit a tensor");

const char *npy_descr(DLDataType d) {
  if (d.lanes != 1) return NULL;
  for (size_t i = 0; i < NTYPES; i++)
    if (types[i].code == d.code && types[i].bits == d.bits) return types[i].descr;
  return NULL;
}

/* A cursor over the header text [p, end). */
struct cur {
  const char *p, *end;
};

static void skip_ws(struct cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t')) c->p++;
}

static int eat(struct cur *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

/* A quoted string ('...' or "...", no escapes) into buf. */
static int string(struct cur *c, char *buf, size_t len) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
  const char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || *c->p == '\0' || n + 1 >= len) return 0; /* a NUL would end the text early */
    buf[n++] = *c->p++;
  }
  if (c->p >= c->end) return 0;
  c->p++;
  buf[n] = '\0';
  return 1;
}

static int word(struct cur *c, const char *w) {
  skip_ws(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
    c->p += n;
    return 1;
  }
  return 0;
}

/* A non-negative decimal integer below 2^62. */
static int integer(struct cur *c, int64_t *v) {
  skip_ws(c);
  int64_t x = 0;
  const char *start = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    if (x > ((int64_t)1 << 62) / 10) return 0;
    x = x * 10 + (*c->p++ - '0');
  }
  if (c->p == start) return 0;
  if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
  *v = x;
  return 1;
}

/* npy_parse; with total, only the header is read, *total is the size the
 * whole file must have, and a header not yet whole in buf returns 1. */
static int parse(const uint8_t *buf, size_t len, npy_array *out, uint64_t *total, char *err, size_t errlen) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  npy_array a;
  memset(&a, 0, sizeof a);
  if (len < 6 && total != NULL) return 1;
  if (len < 6 || memcmp(buf, magic, 6) != 0) return fail(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
  if (len < 10) return total != NULL ? 1 : fail(err, errlen, "truncated .npy header");
  const unsigned major = buf[6], minor = buf[7];
  size_t hlen, hstart;
  if (major == 1) {
    hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) return total != NULL ? 1 : fail(err, errlen, "truncated .npy header");
    hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    hstart = 12;
  } else {
    return fail(err, errlen, ".npy format version %u.%u is not supported (1.0, 2.0, 3.0)", major, minor);
  }
  if (minor != 0) return fail(err, errlen, ".npy format version %u.%u is not supported (1.0, 2.0, 3.0)", major, minor);
  if (hlen > len - hstart)
    return total != NULL ? 1 : fail(err, errlen, "the header claims %zu bytes but the file has %zu", hlen, len - hstart);
  struct cur c = {(const char *)buf + hstart, (const char *)buf + hstart + hlen};
  /* The header ends in '\n', padded with spaces before it. */
  if (hlen == 0 || c.end[-1] != '\n') return fail(err, errlen, "the header does not end with a newline");
  c.end--;
  while (c.end > c.p && c.end[-1] == ' ') c.end--;

  int have_descr = 0, have_order = 0, have_shape = 0;
  char key[32], descr[16] = "";
  if (!eat(&c, '{')) return fail(err, errlen, "the header is not a dict");
  while (!eat(&c, '}')) {
    if (!string(&c, key, sizeof key) || !eat(&c, ':')) return fail(err, errlen, "bad key in the header");
    if (strcmp(key, "descr") == 0 && !have_descr) {
      if (!string(&c, descr, sizeof descr)) return fail(err, errlen, "'descr' is not a simple dtype string");
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
      if (word(&c, "True")) a.fortran_order = 1;
      else if (!word(&c, "False")) return fail(err, errlen, "'fortran_order' is not True or False");
      have_order = 1;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      if (!eat(&c, '(')) return fail(err, errlen, "'shape' is not a tuple");
      while (!eat(&c, ')')) {
        if (a.ndim == NPY_MAX_NDIM) return fail(err, errlen, "'shape' has more than %d dims", NPY_MAX_NDIM);
        if (!integer(&c, &a.shape[a.ndim])) return fail(err, errlen, "'shape' holds something other than sizes");
        a.ndim++;
        if (!eat(&c, ',')) {
          if (!eat(&c, ')')) return fail(err, errlen, "'shape' is not a tuple of sizes");
          break;
        }
      }
      have_shape = 1;
    } else {
      return fail(err, errlen, "unexpected or repeated key '%s' in the header", key);
    }
    if (!eat(&c, ',')) {
      if (!eat(&c, '}')) return fail(err, errlen, "the header dict is malformed");
      break;
    }
  }
  skip_ws(&c);
  if (c.p != c.end) return fail(err, errlen, "text after the header dict");
  if (!have_descr || !have_order || !have_shape)
    return fail(err, errlen, "the header lacks '%s'", !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");

  /* One-byte types as NumPy writes them ('|'), the others in either byte
   * order ('<' or '>'). */
  size_t i = 0;
  for (; i < NTYPES; i++) {
    const bool ordered = types[i].bits > 8 && (descr[0] == '<' || descr[0] == '>');
    if (ordered ? strcmp(descr + 1, types[i].descr + 1) == 0 : strcmp(descr, types[i].descr) == 0) break;
  }
  if (i == NTYPES)
    return fail(err, errlen,
                "dtype '%s' is not supported (bool, int8..64, uint8..64, float16/32/64, complex64/128: one-byte "
                "types as '|b1', '|i1', '|u1', the others in either byte order, '<' or '>')",
                descr);
  a.dtype = (DLDataType){types[i].code, types[i].bits, 1};
  a.swapped = types[i].bits > 8 && (descr[0] == '>') != HOST_BIG;
  const size_t es = types[i].bits / 8u;
  /* Element count, checked for overflow against the bytes present. */
  uint64_t n = 1;
  int zero = 0;
  for (int32_t k = 0; k < a.ndim; k++) zero |= a.shape[k] == 0;
  for (int32_t k = 0; k < a.ndim && !zero; k++)
    if (__builtin_mul_overflow(n, (uint64_t)a.shape[k], &n)) return fail(err, errlen, "the shape's size overflows");
  if (zero) n = 0;
  uint64_t bytes;
  if (__builtin_mul_overflow(n, (uint64_t)es, &bytes)) return fail(err, errlen, "the shape's size overflows");
  const size_t data_at = hstart + hlen, have = len - data_at;
  if (total != NULL) {
    if (__builtin_add_overflow(bytes, (uint64_t)data_at, total)) return fail(err, errlen, "the shape's size overflows");
    return 0;
  }
  if (bytes != have)
    return fail(err, errlen, "the shape and dtype need %llu data bytes, the file has %zu", (unsigned long long)bytes,
                have);
  /* Strides in elements: C order is row-major, Fortran order column-major.
   * An empty array addresses nothing and its other dims may be huge (their
   * product unchecked above): its strides are all 0. */
  int64_t acc = 1;
  for (int32_t k = 0; k < a.ndim && !zero; k++) {
    int32_t d = a.fortran_order ? k : a.ndim - 1 - k;
    a.strides[d] = acc;
    acc *= a.shape[d]; /* <= the element count, checked above */
  }
  a.data = buf + data_at;
  a.nbytes = (size_t)bytes;
  *out = a;
  return 0;
}

int npy_parse(const uint8_t *buf, size_t len, npy_array *out, char *err, size_t errlen) {
  return parse(buf, len, out, NULL, err, errlen);
}

int npy_file_size(const uint8_t *buf, size_t len, uint64_t *total) {
  npy_array a;
  char err[8];
  return parse(buf, len, &a, total, err, sizeof err);
}

/* Opens path for writing without truncating it (an existing file keeps
 * its owner, mode, links and contents until written). Where this call
 * made the file, its path goes into made (path itself, or the target of
 * the dangling symbolic link path is, which is what a failed write must
 * remove); else made is "". The file descriptor, or -1 with errno. */
static int out_open(const char *path, char *made, size_t madelen) {
  made[0] = '\0';
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
  if (fd >= 0) snprintf(made, madelen, "%s", path);
  if (fd < 0 && errno == EEXIST) fd = open(path, O_WRONLY);
  if (fd < 0 && errno == ENOENT) { /* a dangling symlink's target */
    fd = open(path, O_WRONLY | O_CREAT, 0666);
    char *target = fd >= 0 ? realpath(path, NULL) : NULL;
    if (target != NULL && strlen(target) < madelen) snprintf(made, madelen, "%s", target);
    free(target);
  }
  return fd;
}

/* Writes all of buf; 0, or -1 with errno. */
static int write_all(int fd, const void *buf, size_t len) {
  for (const char *p = buf; len > 0;) {
    const ssize_t k = write(fd, p, len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO; /* a device that takes nothing: never a success */
      return -1;
    }
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

void npy_swap_bytes(uint8_t *data, size_t nbytes, DLDataType d) {
  const size_t unit = d.code == kDLComplex ? d.bits / 16u : d.bits / 8u; /* a complex number's parts apart */
  for (size_t at = 0; unit > 1 && nbytes - at >= unit; at += unit)
    for (size_t lo = at, hi = at + unit - 1; lo < hi; lo++, hi--) {
      const uint8_t b = data[lo];
      data[lo] = data[hi];
      data[hi] = b;
    }
}

int npy_write(const char *path, const DLTensor *t, char *err, size_t errlen) {
  const char *descr = npy_descr(t->dtype);
  if (descr == NULL) return fail(err, errlen, "a .npy file cannot hold this dtype (bfloat16 or vector types)");
  char hdr[4096];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  size_t count = 1;
  for (int32_t k = 0; k < t->ndim && n > 0 && (size_t)n < sizeof hdr; k++) {
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%lld%s", (long long)t->shape[k],
                  t->ndim == 1 ? "," : k + 1 < t->ndim ? ", " : "");
    count *= (size_t)t->shape[k];
  }
  if (n <= 0 || (size_t)n + 64 >= sizeof hdr) return fail(err, errlen, "shape too long for a .npy header");
  n += snprintf(hdr + n, sizeof hdr - (size_t)n, "), }");
  /* Pad with spaces so that the data starts at a multiple of 64. */
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  memset(hdr + n, ' ', pad);
  n += (int)pad;
  hdr[n++] = '\n';
  const uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(n & 0xff), (uint8_t)(n >> 8)};
  const size_t bytes = count * (t->dtype.bits / 8u), file_bytes = sizeof pre + (size_t)n + bytes;
  const char *data = (const char *)t->data + t->byte_offset;
  uint8_t *swapped = NULL; /* a big-endian host's data, little-endian */
  if (HOST_BIG && bytes > 0 && t->dtype.bits > 8) {
    if ((swapped = malloc(bytes)) == NULL) return fail(err, errlen, "out of memory (%zu bytes)", bytes);
    memcpy(swapped, data, bytes);
    npy_swap_bytes(swapped, bytes, t->dtype);
    data = (const char *)swapped;
  }
  char made[4096];
  int e = 0;
  const int fd = out_open(path, made, sizeof made);
  const int created = made[0] != '\0';
  if (fd < 0) {
    free(swapped);
    return fail(err, errlen, "cannot create %s: %s", path, strerror(errno));
  }
  struct stat st;
  const int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
#if SIZE_MAX > INT64_MAX /* off_t is 64-bit (_FILE_OFFSET_BITS=64); a 32-bit size_t always fits */
  if (regular && file_bytes > (size_t)INT64_MAX) e = EFBIG;
#endif
  /* A regular file's space comes first: a full disk or a file-size limit
   * then fails before a byte of an existing file (the input, maybe)
   * changes. Where the file system cannot reserve, it is written as is. */
  if (regular && e == 0) {
    e = posix_fallocate(fd, 0, (off_t)file_bytes);
    if (e == EINVAL || e == EOPNOTSUPP || e == ENODEV) e = 0;
    if (e != 0 && !created && st.st_size < (off_t)file_bytes) {
      /* an emulated reservation may have grown it: back to its size (the
       * reservation's error is the one to tell) */
      int ignored = ftruncate(fd, st.st_size);
      (void)ignored;
    }
  }
  if (e == 0 && (write_all(fd, pre, sizeof pre) != 0 || write_all(fd, hdr, (size_t)n) != 0 ||
                 (bytes > 0 && write_all(fd, data, bytes) != 0) ||
                 (regular && ftruncate(fd, (off_t)file_bytes) != 0))) /* an old file's longer tail */
    e = errno;
  if (close(fd) != 0 && e == 0) e = errno;
  free(swapped);
  if (e == 0) return 0;
  if (created) unlink(made);
  return fail(err, errlen, "writing %s failed: %s", path, strerror(e));
}
