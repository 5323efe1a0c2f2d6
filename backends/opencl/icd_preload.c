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
 * where a sanitizer runtime was loaded some other way (LD_PRELOAD). */
#define _GNU_SOURCE 1
#include "backends/opencl/icd_preload.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
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

static int preloaded; /* drivers loaded here, for the log */

static void preload(const char *lib) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == NULL) {
    /* Not ours to judge: the ICD loader will try and report it itself. */
    const char *why = dlerror();
    AB_LOG(AB_LOG_DEBUG, "OpenCL driver %s not preloaded: %s", lib, why ? why : "dlopen failed");
    return;
  }
  preloaded++;
  AB_LOG(AB_LOG_DEBUG, "OpenCL driver %s preloaded with RTLD_DEEPBIND", lib);
}

/* An .icd file holds the driver library's name (or path) on its first line. */
static void preload_icd_file(const char *path) {
  char line[4096];
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  if (fgets(line, sizeof line, f) != NULL) {
    size_t n = strcspn(line, "\r\n");
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t')) n--;
    line[n] = '\0';
    if (n > 0) preload(line);
  }
  fclose(f);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void preload_icd_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[4096];
    if (!ends_with(e->d_name, ".icd")) continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    preload_icd_file(path);
  }
  closedir(d);
}

static bool deepbind_off(void) {
  static const struct ab__env_choice modes[] = {{"1", 1},     {"on", 1},  {"true", 1}, {"yes", 1}, {"0", 0},
                                                {"off", 0},   {"false", 0}, {"no", 0},  {NULL, 0}};
  return !ab__env_choice("AB_OPENCL_DEEPBIND", modes, 1, "1 (on) or 0 (off, false, no)");
}

/* A sanitizer runtime in the process (a sanitized program, or one
 * LD_PRELOADed under a Python that is not): it aborts on RTLD_DEEPBIND. */
static bool sanitizer_present(void) {
  static const char *const inits[] = {"__asan_init", "__tsan_init", "__msan_init", "__hwasan_init"};
  for (size_t k = 0; k < sizeof inits / sizeof *inits; k++)
    if (dlsym(RTLD_DEFAULT, inits[k]) != NULL) return true;
  return false;
}

/* The drivers the ICD loaders (ocl-icd and Khronos') would load, as
 * ocl-icd's libOpenCL(7) describes: the libraries of OCL_ICD_FILENAMES
 * (':'-separated), and besides them OCL_ICD_VENDORS when set (a directory
 * of .icd files; an .icd file, a bare name looked up in the vendors
 * directory first; else a library), else the .icd files of the vendors
 * directory ($OPENCL_VENDOR_PATH, else /etc/OpenCL/vendors). */
static void preload_all(void) {
  if (deepbind_off()) return;
  if (sanitizer_present()) {
    AB_LOG(AB_LOG_DEBUG, "a sanitizer runtime is loaded: OpenCL drivers are not preloaded with RTLD_DEEPBIND");
    return;
  }
  const char *files = getenv("OCL_ICD_FILENAMES");
  if (files != NULL && *files != '\0') {
    char *copy = strdup(files), *save = NULL;
    if (copy != NULL)
      for (char *lib = strtok_r(copy, ":", &save); lib != NULL; lib = strtok_r(NULL, ":", &save)) preload(lib);
    free(copy);
  }
  const char *dir = getenv("OPENCL_VENDOR_PATH");
  if (dir == NULL || *dir == '\0') dir = "/etc/OpenCL/vendors";
  const char *vendors = getenv("OCL_ICD_VENDORS");
  struct stat sb;
  char path[4096];
  if (vendors == NULL || *vendors == '\0') preload_icd_dir(dir);
  else if (stat(vendors, &sb) == 0 && S_ISDIR(sb.st_mode)) preload_icd_dir(vendors);
  else if (ends_with(vendors, ".icd")) {
    if (strchr(vendors, '/') == NULL && snprintf(path, sizeof path, "%s/%s", dir, vendors) < (int)sizeof path &&
        stat(path, &sb) == 0)
      preload_icd_file(path);
    else
      preload_icd_file(vendors);
  } else
    preload(vendors);
  AB_LOG(AB_LOG_DEBUG, "%d OpenCL driver(s) preloaded with RTLD_DEEPBIND", preloaded);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

void ab__opencl_preload_icds(void) { pthread_once(&once, preload_all); }

#else

void ab__opencl_preload_icds(void) {}

#endif
