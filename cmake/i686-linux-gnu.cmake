# 32-bit x86 Linux with Debian's i686-linux-gnu gcc (gcc-i686-linux-gnu,
# libc6-dev-i386-cross): cmake -DCMAKE_TOOLCHAIN_FILE=cmake/i686-linux-gnu.cmake
# (tools/check-cross.sh i386 adds -DAB_CROSS_SYSROOT; see linux-gnu-cross.cmake).
# Debian's folder for i386 libraries is i386-linux-gnu, not the triplet.
set(AB_CROSS_TRIPLET i686-linux-gnu)
set(AB_CROSS_MULTIARCH i386-linux-gnu)
set(AB_CROSS_PROCESSOR i686)
include(${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross.cmake)
