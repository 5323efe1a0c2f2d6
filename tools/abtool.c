/* abtool: what devices do I have, how fast are the links between them, and
 * moving a .npy file through a device.
 *
 *   abtool info [--json]
 *   abtool bandwidth [--sizes 4K,1M,64M] [--devices cpu,opencl:0,...] [--reps N]
 *   abtool convert IN.npy --to DEVICE [--dtype T] [--permute 2,0,1]
 *                  [--scale S] [--offset O] [--explain] --out OUT.npy
 *
 * Exit codes: 0 success; 1 the library failed (its message is printed);
 * 2 bad command line; 3 a bad input file, or an output file (standard
 * output included) that cannot be written. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "arraybridge/arraybridge.h"
#include "npy.h"

enum { EXIT_LIB = 1, EXIT_USAGE = 2, EXIT_FILE = 3 };

/* The device types of this build (ab_device_types), filled by main. */
static DLDeviceType all_types[32];
static size_t ntypes;

static int lib_fail(const char *what) {
  fprintf(stderr, "abtool: %s: %s\n", what, ab_last_error());
  return EXIT_LIB;
}

/* The errno of the first write to standard output that failed, for
 * stdout_checked: a C library that writes a line at once (musl's stdout
 * is line-buffered until its first write) leaves the flush nothing to
 * fail on, and the error's reason only here. */
static int stdout_errno;
static void note_stdout(bool written) {
  if (!written && stdout_errno == 0) stdout_errno = errno;
}

static void usage(FILE *f) {
  const int n = fprintf(f,
          "usage: abtool <command> [options]\n"
          "\n"
          "commands:\n"
          "  info [--json]            library version, backends, every device with its memory and pool\n"
          "  bandwidth [--sizes LIST] [--devices LIST] [--reps N]\n"
          "                           GB/s and latency of ab_convert_memory for every ordered pair of\n"
          "                           devices, beside memcpy (LIST: comma-separated; sizes like 4K,1M,64M)\n"
          "  convert IN.npy --to DEVICE [--dtype T] [--permute 2,0,1] [--scale S] [--offset O] [--explain]\n"
          "          --out OUT.npy\n"
          "                           moves a NumPy file through DEVICE (converting on the way) and back\n"
          "  help [COMMAND]           this text; with a command, that command's --help\n"
          "\n"
          "exit codes: 0 success, 1 library error, 2 bad command line, 3 bad input file or unwritable output\n");
  if (f == stdout) note_stdout(n >= 0);
}

/* ---- info --------------------------------------------------------------- */

static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(out, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(out, "\\u%04x", (unsigned char)*s);
    else fputc(*s, out);
  }
  fputc('"', out);
}

static int info_write(FILE *out, bool json);

static int cmd_info(int argc, char **argv) {
  bool json = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = true;
    else if (strcmp(argv[i], "--help") == 0) {
      note_stdout(printf("usage: abtool info [--json]\n") >= 0);
      return 0;
    } else {
      fprintf(stderr, "abtool info: unknown option %s\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  if (!json) return info_write(stdout, false);
  /* JSON goes out whole or not at all: a failure half way through the
   * list (a device that stops answering) leaves stdout empty, not a
   * document cut short, and says why on stderr. */
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  if (out == NULL) {
    fprintf(stderr, "abtool: %s\n", strerror(errno));
    return EXIT_LIB;
  }
  const int rc = info_write(out, true);
  if (fclose(out) != 0) {
    free(text);
    fprintf(stderr, "abtool: %s\n", strerror(errno));
    return EXIT_LIB;
  }
  if (rc == 0) note_stdout(fwrite(text, 1, len, stdout) == len); /* a failed write: main's check of stdout */
  free(text);
  return rc;
}

/* abtool info's report, as text or JSON, to out; 0, or lib_fail's code. */
static int info_write(FILE *out, bool json) {
  if (json) fprintf(out, "{\"version\": \"%s\", \"device_types\": [", ab_version_string());
  else fprintf(out, "arraybridge %s\n", ab_version_string());
  for (size_t k = 0; k < ntypes; k++) {
    const DLDeviceType type = all_types[k];
    const int32_t n = ab_device_count(type);
    char why[512] = "";
    if (n == 0) {
      struct ab_device_info info;
      ab_device_info((DLDevice){type, 0}, &info);
      snprintf(why, sizeof why, "%s", ab_last_error());
    }
    if (json) {
      fprintf(out, "%s{\"type\": \"%s\", \"count\": %d", k ? ", " : "", ab_device_type_name(type), (int)n);
      if (n == 0) {
        fprintf(out, ", \"why_none\": ");
        json_string(out, why);
      }
      fprintf(out, ", \"devices\": [");
    } else {
      fprintf(out, "\n%s: %d device%s%s%s\n", ab_device_type_name(type), (int)n, n == 1 ? "" : "s",
              n ? "" : " -- ", n ? "" : why);
    }
    for (int32_t id = 0; id < n; id++) {
      struct ab_device_info info;
      const DLDevice dev = {type, id};
      if (ab_device_info(dev, &info) != AB_OK) return lib_fail("device_info");
      struct ab_pool_stats ps = {.size = sizeof ps};
      if (ab_pool_stats(dev, &ps) != AB_OK) return lib_fail("pool_stats");
      if (json) {
        fprintf(out, "%s{\"device\": \"%s:%d\", \"name\": ", id ? ", " : "", ab_device_type_name(type), (int)id);
        json_string(out, info.name);
        fprintf(out, ", \"vendor\": ");
        json_string(out, info.vendor);
        fprintf(out, ", \"version\": ");
        json_string(out, info.version);
        fprintf(out,
                ", \"total_memory\": %llu, \"free_memory\": %llu, \"max_alloc_size\": %llu, \"host_accessible\": %s, "
                "\"unified_memory\": %s, \"compute_capability\": %d, \"pci_bus_id\": ",
                (unsigned long long)info.total_memory, (unsigned long long)info.free_memory,
                (unsigned long long)info.max_alloc_size, info.host_accessible ? "true" : "false",
                info.unified_memory ? "true" : "false", info.compute_capability);
        json_string(out, info.pci_bus_id);
        fprintf(out, ", \"pool\": {\"in_use_bytes\": %llu, \"reserved_bytes\": %llu, \"limit_bytes\": %llu}}",
                (unsigned long long)ps.in_use_bytes.current, (unsigned long long)ps.reserved_bytes.current,
                (unsigned long long)ps.limit_bytes);
      } else {
        fprintf(out, "  %s:%d  %s", ab_device_type_name(type), (int)id, info.name);
        if (info.vendor[0]) fprintf(out, " (%s)", info.vendor);
        fprintf(out, "\n");
        if (info.version[0]) fprintf(out, "      %s\n", info.version);
        if (info.total_memory) fprintf(out, "      memory: %.2f GiB total, ", (double)info.total_memory / (1 << 30));
        else fprintf(out, "      memory: total unknown, "); /* 0 is unknown, as free's is */
        if (info.free_memory) fprintf(out, "%.2f GiB free", (double)info.free_memory / (1 << 30));
        else fprintf(out, "free unknown");
        if (info.compute_capability) fprintf(out, ", sm_%d, PCI %s", info.compute_capability, info.pci_bus_id);
        fprintf(out, "%s\n", info.unified_memory ? ", the host's RAM" : "");
        fprintf(out, "      pool: %llu bytes in use, %llu reserved", (unsigned long long)ps.in_use_bytes.current,
                (unsigned long long)ps.reserved_bytes.current);
        if (ps.limit_bytes) fprintf(out, " (limited to %llu)", (unsigned long long)ps.limit_bytes);
        fprintf(out, "\n");
      }
    }
    if (json) fprintf(out, "]}");
  }
  /* The peer matrix, like nvidia-smi topo -m: can the column GPU read the
   * row GPU's memory directly? In JSON, one entry per ordered pair. */
  const int32_t ngpu = ab_device_count(kDLCUDA);
  int pairs = 0;
  if (json) fprintf(out, "], \"cuda_peer_access\": [");
  else if (ngpu > 1) {
    fprintf(out, "\nCUDA peer access (row -> column; P2P = direct, - = through the host):\n%8s", "");
    for (int32_t j = 0; j < ngpu; j++) fprintf(out, " cuda:%-3d", (int)j);
    fprintf(out, "\n");
  }
  for (int32_t i = 0; i < ngpu && ngpu > 1; i++) {
    if (!json) fprintf(out, " cuda:%-2d", (int)i);
    for (int32_t j = 0; j < ngpu; j++) {
      int can = 0;
      if (i != j && ab_peer_access((DLDevice){kDLCUDA, i}, (DLDevice){kDLCUDA, j}, &can) != AB_OK)
        return lib_fail("peer");
      if (!json) fprintf(out, " %-8s", i == j ? "X" : can ? "P2P" : "-");
      else if (i != j)
        fprintf(out, "%s{\"from\": \"cuda:%d\", \"to\": \"cuda:%d\", \"p2p\": %s}", pairs++ ? ", " : "", (int)i,
                (int)j, can ? "true" : "false");
    }
    if (!json) fprintf(out, "\n");
  }
  if (json) fprintf(out, "]}\n");
  else if (ngpu > 1) fprintf(out, "Peer access is enabled per pair on first use (AB_CUDA_PEER=0 keeps it off).\n");
  return 0;
}

/* ---- bandwidth ------------------------------------------------------------ */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The whole of `s` as a finite decimal number (a '-' in front, no blanks,
 * '+' or hex, as parse_long); -1 when it is not one (atof would take "abc"
 * as 0 and "2x" as 2). Past double's range is infinite, so refused; a
 * subnormal (strtod's ERANGE too) is taken. */
static int parse_double(const char *s, double *out) {
  char *end;
  const char *digits = s[0] == '-' ? s + 1 : s;
  if (!isdigit((unsigned char)digits[0]) && !(digits[0] == '.' && isdigit((unsigned char)digits[1]))) return -1;
  if (digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) return -1;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

/* The whole of `s` as a decimal integer in [lo, hi]; -1 otherwise. */
static int parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  const char *digits = s[0] == '-' && lo < 0 ? s + 1 : s; /* no blanks or '+', which strtol would take */
  if (!isdigit((unsigned char)digits[0])) return -1;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Says so where `arg`, an argument no option took, is one of the options
 * in `valued` given last, without its value. */
static bool missing_value(const char *cmd, const char *arg, const char *const *valued) {
  for (; *valued != NULL; valued++)
    if (strcmp(arg, *valued) == 0) {
      fprintf(stderr, "abtool %s: %s needs a value\n", cmd, arg);
      return true;
    }
  return false;
}

/* A comma-separated option value copied into buf for strtok, read as
 * AB_MEMORY_LIMIT is: a comma at either end is ignored, an empty entry
 * between two is a mistake (strtok would skip it), and so is a list too
 * long for buf (it would be cut). false after saying why. */
static bool list_ok(const char *cmd, const char *opt, const char *list, char *buf, size_t len) {
  const size_t n = strlen(list);
  if (n >= len) {
    fprintf(stderr, "abtool %s: %s is longer than %zu characters\n", cmd, opt, len - 1);
    return false;
  }
  for (size_t k = 0; k + 1 < n; k++)
    if (list[k] == ',' && list[k + 1] == ',') {
      fprintf(stderr, "abtool %s: %s \"%s\" has an empty entry\n", cmd, opt, list);
      return false;
    }
  memcpy(buf, list, n + 1);
  return true;
}

/* "opencl:1": the name of dev as --devices takes it. */
static void dev_name(char *buf, size_t len, DLDevice dev) {
  snprintf(buf, len, "%s:%d", ab_device_type_name(dev.device_type), (int)dev.device_id);
}

/* --sizes into sizes[16]: *n of them, or -1 after saying why. */
static int parse_sizes(const char *list, size_t *sizes, int *n) {
  char buf[1024];
  *n = 0;
  if (!list_ok("bandwidth", "--sizes", list, buf, sizeof buf)) return -1;
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (*n == 16) {
      fprintf(stderr, "abtool bandwidth: --sizes has more than 16 sizes\n");
      return -1;
    }
    /* read as the library reads AB_MEMORY_LIMIT's sizes */
    uint64_t v = 0;
    const bool parsed = ab_parse_size(tok, &v) == AB_OK;
    if (!parsed || v == 0 || v > SIZE_MAX) {
      if (parsed && v > SIZE_MAX)
        fprintf(stderr, "abtool bandwidth: size \"%s\" is larger than this build's memory can hold\n", tok);
      else
        fprintf(stderr, "abtool bandwidth: bad size \"%s\" (like 4K, 1MiB, 64M, 2GB: AB_MEMORY_LIMIT's units)\n",
                tok);
      return -1;
    }
    sizes[(*n)++] = (size_t)v;
  }
  if (*n == 0) { /* "," or "": nothing to measure is a mistake, not a run */
    fprintf(stderr, "abtool bandwidth: --sizes \"%s\" names no size\n", list);
    return -1;
  }
  return 0;
}

/* --devices into devs[MAX_TABLE], each checked present and able to hold a
 * tensor (not staging memory, say) before the table starts; without a
 * list, every device present but managed memory, the first MAX_TABLE of
 * them (saying so where there are more). 0, or an exit code after saying
 * why. */
#define MAX_TABLE 64
static int parse_devices(const char *list, DLDevice *devs, int *n) {
  *n = 0;
  if (list == NULL) {
    int present = 0;
    for (size_t k = 0; k < ntypes; k++)
      for (int32_t i = 0; i < ab_device_count(all_types[k]); i++)
        if (all_types[k] != kDLCUDAManaged && present++ < MAX_TABLE) devs[(*n)++] = (DLDevice){all_types[k], i};
    if (present > MAX_TABLE)
      fprintf(stderr, "abtool bandwidth: %d devices present; the table takes the first %d (to %s:%d): name others with --devices\n",
              present, MAX_TABLE, ab_device_type_name(devs[MAX_TABLE - 1].device_type), (int)devs[MAX_TABLE - 1].device_id);
    return 0;
  }
  char buf[1024];
  if (!list_ok("bandwidth", "--devices", list, buf, sizeof buf)) return EXIT_USAGE;
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (*n == MAX_TABLE || ab_parse_device(tok, &devs[*n]) != AB_OK) {
      fprintf(stderr, "abtool bandwidth: %s\n", *n == MAX_TABLE ? "--devices names more than 64 devices" : ab_last_error());
      return EXIT_USAGE;
    }
    if (devs[*n].device_id == AB_DEVICE_AUTO) { /* a table needs the device each row is */
      fprintf(stderr, "abtool bandwidth: --devices %s: name a device id (%s:0, ...), not auto\n", tok,
              ab_device_type_name(devs[*n].device_type));
      return EXIT_USAGE;
    }
    DLManagedTensorVersioned *probe;
    if (ab_tensor_alloc(devs[*n], 1, (int64_t[]){1}, (DLDataType){kDLUInt, 8, 1}, &probe) != AB_OK)
      return lib_fail(tok);
    probe->deleter(probe);
    (*n)++;
  }
  if (*n == 0) { /* "," or "": as for --sizes */
    fprintf(stderr, "abtool bandwidth: --devices \"%s\" names no device\n", list);
    return EXIT_USAGE;
  }
  return 0;
}

/* The median seconds of reps memcpy calls from a to b (n bytes), after
 * one warm-up, as for the conversions. */
static double memcpy_median(char *b, const char *a, size_t n, int reps) {
  double t[1000];
  memcpy(b, a, n);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    memcpy(b, a, n);
    t[r] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  return t[reps / 2];
}

/* One row of the table: host's bytes, put on `from`, copied to every
 * device (median of reps after a warm-up). 0, or lib_fail's code. */
static int bandwidth_row(const DLTensor *host, DLDevice from, const DLDevice *devs, int ndevs, int reps,
                         bool progress) {
  char name[32];
  dev_name(name, sizeof name, from);
  printf("%14s", name);
  /* The source holds data: memory never written would be read from the
   * kernel's zero page on the host, from the cache, faster than the
   * memcpy baseline reads its own. */
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  DLManagedTensorVersioned *src;
  if (ab_convert_memory(host, from, &o, &src) != AB_OK) return lib_fail(name);
  for (int j = 0; j < ndevs; j++) {
    if (progress) fprintf(stderr, "\r[%s -> %d/%d]", name, j + 1, ndevs);
    double t[1000];
    for (int r = 0; r <= reps; r++) {
      DLManagedTensorVersioned *dst;
      double t0 = now();
      ab_status st = ab_convert_memory(&src->dl_tensor, devs[j], &o, &dst);
      double dt = now() - t0;
      if (st != AB_OK) {
        src->deleter(src);
        return lib_fail("convert");
      }
      dst->deleter(dst);
      if (r > 0) t[r - 1] = dt; /* the first is a warm-up */
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    const size_t n = (size_t)host->shape[0];
    printf(" %9.2f (%6.1f)", (double)n / t[reps / 2] / 1e9, t[reps / 2] * 1e6);
    fflush(stdout);
  }
  if (progress) fprintf(stderr, "\r%*s\r", 40, "");
  printf("\n");
  src->deleter(src);
  return 0;
}

static int cmd_bandwidth(int argc, char **argv) {
  size_t sizes[16];
  int nsizes = 0, reps = 5;
  DLDevice devs[MAX_TABLE];
  int ndevs = 0;
  const char *size_list = "4K,1M,64M", *dev_list = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) size_list = argv[++i];
    else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc) dev_list = argv[++i];
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      long v;
      if (parse_long(argv[++i], 1, 1000, &v) != 0) {
        fprintf(stderr, "abtool bandwidth: --reps must be 1..1000, not \"%s\"\n", argv[i]);
        return EXIT_USAGE;
      }
      reps = (int)v;
    } else if (strcmp(argv[i], "--help") == 0) {
      note_stdout(printf("usage: abtool bandwidth [--sizes 4K,1M,64M] [--devices cpu,opencl:0,...] [--reps N]\n"
                         "Every ordered pair of the devices (default: all present, plus cuda_host when CUDA is "
                         "there;\n"
                         "cuda_managed only when named), median of N copies each (default 5), beside memcpy of the\n"
                         "same size on one thread.\n") >= 0);
      return 0;
    } else {
      static const char *const valued[] = {"--sizes", "--devices", "--reps", NULL};
      if (!missing_value("bandwidth", argv[i], valued)) fprintf(stderr, "abtool bandwidth: unknown option %s\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  if (parse_sizes(size_list, sizes, &nsizes) != 0) return EXIT_USAGE;
  int rc = parse_devices(dev_list, devs, &ndevs);
  if (rc != 0) return rc;
  /* Progress on stderr when stdout goes to a file and stderr to a terminal. */
  const bool progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO); /* a terminal shows the rows grow */
  for (int s = 0; s < nsizes && rc == 0; s++) {
    const size_t n = sizes[s];
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
      free(a);
      free(b);
      fprintf(stderr, "abtool bandwidth: out of host memory for %zu bytes\n", n);
      return EXIT_LIB;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    const double memcpy_s = memcpy_median(b, a, n, reps);
    free(b);
    printf("\n%zu bytes: GB/s (latency us) from row to column; memcpy %.2f GB/s (%.1f us)\n", n,
           (double)n / memcpy_s / 1e9, memcpy_s * 1e6);
    printf("%14s", "");
    for (int j = 0; j < ndevs; j++) {
      char name[32];
      dev_name(name, sizeof name, devs[j]);
      printf(" %18s", name);
    }
    printf("\n");
    int64_t shape[1] = {(int64_t)n};
    const DLTensor host = {a, {kDLCPU, 0}, 1, {kDLUInt, 8, 1}, shape, NULL, 0};
    for (int i = 0; i < ndevs && rc == 0; i++) rc = bandwidth_row(&host, devs[i], devs, ndevs, reps, progress);
    free(a);
  }
  return rc;
}

/* ---- convert ------------------------------------------------------------------ */

/* The whole of a file, or NULL with errno set. A regular file is read
 * into a buffer of its size; anything else (a pipe, /dev/zero) in growing
 * pieces, only while it starts as a .npy file does, and no further than
 * one byte past the size its header gives, or than a header the parser
 * refuses (which it then says: an endless stream is not read for ever). */
static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  struct stat st;
  const bool regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
  size_t cap = regular && (uintmax_t)st.st_size < SIZE_MAX ? (size_t)st.st_size + 1 : (size_t)1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  int e = buf == NULL ? ENOMEM : 0;
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap || (n >= 6 && memcmp(buf, "\x93NUMPY", 6) != 0)) break; /* the parser says why not */
    uint64_t total;
    const int sized = npy_file_size(buf, n, &total);
    if (sized < 0 || (sized == 0 && n > total)) break; /* a bad header, or past its end: the parser says so */
    uint8_t *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
    if (bigger == NULL) {
      free(buf);
      buf = NULL;
      e = ENOMEM;
      break;
    }
    buf = bigger;
    cap *= 2;
  }
  if (e == 0 && ferror(f)) e = errno != 0 ? errno : EIO;
  fclose(f);
  if (e != 0) {
    free(buf);
    errno = e; /* after fclose, which may set it */
    return NULL;
  }
  *len = n;
  return buf;
}

/* --permute as an order of ndim axes into perm; false after saying why. */
static bool parse_permute(const char *list, int32_t ndim, int32_t *perm) {
  char tmp[256];
  if (!list_ok("convert", "--permute", list, tmp, sizeof tmp)) return false;
  bool seen[NPY_MAX_NDIM] = {false}, ok = true;
  int n = 0;
  for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ",")) {
    long v;
    if (n == ndim || parse_long(tok, 0, ndim - 1, &v) != 0 || seen[v]) {
      ok = false;
      break;
    }
    seen[v] = true;
    perm[n++] = (int32_t)v;
  }
  if (ok && n == ndim) return true;
  if (ndim == 0)
    fprintf(stderr, "abtool convert: --permute \"%s\": the array is 0-d, it has no axes to order\n", list);
  else
    fprintf(stderr, "abtool convert: --permute \"%s\" is not an order of the %d axes (each of 0..%d once)\n", list,
            (int)ndim, (int)ndim - 1);
  return false;
}

static int cmd_convert(int argc, char **argv) {
  const char *in = NULL, *to = NULL, *outp = NULL, *dtype_s = NULL, *perm_s = NULL;
  double scale = 1, offset = 0;
  int affine = 0, explain = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      note_stdout(printf("usage: abtool convert IN.npy --to DEVICE [--dtype T] [--permute 2,0,1] [--scale S] "
                         "[--offset O] [--explain] --out OUT.npy\n"
                         "Reads IN.npy, moves it to DEVICE with ab_convert_memory (casting to T, permuting the "
                         "axes, and\n"
                         "applying y = x * S + O on the way), brings it back to the host and writes OUT.npy.\n"
                         "--explain first prints the plan of the move (ab_explain_convert): its steps, and where the\n"
                         "conversion runs.\n") >= 0);
      return 0;
    } else if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) to = argv[++i];
    else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) outp = argv[++i];
    else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) dtype_s = argv[++i];
    else if (strcmp(argv[i], "--permute") == 0 && i + 1 < argc) perm_s = argv[++i];
    else if ((strcmp(argv[i], "--scale") == 0 || strcmp(argv[i], "--offset") == 0) && i + 1 < argc) {
      const char *opt = argv[i++];
      if (parse_double(argv[i], strcmp(opt, "--scale") == 0 ? &scale : &offset) != 0) {
        fprintf(stderr, "abtool convert: %s needs a finite number, not \"%s\"\n", opt, argv[i]);
        return EXIT_USAGE;
      }
      affine = 1;
    } else if (strcmp(argv[i], "--explain") == 0) explain = 1;
    else if (argv[i][0] != '-' && in == NULL) in = argv[i];
    else {
      static const char *const valued[] = {"--to", "--out", "--dtype", "--permute", "--scale", "--offset", NULL};
      if (!missing_value("convert", argv[i], valued))
        fprintf(stderr, "abtool convert: unexpected argument %s (see abtool convert --help)\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  if (in == NULL || to == NULL || outp == NULL) {
    fprintf(stderr, "abtool convert: IN.npy, --to and --out are required (see abtool convert --help)\n");
    return EXIT_USAGE;
  }
  DLDevice dev;
  if (ab_parse_device(to, &dev) != AB_OK) {
    fprintf(stderr, "abtool convert: --to: %s\n", ab_last_error());
    return EXIT_USAGE;
  }
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  if (dtype_s && ab_parse_dtype(dtype_s, &o.dtype) != AB_OK) {
    fprintf(stderr, "abtool convert: unknown --dtype %s\n", dtype_s);
    return EXIT_USAGE;
  }
  if (dtype_s && npy_descr(o.dtype) == NULL) { /* refused before any work, not after it */
    fprintf(stderr, "abtool convert: --dtype %s: a .npy file cannot hold it, so OUT.npy could not be written\n",
            dtype_s);
    return EXIT_USAGE;
  }
  size_t len;
  uint8_t *buf = read_file(in, &len);
  if (buf == NULL) {
    fprintf(stderr, "abtool convert: cannot read %s: %s\n", in, strerror(errno));
    return EXIT_FILE;
  }
  npy_array a;
  char err[256];
  if (npy_parse(buf, len, &a, err, sizeof err) != 0) {
    fprintf(stderr, "abtool convert: %s: %s\n", in, err);
    free(buf);
    return EXIT_FILE;
  }
  if (a.swapped) npy_swap_bytes(buf + (a.data - buf), a.nbytes, a.dtype); /* into the host's order */
  int32_t perm[NPY_MAX_NDIM];
  if (perm_s) {
    if (!parse_permute(perm_s, a.ndim, perm)) {
      free(buf);
      return EXIT_USAGE;
    }
    o.permute = perm;
  }
  if (affine) {
    o.flags |= AB_CONVERT_AFFINE;
    o.scale = scale;
    o.offset = offset;
  }
  DLTensor src = {(void *)a.data, {kDLCPU, 0}, a.ndim, a.dtype, a.shape, a.strides, 0};
  DLManagedTensorVersioned *there, *back;
  if (explain) {
    char plan[2048];
    if (ab_explain_convert(&src, dev, &o, plan, sizeof plan) != AB_OK) {
      free(buf);
      return lib_fail(to);
    }
    fputs(plan, stdout);
  }
  if (ab_convert_memory(&src, dev, &o, &there) != AB_OK) {
    free(buf);
    return lib_fail(to);
  }
  ab_convert_opts plain = AB_CONVERT_OPTS_INIT;
  ab_status st = ab_convert_memory(&there->dl_tensor, (DLDevice){kDLCPU, 0}, &plain, &back);
  if (st != AB_OK) {
    there->deleter(there);
    free(buf);
    return lib_fail("back to cpu");
  }
  /* On the host, back is a view of there, and there (with nothing to
   * change) a view of src, so of buf (the file's bytes): both are let go
   * only once the result is written. */
  int rc = npy_write(outp, &back->dl_tensor, err, sizeof err);
  back->deleter(back);
  there->deleter(there);
  free(buf);
  if (rc != 0) {
    fprintf(stderr, "abtool convert: %s\n", err);
    return EXIT_FILE;
  }
  return 0;
}

/* rc, or EXIT_FILE where rc is a success whose output did not reach its
 * reader (a full disk, a closed pipe's EPIPE with SIGPIPE ignored). */
static int stdout_checked(int rc) {
  /* errno is the flush's, else a failed write's that was noted; another
   * write that failed earlier (a large block written straight through)
   * left only the error flag, and its errno is long gone */
  const int e = fflush(stdout) != 0 ? errno : stdout_errno;
  if (e != 0 || ferror(stdout)) {
    fprintf(stderr, "abtool: writing to standard output: %s\n", e != 0 ? strerror(e) : "a write failed");
    if (rc == 0) rc = EXIT_FILE;
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  char *one_help[4] = {argv[0], NULL, "--help", NULL};
  if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    if (argc == 2) {
      usage(stdout);
      return stdout_checked(0);
    }
    /* `abtool help convert`: that command's own --help; anything else is
     * a mistake, said as one (not the general text and success). */
    const bool known = strcmp(argv[2], "info") == 0 || strcmp(argv[2], "bandwidth") == 0 ||
                       strcmp(argv[2], "convert") == 0;
    if (!known || argc > 3) {
      fprintf(stderr, "abtool %s: takes nothing or one command's name (info, bandwidth, convert), not \"%s\"\n",
              argv[1], known ? argv[3] : argv[2]);
      return EXIT_USAGE;
    }
    one_help[1] = argv[2];
    argc = 3;
    argv = one_help;
  }
  int rc;
  const int n = ab_device_types(all_types, (int)(sizeof all_types / sizeof all_types[0]));
  ntypes = (size_t)n < sizeof all_types / sizeof all_types[0] ? (size_t)n : sizeof all_types / sizeof all_types[0];
  if (strcmp(argv[1], "info") == 0) rc = cmd_info(argc - 2, argv + 2);
  else if (strcmp(argv[1], "bandwidth") == 0) rc = cmd_bandwidth(argc - 2, argv + 2);
  else if (strcmp(argv[1], "convert") == 0) rc = cmd_convert(argc - 2, argv + 2);
  else {
    fprintf(stderr, "abtool: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
  }
  ab_shutdown();
  return stdout_checked(rc);
}
