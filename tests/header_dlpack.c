/* Compiled, never run (tests/CMakeLists.txt): the public header against
 * DLPack headers of other versions, included first, as a program that
 * takes its DLPack header from elsewhere (TensorFlow, PyTorch) does. It
 * must give the type names the header's declarations use. */
#include <dlpack/dlpack.h>

#include "arraybridge/arraybridge.h"

int ab_test_header_dlpack(const DLTensor *src, DLManagedTensorVersioned **out);
int ab_test_header_dlpack(const DLTensor *src, DLManagedTensorVersioned **out) {
  return (int)ab_convert_memory(src, ab_best_device(), NULL, out);
}
