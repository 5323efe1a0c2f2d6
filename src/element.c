/* Element facts that hold on every device (element.h). */
#include <stdio.h>
#include <string.h>

#include "element.h"

static const char *const code_names[AB__CODE_COUNT] = {
  "int", "uint", "float", "opaque_handle", "bfloat", "complex", "bool",
  "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
  "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
  "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
};

const char *ab__dtype_code_name(uint8_t code) { return code < AB__CODE_COUNT ? code_names[code] : NULL; }

/* The dtypes NumPy and the frameworks name, by those names: what
 * ab_dtype_name writes for them and ab_parse_dtype reads. */
static const struct {
  const char *name;
  uint8_t code, bits;
} common[] = {
  {"bool", AB__CODE_BOOL, 8},        {"int8", AB__CODE_INT, 8},          {"int16", AB__CODE_INT, 16},
  {"int32", AB__CODE_INT, 32},       {"int64", AB__CODE_INT, 64},        {"uint8", AB__CODE_UINT, 8},
  {"uint16", AB__CODE_UINT, 16},     {"uint32", AB__CODE_UINT, 32},      {"uint64", AB__CODE_UINT, 64},
  {"float16", AB__CODE_FLOAT, 16},   {"float32", AB__CODE_FLOAT, 32},    {"float64", AB__CODE_FLOAT, 64},
  {"bfloat16", AB__CODE_BFLOAT, 16}, {"complex64", AB__CODE_COMPLEX, 64}, {"complex128", AB__CODE_COMPLEX, 128},
};
#define NCOMMON (sizeof common / sizeof common[0])

const char *ab_dtype_name(DLDataType dt, char *buf, size_t len) {
  int n = -1;
  if (buf == NULL || len == 0) return buf;
  for (size_t i = 0; i < NCOMMON && n < 0; i++)
    if (common[i].code == dt.code && common[i].bits == dt.bits) n = snprintf(buf, len, "%s", common[i].name);
  if (n < 0) {
    /* Others by DLPack's code name: with the bits appended where the name
     * is a family (int4, float128), else beside it (float8_e4m3fn(bits 8)). */
    const char *code = ab__dtype_code_name(dt.code);
    const bool sized = dt.code <= AB__CODE_BOOL && dt.code != AB__CODE_OPAQUE;
    if (code == NULL) n = snprintf(buf, len, "code %u bits %u", (unsigned)dt.code, (unsigned)dt.bits);
    else if (sized) n = snprintf(buf, len, "%s%u", code, (unsigned)dt.bits);
    else n = snprintf(buf, len, "%s(bits %u)", code, (unsigned)dt.bits);
  }
  if (dt.lanes != 1 && n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "x%u", (unsigned)dt.lanes);
  return buf;
}

/* The width of a sub-word float format, from its name ("float8_e4m3fn":
 * 8), for the codes from the first float8 format to float4_e2m1fn. */
static uint8_t format_bits(uint8_t code) { return (uint8_t)(code_names[code][5] - '0'); }

ab_status ab_parse_dtype(const char *name, DLDataType *out) {
  if (name == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "dtype name is NULL");
  if (out == NULL) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "out is NULL");
  for (size_t i = 0; i < NCOMMON; i++)
    if (strcmp(name, common[i].name) == 0) {
      *out = (DLDataType){common[i].code, common[i].bits, 1};
      return AB_OK;
    }
  /* The float8, float6 and float4 formats, by DLPack's names (as the
   * frameworks and ml_dtypes spell them), bare or as ab_dtype_name writes
   * them ("float8_e4m3fn(bits 8)"), at their own width only. */
  for (uint8_t c = AB__CODE_FLOAT8_FIRST; c < AB__CODE_COUNT; c++) {
    const size_t n = strlen(code_names[c]);
    char suffix[16];
    snprintf(suffix, sizeof suffix, "(bits %u)", (unsigned)format_bits(c));
    if (strncmp(name, code_names[c], n) == 0 && (name[n] == '\0' || strcmp(name + n, suffix) == 0)) {
      *out = (DLDataType){c, format_bits(c), 1};
      return AB_OK;
    }
  }
  /* The other DLPack types of the sized codes, as ab_dtype_name writes
   * them: complex32 (torch's chalf, moved as it is) and the sub-byte
   * integers (refused by conversions as sub-byte, not as unknown names). */
  static const struct {
    const char *name;
    uint8_t code, bits;
  } others[] = {{"complex32", AB__CODE_COMPLEX, 32}, {"int1", AB__CODE_INT, 1},   {"int2", AB__CODE_INT, 2},
                {"int4", AB__CODE_INT, 4},           {"uint1", AB__CODE_UINT, 1}, {"uint2", AB__CODE_UINT, 2},
                {"uint4", AB__CODE_UINT, 4}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
    if (strcmp(name, others[i].name) == 0) {
      *out = (DLDataType){others[i].code, others[i].bits, 1};
      return AB_OK;
    }
  char q[AB__QUOTED]; /* printable ASCII only: the text may be cut anywhere, and Python decodes it */
  ab__quote(name, q, sizeof q);
  return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                 "unknown dtype \"%s\" (bool, int8..int64, uint8..uint64, float16/32/64, bfloat16, complex64/128, "
                 "complex32, int1/2/4, uint1/2/4, float8_e4m3fn and DLPack's other float8/6/4 formats)",
                 q);
}

int ab__merge_dims(int32_t ndim, const int64_t *shape, const int64_t *strides, int64_t *out_shape,
                   int64_t *out_strides) {
  return ab__merge_dims2(ndim, shape, strides, NULL, out_shape, out_strides, NULL);
}

/* Whether dim i continues the merged dim before it in one stride array. */
static bool continues(int64_t outer, int64_t stride, int64_t size) {
  int64_t span;
  return !__builtin_mul_overflow(stride, size, &span) && outer == span;
}

int ab__merge_dims2(int32_t ndim, const int64_t *shape, const int64_t *strides, const int64_t *strides2,
                    int64_t *out_shape, int64_t *out_strides, int64_t *out_strides2) {
  int n = 0;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] == 1) continue;
    if (n > 0 && continues(out_strides[n - 1], strides[i], shape[i]) &&
        (strides2 == NULL || continues(out_strides2[n - 1], strides2[i], shape[i]))) {
      out_shape[n - 1] *= shape[i];
    } else {
      out_shape[n] = shape[i];
      n++;
    }
    out_strides[n - 1] = strides[i];
    if (strides2 != NULL) out_strides2[n - 1] = strides2[i];
  }
  return n;
}

bool ab__rect_of(const DLTensor *t, size_t elsize, ab__rect *rect) {
  int64_t bytes[AB_MAX_NDIM], shape[AB_MAX_NDIM], stride[AB_MAX_NDIM]; /* outermost first */
  if (t->strides == NULL) return false;
  /* Byte strides; a size-1 dim's stride says nothing (and may be huge). */
  for (int32_t i = 0; i < t->ndim; i++) {
    bytes[i] = 0;
    if (t->shape[i] != 1 && __builtin_mul_overflow(t->strides[i], (int64_t)elsize, &bytes[i])) return false;
  }
  int n = ab__merge_dims(t->ndim, t->shape, bytes, shape, stride);
  if (n > 3) return false;
  for (int k = 0; k < n; k++)
    if (stride[k] <= 0) return false;
  if (n == 0 || stride[n - 1] != (int64_t)elsize) return false;
  /* Pad to 3 dims: [slices, rows, row bytes]. */
  int64_t s3[3] = {1, 1, 1}, p3[3] = {0, 0, 0};
  for (int k = 0; k < n; k++) {
    s3[3 - n + k] = shape[k];
    p3[3 - n + k] = stride[k];
  }
  size_t row_bytes = (size_t)s3[2] * elsize;
  size_t row_pitch = s3[1] > 1 ? (size_t)p3[1] : row_bytes;
  size_t slice_pitch = s3[0] > 1 ? (size_t)p3[0] : row_pitch * (size_t)s3[1];
  /* OpenCL's rules: rows and slices may not overlap, and the slice pitch is
   * a whole number of row pitches. */
  if (row_pitch < row_bytes || slice_pitch < row_pitch * (size_t)s3[1] || slice_pitch % row_pitch != 0) return false;
  rect->region[0] = row_bytes;
  rect->region[1] = (size_t)s3[1];
  rect->region[2] = (size_t)s3[0];
  rect->row_pitch = row_pitch;
  rect->slice_pitch = slice_pitch;
  return true;
}
