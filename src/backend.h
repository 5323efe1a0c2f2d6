/* The backend interface: one `const struct ab_backend` per memory space
 * (backends/host, backends/cuda, backends/opencl), filled with designated
 * initialisers and registered in src/device.c. This is all a backend
 * includes of the core; the core's own declarations are in src/core.h.
 *
 * Contract
 *  - Identity first: device_type and name are never NULL/0.
 *  - A NULL operation means "not supported". Only the wrappers in
 *    src/backend.c (declared in src/core.h) call through the table; they
 *    turn NULL into AB_ERR_UNSUPPORTED with a message, so nobody else
 *    tests the pointers.
 *  - `id` arguments are always in [0, device_count()), checked by the core.
 *  - Every operation may be called from any thread at any time after init
 *    returned AB_OK; a backend guards its own state.
 *  - A failing operation sets the detail message (AB_FAIL) naming the
 *    native error (cudaError_t, cl_int) and returns the status.
 *  - Memory: alloc returns `bytes` (> 0) of device memory aligned to at least
 *    AB_ALIGNMENT in *out, or AB_ERR_OUT_OF_MEMORY. For device types whose
 *    DLTensor.data is a handle (OpenCL cl_mem), *out is that handle. free
 *    gets the same pointer and size back and cannot fail.
 *  - Copies take tensor descriptions (TVM's DeviceCopyDataFromTo): `from`
 *    may have any strides the core validated; `to` is compact row-major and
 *    of the same shape and dtype. Both are on this backend's devices.
 *    `stream` is the caller's ab_convert_opts.stream (NULL = default) and
 *    the copy is complete, as seen from the host, when the call returns.
 *  - Early return (AB_CONVERT_ASYNC): copy and convert take `async`. When
 *    it is true the operation may return as soon as its work is queued on
 *    `stream` itself (NULL: the default stream ab_synchronize(dev, NULL)
 *    waits for), after making sure that work will start without a further
 *    call (OpenCL: clFlush). Work that has to go elsewhere (a temporary
 *    queue, a queue of another context) is still completed before return,
 *    and so is everything when a step fails.
 */
#ifndef AB_BACKEND_H
#define AB_BACKEND_H

#include "element.h"
#include "internal.h"

/* The arguments of a conversion (converters/host/convert.h). */
typedef struct ab__convert_args ab__convert_args;

/* Alignment of every data block the library allocates (DLPack asks for
 * 256 bytes, as CUDA gives). */
#define AB_ALIGNMENT 256

/* Capability bits. */
enum {
  /* Host code may read and write this memory through DLTensor.data. */
  AB_CAP_HOST_ACCESSIBLE = 1u << 0,
  /* Per device (device_caps): the device's memory is the host's RAM (an
   * OpenCL CPU device), so moving bytes to the host is a memcpy while its
   * kernels are slow: the planner prefers host-side work there. */
  AB_CAP_UNIFIED_MEMORY = 1u << 1,
  /* Memory the library keeps for its own staging buffers, outside DLPack's
   * device types (AB_DEVICE_OPENCL_HOST): it has a pool, but no tensor may
   * name it. */
  AB_CAP_STAGING_ONLY = 1u << 2,
  /* DLTensor.data is an address in the process's one address space that
   * host code may not dereference (CUDA device memory): producers give
   * element 0's (CuPy, the CUDA Array Interface), which negative strides
   * may address below, and tensors at different addresses may share
   * bytes. Without it (OpenCL) data is a buffer handle, addressed only at
   * non-negative offsets, and two handles share bytes only through
   * root(). */
  AB_CAP_ADDRESSED = 1u << 3,
};

struct ab_backend {
  DLDeviceType device_type;
  /* The driver family's name (cuda, opencl), as messages and
   * ab_device_info's backend field say it. */
  const char *name;
  uint32_t caps;
  /* The backend whose driver this one's memory belongs to (cuda_host and
   * cuda_managed: cuda; opencl_host: opencl), so that a stream of one
   * means something to the other; NULL for a backend of its own. */
  const struct ab_backend *family;
  /* For a private device type (AB_CAP_STAGING_ONLY, outside DLPack's
   * numbering): its name in device strings ("opencl_host"); NULL
   * otherwise (DLPack's types have theirs, ab_device_type_name). */
  const char *type_name;
  /* Host-accessible memory this backend's transfers are fastest from and
   * into (CUDA: kDLCUDAHost, page-locked; OpenCL: AB_DEVICE_OPENCL_HOST),
   * used for staging buffers of routes through host memory; 0 = plain
   * host memory. */
  DLDeviceType staging;
  /* Which device of the `staging` type serves device `id`, or -1 when
   * staging does not pay off for it (an OpenCL CPU device, whose memory
   * already is the host's). NULL: device 0 serves every device (CUDA's
   * pinned memory is one space). Use ab__staging_device. */
  int32_t (*staging_id)(int32_t id);

  /* Loads the backend's drivers into the process without initialising
   * them (ab_preload_drivers), before any init; may be NULL. Idempotent,
   * never fails (a driver that does not load is init's to report). */
  void (*preload)(void);
  /* Called once, lazily, before any other operation; may be NULL. A
   * failure means zero devices, never a crash: the core logs it and keeps
   * the message for ab_device_info/convert on that type. */
  ab_status (*init)(void);
  /* Releases everything init and later calls created; may be NULL. */
  void (*shutdown)(void);

  /* Number of devices after init; never negative. Never NULL. */
  int32_t (*device_count)(void);
  /* Per-device capability bits (AB_CAP_UNIFIED_MEMORY); may be NULL. */
  uint32_t (*device_caps)(int32_t id);
  ab_status (*device_info)(int32_t id, struct ab_device_info *out);
  /* AB_OK while device `id` can be used, else a failure with its message
   * (CUDA after a sticky error: the process must restart); may be NULL
   * (always usable). Asked by every device check of the core, so cheap. */
  ab_status (*usable)(int32_t id);

  /* AB_ERR_OUT_OF_MEMORY where memory in use is what refused it (the pool
   * runs its OOM sequence); AB_ERR_UNSUPPORTED where no allocation of that
   * size can be had on the device whatever is freed (OpenCL: past
   * CL_DEVICE_MAX_MEM_ALLOC_SIZE; the pool tries the request's own size,
   * then fails with AB_ERR_OUT_OF_MEMORY without the sequence). */
  ab_status (*alloc)(int32_t id, size_t bytes, void **out);
  void (*free)(int32_t id, void *ptr, size_t bytes);

  ab_status (*copy)(const DLTensor *from, DLTensor *to, void *stream, bool async);
  /* Whether copy() handles this source and destination (both this
   * backend's devices); NULL means always. The host's copy takes any
   * strides; OpenCL's takes sources within one context: compact ones, and
   * strided ones its gather kernel can take. */
  bool (*can_copy)(const DLTensor *from, DLDevice to, bool from_compact);

  /* For memory host code cannot address (NULL for host-accessible
   * backends). Contiguous transfers between host memory and the device
   * data `handle` at byte `offset`, complete on return:
   *   write: `bytes` from host `src` into the device;
   *   read:  `bytes` from the device into host `dst`.
   * `id` is the device the tensor names. */
  ab_status (*write)(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream);
  ab_status (*read)(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream);
  /* A rectangle read into compact host memory: region[0] contiguous bytes
   * per row, region[1] rows `row_pitch` bytes apart, region[2] slices
   * `slice_pitch` bytes apart, starting at byte `offset`. May be NULL. */
  ab_status (*read_rect)(int32_t id, const void *handle, uint64_t offset, const size_t region[3],
                         size_t row_pitch, size_t slice_pitch, void *dst, void *stream);
  /* The reverse: a rectangle of host memory at `src` (rows `row_pitch`,
   * slices `slice_pitch` bytes apart) into compact device bytes at
   * `offset`. May be NULL. */
  ab_status (*write_rect)(int32_t id, void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                          size_t slice_pitch, const void *src, void *stream);
  /* Checks that bytes [begin, end) lie inside the buffer `handle` (which
   * may come from another library), before anything touches it;
   * AB_ERR_INVALID_ARGUMENT otherwise. */
  ab_status (*check_range)(int32_t id, const void *handle, uint64_t begin, uint64_t end);
  /* The buffer `handle` is part of, and where in it it starts (an OpenCL
   * sub-buffer's parent and offset), so that two handles' bytes can be
   * compared; *root = handle and *offset = 0 where it is its own. May be
   * NULL: every handle is its own. */
  void (*root)(const void *handle, const void **root, uint64_t *offset);
  /* For host-accessible memory a device may still be writing (CUDA pinned
   * and managed memory): called before host code reads a source of this
   * type; waits for `stream` (this family's, or NULL for the default
   * one). May be NULL. */
  ab_status (*host_sync)(int32_t id, void *stream);
  /* Called before host code writes a result of this type (CUDA managed
   * memory on a system where the CPU may not touch it while the GPU has
   * work in flight: it waits for the GPUs to be idle); AB_OK at once where
   * nothing is needed. May be NULL. */
  ab_status (*host_write_sync)(int32_t id);
  /* ab_synchronize: waits for `stream` (NULL: the default) on device id.
   * NULL for backends with nothing to wait for. */
  ab_status (*synchronize)(int32_t id, void *stream);
  /* ab_peer_access between two devices of this backend; NULL = never. */
  bool (*peer_access)(int32_t from, int32_t to);

  /* Conversions on the device (the converters/ of this backend), both or
   * neither. can_convert: whether device `id` runs `a` bit-exactly as the
   * host would (the rules in converters/host/convert.h) from the source
   * data `src` + `src_offset` bytes (a buffer the caller may have made
   * elsewhere: its alignment and, for OpenCL, its context matter), or
   * from a buffer the library allocates on the device when `src` is NULL;
   * may build kernels. convert: from the source's elements at `src` + `src_offset`
   * bytes (laid out as a's strides say) into the compact result at `dst` +
   * `dst_offset`, both buffers of device `id`; complete on return unless
   * `async` (see the contract above). */
  bool (*can_convert)(int32_t id, const void *src, uint64_t src_offset, const ab__convert_args *a);
  ab_status (*convert)(int32_t id, const void *src, uint64_t src_offset, void *dst, uint64_t dst_offset,
                       const ab__convert_args *a, void *stream, bool async);

  /* The staging ring (src/staging.c), for backends whose transfers from
   * pageable memory are slow and whose `staging` memory is fast. All of
   * these or none. The async transfers take host memory of the staging
   * type only, are queued on `stream` in order and return at once; a
   * fence recorded on the stream after them completes when they have.
   *   host_is_staged: whether host pointer p already is staging memory
   *                   (pinned or registered): then no ring is needed. */
  ab_status (*write_async)(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream);
  ab_status (*read_async)(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream);
  ab_status (*fence_new)(int32_t id, void **fence);
  ab_status (*fence_record)(int32_t id, void *fence, void *stream);
  ab_status (*fence_wait)(void *fence);
  void (*fence_free)(void *fence);
  bool (*host_is_staged)(const void *p);
  /* Waits for everything queued on `stream` (the ring's last resort when a
   * fence could not be recorded); errors are ignored. */
  void (*stream_sync)(int32_t id, void *stream);
};


#endif /* AB_BACKEND_H */
