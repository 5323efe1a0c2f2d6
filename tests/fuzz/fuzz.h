/* Shared by the fuzz targets: the libFuzzer entry point and a check that
 * stops the run (libFuzzer reports a trap as a crash, with the input). */
#ifndef AB_TESTS_FUZZ_H
#define AB_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#define CHECK(cond)                  \
  do {                               \
    if (!(cond)) __builtin_trap();   \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
