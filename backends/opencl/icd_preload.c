/* Loads the OpenCL drivers (ICDs) before the ICD loader does, each with
 * RTLD_DEEPBIND, so that a driver's own dependencies resolve to themselves.
 *
 * Why: PoCL links LLVM and clang (libclang-cpp, libLLVM). When a process
 * already holds another LLVM with global symbols (TensorFlow's
 * libtensorflow_framework.so.2 is loaded RTLD_GLOBAL), the ICD loader's plain
 * dlopen of libpocl binds the static initialisers of libclang-cpp to that
 * other LLVM's llvm::cl::Option, and the process dies with SIGSEGV inside
 * clGetPlatformIDs. A library loaded with RTLD_DEEPBIND looks up symbols in
 * its own dependency tree before the global scope, so the driver's LLVM is
 * the one its clang uses. The loader's later dlopen of the same file returns
 * the handle made here (already relocated), and so does the dlopen of any
 * other ICD loader in the process (pyclesperanto ships its own).
 *
 * The handles are never closed: the drivers stay for the process's life,
 * as they would through the ICD loader. AB_OPENCL_DEEPBIND=0 (or off,
 * false, no) turns this off. Sanitizer runtimes refuse RTLD_DEEPBIND (they
 * abort the process), so sanitized builds skip it, and so does a process
 * where a sanitizer runtime was loaded some other way (LD_PRELOAD), or where
 * malloc is not libc's (see allocator_replaced) unless AB_OPENCL_DEEPBIND
 * is set to 1. In that last case, a driver not yet loaded when another
 * LLVM is in the global scope can be opened neither way without a crash:
 * ab__opencl_preload_check refuses the backend's start instead. */
#define _GNU_SOURCE 1
#include "backends/opencl/icd_preload.h"

#include <dirent.h>
#include <dlfcn.h>
#ifdef __GLIBC__
#include <gnu/lib-names.h> /* LIBC_SO */
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AB_NO_DEEPBIND 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define AB_NO_DEEPBIND 1
#endif
#endif

#if defined(RTLD_DEEPBIND) && !defined(AB_NO_DEEPBIND)

static atomic_int preloaded; /* drivers loaded here */

static void preload(const char *lib, void *arg) {
  (void)arg;
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == NULL) {
    /* Not ours to judge: the ICD loader will try and report it itself. */
    const char *why = dlerror();
    AB_LOG(AB_LOG_DEBUG, "OpenCL driver %s not preloaded: %s", lib, why ? why : "dlopen failed");
    return;
  }
  atomic_fetch_add(&preloaded, 1);
  AB_LOG(AB_LOG_DEBUG, "OpenCL driver %s preloaded with RTLD_DEEPBIND", lib);
}

/* An .icd file holds the driver library's name (or path) on its first line. */
static void each_icd(const char *path, void (*fn)(const char *lib, void *arg), void *arg) {
  char line[4096];
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  if (fgets(line, sizeof line, f) != NULL) {
    size_t n = strcspn(line, "\r\n");
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t')) n--;
    line[n] = '\0';
    if (n > 0) fn(line, arg);
  }
  fclose(f);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void each_icd_in(const char *dir, void (*fn)(const char *lib, void *arg), void *arg) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[4096];
    if (!ends_with(e->d_name, ".icd")) continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    each_icd(path, fn, arg);
  }
  closedir(d);
}

/* AB_OPENCL_DEEPBIND: 1 or 0 when set, -1 (the library decides) when not. */
static int deepbind_setting(void) {
  static const struct ab__env_choice modes[] = {{"1", 1},     {"on", 1},  {"true", 1}, {"yes", 1}, {"0", 0},
                                                {"off", 0},   {"false", 0}, {"no", 0},  {NULL, 0}};
  return ab__env_choice("AB_OPENCL_DEEPBIND", modes, -1, "1 (on, true, yes) or 0 (off, false, no)");
}

/* A sanitizer runtime in the process (a sanitized program, or one
 * LD_PRELOADed under a Python that is not): it aborts on RTLD_DEEPBIND. */
static bool sanitizer_present(void) {
  static const char *const inits[] = {"__asan_init", "__tsan_init", "__msan_init", "__hwasan_init"};
  for (size_t k = 0; k < sizeof inits / sizeof *inits; k++)
    if (dlsym(RTLD_DEFAULT, inits[k]) != NULL) return true;
  return false;
}

/* A malloc other than libc's serves the process: jemalloc, tcmalloc or
 * mimalloc linked into the program or LD_PRELOADed, as is common under ML
 * frameworks. A driver opened with RTLD_DEEPBIND binds its dependencies'
 * malloc and free to libc's own, which then frees blocks the replacement
 * handed out: PoCL's initialisers abort the process ("munmap_chunk():
 * invalid pointer"). So where any of the four is not libc's, the drivers
 * are left to the ICD loader. Where libc cannot be asked, the same. */
static bool allocator_replaced(void) {
#ifdef LIBC_SO
  static const char *const names[] = {"malloc", "free", "calloc", "realloc"};
  void *libc = dlopen(LIBC_SO, RTLD_LAZY | RTLD_NOLOAD);
  if (libc == NULL) return true;
  bool replaced = false;
  for (size_t k = 0; k < sizeof names / sizeof *names && !replaced; k++)
    replaced = dlsym(RTLD_DEFAULT, names[k]) != dlsym(libc, names[k]);
  dlclose(libc);
  return replaced;
#else
  return true;
#endif
}

/* The drivers the ICD loaders (ocl-icd and Khronos') would load, as
 * ocl-icd's libOpenCL(7) describes: the libraries of OCL_ICD_FILENAMES
 * (':'-separated), and besides them OCL_ICD_VENDORS when set (a directory
 * of .icd files; an .icd file, a bare name looked up in the vendors
 * directory first; else a library), else the .icd files of the vendors
 * directory ($OPENCL_VENDOR_PATH, else /etc/OpenCL/vendors). */
static void each_driver(void (*fn)(const char *lib, void *arg), void *arg) {
  const char *files = getenv("OCL_ICD_FILENAMES");
  if (files != NULL && *files != '\0') {
    char *copy = strdup(files), *save = NULL;
    if (copy != NULL)
      for (char *lib = strtok_r(copy, ":", &save); lib != NULL; lib = strtok_r(NULL, ":", &save)) fn(lib, arg);
    free(copy);
  }
  const char *dir = getenv("OPENCL_VENDOR_PATH");
  if (dir == NULL || *dir == '\0') dir = "/etc/OpenCL/vendors";
  const char *vendors = getenv("OCL_ICD_VENDORS");
  struct stat sb;
  char path[4096];
  if (vendors == NULL || *vendors == '\0') each_icd_in(dir, fn, arg);
  else if (stat(vendors, &sb) == 0 && S_ISDIR(sb.st_mode)) each_icd_in(vendors, fn, arg);
  else if (ends_with(vendors, ".icd")) {
    if (strchr(vendors, '/') == NULL && snprintf(path, sizeof path, "%s/%s", dir, vendors) < (int)sizeof path &&
        stat(path, &sb) == 0)
      each_icd(path, fn, arg);
    else
      each_icd(vendors, fn, arg);
  } else
    fn(vendors, arg);
}

static void preload_all(void) {
  int setting = deepbind_setting();
  if (setting == 0) return;
  if (sanitizer_present()) {
    AB_LOG(AB_LOG_DEBUG, "a sanitizer runtime is loaded: OpenCL drivers are not preloaded with RTLD_DEEPBIND");
    return;
  }
  if (setting < 0 && allocator_replaced()) {
    AB_LOG(AB_LOG_DEBUG, "malloc is not libc's (a replacement allocator is linked or preloaded): OpenCL drivers "
                         "are not preloaded with RTLD_DEEPBIND");
    return;
  }
  each_driver(preload, NULL);
  AB_LOG(AB_LOG_DEBUG, "%d OpenCL driver(s) preloaded with RTLD_DEEPBIND", atomic_load(&preloaded));
}

/* Whether a driver library named by an .icd file is there to be opened:
 * a path as it is; a bare name in LD_LIBRARY_PATH's folders, libc's
 * folder (the distribution's library folder) and the usual ones. An entry
 * of a driver not installed (a stale .icd file) is not: the ICD loader
 * skips it, and it cannot crash anything. */
static bool in_folder(const char *dir, size_t n, const char *lib) {
  char path[4096];
  struct stat sb;
  return n > 0 && snprintf(path, sizeof path, "%.*s/%s", (int)n, dir, lib) < (int)sizeof path && stat(path, &sb) == 0;
}

static bool library_exists(const char *lib) {
  struct stat sb;
  if (strchr(lib, '/') != NULL) return stat(lib, &sb) == 0;
  const char *paths = getenv("LD_LIBRARY_PATH");
  for (const char *p = paths; p != NULL && *p != '\0';) {
    const size_t n = strcspn(p, ":");
    if (in_folder(p, n, lib)) return true;
    p += n + (p[n] == ':');
  }
  Dl_info info;
  if (dladdr((void *)&fopen, &info) != 0 && info.dli_fname != NULL) { /* where libc is: /lib/<triplet> */
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash != NULL && in_folder(info.dli_fname, (size_t)(slash - info.dli_fname), lib)) return true;
  }
  static const char *const usual[] = {"/lib", "/usr/lib", "/usr/local/lib", "/lib64", "/usr/lib64"};
  for (size_t k = 0; k < sizeof usual / sizeof *usual; k++)
    if (in_folder(usual[k], strlen(usual[k]), lib)) return true;
  return false;
}

static void count_unloaded(const char *lib, void *arg) {
  void *h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (h != NULL) dlclose(h);
  else if (library_exists(lib)) ++*(int *)arg;
}

/* A symbol every LLVM defines, which PoCL's clang binds to at load. */
#define LLVM_OPTION_SYMBOL "_ZN4llvm2cl6Option11addArgumentEv"

ab_status ab__opencl_preload_check(void) {
  if (atomic_load(&preloaded) > 0 || deepbind_setting() >= 0 || sanitizer_present() || !allocator_replaced() ||
      dlsym(RTLD_DEFAULT, LLVM_OPTION_SYMBOL) == NULL)
    return AB_OK;
  int unloaded = 0;
  each_driver(count_unloaded, &unloaded);
  if (unloaded == 0) return AB_OK;
  /* Short: backend_why keeps 255 bytes. */
  return AB_FAIL(AB_ERR_NO_DEVICE,
                 "OpenCL drivers not opened: malloc is not libc's (jemalloc, tcmalloc...) and another LLVM "
                 "(TensorFlow's?) is loaded: opening PoCL now would crash. Use OpenCL or import pyclesperanto "
                 "first; AB_OPENCL_DEEPBIND=0 opens them at that risk");
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

void ab__opencl_preload_icds(void) { pthread_once(&once, preload_all); }

#else

void ab__opencl_preload_icds(void) {}
ab_status ab__opencl_preload_check(void) { return AB_OK; }

#endif
