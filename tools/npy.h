/* NumPy .npy files (format versions 1.0, 2.0 and 3.0), read strictly and
 * written as version 1.0, for abtool. A file becomes a host DLTensor over
 * its data: C order gives compact strides, Fortran order reversed ones.
 * Data of either byte order is read (npy_array.swapped says it is not
 * the host's, for npy_swap_bytes), and written little-endian on every
 * host, so that a file's bytes do not depend on the machine. */
#ifndef AB_TOOLS_NPY_H
#define AB_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "arraybridge/arraybridge.h"

#define NPY_MAX_NDIM 64 /* NumPy 2's limit, and AB_MAX_NDIM */

typedef struct npy_array {
  DLDataType dtype;
  int32_t ndim;
  int64_t shape[NPY_MAX_NDIM];
  int64_t strides[NPY_MAX_NDIM]; /* elements */
  int fortran_order;
  const uint8_t *data; /* into the buffer that was parsed */
  size_t nbytes;
  int swapped; /* data is in the other byte order than the host's */
} npy_array;

/* Parses a whole .npy file held in buf[0..len). On success fills *out
 * (data points into buf) and returns 0; otherwise returns -1 and writes a
 * one-line reason into err (errlen bytes). Never reads outside buf. */
int npy_parse(const uint8_t *buf, size_t len, npy_array *out, char *err, size_t errlen);

/* The size a whole .npy file must have, from the start of one held in
 * buf[0..len): 0 and *total where its header is complete, 1 where it is
 * not yet, -1 where it is complete but not one npy_parse takes. */
int npy_file_size(const uint8_t *buf, size_t len, uint64_t *total);

/* The NumPy descr ("<f4", "|u1", ...) of a dtype, as npy_write labels
 * it, or NULL when .npy cannot hold it (bfloat16, lanes > 1, ...). */
const char *npy_descr(DLDataType dtype);

/* Reverses the bytes of each element of dtype d in data[0..nbytes) (of
 * each part of a complex one): npy_array data that is `swapped` into the
 * host's order. */
void npy_swap_bytes(uint8_t *data, size_t nbytes, DLDataType d);

/* Writes a compact host tensor as a version 1.0 .npy file; 0 or -1 with
 * the reason in err. An existing file is written in place (owner, mode,
 * links kept), a regular one only once the space for the whole new file
 * is reserved: a full disk or a file-size limit fails before any byte of
 * it changes. A new file that could not be written whole is removed. */
int npy_write(const char *path, const DLTensor *t, char *err, size_t errlen);

#endif
