/* The OpenCL backend's driver preload (icd_preload.c says why). */
#ifndef AB_BACKENDS_OPENCL_ICD_PRELOAD_H
#define AB_BACKENDS_OPENCL_ICD_PRELOAD_H

#include "arraybridge/arraybridge.h"

/* Loads every OpenCL driver the ICD loader would load, with RTLD_DEEPBIND,
 * once per process; call before the first OpenCL call. Never fails: a driver
 * that does not load is left to the ICD loader, which reports it. */
void ab__opencl_preload_icds(void);

/* After the preload, before the ICD loader opens the drivers: AB_OK, or
 * AB_ERR_NO_DEVICE where opening them now would crash the process (they
 * were not preloaded because malloc is not libc's, and another LLVM is in
 * the global scope). */
ab_status ab__opencl_preload_check(void);

#endif
