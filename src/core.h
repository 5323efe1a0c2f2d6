/* The core's own declarations, shared by src/: the backend registry
 * (device.c), the wrappers that are the only callers of a backend's table
 * (backend.c), the staging ring (staging.c) and the conversion settings
 * (convert.c). Backends include backend.h only. */
#ifndef AB_CORE_H
#define AB_CORE_H

#include "backend.h"
#include "converters/host/convert.h"

/* ---- registry (device.c) ------------------------------------------------ */

/* The staging memory of device `id` of `be` (see ab_backend.staging) into
 * *out; false when it has none, or none right now (no devices of the
 * staging type). */
bool ab__staging_device(const struct ab_backend *be, int32_t id, DLDevice *out);

/* ab__check_device for a device a tensor names (a source, a target, an
 * allocation): staging-only memory (AB_CAP_STAGING_ONLY) is refused. */
ab_status ab__check_tensor_device(DLDevice dev, const char *what, bool is_target, DLDevice *resolved,
                                  const struct ab_backend **be);

/* Initialises the backends once (thread-safe, lazily). */
void ab__ensure_init(void);
/* Shuts the backends down (ab_shutdown's last step); a later call
 * initialises them again. */
void ab__registry_shutdown(void);

/* Whether backend be's driver is one a fork left behind: this process was
 * forked after the backends started, or after another library started
 * be's driver (ab_note_driver_started). Then be has no devices in it, for
 * good, and nothing is handed back to that driver (see device.c, "fork"). */
bool ab__backend_left_behind(const struct ab_backend *be);
/* How many frees of such memory were not handed to their driver (tests). */
uint64_t ab__dev_frees_left_behind(void);

/* The backend serving `type`, or NULL if none is built in. */
const struct ab_backend *ab__backend_for(DLDeviceType type);
/* Whether cpu:0 is checked without the backend search now (tests). */
bool ab__device_shortcut_ready(void);

/* Checks a device named by a caller. `what` names it in messages ("src
 * device", "target device"). A target may carry AB_DEVICE_AUTO, which is resolved here
 * into *resolved. On success *be is the backend. */
ab_status ab__check_device(DLDevice dev, const char *what, bool is_target,
                           DLDevice *resolved, const struct ab_backend **be);

/* ---- the wrappers (backend.c): the only callers of the table ------------ */

/* They turn NULL operations into AB_ERR_UNSUPPORTED (or say what a missing
 * one means), and are the fault-injection sites: allocations consult
 * ab__fault_check, transfers, fences and host syncs
 * ab__fault_transfer_check. */
void ab__dev_preload(const struct ab_backend *be);
ab_status ab__dev_init(const struct ab_backend *be);
void ab__dev_shutdown(const struct ab_backend *be);
int32_t ab__dev_count(const struct ab_backend *be);
/* Which device of be->staging serves device id (see ab_backend.staging_id). */
int32_t ab__dev_staging_id(const struct ab_backend *be, int32_t id);
/* The device's description, with the core's fields (device, backend,
 * host_accessible) filled in. */
ab_status ab__dev_info(const struct ab_backend *be, int32_t id, struct ab_device_info *out);
/* Whether device id can still be used (ab_backend.usable). */
ab_status ab__dev_usable(const struct ab_backend *be, int32_t id);
/* Whether every existing device of the backend is usable (it has no
 * usability check). */
bool ab__dev_always_usable(const struct ab_backend *be);
/* Total and free memory of a device, 0 when unknown. Never fails and
 * leaves the thread's error message as it was. */
void ab__dev_meminfo(const struct ab_backend *be, int32_t id, uint64_t *free_b, uint64_t *total_b);
ab_status ab__dev_alloc(const struct ab_backend *be, int32_t id, size_t bytes, void **out);
void ab__dev_free(const struct ab_backend *be, int32_t id, void *ptr, size_t bytes);
ab_status ab__dev_copy(const struct ab_backend *be, const DLTensor *from, DLTensor *to, void *stream, bool async);
bool ab__dev_can_convert(const struct ab_backend *be, int32_t id, const void *src, uint64_t src_offset,
                         const ab__convert_args *a);
ab_status ab__dev_convert(const struct ab_backend *be, int32_t id, const void *src, uint64_t src_offset, void *dst,
                          uint64_t dst_offset, const ab__convert_args *a, void *stream, bool async);
bool ab__dev_can_copy(const struct ab_backend *be, const DLTensor *from, DLDevice to, bool from_compact);
ab_status ab__dev_write(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset,
                        const void *src, size_t bytes, void *stream);
ab_status ab__dev_read(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset,
                       void *dst, size_t bytes, void *stream);
bool ab__dev_has_read_rect(const struct ab_backend *be);
uint32_t ab__dev_caps(const struct ab_backend *be, int32_t id);
/* Whether two backends belong to one driver family (they share a name, as
 * cuda, cuda_host and cuda_managed do), so that a stream of one means
 * something to the other. */
bool ab__same_family(const struct ab_backend *a, const struct ab_backend *b);
bool ab__dev_has_write_rect(const struct ab_backend *be);
ab_status ab__dev_write_rect(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset,
                             const ab__rect *rect, const void *src, void *stream);
ab_status ab__dev_read_rect(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset,
                            const ab__rect *rect, void *dst, void *stream);
ab_status ab__dev_check_range(const struct ab_backend *be, int32_t id, const void *handle,
                              uint64_t begin, uint64_t end);
/* Waits for device work that may still write host-accessible memory of be
 * (see ab_backend.host_sync); AB_OK when be has nothing to wait for. */
ab_status ab__dev_host_sync(const struct ab_backend *be, int32_t id, void *stream);
bool ab__dev_needs_host_sync(const struct ab_backend *be);
/* Before host code writes a result in be's memory (ab_backend.host_write_sync). */
ab_status ab__dev_host_write_sync(const struct ab_backend *be, int32_t id);
ab_status ab__dev_synchronize(const struct ab_backend *be, int32_t id, void *stream);
bool ab__dev_peer_access(const struct ab_backend *be, int32_t from, int32_t to);
/* The staging ring's operations (see ab_backend): has_ring says whether
 * the backend has them. */
bool ab__dev_has_ring(const struct ab_backend *be);
bool ab__dev_host_is_staged(const struct ab_backend *be, const void *p);
ab_status ab__dev_write_async(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset, const void *src,
                              size_t bytes, void *stream);
ab_status ab__dev_read_async(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset, void *dst,
                             size_t bytes, void *stream);
ab_status ab__dev_fence_new(const struct ab_backend *be, int32_t id, void **fence);
ab_status ab__dev_fence_record(const struct ab_backend *be, int32_t id, void *fence, void *stream);
ab_status ab__dev_fence_wait(const struct ab_backend *be, void *fence);
void ab__dev_fence_free(const struct ab_backend *be, void *fence);
void ab__dev_stream_sync(const struct ab_backend *be, int32_t id, void *stream);

/* ---- the staging ring (staging.c) and conversion settings (convert.c) ---- */

/* The staging ring (staging.c): a compact transfer between pageable host
 * memory and the device `id` of `be`, through a ring of chunks of the
 * backend's staging memory: the host copy into chunk k overlaps the DMA of
 * chunk k-1. Falls back to be->write / be->read when the backend has no
 * ring operations, the host memory already is staging memory, the transfer
 * is below AB_STAGING_MIN bytes, or no chunk can be allocated. Complete on
 * return, like write/read, except that with `async` a transfer from or into
 * host memory that already is staging memory is only queued on `stream`
 * (write_async/read_async; the early return of the backend contract). */
ab_status ab__staged_write(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset, const void *src,
                           size_t bytes, void *stream, bool async);
ab_status ab__staged_read(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset, void *dst,
                          size_t bytes, void *stream, bool async);
/* Whether ab__staged_write/read with `async` would only queue the transfer
 * from or into `host` (the host side already is staging memory). */
bool ab__staged_queueable(const struct ab_backend *be, const void *host, bool async);
/* The ring's settings: AB_STAGING_CHUNK (bytes per chunk; 0: not set, the
 * ring picks one from the threads the call may use), AB_STAGING_CHUNKS
 * (chunks in flight, 2..16) and AB_STAGING_MIN (smaller transfers go
 * direct), read once and again after ab__env_reload (tests). */
struct ab__staging_config {
  size_t chunk, count, min;
};
struct ab__staging_config ab__staging_config(void);

#endif /* AB_CORE_H */
