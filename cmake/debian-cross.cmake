# Cross-compiling on Debian with its cross toolchain and multiarch packages,
# included by the per-target files next to it (EFA_CROSS_TRIPLET set there):
#   dpkg --add-architecture arm64
#   apt-get install g++-aarch64-linux-gnu and the :arm64 -dev packages, with
#   the build host's protobuf-compiler and protobuf-compiler-grpc (protoc and
#   grpc_cpp_plugin run on the build host); scripts/install-deps.sh --arch
#   arm64 does both.
#   cmake --preset release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The Dockerfile's build stage does this for every target but its own.
string(REGEX REPLACE "-.*" "" EFA_CROSS_PROCESSOR "${EFA_CROSS_TRIPLET}")
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ${EFA_CROSS_PROCESSOR})
set(CMAKE_C_COMPILER ${EFA_CROSS_TRIPLET}-gcc)
set(CMAKE_CXX_COMPILER ${EFA_CROSS_TRIPLET}-g++)
# Debian's multiarch layout: target libraries, their CMake and pkg-config
# files live under /usr/lib/TRIPLET; headers are shared under /usr/include.
set(CMAKE_LIBRARY_ARCHITECTURE ${EFA_CROSS_TRIPLET})
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${EFA_CROSS_TRIPLET}/pkgconfig:/usr/share/pkgconfig")
# Programs (protoc, grpc_cpp_plugin) come from the build host. Libraries are
# found through CMAKE_LIBRARY_ARCHITECTURE with no sysroot, as Debian's own
# cross builds (debhelper's cmake build system) do.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
