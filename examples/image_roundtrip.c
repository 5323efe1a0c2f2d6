/* Image round trip, the way an image pipeline uses arraybridge:
 *
 *   1. load an RGB PNG (libpng) as a uint8 HWC tensor;
 *   2. push it to a device as normalised float32 CHW in one call
 *      (permute {2,0,1}, per-channel (x / 255 - mean) / std);
 *   3. run one operation there: invert the image, which in normalised
 *      space is y = -x + (1 - 2 mean) / std per channel;
 *   4. pull it back as uint8 HWC in one call (the inverse map, rounded
 *      and saturated);
 *   5. check every pixel is 255 - the original, and write the PNG.
 *
 * Usage: ab_image [--device cuda:0|opencl:1|cpu|all] [IN.png] OUT.png
 * Exit status: 0 when every round trip came back exact and was written,
 * 2 for a bad command line (a --device name that does not parse too),
 * 1 otherwise (a device that is not there, a library or PNG failure).
 * Without IN.png a test pattern is drawn, written next to OUT.png as
 * *-input.png and read back through libpng. Without --device the best
 * device is used (ab_best_device: a GPU when there is one); "all" runs
 * the round trip on every device present (make demo does). */
#define _XOPEN_SOURCE 700 /* access, stat, realpath */
#include <errno.h>
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arraybridge/arraybridge.h"

static const double mean[3] = {0.485, 0.456, 0.406}, stdv[3] = {0.229, 0.224, 0.225};

static int fail(const char *what) {
  fprintf(stderr, "ab_image: %s: %s\n", what, ab_last_error());
  return 1;
}

/* Reads any PNG as 8-bit RGB (palette, grey and alpha converted). */
static uint8_t *read_png(const char *path, int *w, int *h) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path)) {
    fprintf(stderr, "ab_image: %s: %s\n", path, img.message);
    return NULL;
  }
  img.format = PNG_FORMAT_RGB;
  uint8_t *px = malloc(PNG_IMAGE_SIZE(img));
  if (px == NULL || !png_image_finish_read(&img, NULL, px, 0, NULL)) {
    fprintf(stderr, "ab_image: %s: %s\n", path, px ? img.message : "out of memory");
    free(px);
    png_image_free(&img);
    return NULL;
  }
  *w = (int)img.width;
  *h = (int)img.height;
  return px;
}

/* Writes through a stream of its own, not png_image_write_to_file: that
 * one removes the path whenever the write fails, whatever it names (a
 * device such as /dev/full, a symbolic link, a file that was there
 * before). Here only a file this call created is removed (through a
 * dangling link, the file made at its target; the link stays). */
static int write_png(const char *path, const uint8_t *px, int w, int h) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = PNG_FORMAT_RGB;
  bool existed = access(path, F_OK) == 0;
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    fprintf(stderr, "ab_image: writing %s: %s\n", path, strerror(errno));
    return 1;
  }
  int ok = png_image_write_to_stdio(&img, f, 0, px, 0, NULL);
  const char *why = ok ? NULL : img.message;
  errno = 0;
  if (fflush(f) != 0 || ferror(f)) {
    if (ok) why = errno ? strerror(errno) : "write error";
    ok = 0;
  }
  if (fclose(f) != 0 && ok) {
    why = strerror(errno);
    ok = 0;
  }
  if (!ok) {
    fprintf(stderr, "ab_image: writing %s: %s\n", path, why);
    /* Ours, and partial: the file made (where path is a dangling link,
     * the file at its target, not the link). */
    char *made = existed ? NULL : realpath(path, NULL);
    struct stat st;
    if (made != NULL && stat(made, &st) == 0 && S_ISREG(st.st_mode)) remove(made);
    free(made);
    return 1;
  }
  return 0;
}

/* A colourful test card: gradients and a grid. */
static uint8_t *pattern(int w, int h) {
  uint8_t *px = malloc((size_t)w * h * 3);
  if (px == NULL) return NULL;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *p = px + ((size_t)y * w + x) * 3;
      int grid = (x % 32 == 0) || (y % 32 == 0);
      p[0] = grid ? 255 : (uint8_t)(255 * x / (w - 1));
      p[1] = grid ? 255 : (uint8_t)(255 * y / (h - 1));
      p[2] = (uint8_t)((x ^ y) & 0xff);
    }
  return px;
}

/* A step that failed: ends the device's line on stdout, then says why. */
static int step_failed(const char *what) {
  printf("%s failed\n", what);
  fflush(stdout);
  return fail(what);
}

/* Steps 2 to 5 on one device; 0 when every pixel came back inverted. */
static int roundtrip(DLDevice dev, const uint8_t *px, int w, int h, const char *out) {
  if (dev.device_id == AB_DEVICE_AUTO)
    printf("ab_image: %dx%d RGB on %s:auto: ", w, h, ab_device_type_name(dev.device_type));
  else
    printf("ab_image: %dx%d RGB on %s:%d: ", w, h, ab_device_type_name(dev.device_type), (int)dev.device_id);
  fflush(stdout);
  int64_t hwc[3] = {h, w, 3};
  DLTensor image = {(void *)px, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, hwc, NULL, 0};
  double to_scale[3], to_offset[3], inv_offset[3], back_scale[3], back_offset[3], minus_one[3] = {-1, -1, -1};
  for (int c = 0; c < 3; c++) {
    to_scale[c] = 1.0 / (255.0 * stdv[c]);
    to_offset[c] = -mean[c] / stdv[c];
    inv_offset[c] = (1.0 - 2.0 * mean[c]) / stdv[c];
    back_scale[c] = 255.0 * stdv[c];
    back_offset[c] = 255.0 * mean[c];
  }

  /* 2. to the device, normalised float CHW */
  static const int32_t to_chw[3] = {2, 0, 1}, to_hwc[3] = {1, 2, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = (DLDataType){kDLFloat, 32, 1};
  o.permute = to_chw;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = to_scale;
  o.channel_offset = to_offset;
  DLManagedTensorVersioned *chw, *inv, *back;
  if (ab_convert_memory(&image, dev, &o, &chw) != AB_OK) return step_failed("upload");

  /* 3. invert there (same device, per channel along C) */
  ab_convert_opts oi = AB_CONVERT_OPTS_INIT;
  oi.flags = AB_CONVERT_PER_CHANNEL;
  oi.channel_axis = 0;
  oi.channel_scale = minus_one;
  oi.channel_offset = inv_offset;
  ab_status st = ab_convert_memory(&chw->dl_tensor, dev, &oi, &inv);
  chw->deleter(chw);
  if (st != AB_OK) return step_failed("invert");

  /* 4. back to uint8 HWC on the host */
  ab_convert_opts ob = AB_CONVERT_OPTS_INIT;
  ob.dtype = (DLDataType){kDLUInt, 8, 1};
  ob.permute = to_hwc;
  ob.flags = AB_CONVERT_PER_CHANNEL;
  ob.channel_axis = 0;
  ob.channel_scale = back_scale;
  ob.channel_offset = back_offset;
  st = ab_convert_memory(&inv->dl_tensor, (DLDevice){kDLCPU, 0}, &ob, &back);
  inv->deleter(inv);
  if (st != AB_OK) return step_failed("download");

  /* 5. check and write */
  const uint8_t *res = back->dl_tensor.data;
  size_t n = (size_t)w * h * 3, off = 0;
  for (size_t i = 0; i < n; i++) off += res[i] != 255 - px[i];
  int rc = write_png(out, res, w, h);
  printf("%zu values inverted, %zu differ from 255 - x; %s %s\n", n, off, rc == 0 ? "wrote" : "could not write", out);
  back->deleter(back);
  return rc != 0 || off != 0;
}

int main(int argc, char **argv) {
  const char *device = NULL, *files[2] = {NULL, NULL};
  int nfiles = 0;
  bool bad = false;
  /* Options and file names in any order: one name is OUT, two are IN OUT. */
  for (int i = 1; i < argc && !bad; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
    else if (argv[i][0] == '-' || argv[i][0] == '\0' || nfiles == 2) bad = true;
    else files[nfiles++] = argv[i];
  }
  if (bad || nfiles == 0) {
    fprintf(stderr, "usage: ab_image [--device DEVICE] [IN.png] OUT.png\n");
    return 2;
  }
  const char *in = nfiles == 2 ? files[0] : NULL, *out = files[nfiles - 1];
  /* OUT without its ".png", for the names of the files made beside it */
  const size_t len = strlen(out);
  const int stem = (int)(len > 4 && strcmp(out + len - 4, ".png") == 0 ? len - 4 : len);
  DLDevice dev = ab_best_device();
  if (device != NULL && strcmp(device, "all") != 0) {
    struct ab_device_info info;
    if (ab_parse_device(device, &dev) != AB_OK) { /* a name that does not parse: a usage error */
      fail("--device");
      return 2;
    }
    /* absent: said before any work ("auto" is resolved at the upload) */
    if (dev.device_id != AB_DEVICE_AUTO && ab_device_info(dev, &info) != AB_OK) return fail(device);
  }

  int w, h;
  uint8_t *px;
  if (in == NULL) {
    char path[4096];
    if (snprintf(path, sizeof path, "%.*s-input.png", stem, out) >= (int)sizeof path) {
      fprintf(stderr, "ab_image: %s: too long a name for the test card's file beside it\n", out);
      return 1;
    }
    uint8_t *card = pattern(640, 360);
    if (card == NULL || write_png(path, card, 640, 360) != 0) {
      free(card);
      return 1;
    }
    free(card);
    printf("ab_image: drew a test card into %s\n", path);
    px = read_png(path, &w, &h);
  } else {
    px = read_png(in, &w, &h);
  }
  if (px == NULL) return 1;
  int rc = 0;
  if (device != NULL && strcmp(device, "all") == 0) {
    /* The host, and every device whose memory is its own (not host
     * memory such as cuda_host): where a round trip means a transfer. */
    DLDeviceType types[16];
    const int ntypes = ab_device_types(types, 16);
    for (int k = 0; k < ntypes && k < 16; k++)
      for (int32_t i = 0; i < ab_device_count(types[k]); i++) {
        struct ab_device_info info;
        if (types[k] != kDLCPU && (ab_device_info((DLDevice){types[k], i}, &info) != AB_OK || info.host_accessible))
          continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%.*s-%s%d.png", stem, out, ab_device_type_name(types[k]), (int)i) >=
            (int)sizeof path) {
          fprintf(stderr, "ab_image: %s: too long a name for each device's file beside it\n", out);
          rc = 1;
          continue;
        }
        rc |= roundtrip((DLDevice){types[k], i}, px, w, h, path);
      }
  } else {
    rc = roundtrip(dev, px, w, h, out);
  }
  free(px);
  ab_shutdown();
  return rc;
}
