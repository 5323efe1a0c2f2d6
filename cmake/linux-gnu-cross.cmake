# Cross-compiling for another CPU's Linux with Debian's cross gcc, as
# tools/check-cross.sh does; included by cmake/<triplet>.cmake, which sets
# AB_CROSS_TRIPLET (aarch64-linux-gnu, i686-linux-gnu, arm-linux-gnueabihf),
# AB_CROSS_PROCESSOR and, where Debian's library folder is named otherwise,
# AB_CROSS_MULTIARCH (i386-linux-gnu). AB_CROSS_SYSROOT, where set, is a
# folder of Debian's packages for the target unpacked (the tests' Criterion
# and what it links): searched for libraries and headers after the cross C
# library, and given to the linker for the libraries those libraries need
# (a path without spaces: the flags are one string).
if(NOT AB_CROSS_MULTIARCH)
  set(AB_CROSS_MULTIARCH ${AB_CROSS_TRIPLET})
endif()
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ${AB_CROSS_PROCESSOR})
set(CMAKE_C_COMPILER ${AB_CROSS_TRIPLET}-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/${AB_CROSS_TRIPLET})
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES AB_CROSS_SYSROOT)
if(AB_CROSS_SYSROOT)
  list(APPEND CMAKE_FIND_ROOT_PATH "${AB_CROSS_SYSROOT}")
  set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath-link,${AB_CROSS_SYSROOT}/lib/${AB_CROSS_MULTIARCH} \
-Wl,-rpath-link,${AB_CROSS_SYSROOT}/usr/lib/${AB_CROSS_MULTIARCH}")
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
