/* Every byte-sized DLPack dtype survives a host -> host copy bit for bit,
 * compact and transposed. The copy must move bits, never values: NaN
 * payloads, signalling NaNs, negative zero and denormals come out as they
 * went in. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

struct dtype_case {
  const char *name;
  DLDataType dtype;
};

/* The float8 codes are numbered because the DLPack 1.0 header lacks their
 * names (7 e3m4 .. 14 e8m0fnu). */
static const struct dtype_case dtypes[] = {
  {"int8", {kDLInt, 8, 1}},
  {"int16", {kDLInt, 16, 1}},
  {"int32", {kDLInt, 32, 1}},
  {"int64", {kDLInt, 64, 1}},
  {"uint8", {kDLUInt, 8, 1}},
  {"uint16", {kDLUInt, 16, 1}},
  {"uint32", {kDLUInt, 32, 1}},
  {"uint64", {kDLUInt, 64, 1}},
  {"float16", {kDLFloat, 16, 1}},
  {"float32", {kDLFloat, 32, 1}},
  {"float64", {kDLFloat, 64, 1}},
  {"bfloat16", {kDLBfloat, 16, 1}},
  {"complex32", {kDLComplex, 32, 1}},
  {"complex64", {kDLComplex, 64, 1}},
  {"complex128", {kDLComplex, 128, 1}},
  {"bool", {kDLBool, 8, 1}},
  {"float8_e3m4", {7, 8, 1}},
  {"float8_e4m3", {8, 8, 1}},
  {"float8_e4m3b11fnuz", {9, 8, 1}},
  {"float8_e4m3fn", {10, 8, 1}},
  {"float8_e4m3fnuz", {11, 8, 1}},
  {"float8_e5m2", {12, 8, 1}},
  {"float8_e5m2fnuz", {13, 8, 1}},
  {"float8_e8m0fnu", {14, 8, 1}},
  /* Vector types: 16-byte float32x4 and, for the element sizes no scalar
   * type has, uint8x3 (3 bytes), int16x3 (6), float32x3 (12) and
   * complex128x2 (32). */
  {"float32x4", {kDLFloat, 32, 4}},
  {"uint8x3", {kDLUInt, 8, 3}},
  {"int16x3", {kDLInt, 16, 3}},
  {"float32x3", {kDLFloat, 32, 3}},
  {"complex128x2", {kDLComplex, 128, 2}},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

/* Plants bit patterns a value-based copy (through float registers, or with
 * normalisation) would change: signalling NaNs with payloads, quiet NaNs
 * with payloads, negative zero, denormals, infinities. Written over the
 * lane-sized words of the scalar float types; other types keep the random
 * pattern, which already covers every bit. */
static void plant_special_values(void *buf, size_t nbytes, DLDataType d) {
  size_t w = d.bits / 8u;
  if (d.code == kDLFloat || d.code == kDLBfloat || d.code == kDLComplex) {
    /* complex is two floats of half its bits */
    size_t fw = d.code == kDLComplex ? w / 2 : w;
    static const uint16_t s16[] = {0x7d01, 0xfd55, 0x7e01, 0x8000, 0x0001, 0x7c00, 0x7f81, 0xffc1};
    static const uint32_t s32[] = {0x7f800001u, 0xffa5a5a5u, 0x7fc00123u, 0x80000000u,
                                   0x00000001u, 0x7f800000u, 0x807fffffu, 0xff800000u};
    static const uint64_t s64[] = {0x7ff0000000000001ull, 0xfff5a5a5a5a5a5a5ull,
                                   0x7ff8000000000123ull, 0x8000000000000000ull,
                                   0x0000000000000001ull, 0x7ff0000000000000ull,
                                   0x800fffffffffffffull, 0xfff0000000000000ull};
    size_t nwords = nbytes / fw;
    for (size_t i = 0; i < nwords; i += 3) {
      char *p = (char *)buf + i * fw;
      size_t k = (i / 3) % 8;
      if (fw == 2) memcpy(p, &s16[k], 2);
      else if (fw == 4) memcpy(p, &s32[k], 4);
      else if (fw == 8) memcpy(p, &s64[k], 8);
    }
  }
}

static void fill_tensor_bytes(void *buf, size_t nbytes, DLDataType d, uint32_t seed) {
  fill_pattern(buf, nbytes, seed);
  plant_special_values(buf, nbytes, d);
}

Test(dtypes, compact_copy_is_bit_exact_for_every_dtype) {
  int64_t shape[2] = {7, 33};
  for (size_t k = 0; k < NDTYPES; k++) {
    const struct dtype_case *c = &dtypes[k];
    size_t es = elsize_of(c->dtype), nbytes = (size_t)(7 * 33) * es;
    void *buf = malloc(nbytes);
    cr_assert_not_null(buf);
    fill_tensor_bytes(buf, nbytes, c->dtype, (uint32_t)k + 1);
    uint64_t before = checksum(buf, nbytes);
    DLTensor t = {buf, CPU0, 2, c->dtype, shape, NULL, 0};
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s: %s", c->name, ab_last_error());
    cr_assert(is_compact_copy_of(r, &t), "%s: result is not a compact copy", c->name);
    cr_assert_neq(r->dl_tensor.data, buf, "%s: copy aliases the source", c->name);
    cr_assert(r->dl_tensor.dtype.code == c->dtype.code && r->dl_tensor.dtype.bits == c->dtype.bits &&
                  r->dl_tensor.dtype.lanes == c->dtype.lanes,
              "%s: dtype changed to (%u, %u, %u)", c->name, r->dl_tensor.dtype.code,
              r->dl_tensor.dtype.bits, r->dl_tensor.dtype.lanes);
    cr_assert_eq(r->dl_tensor.byte_offset, 0, "%s", c->name);
    cr_assert(memcmp((char *)r->dl_tensor.data, buf, nbytes) == 0, "%s: bytes differ after copy",
              c->name);
    cr_assert_eq(checksum(buf, nbytes), before, "%s: source was written", c->name);
    r->deleter(r);
    free(buf);
  }
}

/* A transposed view (shape {C, R}, strides {1, C} over an R x C buffer) of
 * every dtype, checked against the reference gather and, independently,
 * element by element against the transpose definition. The sizes cover
 * whole 32 x 32 tiles and ragged edges. */
Test(dtypes, transposed_copy_is_bit_exact_for_every_element_size) {
  const int64_t R = 70, C = 45;
  for (size_t k = 0; k < NDTYPES; k++) {
    const struct dtype_case *c = &dtypes[k];
    size_t es = elsize_of(c->dtype), nbytes = (size_t)(R * C) * es;
    char *buf = malloc(nbytes);
    cr_assert_not_null(buf);
    fill_tensor_bytes(buf, nbytes, c->dtype, 1000u + (uint32_t)k);
    uint64_t before = checksum(buf, nbytes);
    int64_t shape[2] = {C, R}, strides[2] = {1, C};
    DLTensor t = {buf, CPU0, 2, c->dtype, shape, strides, 0};
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s: %s", c->name, ab_last_error());
    cr_assert(is_compact_copy_of(r, &t), "%s: result is not a compact copy", c->name);
    int64_t diff = first_diff_vs_reference(&t, r);
    cr_assert_eq(diff, -1, "%s: byte %lld differs from the reference gather", c->name, (long long)diff);
    const char *out = r->dl_tensor.data;
    for (int64_t i = 0; i < C; i++)
      for (int64_t j = 0; j < R; j++)
        cr_assert(memcmp(out + (size_t)(i * R + j) * es, buf + (size_t)(j * C + i) * es, es) == 0,
                  "%s: out[%lld][%lld] != src[%lld][%lld]", c->name, (long long)i, (long long)j,
                  (long long)j, (long long)i);
    cr_assert_eq(checksum(buf, nbytes), before, "%s: source was written", c->name);
    r->deleter(r);
    free(buf);
  }
}

/* The same for a strided source whose inner dimension is not contiguous
 * (every other column, reversed rows), which takes the element loop. */
Test(dtypes, gapped_reversed_copy_is_bit_exact_for_every_element_size) {
  const int64_t R = 9, C = 40;
  for (size_t k = 0; k < NDTYPES; k++) {
    const struct dtype_case *c = &dtypes[k];
    size_t es = elsize_of(c->dtype), nbytes = (size_t)(R * C) * es;
    char *buf = malloc(nbytes);
    cr_assert_not_null(buf);
    fill_tensor_bytes(buf, nbytes, c->dtype, 2000u + (uint32_t)k);
    /* rows R-1 .. 0, columns 0, 2, 4, ... */
    int64_t shape[2] = {R, C / 2}, strides[2] = {-C, 2};
    DLTensor t = {buf + (size_t)((R - 1) * C) * es, CPU0, 2, c->dtype, shape, strides, 0};
    ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s: %s", c->name, ab_last_error());
    int64_t diff = first_diff_vs_reference(&t, r);
    cr_assert_eq(diff, -1, "%s: byte %lld differs from the reference gather", c->name, (long long)diff);
    const char *out = r->dl_tensor.data;
    for (int64_t i = 0; i < R; i++)
      for (int64_t j = 0; j < C / 2; j++)
        cr_assert(memcmp(out + (size_t)(i * (C / 2) + j) * es, buf + (size_t)((R - 1 - i) * C + 2 * j) * es,
                         es) == 0,
                  "%s: element (%lld, %lld) wrong", c->name, (long long)i, (long long)j);
    r->deleter(r);
    free(buf);
  }
}

/* Views do not depend on the dtype either: a compact tensor of any dtype
 * converts to a view of the same bytes with the same dtype. */
Test(dtypes, compact_source_of_every_dtype_becomes_a_view) {
  int64_t shape[1] = {5};
  unsigned char buf[5 * 32];
  for (size_t k = 0; k < NDTYPES; k++) {
    const struct dtype_case *c = &dtypes[k];
    DLTensor t = {buf, CPU0, 1, c->dtype, shape, NULL, 0};
    DLManagedTensorVersioned *r = NULL;
    cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &r), AB_OK, "%s: %s", c->name, ab_last_error());
    cr_assert_eq(r->dl_tensor.data, (void *)buf, "%s: not a view", c->name);
    cr_assert_eq(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0, "%s: view marked copied", c->name);
    cr_assert(r->dl_tensor.dtype.code == c->dtype.code && r->dl_tensor.dtype.bits == c->dtype.bits &&
                  r->dl_tensor.dtype.lanes == c->dtype.lanes,
              "%s: dtype changed", c->name);
    r->deleter(r);
  }
}

Test(dtypes, names_round_trip_and_unknown_ones_are_refused_with_the_list) {
  static const char *const names[] = {"bool",   "int8",    "int16",   "int32",    "int64",     "uint8",     "uint16", "uint32",
                                      "uint64", "float16", "float32", "float64", "bfloat16", "complex64", "complex128"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    DLDataType d = {0, 0, 0};
    char buf[32];
    cr_assert_eq(ab_parse_dtype(names[i], &d), AB_OK, "%s: %s", names[i], ab_last_error());
    cr_assert_eq(d.lanes, 1);
    cr_assert_str_eq(ab_dtype_name(d, buf, sizeof buf), names[i]);
  }
  char buf[32];
  cr_assert_str_eq(ab_dtype_name(dt(kDLFloat, 32, 4), buf, sizeof buf), "float32x4");
  cr_assert_str_eq(ab_dtype_name(dt(kDLInt, 4, 1), buf, sizeof buf), "int4");
  cr_assert_str_eq(ab_dtype_name(dt(99, 8, 1), buf, sizeof buf), "code 99 bits 8");
  cr_assert_str_eq(ab_dtype_name(dt(kDLFloat, 32, 1), buf, 4), "flo", "not cut to the buffer");
  cr_assert_null(ab_dtype_name(dt(kDLFloat, 32, 1), NULL, 0));
  /* DLPack's sub-word float formats: by name, at their own width, and as
   * ab_dtype_name writes them */
  static const struct {
    const char *name;
    uint8_t code, bits;
  } formats[] = {{"float8_e3m4", 7, 8},    {"float8_e4m3fn", 10, 8}, {"float8_e5m2", 12, 8},
                 {"float8_e8m0fnu", 14, 8}, {"float6_e2m3fn", 15, 6}, {"float4_e2m1fn", 17, 4}};
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
    DLDataType d = {0, 0, 0}, again = {0, 0, 0};
    cr_assert_eq(ab_parse_dtype(formats[i].name, &d), AB_OK, "%s: %s", formats[i].name, ab_last_error());
    cr_assert(d.code == formats[i].code && d.bits == formats[i].bits && d.lanes == 1, "%s: %u %u %u",
              formats[i].name, d.code, d.bits, d.lanes);
    cr_assert_eq(ab_parse_dtype(ab_dtype_name(d, buf, sizeof buf), &again), AB_OK, "%s: %s", buf, ab_last_error());
    cr_assert(again.code == d.code && again.bits == d.bits && again.lanes == 1, "%s", buf);
  }
  /* DLPack's other types of the sized codes, as ab_dtype_name writes
   * them: a complex32 (torch's chalf) tensor's own dtype name reads back */
  static const struct {
    const char *name;
    uint8_t code, bits;
  } others[] = {{"complex32", kDLComplex, 32}, {"int4", kDLInt, 4}, {"uint1", kDLUInt, 1}, {"int2", kDLInt, 2}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    DLDataType d = {0, 0, 0};
    cr_assert_eq(ab_parse_dtype(others[i].name, &d), AB_OK, "%s: %s", others[i].name, ab_last_error());
    cr_assert(d.code == others[i].code && d.bits == others[i].bits && d.lanes == 1, "%s: %u %u %u", others[i].name,
              d.code, d.bits, d.lanes);
    cr_assert_str_eq(ab_dtype_name(d, buf, sizeof buf), others[i].name);
  }
  DLDataType keep = dt(kDLUInt, 8, 1);
  const char *bad[] = {"float", "Float32", "float32x4", "", "int128", "float24", "float128", "bfloat8", "bool1",
                       "complex16", "int3", "opaque_handle64", "float8_e4m3fn(bits 16)", "float8_e4m3fnx",
                       "float8_e4m3(bits 8", "float8", "float6", "float4"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(ab_parse_dtype(bad[i], &keep), AB_ERR_INVALID_ARGUMENT, "\"%s\" was taken", bad[i]);
    cr_assert(strstr(ab_last_error(), "bfloat16") != NULL, "%s", ab_last_error());
    cr_assert(keep.code == kDLUInt && keep.bits == 8, "out changed on failure");
  }
  cr_assert_eq(ab_parse_dtype(NULL, &keep), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_parse_dtype("int8", NULL), AB_ERR_INVALID_ARGUMENT);
}

/* The name went into the message as "%.40s": cut inside a UTF-8
 * character (39 bytes, then a two-byte one) and with control characters
 * as they came, which Python's strict decoding of the message turned
 * into a UnicodeDecodeError instead of the ValueError. */
Test(dtypes, an_unknown_name_is_quoted_in_printable_ascii) {
  const char *names[] = {"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\xc3\xa9", "int8\n\x1b[31m", "\xff\xfe"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    DLDataType d;
    cr_assert_eq(ab_parse_dtype(names[i], &d), AB_ERR_INVALID_ARGUMENT);
    const char *msg = ab_last_error();
    cr_assert(strncmp(msg, "unknown dtype \"", 15) == 0, "%s", msg);
    for (const char *c = msg; *c != '\0'; c++)
      cr_assert(*c >= 0x20 && *c < 0x7f, "name %zu: byte 0x%02x at %td of the message", i, (unsigned char)*c, c - msg);
  }
}
