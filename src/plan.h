/* A conversion between preparing and running it, shared by its three
 * parts: the options and the plan (convert.c), the execution of the plan
 * (steps.c) and its explanation (explain.c). Both of the last two read the
 * steps as ab__resolve_steps describes them, so what runs and what
 * ab_explain_convert says cannot differ. */
#ifndef AB_PLAN_H
#define AB_PLAN_H

#include "core.h"
#include "dlpack.h"
#include "route.h"

/* What a conversion does to the elements (none when !active): the result's
 * shape, dtype and size, the axis order and the element op. */
typedef struct ab__conv {
  bool active;
  int32_t ndim;
  int32_t perm[AB_MAX_NDIM];
  int64_t out_shape[AB_MAX_NDIM];
  DLDataType out_dtype;
  size_t out_nbytes;
  ab__cast_op op;
} ab__conv;

/* Everything decided before a byte moves: the validated source, both
 * devices and backends, and the plan. */
typedef struct ab__prepared {
  ab_convert_opts o;
  ab__layout lay;
  const struct ab_backend *sbe, *tbe;
  DLDevice sdev, tdev;
  ab__route_query q;
  ab__plan plan;
  ab__rect rect;
  ab__conv cv;
} ab__prepared;


/* One step of a plan as it runs: where its input and output are and how
 * many bytes they hold, and how bytes cross for a transfer. */
typedef enum ab__step_out {
  AB_OUT_RESULT,  /* into the result itself (the last step) */
  AB_OUT_STAGING, /* into a compact buffer of host (staging) memory */
  AB_OUT_DEVICE,  /* into a compact buffer on the step's device, s->to */
} ab__step_out;

typedef enum ab__step_xfer {
  AB_XFER_COMPACT, /* compact bytes */
  AB_XFER_RECT,    /* one rectangle of rows of contiguous bytes (ab__rect) */
  AB_XFER_EXTENT,  /* a download of the byte span the strides address, gathered next (UNPACK) */
  AB_XFER_AS_IS,   /* an upload of the source's bytes as they are, for a conversion on the device */
} ab__step_xfer;

typedef struct ab__step_io {
  const ab__step *s;
  bool first, last;
  DLDevice in_dev;     /* where the input is */
  bool in_compact;     /* the input is compact */
  uint64_t in_bytes;   /* bytes of the input as a compact tensor */
  ab__step_out out;
  DLDevice out_dev;    /* where the output is */
  uint64_t out_bytes;  /* bytes of the output buffer */
  ab__step_xfer xfer;  /* DOWNLOAD and UPLOAD: how the bytes cross */
} ab__step_io;

/* Validates src, target and opts and plans the conversion (into: the
 * existing destination of ab_convert_into, else NULL). convert.c. */
ab_status ab__prepare(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, const DLTensor *into,
                      ab__prepared *p);

/* Where bytes that cross through host memory wait. steps.c. */
DLDevice ab__staging_for(const ab__prepared *p);

/* The steps of p's plan as they run, into io[0 .. p->plan.nsteps). steps.c. */
void ab__resolve_steps(const ab__prepared *p, DLDevice staging, ab__step_io io[AB_MAX_STEPS]);

/* The conversion of `cur` (any strides; compact when NULL) as every
 * converter takes it. steps.c. */
void ab__conv_args(const DLTensor *cur, const ab__conv *cv, ab__convert_args *a);

/* Runs a prepared copy plan from src into dst (compact, of the result's
 * shape and dtype, on p->tdev). steps.c. */
ab_status ab__run_copy(const DLTensor *src, const ab__prepared *p, DLTensor *dst);

#endif /* AB_PLAN_H */
