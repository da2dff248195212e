# Cross-compiling for arm64 (Graviton, Grace) on Debian: cmake/debian-cross.cmake.
set(EFA_CROSS_TRIPLET aarch64-linux-gnu)
include(${CMAKE_CURRENT_LIST_DIR}/debian-cross.cmake)
