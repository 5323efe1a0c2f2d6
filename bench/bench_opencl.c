/* OpenCL transfers: host -> opencl and opencl -> host through
 * ab_convert_memory against raw blocking clEnqueueWriteBuffer /
 * clEnqueueReadBuffer of the same sizes, measured in the same run, plus a
 * strided (HWC -> CHW view) upload. Medians; GB/s counts tensor bytes.
 *
 *   POCL_DEVICES="pthread pthread" bench_opencl [--quick]
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#include <arraybridge/arraybridge.h>

static int reps = 9;

#define MEDIAN_OF(expr)                                  \
  ({                                                     \
    double v_[64];                                       \
    for (int r_ = 0; r_ < reps; r_++) {                  \
      double t0_ = bench_now();                          \
      expr;                                              \
      v_[r_] = bench_now() - t0_;                        \
    }                                                    \
    bench_median(v_, reps);                              \
  })

static void die(const char *what) {
  fprintf(stderr, "bench_opencl: %s: %s\n", what, ab_last_error());
  exit(1);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  if (quick) reps = 3;
  if (ab_device_count(kDLOpenCL) < 1) {
    struct ab_device_info info;
    ab_device_info((DLDevice){kDLOpenCL, 0}, &info);
    printf("bench_opencl: SKIP: no OpenCL device (%s)\n", ab_last_error());
    return 0;
  }
  struct ab_device_info info;
  ab_device_info((DLDevice){kDLOpenCL, 0}, &info);
  printf("arraybridge %s OpenCL benchmark on opencl:0 (%s, %s), median of %d runs\n\n", ab_version_string(), info.name,
         info.version, reps);

  /* The raw baseline: its own context on the same first device. */
  cl_platform_id p;
  cl_device_id d;
  cl_int e;
  clGetPlatformIDs(1, &p, NULL);
  clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL);
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  cl_command_queue q = clCreateCommandQueue(ctx, d, 0, &e);

  const size_t sizes[] = {4 << 10, 1 << 20, 64 << 20, (size_t)512 << 20};
  printf("%-8s %-12s %10s %10s %8s\n", "size", "direction", "ours GB/s", "raw GB/s", "ratio");
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    if (quick && n > ((size_t)64 << 20)) continue;
    unsigned char *host = malloc(n), *back = malloc(n);
    memset(host, 7, n);
    memset(back, 0, n);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &e);
    if (e != CL_SUCCESS) {
      printf("%-8zu skipped: clCreateBuffer %d\n", n, (int)e);
      continue;
    }
    int64_t shape[1] = {(int64_t)n};
    DLTensor t = {host, {kDLCPU, 0}, 1, {kDLUInt, 8, 1}, shape, NULL, 0};
    DLManagedTensorVersioned *dev = NULL, *r = NULL;
    if (ab_convert_memory(&t, (DLDevice){kDLOpenCL, 0}, NULL, &dev) != AB_OK) die("warm-up upload");
    double raw_w = MEDIAN_OF(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, host, 0, NULL, NULL));
    double ours_w = MEDIAN_OF({
      DLManagedTensorVersioned *x;
      if (ab_convert_memory(&t, (DLDevice){kDLOpenCL, 0}, NULL, &x) != AB_OK) die("upload");
      x->deleter(x);
    });
    double raw_r = MEDIAN_OF(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, back, 0, NULL, NULL));
    double ours_r = MEDIAN_OF({
      if (ab_convert_memory(&dev->dl_tensor, (DLDevice){kDLCPU, 0}, NULL, &r) != AB_OK) die("download");
      r->deleter(r);
    });
    char label[16];
    if (n >= (1u << 20)) snprintf(label, sizeof label, "%zu MiB", n >> 20);
    else snprintf(label, sizeof label, "%zu KiB", n >> 10);
    printf("%-8s %-12s %10.2f %10.2f %7.2fx\n", label, "host->cl", n / ours_w / 1e9, n / raw_w / 1e9, raw_w / ours_w);
    printf("%-8s %-12s %10.2f %10.2f %7.2fx\n", label, "cl->host", n / ours_r / 1e9, n / raw_r / 1e9, raw_r / ours_r);
    dev->deleter(dev);
    clReleaseMemObject(m);
    free(host);
    free(back);
    ab_pool_trim_all();
  }

  /* HWC -> CHW upload of a 1920x1080x3 frame: packed on the host, then one
   * write, against the raw write of the same bytes (no permutation). */
  {
    const int64_t H = 1080, W = 1920, C = 3;
    size_t n = (size_t)(H * W * C);
    unsigned char *img = malloc(n);
    memset(img, 3, n);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &e);
    int64_t shape[3] = {C, H, W}, strides[3] = {1, W * C, C};
    DLTensor t = {img, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, shape, strides, 0};
    double raw = MEDIAN_OF(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, img, 0, NULL, NULL));
    double ours = MEDIAN_OF({
      DLManagedTensorVersioned *x;
      if (ab_convert_memory(&t, (DLDevice){kDLOpenCL, 0}, NULL, &x) != AB_OK) die("HWC upload");
      x->deleter(x);
    });
    printf("\n%-21s %10.2f %10.2f %7.2fx  (raw: the same bytes, not permuted)\n", "HWC->CHW 1080p u8", n / ours / 1e9,
           n / raw / 1e9, raw / ours);
    clReleaseMemObject(m);
    free(img);
  }
  /* A 1920x1080 crop of a 3840x2160 float32 image, up and down: one
   * rectangle transfer each way, against raw compact transfers of the same
   * number of bytes. */
  {
    const int64_t H = 2160, W = 3840, h = 1080, w = 1920;
    size_t n = (size_t)(H * W) * 4, cn = (size_t)(h * w) * 4;
    float *img = malloc(n), *crop = malloc(cn);
    memset(img, 1, n);
    memset(crop, 1, cn); /* written: the raw upload would read the zero page */
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, cn, NULL, &e);
    int64_t shape[2] = {h, w}, strides[2] = {W, 1};
    DLTensor t = {img + W * 500 + 900, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, strides, 0};
    double raw_w = MEDIAN_OF(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, cn, crop, 0, NULL, NULL));
    double ours_w = MEDIAN_OF({
      DLManagedTensorVersioned *x;
      if (ab_convert_memory(&t, (DLDevice){kDLOpenCL, 0}, NULL, &x) != AB_OK) die("crop upload");
      x->deleter(x);
    });
    int64_t bshape[1] = {(int64_t)(n / 4)};
    DLTensor whole = {img, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, bshape, NULL, 0};
    DLManagedTensorVersioned *dev = NULL;
    if (ab_convert_memory(&whole, (DLDevice){kDLOpenCL, 0}, NULL, &dev) != AB_OK) die("image upload");
    DLTensor dcrop = {dev->dl_tensor.data, {kDLOpenCL, 0}, 2, {kDLFloat, 32, 1}, shape, strides, 4 * (uint64_t)(W * 500 + 900)};
    double raw_r = MEDIAN_OF(clEnqueueReadBuffer(q, m, CL_TRUE, 0, cn, crop, 0, NULL, NULL));
    double ours_r = MEDIAN_OF({
      DLManagedTensorVersioned *x;
      if (ab_convert_memory(&dcrop, (DLDevice){kDLCPU, 0}, NULL, &x) != AB_OK) die("crop download");
      x->deleter(x);
    });
    printf("%-21s %10.2f %10.2f %7.2fx  (raw: compact bytes)\n", "1080p crop f32 up", cn / ours_w / 1e9,
           cn / raw_w / 1e9, raw_w / ours_w);
    printf("%-21s %10.2f %10.2f %7.2fx  (raw: compact bytes)\n", "1080p crop f32 down", cn / ours_r / 1e9,
           cn / raw_r / 1e9, raw_r / ours_r);
    dev->deleter(dev);
    clReleaseMemObject(m);
    free(img);
    free(crop);
  }
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  ab_shutdown();
  return 0;
}
