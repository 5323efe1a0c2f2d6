/* Fuzz target: arbitrary bytes as a .npy file for abtool's reader
 * (tools/npy.c). Beyond "no crash, no sanitizer report": a refusal leaves
 * *out untouched with a terminated reason; an accepted file's data lies
 * inside the input, its size equals shape x itemsize, and its strides
 * describe a compact C- or Fortran-order array; only multi-byte data is
 * flagged as in the other byte order, and swapping it twice is no change. */
#include <stdint.h>
#include <string.h>

#include "fuzz.h"

#include "tools/npy.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_array a, before;
  memset(&a, 0x6b, sizeof a);
  before = a;
  char err[128];
  memset(err, 'x', sizeof err);
  if (npy_parse(data, size, &a, err, sizeof err) != 0) {
    CHECK(memcmp(&a, &before, sizeof a) == 0);
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    return 0;
  }
  CHECK(a.ndim >= 0 && a.ndim <= NPY_MAX_NDIM);
  CHECK(a.data >= data && a.data + a.nbytes == data + size);
  uint64_t n = 1;
  for (int32_t k = 0; k < a.ndim; k++) n *= (uint64_t)a.shape[k];
  CHECK(n * (a.dtype.bits / 8u) == a.nbytes);
  /* Compact in C or Fortran order; an empty array's strides are 0. */
  int64_t acc = 1;
  for (int32_t k = 0; k < a.ndim; k++) {
    int32_t d = a.fortran_order ? k : a.ndim - 1 - k;
    CHECK(a.strides[d] == (n == 0 ? 0 : acc));
    if (n != 0) acc *= a.shape[d];
  }
  /* Only types of more than one byte have an order to swap; swapped
   * twice, the data is as it was. */
  CHECK(!a.swapped || a.dtype.bits > 8);
  uint8_t copy[4096];
  if (a.nbytes <= sizeof copy) {
    memcpy(copy, a.data, a.nbytes);
    npy_swap_bytes(copy, a.nbytes, a.dtype);
    npy_swap_bytes(copy, a.nbytes, a.dtype);
    CHECK(memcmp(copy, a.data, a.nbytes) == 0);
  }
  return 0;
}
