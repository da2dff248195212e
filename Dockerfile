# syntax=docker/dockerfile:1
# Build stage: the same dependency script and preset as CI.
FROM debian:12 AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh
COPY . .
RUN cmake --preset release -DEFA_BUILD_TESTS=OFF \
 && cmake --build --preset release -j2 --target efa-k8s-device-plugin \
 && strip build/release/plugin/efa-k8s-device-plugin

# Runtime stage: only the shared libraries the binary links.
FROM debian:12-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="efa-k8s-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for AWS Elastic Fabric Adapter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libibverbs1 ibverbs-providers libhwloc15 \
      libyaml-cpp0.7 libspdlog1.10 libfmt9 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/release/plugin/efa-k8s-device-plugin /usr/bin/efa-k8s-device-plugin
USER 0:0
ENTRYPOINT ["/usr/bin/efa-k8s-device-plugin"]
