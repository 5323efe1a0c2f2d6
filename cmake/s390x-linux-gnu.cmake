# 64-bit IBM Z Linux, big-endian, with Debian's s390x-linux-gnu gcc
# (gcc-s390x-linux-gnu, libc6-dev-s390x-cross):
# cmake -DCMAKE_TOOLCHAIN_FILE=cmake/s390x-linux-gnu.cmake
# (tools/check-cross.sh s390x; see linux-gnu-cross.cmake).
set(AB_CROSS_TRIPLET s390x-linux-gnu)
set(AB_CROSS_PROCESSOR s390x)
include(${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross.cmake)
