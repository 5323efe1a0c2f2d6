/* Image conversion benchmark: a 3840x2160x3 uint8 HWC frame to float32 CHW,
 * normalised per channel ((x / 255 - mean) / std), in one run:
 *   memcpy   of the output's bytes (99.5 MB): the ceiling for one pass
 *   naive    the three nested loops a user writes
 *   ours     ab_convert_memory with permute {2,0,1} and per-channel scale/offset
 *   opencl   (when a device exists) ours to opencl:0 in one call, against
 *            upload then convert on the device in two calls (run it with
 *            AB_CONVERT_PLACE=device too: the conversion on the device)
 * NumPy's figure comes from bench/bench_convert_numpy.py in the same session.
 *
 *   bench_convert [reps] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#include "arraybridge/arraybridge.h"

enum { H = 2160, W = 3840, C = 3 };
static const double mean[C] = {0.485, 0.456, 0.406}, stdv[C] = {0.229, 0.224, 0.225};
static volatile float sink;

static DLManagedTensorVersioned *convert(const DLTensor *src, DLDevice to, const ab_convert_opts *o) {
  DLManagedTensorVersioned *r;
  ab_status st = ab_convert_memory(src, to, o, &r);
  if (st != AB_OK) {
    fprintf(stderr, "bench_convert: %s\n", ab_last_error());
    exit(1);
  }
  return r;
}

int main(int argc, char **argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 7;
  const size_t in_bytes = (size_t)H * W * C, out_bytes = in_bytes * sizeof(float);
  uint8_t *img = malloc(in_bytes);
  float *out = malloc(out_bytes), *out2 = malloc(out_bytes);
  if (!img || !out || !out2) return 1;
  for (size_t i = 0; i < in_bytes; i++) img[i] = (uint8_t)(i * 2654435761u >> 24);
  memset(out, 0, out_bytes);
  memset(out2, 1, out_bytes);

  double scale[C], offset[C];
  for (int c = 0; c < C; c++) {
    scale[c] = 1.0 / (255.0 * stdv[c]);
    offset[c] = -mean[c] / stdv[c];
  }
  int64_t shape[3] = {H, W, C};
  DLTensor src = {img, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, shape, NULL, 0};
  static const int32_t perm[3] = {2, 0, 1};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = (DLDataType){kDLFloat, 32, 1};
  o.permute = perm;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = scale;
  o.channel_offset = offset;

  double t_mem[64], t_naive[64], t_ours[64];
  for (int r = 0; r < reps + 1; r++) { /* the first round warms up */
    double t0 = bench_now();
    memcpy(out2, out, out_bytes);
    sink += out2[12345]; /* read, so that no compiler drops the copy (clang did) */
    double t1 = bench_now();
    for (int c = 0; c < C; c++) {
      const float a = (float)scale[c], b = (float)offset[c];
      for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) out[((size_t)c * H + y) * W + x] = (float)img[((size_t)y * W + x) * C + c] * a + b;
    }
    double t2 = bench_now();
    DLManagedTensorVersioned *res = convert(&src, (DLDevice){kDLCPU, 0}, &o);
    double t3 = bench_now();
    if (r == 0 && memcmp(res->dl_tensor.data, out, out_bytes) != 0) {
      fprintf(stderr, "bench_convert: ours differs from the naive loop\n");
      return 1;
    }
    sink += ((float *)res->dl_tensor.data)[12345];
    res->deleter(res);
    if (r > 0) {
      t_mem[r - 1] = t1 - t0;
      t_naive[r - 1] = t2 - t1;
      t_ours[r - 1] = t3 - t2;
    }
  }
  double m = bench_median(t_mem, reps), n = bench_median(t_naive, reps), u = bench_median(t_ours, reps);
  printf("3840x2160x3 u8 HWC -> f32 CHW normalised, host, median of %d\n", reps);
  printf("  memcpy of the output (%.1f MB): %8.2f ms  %6.2f GB/s\n", out_bytes / 1e6, m * 1e3, out_bytes / m / 1e9);
  printf("  naive loops                  : %8.2f ms  (%.2fx the memcpy ceiling)\n", n * 1e3, m / n);
  printf("  ours                         : %8.2f ms  (%.2fx the memcpy ceiling, %.2fx naive)\n", u * 1e3, m / u,
         n / u);

  if (ab_device_count(kDLOpenCL) > 0) {
    const DLDevice cl = {kDLOpenCL, 0};
    ab_convert_opts plain = AB_CONVERT_OPTS_INIT;
    double t_one[64], t_two[64];
    for (int r = 0; r < reps + 1; r++) {
      double t0 = bench_now();
      DLManagedTensorVersioned *a = convert(&src, cl, &o);
      double t1 = bench_now();
      DLManagedTensorVersioned *up = convert(&src, cl, &plain);
      DLManagedTensorVersioned *b = convert(&up->dl_tensor, cl, &o);
      double t2 = bench_now();
      a->deleter(a);
      up->deleter(up);
      b->deleter(b);
      if (r > 0) {
        t_one[r - 1] = t1 - t0;
        t_two[r - 1] = t2 - t1;
      }
    }
    double one = bench_median(t_one, reps), two = bench_median(t_two, reps);
    const char *place = getenv("AB_CONVERT_PLACE");
    printf("  opencl:0, one call           : %8.2f ms  (AB_CONVERT_PLACE=%s)\n", one * 1e3, place ? place : "auto");
    printf("  opencl:0, upload then convert: %8.2f ms  (one call is %.2fx faster)\n", two * 1e3, two / one);
  }
  free(img);
  free(out);
  free(out2);
  ab_shutdown();
  return 0;
}
