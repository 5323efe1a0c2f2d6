/* Stands for another LLVM in the process's global scope (TensorFlow's
 * libtensorflow_framework.so.2 exports LLVM's symbols): the one symbol the
 * library looks for (see backends/opencl/icd_preload.c). Loaded with
 * RTLD_GLOBAL by tests/stress/replaced_malloc.c. Never called. */
void ab_test_fake_llvm_option(void) __asm__("_ZN4llvm2cl6Option11addArgumentEv");
void ab_test_fake_llvm_option(void) {}
