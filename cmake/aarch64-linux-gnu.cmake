# 64-bit Arm Linux with Debian's aarch64-linux-gnu gcc (gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross): cmake -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# (tools/check-cross.sh aarch64 adds -DAB_CROSS_SYSROOT; see linux-gnu-cross.cmake).
set(AB_CROSS_TRIPLET aarch64-linux-gnu)
set(AB_CROSS_PROCESSOR aarch64)
include(${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross.cmake)
