/* The OpenCL API through the ICD loader opened at run time (cl_api.h). */
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#define AB_CL_API_LOADER 1
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backends/opencl/cl_api.h"
#include "internal.h"

struct ab__cl_api ab__cl;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[448]; /* why not, once load has run; "" when it worked */

/* text for a message into buf: every byte unprintable as '?', and where
 * it does not fit, its end (a path's file name, dlerror's reason) after
 * "...". ab__quote keeps 40 characters from the start, which cut the
 * reason off. */
static void printable_tail(const char *text, char *buf, size_t len) {
  const size_t n = strlen(text), skip = n < len ? 0 : n - (len - 4);
  size_t k = 0;
  if (skip > 0) {
    memcpy(buf, "...", 3);
    k = 3;
  }
  for (size_t i = skip; i < n; i++) buf[k++] = isprint((unsigned char)text[i]) ? text[i] : '?';
  buf[k] = '\0';
}

/* Every function from h (a handle, or RTLD_DEFAULT) into ab__cl; false,
 * saying which was missing in load_error, where one is. */
static bool find_all(void *h, const char *from) {
  struct ab__cl_api api;
#define AB_CL_FIND_(f)                                                                 \
  if ((*(void **)&api.f = dlsym(h, #f)) == NULL) {                                     \
    snprintf(load_error, sizeof load_error, "%s has no %s (OpenCL 1.2 wanted)", from, #f); \
    return false;                                                                      \
  }
  AB_CL_FUNCTIONS(AB_CL_FIND_)
#undef AB_CL_FIND_
  ab__cl = api;
  load_error[0] = '\0';
  return true;
}

/* Where from: AB_OPENCL_LIBRARY where set; else the process's own OpenCL
 * where one with every function is in its global scope (a program linked
 * to the ICD loader, or one that stands in for some of its calls, as
 * test_opencl does: their definitions come first there; a loader opened
 * RTLD_LOCAL, as Python's extensions open theirs, is not in it); else
 * libOpenCL.so.1, opened here. That loader stays open for the life of
 * the process: the drivers it opens, and every cl_mem the backend hands
 * out, belong to it. */
static void load(void) {
  const char *name = ab__env_str("AB_OPENCL_LIBRARY");
  const bool named = name != NULL && name[0] != '\0';
  if (!named) name = "libOpenCL.so.1";
  if (!named && dlsym(RTLD_DEFAULT, "clGetPlatformIDs") != NULL &&
      find_all(RTLD_DEFAULT, "the OpenCL already in the process"))
    return;
  char q[160], why[224], from[192];
  printable_tail(name, q, sizeof q);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    printable_tail(e != NULL ? e : name, why, sizeof why);
    snprintf(load_error, sizeof load_error, "the ICD loader could not be opened: %s", why);
    return;
  }
  snprintf(from, sizeof from, "the OpenCL ICD loader \"%s\"", q);
  if (!find_all(h, from)) dlclose(h);
}

ab_status ab__cl_load(void) {
  pthread_once(&once, load);
  if (load_error[0] != '\0') return AB_FAIL(AB_ERR_NO_DEVICE, "no OpenCL: %s", load_error);
  return AB_OK;
}
