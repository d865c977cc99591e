# syntax=docker/dockerfile:1
#
# Container image of ray-history-collector: the collector binary alone, on a
# distroless base, running as uid 1000 / gid 100 (the `ray` user of the
# rayproject/ray images, so both containers of a pod own what they write in the
# shared /tmp/ray emptyDir).
#
#   docker build -t ghcr.io/ray-history-collector/ray-history-collector:dev .
#
# The build is not exercised by this repository's CI (no Docker engine there);
# hadolint lints this file (scripts/check-deploy.sh).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------- build stage
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
# The image is built with the `igzip` feature: ISA-L's igzip compresses uploads at
# --gzip-level 1 and 2 (less CPU than the default build's libdeflate for the same stored
# size on Ray's events; BENCHMARKS.md, "Compressor of the default build"). isal-sys builds
# it from source with nasm and the autotools; this image has all but nasm, and apt skips
# what is there. The Debian release is pinned by the tag above, so the package versions
# are that release's.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nasm autoconf automake libtool make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole source tree, minus what .dockerignore keeps out (target/, .git, ...).
COPY . .
# Cache mounts keep the crate registry and the target dir between builds on the
# same builder; the binary is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features igzip --bin ray-history-collector \
    && install -D -m 0755 target/release/ray-history-collector /out/ray-history-collector

# ---------------------------------------------------------------- runtime stage
# distroless/cc: glibc, libgcc and CA certificates (rustls reads the system
# roots), no shell and no package manager. Debian 12, like the build stage.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="ray-history-collector" \
      org.opencontainers.image.description="Sidecar that spools Ray's events and uploads them for the Ray History Server" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ray-history-collector /usr/local/bin/ray-history-collector
USER 1000:100
# Ray's events, /healthz, /readyz and /metrics. The binary listens on
# 127.0.0.1 unless told otherwise (--listen / RHC_LISTEN).
EXPOSE 8084
ENTRYPOINT ["/usr/local/bin/ray-history-collector"]
