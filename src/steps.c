/* The execution of a plan (plan.h): the steps resolved once
 * (ab__resolve_steps), which both run_steps and ab_explain_convert read,
 * then run in order through the backends' wrappers. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "parallel.h"
#include "plan.h"

/* A staging buffer for routes through host memory, from the pool of
 * `staging` (pinned memory when a backend asks for it), else from the
 * plain host pool: pageable staging is slower, not wrong. */
static ab_status stage_alloc(DLDevice staging, size_t bytes, ab__block **out) {
  const struct ab_backend *host = ab__backend_for(kDLCPU);
  if (staging.device_type != kDLCPU) {
    char saved[AB_ERRBUF_SIZE];
    ab__save_error(saved);
    if (ab__pool_alloc(ab__backend_for(staging.device_type), staging, bytes, out) == AB_OK) return AB_OK;
    AB_LOG(AB_LOG_DEBUG, "pinned staging of %zu bytes failed (%s); staging in pageable memory", bytes, ab_last_error());
    ab__restore_error(saved);
  }
  return ab__pool_alloc(host, (DLDevice){kDLCPU, 0}, bytes, out);
}

/* The compact tensor of t's shape and dtype at `data` on `dev`. */
static DLTensor compact_at(const DLTensor *t, DLDevice dev, void *data) {
  DLTensor c = *t;
  c.device = dev;
  c.data = data;
  c.byte_offset = 0;
  c.strides = NULL;
  return c;
}

/* The conversion of `cur` (any strides; compact when NULL) as every
 * converter takes it: the result's shape, the source's element strides in
 * the result's axis order, and the op with its channel in those axes. */
void ab__conv_args(const DLTensor *cur, const ab__conv *cv, ab__convert_args *a) {
  int64_t st[AB_MAX_NDIM];
  int64_t acc = 1;
  for (int32_t i = cur->ndim - 1; i >= 0; i--) {
    st[i] = cur->shape[i] == 1 ? 0 : cur->strides ? cur->strides[i] : acc;
    acc *= cur->shape[i];
  }
  a->ndim = cur->ndim;
  a->op = cv->op;
  a->op.channel_dim = -1;
  for (int32_t i = 0; i < cur->ndim; i++) {
    a->shape[i] = cur->shape[cv->perm[i]];
    a->stride[i] = st[cv->perm[i]];
    if (cv->op.channel_dim >= 0 && cv->perm[i] == cv->op.channel_dim) a->op.channel_dim = i;
  }
}

/* The CONVERT step on the host: bytes `cur` (any strides) into compact
 * `out`, permuted, cast and scaled as cv says. */
static void convert_host(const DLTensor *cur, const ab__conv *cv, void *out) {
  const size_t es = ab__elsize(cur->dtype);
  int64_t pst[AB_MAX_NDIM];
  ab__convert_args a;
  ab__conv_args(cur, cv, &a);
  for (int32_t i = 0; i < a.ndim; i++) pst[i] = a.stride[i] * (int64_t)es; /* validated: no overflow */
  const ab__cast_op *op = &a.op;
  const bool permutation_only =
      !op->affine && op->from.code == op->to.code && op->from.bits == op->to.bits && op->from.lanes == op->to.lanes;
  /* A pure permutation takes the fast gather; on all cores when large. */
  const ab__host_job job = {out, (const char *)cur->data + cur->byte_offset, a.ndim, a.shape, pst, es,
                            permutation_only ? NULL : op, 0};
  ab__host_run(&job);
}

/* Whose opts.stream it is: a backend family and one of its devices. */
typedef struct stream_owner {
  const struct ab_backend *be;
  DLDevice dev;
  void *stream;
  bool async; /* AB_CONVERT_ASYNC */
} stream_owner;

static bool dev_eq(DLDevice a, DLDevice b) { return a.device_type == b.device_type && a.device_id == b.device_id; }

/* Whether a step runs on the caller's stream: a step of its backend family
 * that touches its device (a cl_command_queue means nothing to CUDA, and a
 * cudaStream_t of cuda:1 cannot order work on cuda:0); others use their
 * default and are complete when they return all the same. */
static bool on_stream(const ab__step *s, const stream_owner *owner) {
  return ab__same_family(ab__backend_for(s->via), owner->be) && (dev_eq(s->from, owner->dev) || dev_eq(s->to, owner->dev));
}

/* The caller's stream for a step, or NULL (the default). */
static void *stream_for(const ab__step *s, const stream_owner *owner) {
  return on_stream(s, owner) ? owner->stream : NULL;
}

void ab__resolve_steps(const ab__prepared *p, DLDevice staging, ab__step_io io[AB_MAX_STEPS]) {
  bool in_compact = p->lay.compact;
  uint64_t in_bytes = p->lay.nbytes;
  DLDevice in_dev = p->sdev;
  const bool has_rect = p->q.src_rect || p->q.dst_rect;
  for (int i = 0; i < p->plan.nsteps; i++) {
    const ab__step *s = &p->plan.steps[i];
    ab__step_io *x = &io[i];
    *x = (ab__step_io){.s = s, .first = i == 0, .last = i == p->plan.nsteps - 1, .in_dev = in_dev,
                       .in_compact = in_compact, .in_bytes = in_bytes, .xfer = AB_XFER_COMPACT};
    /* Compact host bytes: into the result when last, else into staging. */
    const ab__step_out host_out = x->last ? AB_OUT_RESULT : AB_OUT_STAGING;
    const DLDevice host_dev = x->last ? p->tdev : staging;
    switch (s->kind) {
    case AB_STEP_VIEW:
      x->out = AB_OUT_RESULT;
      x->out_dev = p->tdev;
      break;
    case AB_STEP_COPY: /* when not last: a gather into a buffer on the source's device */
      x->out = x->last ? AB_OUT_RESULT : AB_OUT_DEVICE;
      x->out_dev = x->last ? p->tdev : s->to;
      x->out_bytes = p->lay.nbytes;
      in_compact = true;
      break;
    case AB_STEP_PACK:
    case AB_STEP_UNPACK:
      x->out = host_out;
      x->out_dev = host_dev;
      x->out_bytes = in_bytes;
      in_compact = true;
      break;
    case AB_STEP_DOWNLOAD:
      if (in_compact || has_rect) {
        x->xfer = in_compact ? AB_XFER_COMPACT : AB_XFER_RECT;
        x->out = host_out;
        x->out_dev = host_dev;
        x->out_bytes = in_bytes;
        in_compact = true;
      } else { /* only the bytes the strides address; UNPACK gathers them */
        x->xfer = AB_XFER_EXTENT;
        x->out = AB_OUT_STAGING;
        x->out_dev = staging;
        x->out_bytes = p->q.extent;
      }
      break;
    case AB_STEP_CONVERT:
      if (s->via == kDLCPU) {
        x->out = host_out;
        x->out_dev = host_dev;
      } else { /* on a device: into the result, or a buffer there that is downloaded next */
        x->out = x->last ? AB_OUT_RESULT : AB_OUT_DEVICE;
        x->out_dev = x->last ? p->tdev : s->to;
      }
      x->out_bytes = p->cv.out_nbytes;
      in_compact = true;
      in_bytes = p->cv.out_nbytes;
      break;
    case AB_STEP_UPLOAD:
      if (x->last) {
        x->out = AB_OUT_RESULT;
        x->out_dev = p->tdev;
        x->out_bytes = in_bytes;
        x->xfer = in_compact ? AB_XFER_COMPACT : AB_XFER_RECT; /* a host crop, written as one rectangle */
      } else { /* the source's bytes, compact, for a conversion on the target */
        x->out = AB_OUT_DEVICE;
        x->out_dev = s->to;
        x->out_bytes = p->lay.nbytes;
        x->xfer = AB_XFER_AS_IS;
        in_compact = true;
      }
      break;
    }
    in_dev = x->out_dev;
  }
}

/* Runs the steps of a plan from `src` into the compact tensor `dst`, as
 * ab__resolve_steps describes them. `cur` describes where the bytes are
 * after each step. Staging blocks go back to their pools whatever
 * happens. */
static ab_status run_steps(const ab__prepared *p, const DLTensor *src, DLTensor *dst, DLDevice staging,
                           const stream_owner *owner) {
  const struct ab_backend *host = ab__backend_for(kDLCPU);
  const ab__layout *lay = &p->lay;
  const ab__conv *cv = &p->cv;
  ab__step_io io[AB_MAX_STEPS];
  ab__block *stage[AB_MAX_STEPS] = {NULL};
  int nstage = 0;
  DLTensor cur = *src;
  ab_status st = AB_OK;

  ab__resolve_steps(p, staging, io);
  for (int i = 0; i < p->plan.nsteps && st == AB_OK; i++) {
    const ab__step_io *x = &io[i];
    const ab__step *s = x->s;
    void *stream = stream_for(s, owner);
    const struct ab_backend *be = ab__backend_for(s->via);
    /* An early return leaves the work queued on the caller's stream: only
     * for a route of one step on it, which needs no buffer of ours freed
     * below while the work may still read or write it. */
    const bool async = owner->async && p->plan.nsteps == 1 && on_stream(s, owner);
    /* The output buffer: the result's bytes, or a new staging or device buffer. */
    void *out = (char *)dst->data + dst->byte_offset;
    uint64_t out_offset = dst->byte_offset;
    if (x->out == AB_OUT_STAGING) {
      st = stage_alloc(staging, (size_t)x->out_bytes, &stage[nstage]);
      if (st != AB_OK) break;
      out = stage[nstage++]->ptr;
    } else if (x->out == AB_OUT_DEVICE) {
      st = ab__pool_alloc(be, s->to, (size_t)x->out_bytes, &stage[nstage]);
      if (st != AB_OK) break;
      out = stage[nstage++]->ptr;
      out_offset = 0;
    }
    switch (s->kind) {
    case AB_STEP_COPY: {
      if (x->last) {
        st = ab__dev_copy(be, &cur, dst, stream, async);
        break;
      }
      DLTensor to = compact_at(&cur, s->to, out); /* a gather on the source's device */
      st = ab__dev_copy(be, &cur, &to, stream, false);
      cur = to;
      break;
    }
    case AB_STEP_PACK:
    case AB_STEP_UNPACK: {
      DLTensor to = compact_at(&cur, (DLDevice){kDLCPU, 0}, out);
      st = ab__dev_copy(host, &cur, &to, NULL, false);
      cur = to;
      break;
    }
    case AB_STEP_DOWNLOAD: {
      const int32_t id = cur.device.device_id;
      cur.device = (DLDevice){kDLCPU, 0};
      if (x->xfer == AB_XFER_EXTENT) {
        st = ab__dev_read(be, id, cur.data, cur.byte_offset + (uint64_t)lay->min_off, out, (size_t)x->out_bytes, stream);
        cur.data = out;
        cur.byte_offset = (uint64_t)0 - (uint64_t)lay->min_off;
        break;
      }
      st = x->xfer == AB_XFER_COMPACT
               ? ab__staged_read(be, id, cur.data, cur.byte_offset, out, (size_t)x->in_bytes, stream, async)
               : ab__dev_read_rect(be, id, cur.data, cur.byte_offset, &p->rect, out, stream);
      cur = compact_at(&cur, cur.device, out);
      break;
    }
    case AB_STEP_CONVERT:
      if (s->via != kDLCPU) {
        /* On a device: the target's, from the source's bytes uploaded
         * there, or the source's, from the source as it is. */
        ab__convert_args a;
        ab__conv_args(&cur, cv, &a);
        void *into = x->out == AB_OUT_RESULT ? dst->data : out;
        st = ab__dev_convert(be, s->to.device_id, cur.data, cur.byte_offset, into, out_offset, &a, stream, async);
        cur = compact_at(dst, s->to, into);
        cur.byte_offset = out_offset;
        break;
      }
      convert_host(&cur, cv, out);
      cur = compact_at(dst, (DLDevice){kDLCPU, 0}, out); /* the result's shape and dtype from here */
      break;
    case AB_STEP_UPLOAD: {
      const char *from = (const char *)cur.data + cur.byte_offset;
      if (x->xfer == AB_XFER_AS_IS) {
        DLTensor to = compact_at(&cur, s->to, out);
        st = ab__staged_write(be, s->to.device_id, to.data, 0, from, (size_t)x->out_bytes, stream, false);
        cur = to;
      } else if (x->xfer == AB_XFER_COMPACT) {
        st = ab__staged_write(be, dst->device.device_id, dst->data, dst->byte_offset, from, (size_t)x->in_bytes,
                              stream, async);
      } else {
        st = ab__dev_write_rect(be, dst->device.device_id, dst->data, dst->byte_offset, &p->rect, from, stream);
      }
      break;
    }
    default:
      st = AB_FAIL(AB_ERR_INTERNAL, "plan step %d has unknown kind %d", i, (int)s->kind);
    }
  }
  while (nstage > 0) ab__pool_free(stage[--nstage]);
  return st;
}

/* Where bytes that cross through host memory wait: the target's preferred
 * staging memory (CUDA: pinned, so its DMA needs no driver bounce), else
 * the source's, else plain host memory. */
DLDevice ab__staging_for(const ab__prepared *p) {
  DLDevice d;
  if (ab__staging_device(p->tbe, p->tdev.device_id, &d) || ab__staging_device(p->sbe, p->sdev.device_id, &d)) return d;
  return (DLDevice){kDLCPU, 0};
}

/* First waits for host-addressable source memory a device may still be
 * writing, then runs the plan's steps. */
ab_status ab__run_copy(const DLTensor *src, const ab__prepared *p, DLTensor *dst) {
  if (p->lay.numel == 0) return AB_OK;
  /* opts.stream belongs to the target, or to the source when the target
   * is host memory (pageable, pinned or managed). */
  const bool to_host = (p->q.dst_caps & AB_CAP_HOST_ACCESSIBLE) != 0;
  const stream_owner owner = {to_host ? p->sbe : p->tbe, to_host ? p->sdev : p->tdev, p->o.stream,
                              (p->o.flags & AB_CONVERT_ASYNC) != 0};
  /* Host-addressable memory a device may still be writing (CUDA pinned
   * or managed) is waited for before host code reads it; not when the
   * only reader is a transfer queued on the very stream waited for: a
   * stream the caller named, since the defaults (NULL, and DLPack's 1
   * and 2) are per device, and host_sync would wait on the caller's
   * current device's while the transfer goes on the target's. */
  const ab__step *first = &p->plan.steps[0];
  const bool named_stream = (uintptr_t)owner.stream > 2;
  const bool stream_ordered = named_stream && owner.async && p->plan.nsteps == 1 && first->kind == AB_STEP_UPLOAD &&
                              p->lay.compact && on_stream(first, &owner) && ab__same_family(p->sbe, owner.be) &&
                              ab__staged_queueable(ab__backend_for(first->via), (const char *)src->data + src->byte_offset,
                                                   true);
  if (ab__dev_needs_host_sync(p->sbe) && !stream_ordered) {
    void *s = owner.stream != NULL && ab__same_family(p->sbe, owner.be) ? owner.stream : NULL;
    AB_FORWARD(ab__dev_host_sync(p->sbe, p->sdev.device_id, s));
  }
  /* And memory host code will write, for the same reason (managed memory
   * on a GPU without concurrent access). */
  if (to_host) AB_FORWARD(ab__dev_host_write_sync(p->tbe, p->tdev.device_id));
  const uint32_t prev = ab__parallel_call_threads(p->o.threads);
  ab_status st = run_steps(p, src, dst, ab__staging_for(p), &owner);
  ab__parallel_call_threads(prev);
  return st;
}

