/* The route planner (route.c): a pure function from a description of the
 * source, the target and their capabilities to the steps of a conversion.
 * No I/O and no device calls, so every route is unit-testable. */
#ifndef AB_ROUTE_H
#define AB_ROUTE_H

#include "internal.h"

typedef enum ab__step_kind {
  AB_STEP_VIEW = 1,     /* alias src's bytes; nothing moves */
  AB_STEP_COPY = 2,     /* one backend copy, src -> compact dst, same backend */
  AB_STEP_PACK = 3,     /* host gather of a strided host tensor into a compact host buffer */
  AB_STEP_UPLOAD = 4,   /* host bytes -> device: compact, or one rectangle (dst_rect) */
  AB_STEP_DOWNLOAD = 5, /* device -> host: the whole compact tensor; a
                         * strided one as one rectangle read (src_rect) or as
                         * the byte extent its strides address */
  AB_STEP_UNPACK = 6,   /* host gather of a downloaded strided extent into compact bytes */
  AB_STEP_CONVERT = 7,  /* conversion (dtype, affine, axis order) into compact bytes: on the host
                         * (via kDLCPU), or on the target device (via its type) from the source's
                         * bytes uploaded there */
} ab__step_kind;

/* Where a conversion may run (AB_CONVERT_PLACE): auto lets the planner
 * choose, host and device force a side where the route allows it. */
typedef enum ab__place { AB_PLACE_AUTO = 0, AB_PLACE_HOST = 1, AB_PLACE_DEVICE = 2 } ab__place;

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
  /* Elements change on the way: another dtype, an affine map or another
   * axis order (implies !viewable). */
  bool convert;
  bool src_compact;            /* source is compact row-major */
  ab_copy_mode copy;
  uint32_t flags;              /* AB_CONVERT_* */
  /* The backend can copy this source to dst itself (same backend; for
   * OpenCL: one context, and a compact source or one its gather kernel
   * takes). */
  bool direct;
  /* A strided source the source backend can read into compact host memory
   * in one rectangle transfer (rows of contiguous bytes, up to 3-D). */
  bool src_rect;
  /* A strided host source the target backend can write into its compact
   * buffer in one rectangle transfer. */
  bool dst_rect;
  /* The source backend can gather this strided source into a compact
   * buffer on its own device (an OpenCL kernel). */
  bool src_gather;
  /* Bytes of the tensor, and bytes its strides span: a gather moves the
   * first over the link, a raw download the second. */
  uint64_t nbytes, extent;
  /* The target backend can run this conversion on its device, from the
   * source's bytes as they are once uploaded compact. */
  bool dst_convert;
  /* The source backend can run this conversion on the source's device,
   * from the source as it is (strides included). */
  bool src_convert;
  /* Bytes of the converted result. */
  uint64_t out_nbytes;
  ab__place place;
} ab__route_query;

/* Routes: a view; one backend copy when `direct`; otherwise through host
 * memory: [PACK] UPLOAD into a device, DOWNLOAD [UNPACK] out of one, or
 * DOWNLOAD [UNPACK] UPLOAD between two devices that cannot copy directly.
 * Conversions: [DOWNLOAD] CONVERT [UPLOAD] with the host converting; or,
 * from compact host memory to a device that can convert (dst_convert),
 * UPLOAD then CONVERT on the device when the result is the bigger of the
 * two (fewer bytes cross the link: uint8 -> float32 moves a quarter) and
 * the device's memory is not the host's (whose kernels are slower than
 * the host's own loop), or whenever place is AB_PLACE_DEVICE. From a
 * device that can convert (src_convert): CONVERT there first, when the
 * result is the smaller (float32 -> uint8 on the way back) or the target
 * is the same device (then it is the only step), under the same rule on
 * unified memory and place; then DOWNLOAD [UPLOAD].
 * Host-accessible memory is never downloaded or uploaded.
 * Fills *plan or fails with AB_ERR_COPY_REQUIRED (AB_COPY_NEVER and the
 * source is not acceptable as it is) or AB_ERR_UNSUPPORTED (no route). */
ab_status ab__plan_route(const ab__route_query *q, ab__plan *plan);
/* Whether the plan is a view (nothing moves). It reads src, dst,
 * same_dtype, convert, src_compact, flags and copy only: a caller may ask
 * before it fills the rest of the query, which a view does not use. */
bool ab__route_is_view(const ab__route_query *q);
/* The same question from the facts it reads, for a caller that has not
 * built a query (a zero-copy call needs nothing else): converts is
 * `convert || !same_dtype`, the rest as in the query. */
bool ab__route_view(DLDevice src, DLDevice dst, bool converts, bool src_compact, uint32_t flags, ab_copy_mode copy);

/* Whether the plan would convert on the target (resp. the source) device
 * if that device can (dst_convert, src_convert are then ignored): the
 * caller asks a backend, which may build kernels, only when this is true. */
bool ab__route_converts_on_target(const ab__route_query *q);
bool ab__route_converts_on_source(const ab__route_query *q);

#endif
