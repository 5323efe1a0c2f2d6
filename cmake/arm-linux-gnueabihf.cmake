# 32-bit Arm Linux, hardware floating point (ARMv7), with Debian's
# arm-linux-gnueabihf gcc (gcc-arm-linux-gnueabihf, libc6-dev-armhf-cross):
# cmake -DCMAKE_TOOLCHAIN_FILE=cmake/arm-linux-gnueabihf.cmake
# (tools/check-cross.sh armhf adds -DAB_CROSS_SYSROOT; see linux-gnu-cross.cmake).
set(AB_CROSS_TRIPLET arm-linux-gnueabihf)
set(AB_CROSS_PROCESSOR arm)
include(${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross.cmake)
