# Cross-compiling for 64-bit Arm Linux with Debian's aarch64-linux-gnu gcc
# (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross), as tools/check-aarch64.sh
# does. AB_AARCH64_SYSROOT, where set, is a folder of Debian's arm64
# packages unpacked (the tests' Criterion and what it links): searched for
# libraries and headers after the cross C library, and given to the linker
# for the libraries those libraries need (a path without spaces: the flags
# are one string).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES AB_AARCH64_SYSROOT)
if(AB_AARCH64_SYSROOT)
  list(APPEND CMAKE_FIND_ROOT_PATH "${AB_AARCH64_SYSROOT}")
  set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath-link,${AB_AARCH64_SYSROOT}/lib/aarch64-linux-gnu \
-Wl,-rpath-link,${AB_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu")
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
