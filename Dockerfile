# syntax=docker/dockerfile:1
# The EFA device plugin image, for amd64 and arm64 from this one file:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t REGISTRY/efa-k8s-device-plugin:0.1.0 .
# scripts/image.sh does the same with podman, checks both images (the arm64
# one under emulation) and saves them as one archive. (.dockerignore keeps
# build trees and .git out of the context.) The Helm chart runs it as uid 0
# with every capability dropped and a read-only root file system.

# Build stage: always on the build host's architecture (compiling under
# emulation would take an hour). For another target it cross-compiles with
# Debian's cross compiler and the target's multiarch -dev packages
# (scripts/install-deps.sh --arch, cmake/debian-cross.cmake); then it gathers
# the runtime file system in /rootfs (scripts/image-rootfs.sh). It compiles
# through ccache, into /var/cache/efa-ccache (CMakeLists.txt): a build that
# mounts the host's cache there (scripts/image.sh: `podman build --volume
# /var/cache/efa-ccache:/var/cache/efa-ccache`) reuses what the host's builds
# and earlier image builds compiled and prints its hits; without the mount the
# cache stays in this stage, which the image does not keep.
FROM --platform=$BUILDPLATFORM debian:12 AS build
ARG TARGETARCH
WORKDIR /src
COPY scripts/install-deps.sh scripts/apt-get.sh scripts/
RUN scripts/install-deps.sh --daemon --arch "${TARGETARCH}"
# Declared after the packages' layer, which they would invalidate.
ARG REVISION=unknown
# CI builds with warnings as errors (-Werror), users without.
ARG EFA_WERROR=OFF
COPY . .
RUN set -e; \
    case "${TARGETARCH}" in arm64) triplet=aarch64-linux-gnu ;; *) triplet=x86_64-linux-gnu ;; esac; \
    cross=""; \
    if [ "${TARGETARCH}" != "$(dpkg --print-architecture)" ]; then \
      cross="-DCMAKE_TOOLCHAIN_FILE=cmake/${triplet}.cmake"; \
    fi; \
    cmake --preset release ${cross} -DEFA_BUILD_TESTS=OFF -DEFA_WERROR="${EFA_WERROR}" \
      -DEFA_REVISION="${REVISION}"; \
    export CCACHE_STATSLOG=/tmp/ccache-stats.log; \
    cmake --build --preset release -j"$(nproc)" \
      --target efa-k8s-device-plugin efa-k8s-device-plugin-idle; \
    if [ -f /tmp/ccache-stats.log ]; then \
      echo "ccache, this build:"; ccache --show-log-stats | grep -E '^ *(Hits|Misses):' || true; \
    fi; \
    scripts/image-rootfs.sh "${triplet}" /rootfs \
      build/release/plugin/efa-k8s-device-plugin build/release/plugin/efa-k8s-device-plugin-idle

# The host install's .deb and .rpm (packaging/) for TARGETARCH, from the
# build stage's tree: its binaries as the image has them, cross-compiled the
# same way. Built only when asked for (`podman build --target packages
# --output type=local,dest=DIR`, scripts/image.sh with EFA_IMAGE_PACKAGES);
# the image does not hold them. rpmbuild packages another architecture's
# binaries with --target (cpack passes it), and dpkg-shlibdeps (which cpack
# runs after `file`) reads them with the cross binutils and the target's
# multiarch packages.
FROM build AS package-build
RUN scripts/apt-get.sh install -y -qq --no-install-recommends rpm file >/dev/null && \
    cpack --preset release -B /packages && \
    rm -rf /packages/_CPack_Packages

FROM scratch AS packages
COPY --from=package-build /packages/ /

# Runtime stage: the two binaries, the shared libraries they and the
# inventory's dlopen of libibverbs (with its EFA provider) load, and the
# loader; no shell, no package manager. gRPC, protobuf, abseil, re2 and
# c-ares are linked in statically (EFA_STATIC_GRPC). To look inside a running
# pod: `kubectl debug` with an ephemeral container (docs/architectures.md).
FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
# The repository URL: --build-arg SOURCE=...
ARG SOURCE=""
LABEL org.opencontainers.image.title="efa-k8s-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for AWS Elastic Fabric Adapter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build /rootfs/ /
# Root (uid 0) owns the kubelet's device-plugins directory (0750), where the
# plugin creates its socket; the chart drops every capability.
USER 0:0
EXPOSE 8080 8081
ENTRYPOINT ["/usr/bin/efa-k8s-device-plugin"]
