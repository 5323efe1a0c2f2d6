/* Host strided gather: any-strided N-d array -> compact row-major copy. */
#ifndef AB_CONVERTERS_HOST_GATHER_H
#define AB_CONVERTERS_HOST_GATHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Copies the ndim-dimensional array at `src` into `dst` in row-major order.
 * shape[i] >= 0; byte_strides[i] is the distance in bytes between
 * neighbours along dim i (any sign, 0 for broadcast); elsize is the bytes
 * of one element. The caller has validated that every addressed byte is
 * readable and that dst holds prod(shape) * elsize bytes, which must not
 * overlap src. ndim <= AB_MAX_NDIM. */
void ab__host_gather(void *dst, const void *src, int32_t ndim, const int64_t *shape,
                     const int64_t *byte_strides, size_t elsize);

/* Whether large transposes use streaming stores on this machine: 1 or 0,
 * from AB_HOST_STREAMING (1, 0) or measured once (auto); see gather.c. */
int ab__host_streaming(void);
/* The same without deciding: 1, 0, or -1 while not yet measured. */
int ab__host_streaming_known(void);
/* The host kernels this CPU runs ("avx", "ssse3", "sse2"; "portable"
 * off x86-64), as AB_HOST_TILES caps them; see gather.c. */
const char *ab__host_tiles(void);


#endif
