/* ab_explain_route and ab_explain_convert: the plan of a conversion in
 * words, from the same resolved steps run_steps executes (plan.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "plan.h"

struct text {
  char *buf;
  size_t len, at; /* at may pass len: the text is then cut */
};

static void AB_PRINTF(2, 3) put(struct text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = t->at < t->len ? t->len - t->at : 0;
  int n = vsnprintf(room ? t->buf + t->at : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) t->at += (size_t)n;
}

static void put_dev(struct text *t, DLDevice d) {
  put(t, "%s:%" PRId32, ab_device_type_name(d.device_type), d.device_id);
}

static void explain_step(struct text *t, const ab__prepared *p, const ab__step_io *x) {
  const ab__step *s = x->s;
  switch (s->kind) {
  case AB_STEP_VIEW:
    put(t, "view: no bytes move; the result aliases the source's memory%s",
        p->lay.compact ? "" : " with the source's strides");
    return;
  case AB_STEP_COPY:
    if (!x->last) {
      put(t, "gather on ");
      put_dev(t, s->from);
      put(t, " into a compact %" PRIu64 "-byte buffer there (the %" PRIu64 "-byte span need not cross the link)",
          x->out_bytes, p->q.extent);
    } else if (s->via == kDLCPU && s->from.device_type != kDLCPU) {
      put(t, "host copy ");
      put_dev(t, s->from);
      put(t, " -> ");
      put_dev(t, s->to);
      put(t, " (both host-addressable)");
    } else {
      put(t, "%s copy ", ab__backend_for(s->via)->name);
      put_dev(t, s->from);
      put(t, " -> ");
      put_dev(t, s->to);
      put(t, "%s", x->in_compact ? "" : " (strided source)");
    }
    return;
  case AB_STEP_PACK:
    put(t, "pack on the host: gather the strided source into compact ");
    put_dev(t, x->out_dev);
    put(t, " memory");
    return;
  case AB_STEP_UNPACK:
    put(t, "unpack on the host: gather the downloaded span into compact bytes");
    return;
  case AB_STEP_CONVERT: {
    char a[48], b[48];
    if (s->via == kDLCPU) {
      put(t, "convert on the host: ");
    } else {
      put(t, "convert on ");
      put_dev(t, s->to);
      put(t, ": ");
    }
    put(t, "%s -> %s", ab_dtype_name(p->cv.op.from, a, sizeof a), ab_dtype_name(p->cv.op.to, b, sizeof b));
    if (p->cv.op.affine) put(t, p->cv.op.channel_dim >= 0 ? ", scaled per channel" : ", scaled");
    put(t, " into compact ");
    put_dev(t, x->out_dev);
    put(t, " memory");
    bool moved = false;
    for (int32_t i = 0; i < p->cv.ndim; i++) moved = moved || p->cv.perm[i] != i;
    if (moved) { /* the axis order, as opts->permute gave it (the first 8 axes of more) */
      put(t, " in axis order (");
      for (int32_t i = 0; i < p->cv.ndim && i < 8; i++) put(t, i ? ", %" PRId32 : "%" PRId32, p->cv.perm[i]);
      put(t, p->cv.ndim > 8 ? ", ...)" : ")");
    }
    if (s->via != kDLCPU && !x->first) /* after the upload of the source's bytes */
      put(t, " (%" PRIu64 " bytes crossed the link instead of %" PRIu64 ")", x->in_bytes, x->out_bytes);
    else if (s->via != kDLCPU && !x->last) /* before the download of the result */
      put(t, " (%" PRIu64 " bytes cross the link instead of %" PRIu64 ")", x->out_bytes, x->in_bytes);
    return;
  }
  case AB_STEP_DOWNLOAD:
    put(t, "download ");
    put_dev(t, s->from);
    put(t, " -> ");
    put_dev(t, x->out_dev);
    if (x->xfer == AB_XFER_COMPACT)
      put(t, ", %" PRIu64 " bytes", x->in_bytes);
    else if (x->xfer == AB_XFER_RECT)
      put(t, ", %" PRIu64 " bytes as one rectangle of %zu-byte rows", x->in_bytes, p->rect.region[0]);
    else
      put(t, ", the %" PRIu64 "-byte span the strides address", x->out_bytes);
    return;
  case AB_STEP_UPLOAD:
    put(t, "upload ");
    put_dev(t, x->in_dev);
    put(t, " -> ");
    put_dev(t, s->to);
    if (x->xfer == AB_XFER_RECT)
      put(t, ", %" PRIu64 " bytes as one rectangle of %zu-byte rows", x->in_bytes, p->rect.region[0]);
    else if (x->xfer == AB_XFER_AS_IS)
      put(t, ", %" PRIu64 " bytes as they are, for the conversion there", x->out_bytes);
    else
      put(t, ", %" PRIu64 " bytes", x->in_bytes);
    return;
  }
  put(t, "step of unknown kind %d", (int)s->kind);
}

ab_status ab_explain_route(const DLTensor *src, DLDevice target, char *buf, size_t len) {
  return ab_explain_convert(src, target, NULL, buf, len);
}

ab_status ab_explain_convert(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, char *buf,
                             size_t len) {
  ab__prepared p;
  ab__step_io io[AB_MAX_STEPS];
  if (buf == NULL && len > 0) return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "buf is NULL but len is %zu", len);
  AB_FORWARD(ab__prepare(src, target, opts, NULL, &p));
  if (len == 0) return AB_OK; /* asked only whether the plan stands (no text to write) */
  struct text t = {buf, len, 0};
  put_dev(&t, p.sdev);
  put(&t, " -> ");
  put_dev(&t, p.tdev);
  /* A copy of no elements runs none of its steps (ab__run_copy). */
  const bool view = p.plan.nsteps == 1 && p.plan.steps[0].kind == AB_STEP_VIEW;
  if (p.lay.numel == 0 && !view) {
    put(&t, ": no elements, %s source, 0 steps\n  nothing moves; the result is an empty tensor on ",
        p.lay.compact ? "compact" : "strided");
    put_dev(&t, p.tdev);
    put(&t, "\n");
    return AB_OK;
  }
  put(&t, ": %" PRIu64 " bytes, %s source, %d step%s\n", p.q.nbytes, p.lay.compact ? "compact" : "strided",
      p.plan.nsteps, p.plan.nsteps == 1 ? "" : "s");
  ab__resolve_steps(&p, ab__staging_for(&p), io);
  for (int i = 0; i < p.plan.nsteps; i++) {
    put(&t, "  %d. ", i + 1);
    explain_step(&t, &p, &io[i]);
    put(&t, "\n");
  }
  return AB_OK;
}
