/* The only code that calls through a backend's table (struct ab_backend):
 * every operation of every backend goes through one wrapper here, which
 * turns a NULL operation into AB_ERR_UNSUPPORTED (or the documented
 * default) and is the one fault-injection site for transfers, so the rest
 * of the core never tests a pointer of the table or injects a fault of its
 * own. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

/* A numbered fault site for the tests' transfer sweep (ab__fault_arm_transfer). */
#define INJECT_TRANSFER_FAULT(be, what)                                                              \
  do {                                                                                             \
    if (AB_UNLIKELY(ab__fault_transfer_check()))                                                   \
      return AB_FAIL(AB_ERR_BACKEND, "%s: %s failed (injected transfer fault)", (be)->name, (what)); \
  } while (0)

/* ---- lifetime ---------------------------------------------------------------- */

void ab__dev_preload(const struct ab_backend *be) {
  if (be->preload != NULL) be->preload();
}

ab_status ab__dev_init(const struct ab_backend *be) {
  const ab_status st = be->init != NULL ? be->init() : AB_OK;
  if (st == AB_OK && be->device_count() > AB__MAX_IDS)
    AB_LOG(AB_LOG_WARN, "backend %s has %" PRId32 " devices; arraybridge uses ids 0..%d of them (ab_device_count says %d)",
           be->name, be->device_count(), AB__MAX_IDS - 1, AB__MAX_IDS);
  return st;
}

void ab__dev_shutdown(const struct ab_backend *be) {
  if (be->shutdown != NULL) be->shutdown();
}

int32_t ab__dev_count(const struct ab_backend *be) {
  const int32_t n = be->device_count();
  return n > AB__MAX_IDS ? AB__MAX_IDS : n;
}

int32_t ab__dev_staging_id(const struct ab_backend *be, int32_t id) {
  return be->staging_id != NULL ? be->staging_id(id) : 0;
}

/* In a child forked after the drivers started, their memory, events and
 * streams are the parent's and their threads are gone: the wrappers below
 * that cannot fail (frees, fence frees, stream waits, memory gauges) hand
 * nothing to such a backend (ab__backend_left_behind). No path reaches
 * them there today (its device count is 0, so no tensor of it is made or
 * taken); this makes the rule hold by construction. */

/* ---- devices ----------------------------------------------------------------- */

ab_status ab__dev_usable(const struct ab_backend *be, int32_t id) {
  return be->usable != NULL ? be->usable(id) : AB_OK;
}

bool ab__dev_always_usable(const struct ab_backend *be) { return be->usable == NULL; }

ab_status ab__dev_info(const struct ab_backend *be, int32_t id, struct ab_device_info *out) {
  if (be->device_info == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot describe its devices", be->name);
  struct ab_device_info tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.device.device_type = be->device_type;
  tmp.device.device_id = id;
  snprintf(tmp.backend, sizeof tmp.backend, "%s", be->name);
  tmp.host_accessible = (be->caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  AB_FORWARD(be->device_info(id, &tmp));
  *out = tmp;
  return AB_OK;
}

void ab__dev_meminfo(const struct ab_backend *be, int32_t id, uint64_t *free_b, uint64_t *total_b) {
  struct ab_device_info info = {0}; /* written only on success; zeroed to quiet -Wmaybe-uninitialized */
  char saved[AB_ERRBUF_SIZE];
  ab__save_error(saved);
  if (!ab__backend_left_behind(be) && ab__dev_info(be, id, &info) == AB_OK) {
    *free_b = info.free_memory;
    *total_b = info.total_memory;
  } else {
    *free_b = *total_b = 0;
  }
  ab__restore_error(saved);
}

/* ---- memory and transfers ------------------------------------------------ */

ab_status ab__dev_alloc(const struct ab_backend *be, int32_t id, size_t bytes, void **out) {
  if (be->alloc == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot allocate memory", be->name);
  if (ab__fault_check())
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "%s:%" PRId32 ": allocation of %zu bytes failed (injected fault)",
                   ab_device_type_name(be->device_type), id, bytes);
  return be->alloc(id, bytes, out);
}

static atomic_uint_fast64_t frees_left_behind;

uint64_t ab__dev_frees_left_behind(void) { return atomic_load_explicit(&frees_left_behind, memory_order_relaxed); }

void ab__dev_free(const struct ab_backend *be, int32_t id, void *ptr, size_t bytes) {
  /* In a child forked after the drivers started, their memory is the
   * parent's and their threads are gone: nothing goes back to them. */
  if (ab__backend_left_behind(be)) {
    atomic_fetch_add_explicit(&frees_left_behind, 1, memory_order_relaxed);
    return;
  }
  if (be->free != NULL) be->free(id, ptr, bytes);
}

ab_status ab__dev_copy(const struct ab_backend *be, const DLTensor *from, DLTensor *to, void *stream, bool async) {
  if (be->copy == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot copy between its devices", be->name);
  INJECT_TRANSFER_FAULT(be, "copy");
  return be->copy(from, to, stream, async);
}

bool ab__dev_can_convert(const struct ab_backend *be, int32_t id, const void *src, uint64_t src_offset,
                         const ab__convert_args *a) {
  return be->convert != NULL && be->can_convert != NULL && be->can_convert(id, src, src_offset, a);
}

ab_status ab__dev_convert(const struct ab_backend *be, int32_t id, const void *src, uint64_t src_offset, void *dst,
                          uint64_t dst_offset, const ab__convert_args *a, void *stream, bool async) {
  if (be->convert == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot convert on its devices", be->name);
  INJECT_TRANSFER_FAULT(be, "convert");
  return be->convert(id, src, src_offset, dst, dst_offset, a, stream, async);
}

bool ab__dev_can_copy(const struct ab_backend *be, const DLTensor *from, DLDevice to, bool from_compact) {
  if (be->copy == NULL) return false;
  return be->can_copy == NULL || be->can_copy(from, to, from_compact);
}

ab_status ab__dev_write(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset,
                        const void *src, size_t bytes, void *stream) {
  if (be->write == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot write from host memory", be->name);
  INJECT_TRANSFER_FAULT(be, "write");
  return be->write(id, handle, offset, src, bytes, stream);
}

ab_status ab__dev_read(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset,
                       void *dst, size_t bytes, void *stream) {
  if (be->read == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot read into host memory", be->name);
  INJECT_TRANSFER_FAULT(be, "read");
  return be->read(id, handle, offset, dst, bytes, stream);
}

ab_status ab__dev_check_range(const struct ab_backend *be, int32_t id, const void *handle,
                              uint64_t begin, uint64_t end) {
  if (be->check_range == NULL) return AB_OK; /* host memory: the producer's contract */
  return be->check_range(id, handle, begin, end);
}

ab_status ab__dev_read_rect(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset,
                            const ab__rect *rect, void *dst, void *stream) {
  if (be->read_rect == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot read rectangles", be->name);
  INJECT_TRANSFER_FAULT(be, "read_rect");
  return be->read_rect(id, handle, offset, rect->region, rect->row_pitch, rect->slice_pitch, dst, stream);
}

bool ab__dev_has_read_rect(const struct ab_backend *be) { return be->read_rect != NULL; }
bool ab__dev_has_write_rect(const struct ab_backend *be) { return be->write_rect != NULL; }

ab_status ab__dev_write_rect(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset,
                             const ab__rect *rect, const void *src, void *stream) {
  if (be->write_rect == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s cannot write rectangles", be->name);
  INJECT_TRANSFER_FAULT(be, "write_rect");
  return be->write_rect(id, handle, offset, rect->region, rect->row_pitch, rect->slice_pitch, src, stream);
}

uint32_t ab__dev_caps(const struct ab_backend *be, int32_t id) {
  return be->caps | (be->device_caps ? be->device_caps(id) : 0);
}

bool ab__same_family(const struct ab_backend *a, const struct ab_backend *b) {
  if (a == NULL || b == NULL) return a == b;
  return (a->family != NULL ? a->family : a) == (b->family != NULL ? b->family : b);
}

ab_status ab__dev_host_sync(const struct ab_backend *be, int32_t id, void *stream) {
  if (be->host_sync == NULL) return AB_OK;
  INJECT_TRANSFER_FAULT(be, "host_sync");
  return be->host_sync(id, stream);
}

bool ab__dev_needs_host_sync(const struct ab_backend *be) { return be->host_sync != NULL; }

ab_status ab__dev_host_write_sync(const struct ab_backend *be, int32_t id) {
  if (be->host_write_sync == NULL) return AB_OK;
  INJECT_TRANSFER_FAULT(be, "host_write_sync");
  return be->host_write_sync(id);
}

ab_status ab__dev_synchronize(const struct ab_backend *be, int32_t id, void *stream) {
  return be->synchronize != NULL ? be->synchronize(id, stream) : AB_OK;
}

bool ab__dev_peer_access(const struct ab_backend *be, int32_t from, int32_t to) {
  return be->peer_access != NULL && be->peer_access(from, to);
}

/* ---- the staging ring's operations ----------------------------------------- */

bool ab__dev_has_ring(const struct ab_backend *be) { return be->write_async != NULL; }

bool ab__dev_host_is_staged(const struct ab_backend *be, const void *p) {
  return be->host_is_staged != NULL && be->host_is_staged(p);
}

ab_status ab__dev_write_async(const struct ab_backend *be, int32_t id, void *handle, uint64_t offset, const void *src,
                              size_t bytes, void *stream) {
  if (be->write_async == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s has no asynchronous writes", be->name);
  INJECT_TRANSFER_FAULT(be, "write_async");
  return be->write_async(id, handle, offset, src, bytes, stream);
}

ab_status ab__dev_read_async(const struct ab_backend *be, int32_t id, const void *handle, uint64_t offset, void *dst,
                             size_t bytes, void *stream) {
  if (be->read_async == NULL)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s has no asynchronous reads", be->name);
  INJECT_TRANSFER_FAULT(be, "read_async");
  return be->read_async(id, handle, offset, dst, bytes, stream);
}

ab_status ab__dev_fence_new(const struct ab_backend *be, int32_t id, void **fence) {
  if (be->fence_new == NULL) return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s has no fences", be->name);
  return be->fence_new(id, fence);
}

ab_status ab__dev_fence_record(const struct ab_backend *be, int32_t id, void *fence, void *stream) {
  if (be->fence_record == NULL) return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s has no fences", be->name);
  INJECT_TRANSFER_FAULT(be, "fence_record");
  return be->fence_record(id, fence, stream);
}

ab_status ab__dev_fence_wait(const struct ab_backend *be, void *fence) {
  if (be->fence_wait == NULL) return AB_FAIL(AB_ERR_UNSUPPORTED, "backend %s has no fences", be->name);
  INJECT_TRANSFER_FAULT(be, "fence_wait");
  return be->fence_wait(fence);
}

void ab__dev_fence_free(const struct ab_backend *be, void *fence) {
  if (be->fence_free != NULL && !ab__backend_left_behind(be)) be->fence_free(fence);
}

void ab__dev_stream_sync(const struct ab_backend *be, int32_t id, void *stream) {
  if (be->stream_sync != NULL && !ab__backend_left_behind(be)) be->stream_sync(id, stream);
}
