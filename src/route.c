/* The route planner: which steps move a tensor from one memory space to
 * another. Pure: it sees only the query. */
#include <inttypes.h>

#include "core.h"
#include "route.h"

static bool same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

static void add(ab__plan *plan, ab__step_kind kind, DLDevice from, DLDevice to, DLDeviceType via) {
  plan->steps[plan->nsteps++] = (ab__step){kind, from, to, via};
}

/* Plans into a local plan: *out is written only on success. */
static ab_status plan_route(const ab__route_query *q, ab__plan *plan);

ab_status ab__plan_route(const ab__route_query *q, ab__plan *out) {
  ab__plan plan;
  AB_FORWARD(plan_route(q, &plan));
  *out = plan;
  return AB_OK;
}

static bool wants_device(const ab__route_query *q, bool pays) {
  return q->place == AB_PLACE_DEVICE || (q->place == AB_PLACE_AUTO && pays);
}

/* On the target: the source's bytes cross the link as they are and the
 * device widens them there. */
bool ab__route_converts_on_target(const ab__route_query *q) {
  const bool src_host = (q->src_caps & AB_CAP_HOST_ACCESSIBLE) != 0, dst_host = (q->dst_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const bool pays = q->out_nbytes > q->nbytes && !(q->dst_caps & AB_CAP_UNIFIED_MEMORY);
  return src_host && !dst_host && q->src_compact && wants_device(q, pays);
}

/* On the source: it narrows there, so fewer bytes leave it; on the same
 * device nothing leaves it at all. */
bool ab__route_converts_on_source(const ab__route_query *q) {
  const bool src_host = (q->src_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const bool pays = (same_device(q->src, q->dst) || q->out_nbytes < q->nbytes) && !(q->src_caps & AB_CAP_UNIFIED_MEMORY);
  return !src_host && wants_device(q, pays);
}

/* Same device, same elements, a layout the caller accepts, and a caller
 * who did not ask for a copy. */
bool ab__route_view(DLDevice src, DLDevice dst, bool converts, bool src_compact, uint32_t flags, ab_copy_mode copy) {
  const bool layout_ok = src_compact || (flags & AB_CONVERT_ALLOW_STRIDED_VIEW);
  return same_device(src, dst) && !converts && layout_ok && copy != AB_COPY_ALWAYS;
}

bool ab__route_is_view(const ab__route_query *q) {
  return ab__route_view(q->src, q->dst, q->convert || !q->same_dtype, q->src_compact, q->flags, q->copy);
}

static ab_status plan_route(const ab__route_query *q, ab__plan *plan) {
  const bool here = same_device(q->src, q->dst);
  const bool src_host = (q->src_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const bool dst_host = (q->dst_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const DLDevice host = {kDLCPU, 0};

  plan->nsteps = 0;
  if (ab__route_is_view(q)) {
    add(plan, AB_STEP_VIEW, q->src, q->dst, q->dst.device_type);
    return AB_OK;
  }
  if (q->copy == AB_COPY_NEVER) {
    const char *why = !here ? "the target is another device"
                    : !q->same_dtype ? "the dtype changes"
                    : q->convert ? "the elements are converted (scale, offset or axis order)"
                    : "the source is not compact (set AB_CONVERT_ALLOW_STRIDED_VIEW to accept a strided view)";
    return AB_FAIL(AB_ERR_COPY_REQUIRED, "AB_COPY_NEVER given but a copy is needed: %s (%s:%" PRId32 " -> %s:%" PRId32 ")",
                   why, ab_device_type_name(q->src.device_type), q->src.device_id,
                   ab_device_type_name(q->dst.device_type), q->dst.device_id);
  }
  if (q->convert || !q->same_dtype) {
    if (q->dst_convert && ab__route_converts_on_target(q)) {
      add(plan, AB_STEP_UPLOAD, q->src, q->dst, q->dst.device_type);
      add(plan, AB_STEP_CONVERT, q->dst, q->dst, q->dst.device_type);
      return AB_OK;
    }
    if (q->src_convert && ab__route_converts_on_source(q)) {
      add(plan, AB_STEP_CONVERT, q->src, q->src, q->src.device_type);
      if (here) return AB_OK;
      add(plan, AB_STEP_DOWNLOAD, q->src, host, q->src.device_type);
      if (!dst_host) add(plan, AB_STEP_UPLOAD, host, q->dst, q->dst.device_type);
      return AB_OK;
    }
    /* Otherwise on the host: the bytes come to host memory (as they are,
     * strided or not), are converted into compact ones, and go on to the
     * target. */
    if (!src_host) add(plan, AB_STEP_DOWNLOAD, q->src, host, q->src.device_type);
    add(plan, AB_STEP_CONVERT, src_host ? q->src : host, dst_host ? q->dst : host, kDLCPU);
    if (!dst_host) add(plan, AB_STEP_UPLOAD, host, q->dst, q->dst.device_type);
    return AB_OK;
  }
  if (q->direct) {
    add(plan, AB_STEP_COPY, q->src, q->dst, q->src.device_type);
    return AB_OK;
  }
  if (src_host && dst_host) {
    /* Two host-addressable memories (pageable, pinned, managed): a host
     * gather reads and writes them all. */
    add(plan, AB_STEP_COPY, q->src, q->dst, kDLCPU);
    return AB_OK;
  }
  /* Through host memory. */
  if (src_host) {
    if (!q->src_compact && !(q->dst_rect && !dst_host)) add(plan, AB_STEP_PACK, q->src, host, kDLCPU);
  } else {
    /* A gather kernel moves fewer bytes over the link; on a device whose
     * memory is the host's the link is a memcpy and kernels are slow
     * (bench/results/2026-11-22-opencl.md), so only a very sparse source
     * is worth one there. */
    const uint64_t worth = (q->src_caps & AB_CAP_UNIFIED_MEMORY) ? 16 : 1;
    const bool gather = !q->src_compact && !q->src_rect && q->src_gather && q->nbytes <= UINT64_MAX / worth &&
                        q->extent > q->nbytes * worth;
    if (gather) add(plan, AB_STEP_COPY, q->src, q->src, q->src.device_type);
    add(plan, AB_STEP_DOWNLOAD, q->src, host, q->src.device_type);
    if (!q->src_compact && !q->src_rect && !gather) add(plan, AB_STEP_UNPACK, host, host, kDLCPU);
  }
  if (!dst_host) add(plan, AB_STEP_UPLOAD, host, q->dst, q->dst.device_type);
  return AB_OK;
}
