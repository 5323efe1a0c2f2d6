/* The OpenCL backend's own declarations, shared by its files: opencl.c
 * (platforms, devices, queues, the backend tables), transfers.c, kernels.c
 * (converters/opencl/) and pinned.c. Nothing outside backends/opencl/
 * includes it. */
#ifndef AB_BACKENDS_OPENCL_H
#define AB_BACKENDS_OPENCL_H
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "backends/opencl/cl_api.h" /* after <CL/cl.h>: the calls go through ab__cl's pointers */

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "converters/host/convert.h"
#include "backends/opencl/icd_preload.h"
#include "converters/host/gather.h"

#define MAX_PLATFORMS 16
#define MAX_DEVICES AB__MAX_IDS /* the ids the core uses (ab__dev_count) */

/* The kernels: gathers, one per element width (1, 2, 4, 8, 16 bytes), then
 * the conversions in float32 arithmetic, one per result type (float32,
 * float16, bfloat16) and source kind (convert_kernel), then the narrowing
 * conversions (narrow_kernel), which only devices with doubles have (NULL
 * elsewhere), then the two that take the kinds as arguments: integers
 * exactly (K_INT) and float64 arithmetic (K_WIDE, doubles only). The
 * conversions' lists are converters/opencl/kernels.def, which convert.cl
 * defines its kernels from. */
#include "converters/opencl/kernels.def"
#define AB_COUNT_ONE_(...) +1
#define NGATHER 5
#define NSOURCES (0 AB_CL_SOURCES(AB_COUNT_ONE_, , , ))
#define NFLOAT_RESULTS (0 AB_CL_FLOAT_RESULTS(AB_COUNT_ONE_))
#define NNARROW_RESULTS (0 AB_CL_NARROW_RESULTS(AB_COUNT_ONE_, , , ))
#define NCONVERT (NFLOAT_RESULTS * NSOURCES)
#define NNARROW (NSOURCES * NNARROW_RESULTS)
#define NREQUIRED (NGATHER + NCONVERT)
#define K_INT (NREQUIRED + NNARROW)
#define K_WIDE (K_INT + 1)
#define NKERNELS (K_WIDE + 1)

struct platform {
  cl_platform_id id;
  cl_context ctx; /* lazily */
  int first, count; /* its devices in the flat table */
  /* converters/opencl/gather.cl and convert.cl, built on first need
   * (program_ready) */
  cl_program prog[2];
  cl_kernel kernel[NKERNELS]; /* gathers, then conversions */
  bool prog_failed[2];
};

extern const char ab__opencl_gather_cl[], ab__opencl_convert_cl[];
extern const size_t ab__opencl_gather_cl_len, ab__opencl_convert_cl_len;

struct device {
  cl_device_id id;
  int platform;
  cl_command_queue queue; /* lazily */
  bool unified;           /* CL_DEVICE_HOST_UNIFIED_MEMORY */
};

/* The platforms and devices found by init (opencl.c); contexts, queues
 * and programs are made on first use under ab__cl_lock. */
extern pthread_mutex_t ab__cl_lock;
extern struct platform ab__cl_platforms[MAX_PLATFORMS];
extern struct device ab__cl_devices[MAX_DEVICES];
extern int ab__cl_nplatforms, ab__cl_ndevices;

/* AB_OPENCL_PINNED: which devices stage through pinned memory. */
enum ab__cl_pinned_mode { PINNED_AUTO, PINNED_ALL, PINNED_NONE };
extern enum ab__cl_pinned_mode ab__cl_pinned_mode;

/* ---- shared within the backend ------------------------------------------ */

/* opencl.c: errors, queues, device description. */
const char *ab__cl_err_name(cl_int e);
bool ab__cl_is_oom(cl_int e);
ab_status ab__cl_fail_cl(cl_int e, int32_t id, const char *call);
ab_status ab__cl_get_queue(int32_t id, cl_context *ctx, cl_command_queue *q);
ab_status ab__cl_info(int32_t id, struct ab_device_info *out);

/* transfers.c: buffers, transfers, queues of the caller's. */
ab_status ab__cl_alloc(int32_t id, size_t bytes, void **out);
void ab__cl_free(int32_t id, void *ptr, size_t bytes);
/* ab__cl_fail_cl for a read (write false) or write of buffer m by the host:
 * a buffer whose flags forbid it (CL_MEM_HOST_NO_ACCESS and the like) is
 * AB_ERR_INVALID_ARGUMENT, said in those words. */
ab_status ab__cl_fail_host_xfer(cl_int e, int32_t id, cl_mem m, bool write, const char *call);
ab_status ab__cl_use_stream(int32_t id, cl_context ctx, void *stream, cl_command_queue *q);
ab_status ab__cl_queue_for(int32_t id, cl_mem m, void *stream, cl_command_queue *q, bool *tmp);
ab_status ab__cl_write(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream);
ab_status ab__cl_read(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream);
ab_status ab__cl_read_rect(int32_t id, const void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                           size_t slice_pitch, void *dst, void *stream);
ab_status ab__cl_write_rect(int32_t id, void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                            size_t slice_pitch, const void *src, void *stream);
ab_status ab__cl_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end);
void ab__cl_root(const void *handle, const void **root, uint64_t *offset);
ab_status ab__cl_synchronize(int32_t id, void *stream);

/* kernels.c: copies (the gather kernels) and conversions on the device. */
bool ab__cl_can_copy(const DLTensor *from, DLDevice to, bool from_compact);
ab_status ab__cl_copy(const DLTensor *from, DLTensor *to, void *stream, bool async);
bool ab__cl_can_convert(int32_t id, const void *src, uint64_t src_offset, const ab__convert_args *args);
ab_status ab__cl_convert(int32_t id, const void *src, uint64_t src_offset, void *dst, uint64_t dst_offset,
                         const ab__convert_args *args, void *stream, bool async);

/* pinned.c: pinned staging memory (AB_DEVICE_OPENCL_HOST) and the ring's
 * operations. */
ab_status ab__cl_pinned_alloc(int32_t id, size_t bytes, void **out);
void ab__cl_pinned_free(int32_t id, void *ptr, size_t bytes);
int32_t ab__cl_pinned_count(void);
ab_status ab__cl_pinned_info(int32_t id, struct ab_device_info *out);
bool ab__cl_host_is_staged(const void *p);
int32_t ab__cl_staging_id(int32_t id);
ab_status ab__cl_write_async(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream);
ab_status ab__cl_read_async(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream);
ab_status ab__cl_fence_new(int32_t id, void **out);
ab_status ab__cl_fence_record(int32_t id, void *fence, void *stream);
ab_status ab__cl_fence_wait(void *fence);
void ab__cl_fence_free(void *fence);
void ab__cl_stream_sync(int32_t id, void *stream);

#endif /* AB_BACKENDS_OPENCL_H */
