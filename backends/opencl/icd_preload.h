/* The OpenCL backend's driver preload (icd_preload.c says why). */
#ifndef AB_BACKENDS_OPENCL_ICD_PRELOAD_H
#define AB_BACKENDS_OPENCL_ICD_PRELOAD_H

/* Loads every OpenCL driver the ICD loader would load, with RTLD_DEEPBIND,
 * once per process; call before the first OpenCL call. Never fails: a driver
 * that does not load is left to the ICD loader, which reports it. */
void ab__opencl_preload_icds(void);

#endif
