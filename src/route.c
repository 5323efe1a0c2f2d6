/* The route planner. Today's routes: a view, or one copy within a backend.
 * Cross-backend routes (staging through pinned host memory, peer copies)
 * join here as the CUDA and OpenCL backends land. */
#include <inttypes.h>

#include "backend.h"
#include "route.h"

static bool same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

ab_status ab__plan_route(const ab__route_query *q, ab__plan *plan) {
  const bool here = same_device(q->src, q->dst);
  const bool layout_ok = q->src_compact || (q->flags & AB_CONVERT_ALLOW_STRIDED_VIEW);
  const bool viewable = here && q->same_dtype && layout_ok;

  if (viewable && q->copy != AB_COPY_ALWAYS) {
    plan->nsteps = 1;
    plan->steps[0] = (ab__step){AB_STEP_VIEW, q->src, q->dst, q->dst.device_type};
    return AB_OK;
  }
  if (q->copy == AB_COPY_NEVER) {
    const char *why = !here ? "the target is another device"
                    : !q->same_dtype ? "the dtype changes"
                    : "the source is not compact (set AB_CONVERT_ALLOW_STRIDED_VIEW to accept a strided view)";
    return AB_FAIL(AB_ERR_COPY_REQUIRED, "AB_COPY_NEVER given but a copy is needed: %s (%s:%" PRId32 " -> %s:%" PRId32 ")",
                   why, ab_device_type_name(q->src.device_type), q->src.device_id,
                   ab_device_type_name(q->dst.device_type), q->dst.device_id);
  }
  if (!q->same_dtype)
    return AB_FAIL(AB_ERR_UNSUPPORTED, "dtype conversion is not supported yet; request the source dtype");
  if (q->src.device_type == q->dst.device_type) {
    plan->nsteps = 1;
    plan->steps[0] = (ab__step){AB_STEP_COPY, q->src, q->dst, q->src.device_type};
    return AB_OK;
  }
  return AB_FAIL(AB_ERR_UNSUPPORTED, "no route from %s:%" PRId32 " to %s:%" PRId32 " in this build",
                 ab_device_type_name(q->src.device_type), q->src.device_id,
                 ab_device_type_name(q->dst.device_type), q->dst.device_id);
}
