/* The route planner (route.c): a pure function from a description of the
 * source, the target and their capabilities to the steps of a conversion.
 * No I/O and no device calls, so every route is unit-testable. */
#ifndef AB_ROUTE_H
#define AB_ROUTE_H

#include "internal.h"

typedef enum ab__step_kind {
  AB_STEP_VIEW = 1, /* alias src's bytes; nothing moves */
  AB_STEP_COPY = 2, /* one backend copy, strided src -> compact dst */
} ab__step_kind;

typedef struct ab__step {
  ab__step_kind kind;
  DLDevice from, to;
  DLDeviceType via; /* backend whose copy runs the step */
} ab__step;

#define AB_MAX_STEPS 4

typedef struct ab__plan {
  int nsteps;
  ab__step steps[AB_MAX_STEPS];
} ab__plan;

typedef struct ab__route_query {
  DLDevice src, dst;           /* both resolved (no AB_DEVICE_AUTO) */
  uint32_t src_caps, dst_caps; /* AB_CAP_* of their backends */
  bool same_dtype;             /* requested dtype equals the source's */
  bool src_compact;            /* source is compact row-major */
  ab_copy_mode copy;
  uint32_t flags;              /* AB_CONVERT_* */
} ab__route_query;

/* Fills *plan or fails with AB_ERR_COPY_REQUIRED (AB_COPY_NEVER and the
 * source is not acceptable as it is) or AB_ERR_UNSUPPORTED (no route). */
ab_status ab__plan_route(const ab__route_query *q, ab__plan *plan);

#endif
