# Cross-compiling for amd64 on Debian (an arm64 build host): cmake/debian-cross.cmake.
set(EFA_CROSS_TRIPLET x86_64-linux-gnu)
include(${CMAKE_CURRENT_LIST_DIR}/debian-cross.cmake)
