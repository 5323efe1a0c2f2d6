/* The OpenCL backend's buffers and transfers: allocation, reads and writes
 * (plain and rectangles) on the caller's queue or ours, range checks of
 * foreign buffers, synchronisation. */
#include "backends/opencl/opencl.h"

ab_status ab__cl_alloc(int32_t id, size_t bytes, void **out) {
  cl_context ctx;
  cl_command_queue q;
  cl_int e;
  AB_FORWARD(ab__cl_get_queue(id, &ctx, &q));
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &e);
  if (e == CL_INVALID_BUFFER_SIZE) {
    /* The size itself, not memory in use: the pool runs no OOM sequence
     * for it (struct ab_backend's alloc). */
    cl_ulong max = 0;
    clGetDeviceInfo(ab__cl_devices[id].id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max, &max, NULL);
    return AB_FAIL(AB_ERR_UNSUPPORTED, "opencl:%" PRId32 ": %zu bytes is more than one buffer may hold (%llu)", id,
                   bytes, (unsigned long long)max);
  }
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clCreateBuffer");
  *out = m;
  return AB_OK;
}

void ab__cl_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  clReleaseMemObject((cl_mem)ptr);
}

/* The caller's stream if it belongs to `ctx`. A stream of another context
 * cannot touch this buffer (our result buffers live in our own context):
 * it is finished first, so that work the caller queued on it is ordered
 * before ours, and our queue is used instead. */
ab_status ab__cl_use_stream(int32_t id, cl_context ctx, void *stream, cl_command_queue *q) {
  cl_context sctx = NULL;
  cl_command_queue s = (cl_command_queue)stream;
  cl_int e = clGetCommandQueueInfo(s, CL_QUEUE_CONTEXT, sizeof sctx, &sctx, NULL);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": opts->stream is not a cl_command_queue (%s)", id,
                   ab__cl_err_name(e));
  /* An out-of-order queue would not order our work after the caller's
   * (nor the caller's next work after ours): finished first, not used,
   * like a queue of another context. */
  cl_command_queue_properties props = 0;
  e = clGetCommandQueueInfo(s, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
  if (sctx == ctx && !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    *q = s;
    return AB_OK;
  }
  e = clFinish(s);
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "clFinish(opts->stream)");
}

/* The queue to use for a buffer on device `id`: the caller's stream when
 * it belongs to the buffer's context; ours when the buffer lives in our
 * context; otherwise a temporary queue on the buffer's own context (a
 * foreign cl_mem). *tmp is then set and must be released. */
ab_status ab__cl_queue_for(int32_t id, cl_mem m, void *stream, cl_command_queue *q, bool *tmp) {
  cl_context ours, theirs = NULL;
  *tmp = false;
  AB_FORWARD(ab__cl_get_queue(id, &ours, q));
  cl_int e = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof theirs, &theirs, NULL);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clGetMemObjectInfo(CL_MEM_CONTEXT)");
  if (stream != NULL) {
    cl_command_queue s = *q;
    AB_FORWARD(ab__cl_use_stream(id, theirs, stream, &s));
    if (s == (cl_command_queue)stream) {
      *q = s;
      return AB_OK;
    }
  }
  if (theirs == ours) return AB_OK;
  *q = clCreateCommandQueue(theirs, ab__cl_devices[id].id, 0, &e);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the buffer's context does not contain this device (clCreateCommandQueue: %s)", id,
                   ab__cl_err_name(e));
  *tmp = true;
  return AB_OK;
}

ab_status ab__cl_fail_host_xfer(cl_int e, int32_t id, cl_mem m, bool write, const char *call) {
  cl_mem_flags flags = 0;
  const cl_mem_flags forbid = CL_MEM_HOST_NO_ACCESS | (write ? CL_MEM_HOST_READ_ONLY : CL_MEM_HOST_WRITE_ONLY);
  /* Flags are asked for only once the driver has refused: the calls that
   * succeed pay nothing. */
  if (e == CL_INVALID_OPERATION && clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL) == CL_SUCCESS &&
      (flags & forbid) != 0)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the host cannot %s this buffer (created with %s), so %s refused",
                   id, write ? "write" : "read",
                   flags & CL_MEM_HOST_NO_ACCESS ? "CL_MEM_HOST_NO_ACCESS"
                   : write                       ? "CL_MEM_HOST_READ_ONLY"
                                                 : "CL_MEM_HOST_WRITE_ONLY",
                   call);
  return ab__cl_fail_cl(e, id, call);
}

/* One blocking transfer between host memory and a buffer, on the queue
 * queue_for picks. Rectangles are compact on one side: the device side for
 * writes (host pitches given), the host side for reads (device pitches). */
enum xfer_kind { XFER_WRITE, XFER_READ, XFER_WRITE_RECT, XFER_READ_RECT };

struct xfer {
  enum xfer_kind kind;
  uint64_t offset;      /* bytes into the buffer */
  size_t bytes;         /* plain transfers */
  const size_t *region; /* rectangles: row bytes, rows, slices */
  size_t row_pitch, slice_pitch;
  void *host;
};

static ab_status transfer(int32_t id, cl_mem m, void *stream, const struct xfer *x) {
  static const char *calls[] = {"clEnqueueWriteBuffer", "clEnqueueReadBuffer", "clEnqueueWriteBufferRect",
                                "clEnqueueReadBufferRect"};
  const size_t origin[3] = {(size_t)x->offset, 0, 0}, host_origin[3] = {0, 0, 0};
  cl_command_queue q;
  bool tmp;
  cl_int e = CL_INVALID_VALUE;
  AB_FORWARD(ab__cl_queue_for(id, m, stream, &q, &tmp));
  switch (x->kind) {
  case XFER_WRITE:
    e = clEnqueueWriteBuffer(q, m, CL_TRUE, (size_t)x->offset, x->bytes, x->host, 0, NULL, NULL);
    break;
  case XFER_READ:
    e = clEnqueueReadBuffer(q, m, CL_TRUE, (size_t)x->offset, x->bytes, x->host, 0, NULL, NULL);
    break;
  case XFER_WRITE_RECT:
    e = clEnqueueWriteBufferRect(q, m, CL_TRUE, origin, host_origin, x->region, x->region[0],
                                 x->region[0] * x->region[1], x->row_pitch, x->slice_pitch, x->host, 0, NULL, NULL);
    break;
  case XFER_READ_RECT:
    e = clEnqueueReadBufferRect(q, m, CL_TRUE, origin, host_origin, x->region, x->row_pitch, x->slice_pitch,
                                x->region[0], x->region[0] * x->region[1], x->host, 0, NULL, NULL);
    break;
  }
  if (tmp) clReleaseCommandQueue(q);
  const bool write = x->kind == XFER_WRITE || x->kind == XFER_WRITE_RECT;
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_host_xfer(e, id, m, write, calls[x->kind]);
}

ab_status ab__cl_write(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  struct xfer x = {XFER_WRITE, offset, bytes, NULL, 0, 0, (void *)src};
  return transfer(id, (cl_mem)handle, stream, &x);
}

ab_status ab__cl_read(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  struct xfer x = {XFER_READ, offset, bytes, NULL, 0, 0, dst};
  return transfer(id, (cl_mem)handle, stream, &x);
}

ab_status ab__cl_read_rect(int32_t id, const void *handle, uint64_t offset, const size_t region[3],
                              size_t row_pitch, size_t slice_pitch, void *dst, void *stream) {
  struct xfer x = {XFER_READ_RECT, offset, 0, region, row_pitch, slice_pitch, dst};
  return transfer(id, (cl_mem)handle, stream, &x);
}

ab_status ab__cl_write_rect(int32_t id, void *handle, uint64_t offset, const size_t region[3], size_t row_pitch,
                               size_t slice_pitch, const void *src, void *stream) {
  struct xfer x = {XFER_WRITE_RECT, offset, 0, region, row_pitch, slice_pitch, (void *)src};
  return transfer(id, (cl_mem)handle, stream, &x);
}

/* A sub-buffer's parent and offset (OpenCL has no sub-buffers of
 * sub-buffers: one level). */
void ab__cl_root(const void *handle, const void **root, uint64_t *offset) {
  cl_mem parent = NULL;
  size_t at = 0;
  *root = handle;
  *offset = 0;
  if (clGetMemObjectInfo((cl_mem)handle, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) == CL_SUCCESS &&
      parent != NULL && clGetMemObjectInfo((cl_mem)handle, CL_MEM_OFFSET, sizeof at, &at, NULL) == CL_SUCCESS) {
    *root = parent;
    *offset = at;
  }
}

ab_status ab__cl_check_range(int32_t id, const void *handle, uint64_t begin, uint64_t end) {
  size_t size = 0;
  cl_mem_object_type type = 0;
  cl_int e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_TYPE, sizeof type, &type, NULL);
  if (e == CL_SUCCESS) e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_SIZE, sizeof size, &size, NULL);
  if (e != CL_SUCCESS)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": data %p is not a cl_mem buffer (%s)", id, handle,
                   ab__cl_err_name(e));
  if (type != CL_MEM_OBJECT_BUFFER)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT, "opencl:%" PRId32 ": data is an OpenCL image, not a buffer", id);
  /* The device the tensor names must be one of the buffer's context. */
  cl_context ctx = NULL;
  cl_uint n = 0;
  /* A caller's context may hold more devices than the library lists
   * (sub-devices, say): their ids go on the heap. Past MAX_DEVICES the
   * list was once left unread and compared uninitialised. */
  cl_device_id few[MAX_DEVICES], *in_ctx = few;
  e = clGetMemObjectInfo((cl_mem)handle, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clGetMemObjectInfo(CL_MEM_CONTEXT)");
  e = clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clGetContextInfo");
  if (n > MAX_DEVICES && (in_ctx = ab__malloc((size_t)n * sizeof *in_ctx)) == NULL)
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl:%" PRId32 ": no memory for the ids of a context's %u devices", id,
                   (unsigned)n);
  e = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, (size_t)n * sizeof *in_ctx, in_ctx, NULL);
  bool found = false;
  for (cl_uint i = 0; e == CL_SUCCESS && i < n; i++) found |= in_ctx[i] == ab__cl_devices[id].id;
  if (in_ctx != few) ab__free(in_ctx);
  if (e != CL_SUCCESS) return ab__cl_fail_cl(e, id, "clGetContextInfo");
  if (!found)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the tensor's buffer belongs to a context without this device", id);
  if (end > size)
    return AB_FAIL(AB_ERR_INVALID_ARGUMENT,
                   "opencl:%" PRId32 ": the tensor addresses bytes [%" PRIu64 ", %" PRIu64 ") of a %zu-byte buffer", id,
                   begin, end, size);
  return AB_OK;
}

/* ab_synchronize: the caller's queue, or ours for the device. */
ab_status ab__cl_synchronize(int32_t id, void *stream) {
  cl_context ctx;
  cl_command_queue q;
  if (stream != NULL) {
    cl_int e = clFinish((cl_command_queue)stream);
    return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "clFinish(stream)");
  }
  AB_FORWARD(ab__cl_get_queue(id, &ctx, &q));
  cl_int e = clFinish(q);
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, id, "clFinish");
}
