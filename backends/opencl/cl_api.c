/* The OpenCL API through the ICD loader opened at run time (cl_api.h). */
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#define AB_CL_API_LOADER 1
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "backends/opencl/cl_api.h"
#include "internal.h"

struct ab__cl_api ab__cl;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[448]; /* why not, once load has run; "" when it worked */

/* Where from: AB_OPENCL_LIBRARY where set; else the process's own OpenCL
 * where one is in its global scope (a program linked to the ICD loader,
 * or one that stands in for some of its calls, as test_opencl does:
 * their definitions come first there); else libOpenCL.so.1, opened here.
 * That loader stays open for the life of the process: the drivers it
 * opens, and every cl_mem the backend hands out, belong to it. */
static void load(void) {
  const char *name = ab__env_str("AB_OPENCL_LIBRARY");
  const bool named = name != NULL && name[0] != '\0';
  if (!named) name = "libOpenCL.so.1";
  char q[128], why[192];
  ab__quote(name, q, sizeof q);
  /* (RTLD_DEFAULT is a null pointer in glibc: `own` says which it is) */
  const bool own = !named && dlsym(RTLD_DEFAULT, "clGetPlatformIDs") != NULL;
  void *h = own ? RTLD_DEFAULT : dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!own && h == NULL) {
    const char *e = dlerror();
    ab__quote(e != NULL ? e : "dlopen failed", why, sizeof why);
    snprintf(load_error, sizeof load_error, "the OpenCL ICD loader \"%s\" could not be opened (%s)", q, why);
    return;
  }
  char from[160];
  if (own) snprintf(from, sizeof from, "the OpenCL already in the process");
  else snprintf(from, sizeof from, "the OpenCL ICD loader \"%s\"", q);
  struct ab__cl_api api;
#define AB_CL_FIND_(f)                                                                                     \
  if ((*(void **)&api.f = dlsym(h, #f)) == NULL) {                                                         \
    snprintf(load_error, sizeof load_error, "%s has no %s (OpenCL 1.2 wanted)", from, #f);                \
    if (!own) dlclose(h);                                                                                  \
    return;                                                                                                \
  }
  AB_CL_FUNCTIONS(AB_CL_FIND_)
#undef AB_CL_FIND_
  ab__cl = api;
}

ab_status ab__cl_load(void) {
  pthread_once(&once, load);
  if (load_error[0] != '\0') return AB_FAIL(AB_ERR_NO_DEVICE, "no OpenCL: %s", load_error);
  return AB_OK;
}
