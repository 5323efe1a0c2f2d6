/* The OpenCL backend's pinned staging memory (AB_DEVICE_OPENCL_HOST) and
 * the staging ring's operations: asynchronous transfers and fences. */
#include "backends/opencl/opencl.h"

/* A pinned block: one CL_MEM_ALLOC_HOST_PTR buffer, mapped while it lives.
 * Its header sits in the mapped bytes just before the 256-byte aligned
 * pointer handed out, so freeing needs no lookup and no host allocation;
 * the headers form a list that host_is_staged walks (the pool keeps the
 * blocks few: staging chunks and intermediate buffers). */
struct pinned {
  cl_mem mem;
  cl_command_queue queue; /* retained: the unmap may come after ab_shutdown released ours */
  void *base;
  size_t len;
  struct pinned *prev, *next;
};
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pinned *pinned_list;

static ab_status fail_pinned(cl_int e, int32_t id, const char *call) {
  return AB_FAIL(ab__cl_is_oom(e) ? AB_ERR_OUT_OF_MEMORY : AB_ERR_BACKEND, "opencl_host:%" PRId32 ": %s failed: %s (%d)", id,
                 call, ab__cl_err_name(e), (int)e);
}

ab_status ab__cl_pinned_alloc(int32_t id, size_t bytes, void **out) {
  cl_context ctx;
  cl_command_queue q;
  cl_int e;
  size_t len;
  /* Room for the header and for aligning the block past it. */
  if (__builtin_add_overflow(bytes, 2 * (size_t)AB_ALIGNMENT, &len))
    return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl_host:%" PRId32 ": %zu bytes is too many", id, bytes);
  AB_FORWARD(ab__cl_get_queue(id, &ctx, &q));
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, len, NULL, &e);
  if (e == CL_INVALID_BUFFER_SIZE)
    /* Not an out-of-memory the OOM sequence could cure (struct
     * ab_backend's alloc): the caller stages in pageable memory instead. */
    return AB_FAIL(AB_ERR_UNSUPPORTED, "opencl_host:%" PRId32 ": %zu bytes is more than one buffer may hold", id, len);
  if (e != CL_SUCCESS) return fail_pinned(e, id, "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)");
  void *base = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, len, 0, NULL, NULL, &e);
  if (e != CL_SUCCESS || base == NULL) {
    clReleaseMemObject(m);
    return fail_pinned(e != CL_SUCCESS ? e : CL_OUT_OF_HOST_MEMORY, id, "clEnqueueMapBuffer");
  }
  uintptr_t user = ((uintptr_t)base + sizeof(struct pinned) + AB_ALIGNMENT - 1) & ~(uintptr_t)(AB_ALIGNMENT - 1);
  struct pinned *h = (struct pinned *)(user - sizeof(struct pinned));
  clRetainCommandQueue(q);
  *h = (struct pinned){m, q, base, len, NULL, NULL};
  pthread_mutex_lock(&pinned_lock);
  h->next = pinned_list;
  if (pinned_list != NULL) pinned_list->prev = h;
  pinned_list = h;
  pthread_mutex_unlock(&pinned_lock);
  *out = (void *)user;
  return AB_OK;
}

void ab__cl_pinned_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  struct pinned *h = (struct pinned *)((char *)ptr - sizeof(struct pinned));
  pthread_mutex_lock(&pinned_lock);
  if (h->prev != NULL) h->prev->next = h->next;
  else pinned_list = h->next;
  if (h->next != NULL) h->next->prev = h->prev;
  pthread_mutex_unlock(&pinned_lock);
  struct pinned copy = *h; /* the header lives in the bytes being unmapped */
  clEnqueueUnmapMemObject(copy.queue, copy.mem, copy.base, 0, NULL, NULL);
  clFinish(copy.queue);
  clReleaseMemObject(copy.mem);
  clReleaseCommandQueue(copy.queue);
}

bool ab__cl_host_is_staged(const void *p) {
  bool found = false;
  pthread_mutex_lock(&pinned_lock);
  for (struct pinned *h = pinned_list; h != NULL && !found; h = h->next)
    found = (const char *)p >= (const char *)h->base && (const char *)p < (const char *)h->base + h->len;
  pthread_mutex_unlock(&pinned_lock);
  return found;
}

/* Each device stages in its own pinned pool (its buffers belong to the
 * device's context); see AB_OPENCL_PINNED above. */
int32_t ab__cl_staging_id(int32_t id) {
  if (ab__cl_pinned_mode == PINNED_NONE || (ab__cl_pinned_mode == PINNED_AUTO && ab__cl_devices[id].unified)) return -1;
  return id;
}

int32_t ab__cl_pinned_count(void) { return ab__cl_pinned_mode == PINNED_NONE ? 0 : ab__cl_ndevices; }

ab_status ab__cl_pinned_info(int32_t id, struct ab_device_info *out) {
  char name[sizeof out->name];
  AB_FORWARD(ab__cl_info(id, out));
  snprintf(name, sizeof name, "%s", out->name);
  snprintf(out->name, sizeof out->name, "pinned host memory of opencl:%" PRId32 " (%.80s)", id, name);
  out->total_memory = out->free_memory = 0; /* host memory: not the device's */
  out->unified_memory = 1;
  return AB_OK;
}

/* The queue the ring's fences go on: the caller's stream when use_stream
 * takes it (our context, in order; the ring's transfers are then queued on
 * it too), else our queue. */
static ab_status fence_queue(int32_t id, void *stream, cl_command_queue *q) {
  cl_context ctx;
  AB_FORWARD(ab__cl_get_queue(id, &ctx, q));
  return stream != NULL ? ab__cl_use_stream(id, ctx, stream, q) : AB_OK;
}

/* A ring transfer: non-blocking when it goes on the queue the fences go
 * on; blocking otherwise (a buffer of another context), which completes
 * before the fence is recorded and so keeps the ring's promise. */
static ab_status async_xfer(int32_t id, cl_mem m, uint64_t offset, void *host, size_t bytes, void *stream, bool write) {
  cl_command_queue q, fq;
  bool tmp;
  AB_FORWARD(ab__cl_queue_for(id, m, stream, &q, &tmp));
  ab_status st = fence_queue(id, stream, &fq);
  cl_int e = CL_SUCCESS;
  if (st == AB_OK) {
    const cl_bool block = tmp || q != fq ? CL_TRUE : CL_FALSE;
    e = write ? clEnqueueWriteBuffer(q, m, block, (size_t)offset, bytes, host, 0, NULL, NULL)
              : clEnqueueReadBuffer(q, m, block, (size_t)offset, bytes, host, 0, NULL, NULL);
    if (e == CL_SUCCESS && !block) e = clFlush(q); /* started without a fence behind it (an early return) */
  }
  if (tmp) clReleaseCommandQueue(q);
  AB_FORWARD(st);
  return e == CL_SUCCESS ? AB_OK
                         : ab__cl_fail_host_xfer(e, id, m, write,
                                                 write ? "clEnqueueWriteBuffer (staged)" : "clEnqueueReadBuffer (staged)");
}

ab_status ab__cl_write_async(int32_t id, void *handle, uint64_t offset, const void *src, size_t bytes, void *stream) {
  return async_xfer(id, (cl_mem)handle, offset, (void *)src, bytes, stream, true);
}

ab_status ab__cl_read_async(int32_t id, const void *handle, uint64_t offset, void *dst, size_t bytes, void *stream) {
  return async_xfer(id, (cl_mem)handle, offset, dst, bytes, stream, false);
}

/* A fence is the event of a marker: complete when everything queued
 * before it is. */
struct fence {
  cl_event ev; /* NULL until recorded */
  int32_t id;  /* the device whose transfers it follows, for messages */
};

ab_status ab__cl_fence_new(int32_t id, void **out) {
  struct fence *f = ab__malloc(sizeof *f);
  if (f == NULL) return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "opencl:%" PRId32 ": no host memory for a fence", id);
  f->ev = NULL;
  f->id = id;
  *out = f;
  return AB_OK;
}

ab_status ab__cl_fence_record(int32_t id, void *fence, void *stream) {
  struct fence *f = fence;
  cl_command_queue q;
  AB_FORWARD(fence_queue(id, stream, &q));
  if (f->ev != NULL) clReleaseEvent(f->ev);
  f->ev = NULL;
  cl_int e = clEnqueueMarkerWithWaitList(q, 0, NULL, &f->ev);
  if (e != CL_SUCCESS) {
    f->ev = NULL;
    return ab__cl_fail_cl(e, id, "clEnqueueMarkerWithWaitList");
  }
  clFlush(q); /* start the queued transfers now, not at the first wait */
  return AB_OK;
}

ab_status ab__cl_fence_wait(void *fence) {
  struct fence *f = fence;
  cl_int status = CL_COMPLETE;
  if (f->ev == NULL) return AB_OK;
  cl_int e = clWaitForEvents(1, &f->ev);
  if (e == CL_SUCCESS || e == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    e = clGetEventInfo(f->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (e == CL_SUCCESS && status < 0) e = status; /* the transfers before the marker failed */
  return e == CL_SUCCESS ? AB_OK : ab__cl_fail_cl(e, f->id, "waiting for a staged transfer");
}

void ab__cl_fence_free(void *fence) {
  struct fence *f = fence;
  if (f->ev != NULL) clReleaseEvent(f->ev);
  ab__free(f);
}

void ab__cl_stream_sync(int32_t id, void *stream) {
  cl_command_queue q;
  if (fence_queue(id, stream, &q) == AB_OK) clFinish(q);
}
