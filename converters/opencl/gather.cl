/* Strided gather on an OpenCL device: element i of the compact row-major
 * destination comes from the source element whose index is i's row-major
 * decomposition. Up to 8 dimensions (after the host merged contiguous
 * ones); shape and strides, in elements, arrive as long8 vectors. One work
 * item per element; the element type only sets the width of the move, so
 * the copy is bit-exact for every dtype of that size.
 *
 * Embedded into the library at build time (converters/opencl/embed.cmake,
 * from backends/opencl/backend.cmake) and
 * compiled once per context. */

#define AB_DEFINE_GATHER(NAME, T)                                                       \
  __kernel void NAME(__global const T *src, ulong src_off, __global T *dst, ulong dst_off, \
                     int ndim, long8 shape8, long8 stride8, ulong n) {                   \
    size_t gid = get_global_id(0);                                                      \
    if (gid >= n) return;                                                               \
    long shape[8] = {shape8.s0, shape8.s1, shape8.s2, shape8.s3,                        \
                     shape8.s4, shape8.s5, shape8.s6, shape8.s7};                       \
    long stride[8] = {stride8.s0, stride8.s1, stride8.s2, stride8.s3,                   \
                      stride8.s4, stride8.s5, stride8.s6, stride8.s7};                  \
    long rem = (long)gid, off = 0;                                                      \
    for (int i = ndim - 1; i >= 0; i--) {                                               \
      long q = rem / shape[i];                                                          \
      off += (rem - q * shape[i]) * stride[i];                                          \
      rem = q;                                                                          \
    }                                                                                   \
    dst[dst_off + gid] = src[(long)src_off + off];                                      \
  }

AB_DEFINE_GATHER(ab_gather_1, uchar)
AB_DEFINE_GATHER(ab_gather_2, ushort)
AB_DEFINE_GATHER(ab_gather_4, uint)
AB_DEFINE_GATHER(ab_gather_8, ulong)
AB_DEFINE_GATHER(ab_gather_16, uint4)
