/* Conversions on an OpenCL device, by the rules of
 * converters/host/convert.h, for the cases whose arithmetic is float32:
 * uint8, int8, uint16, int16, bool, float16, bfloat16 and float32 sources
 * into float32, float16 or bfloat16, with an optional affine map y = x * a + b (per
 * tensor, or per channel along one result axis, at most 16 channels) and
 * any axis order. Element i of the compact result comes from the source
 * element at the row-major decomposition of i over the result's shape,
 * dotted with the source's strides in the result's axis order (in
 * elements): the ab__convert_args the host converter takes too. The
 * narrowing kernels (float -> 8- and 16-bit integers) are at the end.
 *
 * Bit-exact with the host: the loads are exact in float, and the multiply
 * and the add are two correctly rounded float operations, never fused (the
 * pragma below forbids contraction into an fma). The backend uses these
 * kernels only on devices with round-to-nearest and denormals in
 * CL_DEVICE_SINGLE_FP_CONFIG. NaN payloads may differ between devices.
 *
 * Built once per context, as a program of its own (gather.cl is another). */
#pragma OPENCL FP_CONTRACT OFF

#define AB_LOAD_U8(p, i) ((float)(p)[i])
#define AB_LOAD_I8(p, i) ((float)(p)[i])
#define AB_LOAD_U16(p, i) ((float)(p)[i])
#define AB_LOAD_I16(p, i) ((float)(p)[i])
#define AB_LOAD_BOOL(p, i) ((p)[i] != 0 ? 1.0f : 0.0f)
#define AB_LOAD_F16(p, i) vload_half((size_t)(i), (__global const half *)(p))
#define AB_LOAD_BF16(p, i) as_float((uint)(p)[i] << 16)
#define AB_LOAD_F32(p, i) ((p)[i])

/* The source element of result element gid: its row-major index over
 * `shape`, dotted with `stride` (elements); *c gets its index along the
 * result axis `chan` (0 when chan is -1). Every kernel below maps this way. */
long ab_source_offset(size_t gid, int ndim, long8 shape8, long8 stride8, int chan, long *c) {
  long shape[8] = {shape8.s0, shape8.s1, shape8.s2, shape8.s3, shape8.s4, shape8.s5, shape8.s6, shape8.s7};
  long stride[8] = {stride8.s0, stride8.s1, stride8.s2, stride8.s3, stride8.s4, stride8.s5, stride8.s6, stride8.s7};
  long rem = (long)gid, off = 0;
  *c = 0;
  for (int i = ndim - 1; i >= 0; i--) {
    long q = rem / shape[i];
    long k = rem - q * shape[i];
    off += k * stride[i];
    if (i == chan) *c = k;
    rem = q;
  }
  return off;
}

/* Float32 into the result types of float32 arithmetic: float32 as it is;
 * float16 and bfloat16 rounded once, to nearest even (overflow to
 * infinity, NaN stays NaN): vstore_half_rte, and for bfloat16 the same
 * rounding on the top 16 bits. */
#define AB_STORE_F32(p, i, y) ((p)[i] = (y))
#define AB_STORE_F16(p, i, y) vstore_half_rte((y), (size_t)(i), (__global half *)(p))
#define AB_STORE_BF16(p, i, y) ((p)[i] = ab_bf16_rne(y))

ushort ab_bf16_rne(float y) {
  uint u = as_uint(y);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); /* NaN: kept, quiet */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* mode: 0 no arithmetic, 1 affine. chan: the result axis the per-channel
 * a and b run along, -1 for a[0] and b[0] everywhere. */
#define AB_DEFINE_FLOAT32_MATH(NAME, T, LOAD, TD, STORE)                                        \
  __kernel void NAME(__global const T *src, ulong src_off, __global TD *dst, ulong dst_off,        \
                     int ndim, long8 shape8, long8 stride8, ulong n, int mode, int chan,           \
                     float16 a16, float16 b16) {                                                  \
    size_t gid = get_global_id(0);                                                              \
    if (gid >= n) return;                                                                       \
    long c;                                                                                     \
    const long off = ab_source_offset(gid, ndim, shape8, stride8, chan, &c);                    \
    float y = LOAD(src, (long)src_off + off);                                                   \
    if (mode) {                                                                                 \
      float av[16], bv[16];                                                                     \
      vstore16(a16, 0, av);                                                                     \
      vstore16(b16, 0, bv);                                                                     \
      float a = av[c], b = bv[c];                                                               \
      y = y * a;                                                                                \
      y = y + b;                                                                                \
    }                                                                                           \
    STORE(dst, dst_off + gid, y);                                                               \
  }

/* Every source kind: its name in kernel names, element type and load;
 * M is called with three more arguments of the caller's. The order is the
 * backend's (convert_kernel in backends/opencl/opencl.c). */
#define AB_FOR_EACH_SOURCE(M, A, B, C)  \
  M(u8, uchar, AB_LOAD_U8, A, B, C)     \
  M(i8, char, AB_LOAD_I8, A, B, C)      \
  M(u16, ushort, AB_LOAD_U16, A, B, C)  \
  M(i16, short, AB_LOAD_I16, A, B, C)   \
  M(bool, uchar, AB_LOAD_BOOL, A, B, C) \
  M(f16, ushort, AB_LOAD_F16, A, B, C)  \
  M(bf16, ushort, AB_LOAD_BF16, A, B, C) \
  M(f32, float, AB_LOAD_F32, A, B, C)

/* One kernel per source kind and result type: ab_to_<result>_<source>. */
#define AB_FLOAT32_MATH_FROM(SUFFIX, TS, LOAD, RSUFFIX, TD, STORE) \
  AB_DEFINE_FLOAT32_MATH(ab_to_##RSUFFIX##_##SUFFIX, TS, LOAD, TD, STORE)

AB_FOR_EACH_SOURCE(AB_FLOAT32_MATH_FROM, f32, float, AB_STORE_F32)
AB_FOR_EACH_SOURCE(AB_FLOAT32_MATH_FROM, f16, ushort, AB_STORE_F16)
AB_FOR_EACH_SOURCE(AB_FLOAT32_MATH_FROM, bf16, ushort, AB_STORE_BF16)

/* The way back: every source kind above into uint8, int8, uint16 and
 * int16, narrowing on the device before the download (a float32 frame to
 * uint8, a 16-bit depth image to 8 bits). Every source value is exact in
 * float, hence in double. The host's rule for
 * these is float64 arithmetic (y = x * a + b, two roundings), then round
 * half to even and saturate, NaN -> 0: exactly OpenCL's convert_T_sat_rte
 * of a double. So these exist only where the compiler has doubles. */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

#define AB_DEFINE_NARROW(NAME, TS, LOAD, TD, CONV)                                                \
  __kernel void NAME(__global const TS *src, ulong src_off, __global TD *dst, ulong dst_off,        \
                     int ndim, long8 shape8, long8 stride8, ulong n, int mode, int chan,            \
                     double16 a16, double16 b16) {                                                 \
    size_t gid = get_global_id(0);                                                               \
    if (gid >= n) return;                                                                        \
    long c;                                                                                      \
    const long off = ab_source_offset(gid, ndim, shape8, stride8, chan, &c);                     \
    double y = (double)LOAD(src, (long)src_off + off);                                           \
    if (mode) {                                                                                  \
      double av[16], bv[16];                                                                     \
      vstore16(a16, 0, av);                                                                      \
      vstore16(b16, 0, bv);                                                                      \
      y = y * av[c];                                                                             \
      y = y + bv[c];                                                                             \
    }                                                                                            \
    dst[dst_off + gid] = CONV(y);                                                                \
  }

/* ab_<source>_to_<result> for the four integer results. */
#define AB_NARROW_FROM(SUFFIX, TS, LOAD, A, B, C)                                                 \
  AB_DEFINE_NARROW(ab_##SUFFIX##_to_u8, TS, LOAD, uchar, convert_uchar_sat_rte)                   \
  AB_DEFINE_NARROW(ab_##SUFFIX##_to_i8, TS, LOAD, char, convert_char_sat_rte)                     \
  AB_DEFINE_NARROW(ab_##SUFFIX##_to_u16, TS, LOAD, ushort, convert_ushort_sat_rte)                \
  AB_DEFINE_NARROW(ab_##SUFFIX##_to_i16, TS, LOAD, short, convert_short_sat_rte)

AB_FOR_EACH_SOURCE(AB_NARROW_FROM, , , )
#endif
