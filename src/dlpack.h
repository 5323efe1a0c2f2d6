/* DLPack validation, export and ownership (dlpack.c). */
#ifndef AB_DLPACK_H
#define AB_DLPACK_H

#include "pool.h"

/* What validation learnt about a tensor. Offsets are in bytes, relative to
 * data + byte_offset: the addressed bytes are [min_off, max_off + elsize). */
typedef struct ab__layout {
  size_t elsize;   /* bytes per element (bits / 8 * lanes) */
  int64_t numel;
  size_t nbytes;   /* numel * elsize */
  bool compact;    /* row-major compact (NULL strides count; empty tensors too) */
  int64_t min_off;
  int64_t max_off;
} ab__layout;

/* Validates a dtype; on success *elsize is its element size in bytes.
 * `what` names it in messages. */
ab_status ab__check_dtype(DLDataType dt, const char *what, size_t *elsize);

/* Validates ndim, shape and dtype, and fills *lay as for a compact tensor
 * (on failure *lay may be partly written). */
ab_status ab__check_shape(int32_t ndim, const int64_t *shape, DLDataType dtype,
                         const char *what, ab__layout *lay);

/* Validates shape, dtype, strides, data and offsets of `t` (not its device;
 * see ab__check_device) without reading its data. `what` names it. On
 * failure *lay may be partly written. */
ab_status ab__check_tensor(const DLTensor *t, const char *what, ab__layout *lay);

/* The managed tensors the library makes: one allocation holds the struct,
 * the bookkeeping and the shape and strides arrays; for a tensor with a
 * pooled block and up to ROOM_DIMS (dlpack.c) dims that is the block's
 * descriptor (ab__tensor_create). */
struct ab__tensor {
  DLManagedTensorVersioned mt; /* first: the deleter casts self back */
  ab__block *block;            /* data owned by this tensor; NULL for views */
  int64_t dims[];              /* shape[ndim] then strides[ndim] */
};

/* Allocates the metadata of a tensor on `dev` with compact strides, data
 * NULL, flags 0. Owned by the caller until exported; release an unexported
 * one with ab__tensor_discard. */
ab_status ab__tensor_new(DLDevice dev, int32_t ndim, const int64_t *shape,
                         DLDataType dtype, struct ab__tensor **out);

/* A tensor as ab__tensor_new makes one, with a data block of `nbytes`
 * from its device's pool, which backend `be` serves (none when 0). */
ab_status ab__tensor_create(DLDevice dev, int32_t ndim, const int64_t *shape, DLDataType dtype,
                            const struct ab_backend *be, size_t nbytes, struct ab__tensor **out);

/* Frees a tensor and returns its block to the pool; what the deleter does. */
void ab__tensor_discard(struct ab__tensor *t);

#endif /* AB_DLPACK_H */
