# syntax=docker/dockerfile:1
# The EFA device plugin image:
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t REGISTRY/efa-k8s-device-plugin:0.1.0 .
# (.dockerignore keeps build trees and .git out of the context.)
# The Helm chart (helm/aws-efa-k8s-device-plugin) runs it as uid 0 with every
# capability dropped and a read-only root file system.

# Build stage: the same dependency script and CMake preset (release) as the
# README's demo and CI; scripts/image.sh builds this file with podman.
FROM debian:12 AS build
ARG REVISION=unknown
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh --daemon
COPY . .
RUN cmake --preset release -DEFA_BUILD_TESTS=OFF -DEFA_REVISION="${REVISION}" \
 && cmake --build --preset release -j"$(nproc)" \
      --target efa-k8s-device-plugin efa-k8s-device-plugin-idle \
 && strip build/release/plugin/efa-k8s-device-plugin build/release/plugin/efa-k8s-device-plugin-idle

# Runtime stage: Debian 12 slim and only the shared libraries the binary
# loads. test/image/runtime_libs_test.sh checks this list against `ldd` of
# the built binary: a library it links directly must be listed here (or be in
# the base image), not arrive by chance as another package's dependency.
# gRPC, protobuf, abseil, re2 and c-ares are linked in statically
# (EFA_STATIC_GRPC), so none of them is here.
FROM debian:12-slim
ARG VERSION=0.1.0
ARG REVISION=unknown
# The repository URL: --build-arg SOURCE=...
ARG SOURCE=""
LABEL org.opencontainers.image.title="efa-k8s-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for AWS Elastic Fabric Adapter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="debian:12-slim"
# The inventory command loads libibverbs1 with dlopen, and libibverbs its
# EFA provider (ibverbs-providers); hwloc's
# Linux backend reads PCI from sysfs itself, so libhwloc-plugins (a
# recommendation) stays out.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libibverbs1 ibverbs-providers libhwloc15 \
      libyaml-cpp0.7 libspdlog1.10 libfmt9 \
      libprometheus-cpp-core1.0 \
      libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/release/plugin/efa-k8s-device-plugin /usr/bin/efa-k8s-device-plugin
# What the daemon execs on a node without EFA; its libraries are a subset of
# the daemon's.
COPY --from=build /src/build/release/plugin/efa-k8s-device-plugin-idle /usr/bin/efa-k8s-device-plugin-idle
# Root (uid 0) owns the kubelet's device-plugins directory (0750), where the
# plugin creates its socket; the chart drops every capability.
USER 0:0
EXPOSE 8080 8081
ENTRYPOINT ["/usr/bin/efa-k8s-device-plugin"]
