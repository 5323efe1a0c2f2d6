/* The host backend: kDLCPU, device 0 only. Memory comes from the library's
 * allocation hook, copies from the host strided gather. */
#define _DEFAULT_SOURCE 1 /* madvise, MADV_HUGEPAGE */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "backend.h"
#include "converters/host/convert.h"
#include "converters/host/gather.h"
#include "parallel.h"

static int32_t host_count(void) { return 1; }

/* The CPU's model name ("host CPU" where /proc/cpuinfo has none) and
 * vendor ("GenuineIntel", "AuthenticAMD"; "" where it has no vendor_id,
 * as on ARM), from the first processor's lines of /proc/cpuinfo. */
static void cpu_strings(char *name, size_t name_len, char *vendor, size_t vendor_len) {
  snprintf(name, name_len, "host CPU");
  vendor[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[256];
  bool have_name = false, have_vendor = false;
  while ((!have_name || !have_vendor) && fgets(line, sizeof line, f) != NULL) {
    char *colon = strchr(line, ':');
    if (colon == NULL) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = '\0';
    if (!have_name && strncmp(line, "model name", 10) == 0 && *colon != '\0') {
      snprintf(name, name_len, "%s", colon);
      have_name = true;
    } else if (!have_vendor && strncmp(line, "vendor_id", 9) == 0) {
      snprintf(vendor, vendor_len, "%s", colon);
      have_vendor = true;
    }
  }
  fclose(f);
}

/* MemAvailable from /proc/meminfo (what could be allocated without
 * swapping), else the kernel's free page count. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f != NULL) {
    char line[128];
    unsigned long long kib;
    while (fgets(line, sizeof line, f) != NULL) {
      if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        fclose(f);
        return (uint64_t)kib * 1024u;
      }
    }
    fclose(f);
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

static ab_status host_info(int32_t id, struct ab_device_info *out) {
  (void)id;
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  cpu_strings(out->name, sizeof out->name, out->vendor, sizeof out->vendor);
  out->total_memory = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
  out->free_memory = mem_available();
  out->unified_memory = 1;
  /* What the host moves run with (abtool info prints it): the SIMD kernels
   * this CPU gets, the threads, and how large transposes of 1, 2, 4, 8 and
   * 16-byte elements write: p(lain), s(treamed), b(locked), or a(uto) until
   * measured at the first large transpose of that size with rows on cache
   * lines (each kind of rows is measured when first needed). The letter is
   * the choice for rows on cache lines from memory; the other kinds of
   * rows, and transposes that fit the last-level cache, have their own
   * (gather.c, "the store variant"). */
  char m[5];
  for (int i = 0; i < 5; i++) m[i] = ab__host_transpose_mode_name(ab__host_transpose_mode_known((size_t)1 << i))[0];
  snprintf(out->version, sizeof out->version, "kernels: %s%s; %d threads; stores 1-16B: %c/%c/%c/%c/%c",
           ab__host_tiles(), ab__host_f16c() ? " f16c" : "", ab__num_threads(), m[0], m[1], m[2], m[3], m[4]);
  return AB_OK;
}

/* Blocks of HUGE_MIN bytes and more start on a 2 MiB boundary and are
 * offered to the kernel for transparent huge pages (MADV_HUGEPAGE: used
 * where /sys/kernel/mm/transparent_hugepage/enabled says madvise or
 * always, ignored where it says never). A large transpose's output is
 * written a few lines per row over thousands of rows, and with 4 KiB
 * pages every row is a TLB miss: on the AMD EPYC VM a 4096^2 float32
 * transpose into such a block ran 15.4-17.1 GB/s against 12.1-12.6,
 * uint8 14.5-15.2 against 11.7-13.4, float64 14.3-14.4 against 12.2-13.2
 * (bench/results/2026-11-25-amd-blocked.md); first touches fault 2 MiB
 * at a time too. AB_HOST_HUGEPAGES=0 turns it off. */
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

bool ab__host_hugepages(void) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static ab__env_cache cache;
  return ab__env_switch(&cache, "AB_HOST_HUGEPAGES", 1);
#else
  return false;
#endif
}

static ab_status host_alloc(int32_t id, size_t bytes, void **out) {
  (void)id;
  /* Large blocks are page-aligned. posix_memalign(256) puts them 256 bytes
   * into a page, and copies between such a block and a page-aligned buffer
   * (a driver's, another library's) then hit 4K aliasing: PoCL's 512 MiB
   * read ran at 3.5 GB/s into it against 11 GB/s into a page-aligned one
   * (bench/results/2026-11-22-opencl.md). */
  size_t align = bytes >= ((size_t)64 << 10) ? (size_t)4096 : AB_ALIGNMENT;
  const bool huge = bytes >= HUGE_MIN && ab__host_hugepages();
  if (huge) align = HUGE_PAGE;
  void *p = ab__aligned_alloc(align, bytes);
  if (p == NULL) return AB_FAIL(AB_ERR_OUT_OF_MEMORY, "cpu:0: cannot allocate %zu bytes of host memory", bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) (void)madvise(p, bytes & ~(HUGE_PAGE - 1), MADV_HUGEPAGE); /* advice: a refusal changes nothing */
#endif
  *out = p;
  return AB_OK;
}

static void host_free(int32_t id, void *ptr, size_t bytes) {
  (void)id;
  (void)bytes;
  ab__free(ptr);
}

static ab_status host_copy(const DLTensor *from, DLTensor *to, void *stream, bool async) {
  int64_t st[AB_MAX_NDIM];
  const size_t es = ab__elsize(from->dtype);
  (void)stream, (void)async; /* host copies are done when they return */
  int64_t acc = 1;
  for (int32_t i = from->ndim - 1; i >= 0; i--) {
    int64_t elems = from->strides ? from->strides[i] : acc;
    /* A size-1 dim may carry any stride, even one that overflows in bytes;
     * it addresses nothing, so its byte stride is 0. Others were validated. */
    st[i] = from->shape[i] == 1 ? 0 : elems * (int64_t)es;
    if (!from->strides) acc *= from->shape[i];
  }
  const ab__host_job job = {(char *)to->data + to->byte_offset, (const char *)from->data + from->byte_offset,
                            from->ndim, from->shape, st, es, NULL, 0};
  ab__host_run(&job); /* on all cores when large */
  return AB_OK;
}

const struct ab_backend ab__backend_host = {
  .device_type = kDLCPU,
  .name = "host",
  .caps = AB_CAP_HOST_ACCESSIBLE,
  .init = NULL,
  .shutdown = NULL,
  .device_count = host_count,
  .device_info = host_info,
  .alloc = host_alloc,
  .free = host_free,
  .copy = host_copy,
};
