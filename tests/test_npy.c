#define _GNU_SOURCE /* memmem */
/* The .npy reader and writer abtool uses (tools/npy.c): files NumPy wrote
 * (tests/data/npy, made with np.save) parse to the right dtype, shape,
 * strides and bytes; malformed headers are refused with a reason; written
 * files parse back to what was written. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"
#include "tools/npy.h"

#ifndef AB_TEST_DATA_DIR
#error "AB_TEST_DATA_DIR must name tests/data"
#endif

static uint8_t *slurp(const char *name, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/npy/%s", AB_TEST_DATA_DIR, name);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  uint8_t *buf = malloc(1 << 16);
  *len = fread(buf, 1, 1 << 16, f);
  fclose(f);
  return buf;
}

static npy_array parse_ok(const uint8_t *buf, size_t len, const char *what) {
  npy_array a;
  char err[256] = "";
  cr_assert_eq(npy_parse(buf, len, &a, err, sizeof err), 0, "%s: %s", what, err);
  return a;
}

static void parse_bad(const uint8_t *buf, size_t len, const char *word, const char *what) {
  npy_array a;
  memset(&a, 0x5a, sizeof a);
  npy_array before = a;
  char err[256] = "";
  cr_assert_eq(npy_parse(buf, len, &a, err, sizeof err), -1, "%s was accepted", what);
  cr_assert_not_null(strstr(err, word), "%s: reason \"%s\" lacks \"%s\"", what, err, word);
  cr_assert(memcmp(&a, &before, sizeof a) == 0, "%s: out written on failure", what);
}

Test(npy, files_numpy_wrote_parse_exactly) {
  size_t len;
  uint8_t *b = slurp("u8_2x3x4.npy", &len);
  npy_array a = parse_ok(b, len, "u8");
  cr_assert(a.dtype.code == kDLUInt && a.dtype.bits == 8 && a.ndim == 3);
  cr_assert(a.shape[0] == 2 && a.shape[1] == 3 && a.shape[2] == 4);
  cr_assert(a.strides[0] == 12 && a.strides[1] == 4 && a.strides[2] == 1 && !a.fortran_order);
  cr_assert_eq(a.nbytes, 24);
  for (int i = 0; i < 24; i++) cr_assert_eq(a.data[i], i);
  free(b);

  b = slurp("f32_fortran_3x4.npy", &len);
  a = parse_ok(b, len, "fortran");
  cr_assert(a.fortran_order && a.strides[0] == 1 && a.strides[1] == 3, "Fortran order is column-major");
  float v;
  memcpy(&v, a.data + 4 * (1 + 3 * 2), 4); /* element [1][2] = 6 / 3 */
  cr_assert_float_eq(v, 2.0f, 1e-6);
  free(b);

  const struct {
    const char *file;
    uint8_t code, bits;
    int32_t ndim;
    size_t nbytes;
  } cases[] = {
    {"f64_scalar.npy", kDLFloat, 64, 0, 8},   {"bool_5.npy", kDLBool, 8, 1, 5},
    {"c64_2x2.npy", kDLComplex, 64, 2, 32},   {"i16_empty_0x3.npy", kDLInt, 16, 2, 0},
    {"f16_4.npy", kDLFloat, 16, 1, 8},        {"v2_i32.npy", kDLInt, 32, 2, 24},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    b = slurp(cases[i].file, &len);
    a = parse_ok(b, len, cases[i].file);
    cr_assert(a.dtype.code == cases[i].code && a.dtype.bits == cases[i].bits && a.ndim == cases[i].ndim &&
                  a.nbytes == cases[i].nbytes,
              "%s: code %d bits %d ndim %d nbytes %zu", cases[i].file, a.dtype.code, a.dtype.bits, (int)a.ndim,
              a.nbytes);
    free(b);
  }
}

/* Data of either byte order is read, and flagged where it is not the
 * host's; files are written little-endian on every host. A
 * big-endian file was refused, and on a big-endian host (s390x under
 * qemu) little-endian data was read as it lay: 1.0f as 4.6e-41. */
Test(npy, either_byte_order_reads_and_little_endian_is_written) {
  const uint16_t probe = 1;
  uint8_t first;
  memcpy(&first, &probe, 1);
  const bool little = first == 1;
  size_t len;
  uint8_t *b = slurp("be_f4.npy", &len); /* '>f4': 0, 1, 2 */
  npy_array a = parse_ok(b, len, "big-endian float32");
  cr_assert(a.dtype.code == kDLFloat && a.dtype.bits == 32 && a.ndim == 1 && a.shape[0] == 3 && a.nbytes == 12);
  cr_assert_eq(a.swapped, little, "big-endian data on a %s-endian host: swapped %d", little ? "little" : "big",
               a.swapped);
  uint8_t *data = b + (a.data - b);
  if (a.swapped) npy_swap_bytes(data, a.nbytes, a.dtype);
  for (int i = 0; i < 3; i++) {
    float v;
    memcpy(&v, data + 4 * i, 4);
    cr_assert_eq(v, (float)i, "element %d: %g", i, (double)v);
  }
  free(b);
  b = slurp("f32_fortran_3x4.npy", &len); /* '<f4' */
  a = parse_ok(b, len, "little-endian float32");
  cr_assert_eq(a.swapped, !little);
  free(b);
  b = slurp("u8_2x3x4.npy", &len); /* one byte: no order */
  cr_assert_eq(parse_ok(b, len, "uint8").swapped, 0);
  free(b);
  cr_assert_str_eq(npy_descr((DLDataType){kDLFloat, 32, 1}), "<f4");
  cr_assert_str_eq(npy_descr((DLDataType){kDLUInt, 8, 1}), "|u1");
  /* a complex number's parts are swapped apart; one-byte types not at all */
  uint8_t c[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  npy_swap_bytes(c, 16, (DLDataType){kDLComplex, 64, 1});
  const uint8_t want[16] = {4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13};
  cr_assert(memcmp(c, want, 16) == 0);
  npy_swap_bytes(c, 16, (DLDataType){kDLUInt, 8, 1});
  cr_assert(memcmp(c, want, 16) == 0);
  /* 2- and 8-byte units; a partial element at the end is left alone */
  uint8_t h[7] = {1, 2, 3, 4, 5, 6, 7};
  npy_swap_bytes(h, 7, (DLDataType){kDLFloat, 16, 1});
  cr_assert(memcmp(h, (const uint8_t[]){2, 1, 4, 3, 6, 5, 7}, 7) == 0);
  uint8_t d[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  npy_swap_bytes(d, 11, (DLDataType){kDLInt, 64, 1});
  cr_assert(memcmp(d, (const uint8_t[]){8, 7, 6, 5, 4, 3, 2, 1, 9, 10, 11}, 11) == 0);
  /* a float32 file's descr without an order, or with the native mark,
   * is not taken for either order */
  b = slurp("be_f4.npy", &len);
  for (int i = 0; i < 2; i++) {
    uint8_t *at = memmem(b + 10, len - 10, i == 0 ? "'>f4'" : "'|f4'", 5);
    cr_assert_not_null(at);
    memcpy(at, i == 0 ? "'|f4'" : "'=f4'", 5);
    parse_bad(b, len, "not supported", i == 0 ? "'|f4'" : "'=f4'");
  }
  free(b);
}

Test(npy, malformed_files_are_refused_with_the_reason) {
  size_t len;
  uint8_t *b = slurp("str_u2.npy", &len);
  parse_bad(b, len, "'<U2' is not supported", "a string dtype");
  free(b);
  b = slurp("u8_2x3x4.npy", &len);
  parse_bad(b, len - 1, "need 24 data bytes", "one byte short");
  parse_bad(b, 9, "truncated .npy header", "cut in the preamble, after the magic");
  parse_bad(b, 5, "not a .npy", "cut in the magic");
  parse_bad(b, 40, "header claims", "cut in the header");
  uint8_t *c = malloc(len + 1);
  memcpy(c, b, len);
  c[len] = 0;
  parse_bad(c, len + 1, "need 24 data bytes", "a trailing byte");
  /* Header edits, same length so the data stays put. */
  const struct {
    const char *from, *to, *word;
  } edits[] = {
    {"'descr'", "'desc '", "unexpected or repeated key"},
    {"'|u1'", "'|u3'", "not supported"},
    {"'|u1'", "'<V8'", "not supported"},
    /* one-byte types as NumPy writes them only; the others with an order */
    {"'|u1'", "'<u1'", "not supported"},
    {"'|u1'", "'>b1'", "not supported"},
    {"False", "Fals ", "not True or False"},
    {"(2, 3, 4)", "(2, -3,4)", "sizes"},
    {"(2, 3, 4)", "[2, 3, 4]", "not a tuple"},
    {"{'descr'", "('descr'", "not a dict"},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    memcpy(c, b, len);
    char *hdr = (char *)c + 10;
    char *at = memmem(hdr, len - 10, edits[i].from, strlen(edits[i].from));
    cr_assert_not_null(at, "fixture lacks %s", edits[i].from);
    cr_assert_eq(strlen(edits[i].from), strlen(edits[i].to));
    memcpy(at, edits[i].to, strlen(edits[i].to));
    parse_bad(c, len, edits[i].word, edits[i].to);
  }
  memcpy(c, b, len);
  c[6] = 4; /* version 4.0 */
  parse_bad(c, len, "version 4.0", "format version");
  memcpy(c, b, len);
  c[10 + 0x76 - 1] = ' '; /* the header's last byte is not a newline */
  parse_bad(c, len, "newline", "no newline");
  free(c);
  free(b);
  /* A shape whose size overflows. */
  const char hdr[] = "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387903, 8), }\n";
  uint8_t hostile[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(sizeof hdr - 1), 0};
  memcpy(hostile + 10, hdr, sizeof hdr - 1);
  parse_bad(hostile, 10 + sizeof hdr - 1, "overflows", "overflowing shape");
  /* A NUL inside a string would end it early for every later reader:
   * '<f8\0junk' is not '<f8'. */
  const char nul[] = "{'descr': '<f8\0junk', 'fortran_order': False, 'shape': (1,), }\n";
  memset(hostile, 0, sizeof hostile);
  memcpy(hostile, (const uint8_t[]){0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(sizeof nul - 1), 0}, 10);
  memcpy(hostile + 10, nul, sizeof nul - 1);
  parse_bad(hostile, 10 + sizeof nul - 1 + 8, "'descr' is not", "a NUL in descr");
}

/* A header of ndim sizes of 1 and one uint8 into buf; the file's length. */
static size_t ones_file(uint8_t *buf, size_t cap, int ndim) {
  char hdr[1024];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '|u1', 'fortran_order': False, 'shape': (");
  for (int k = 0; k < ndim; k++) n += snprintf(hdr + n, sizeof hdr - (size_t)n, "1,");
  n += snprintf(hdr + n, sizeof hdr - (size_t)n, "), }\n");
  cr_assert(n > 0 && (size_t)n + 11 <= cap);
  memcpy(buf, (const uint8_t[]){0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(n & 0xff), (uint8_t)(n >> 8)}, 10);
  memcpy(buf + 10, hdr, (size_t)n);
  buf[10 + n] = 7;
  return 10 + (size_t)n + 1;
}

Test(npy, as_many_dims_as_numpy_allows) {
  /* NumPy 2 makes arrays of up to 64 dims; so does the library */
  uint8_t buf[1024];
  size_t len = ones_file(buf, sizeof buf, 64);
  npy_array a = parse_ok(buf, len, "64 dims");
  cr_assert_eq(a.ndim, 64);
  cr_assert_eq(a.nbytes, 1);
  cr_assert_eq(a.data[0], 7);
  len = ones_file(buf, sizeof buf, 65);
  parse_bad(buf, len, "more than 64 dims", "65 dims");
}

Test(npy, written_files_parse_back) {
  int16_t v[2][3] = {{1, -2, 3}, {-4, 5, -6}};
  int64_t shape[2] = {2, 3};
  DLTensor t = {v, CPU0, 2, dt(kDLInt, 16, 1), shape, NULL, 0};
  char path[] = "/tmp/ab_test_npy_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  char err[256];
  cr_assert_eq(npy_write(path, &t, err, sizeof err), 0, "%s", err);
  size_t len;
  FILE *f = fopen(path, "rb");
  uint8_t *buf = malloc(4096);
  len = fread(buf, 1, 4096, f);
  fclose(f);
  remove(path);
  cr_assert_eq((len - 6) % 16 == 0 || len > 0, 1);
  npy_array a = parse_ok(buf, len, "written");
  cr_assert_eq((size_t)(a.data - buf) % 64, 0, "data starts at a multiple of 64");
  cr_assert(a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.dtype.code == kDLInt && a.dtype.bits == 16);
  cr_assert(memcmp(a.data, v, sizeof v) == 0);
  free(buf);
  DLTensor bf = t;
  bf.dtype = dt(kDLBfloat, 16, 1);
  cr_assert_eq(npy_write(path, &bf, err, sizeof err), -1, "bfloat16 has no .npy descr");
  close(fd);
}
