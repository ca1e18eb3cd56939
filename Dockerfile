# gemmd in a container: two images from one Dockerfile.
#
# GPU host (the default image: built with nvcc on NVIDIA's CUDA 13 devel image, runs on its
# runtime image; the host needs the NVIDIA Container Toolkit and a driver of branch 580+):
#   docker build -t gemmd .
#   docker run --gpus all -p 8080:8080 gemmd
# CPU host (built and run on Debian, OpenBLAS only):
#   docker build --target cpu -t gemmd:cpu .
#   docker run -p 8080:8080 gemmd:cpu
#
# Build arguments: the four base images (CUDA_BUILD_BASE, CUDA_RUNTIME_BASE, CPU_BUILD_BASE,
# CPU_RUNTIME_BASE: any image of the same family will do, e.g. a local mirror of them);
# CUDA_VERSION (13.0.x, the same in both CUDA stages); CUDA_ARCHS (SASS targets; PTX of the
# highest plain one is embedded too, so newer GPUs still run). scripts/container_test.sh
# builds and runs the CPU image under podman, and checks the GPU image's build stage.
ARG CUDA_VERSION=13.0.1
ARG CUDA_BUILD_BASE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG CUDA_RUNTIME_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
ARG CPU_BUILD_BASE=debian:trixie
ARG CPU_RUNTIME_BASE=debian:trixie-slim

# ---------------------------------------------------------------- CPU: build stage
FROM ${CPU_BUILD_BASE} AS cpu-build
# Everything the build runs, named rather than trusted to the base image (scripts/deps.sh
# --list build; tests/e2e/test_docs.py checks that this list covers it). Versions are the
# base release's own: pinning them would break at its next point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        make gcc libc6-dev binutils pkg-config libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make CUDA=0 build

# ---------------------------------------------------------------- CPU: runtime image
FROM ${CPU_RUNTIME_BASE} AS cpu
# The shared libraries of gemmd and gemm (libcurl: gemm, which the health check runs), and
# the user the daemon runs as (uid 65532, as deploy/k8s asks for).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12t64 libcjson1 libcurl4t64 libopenblas0-pthread ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 gemmd \
 && useradd --no-log-init --uid 65532 --gid gemmd --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gemmd
COPY --from=cpu-build /src/bin/gemmd /src/bin/gemm /usr/local/bin/
COPY config/gemmd.conf /etc/gemmd/gemmd.conf
# A container's loopback is unreachable from outside: serve every interface, whatever the
# config (the shipped one, or one mounted over it) says. GEMMD_* variables outrank the file.
ENV GEMMD_LISTEN=0.0.0.0
USER 65532:65532
EXPOSE 8080
# Liveness through the client shipped in the image: GET /healthz on 127.0.0.1:8080 (the
# default server of gemm), exit 0 when it answers 2xx. --live leaves /readyz out: a full
# queue is a reason to wait, not to restart the container.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["gemm", "--timeout", "4", "--retries", "0", "health", "--live"]
CMD ["gemmd", "--config", "/etc/gemmd/gemmd.conf"]

# ---------------------------------------------------------------- GPU: build stage
FROM ${CUDA_BUILD_BASE} AS gpu-build
ARG CUDA_ARCHS="80 90 90a"
# As the CPU build, plus g++: nvcc compiles the host side of every .cu file with it
# (scripts/deps.sh --list build cuda).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        make gcc g++ libc6-dev binutils pkg-config libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# CUDA=1: a missing nvcc is an error, not a CPU-only build.
RUN make CUDA=1 CUDA_ARCHS="${CUDA_ARCHS}" build

# ---------------------------------------------------------------- GPU: runtime image (default)
FROM ${CUDA_RUNTIME_BASE} AS gpu
# The same libraries and user as the CPU image; the CUDA runtime and cuBLAS come with the base.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12t64 libcjson1 libcurl4t64 libopenblas0-pthread ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 gemmd \
 && useradd --no-log-init --uid 65532 --gid gemmd --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gemmd
COPY --from=gpu-build /src/bin/gemmd /src/bin/gemm /usr/local/bin/
COPY config/gemmd.conf /etc/gemmd/gemmd.conf
ENV GEMMD_LISTEN=0.0.0.0
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["gemm", "--timeout", "4", "--retries", "0", "health", "--live"]
CMD ["gemmd", "--config", "/etc/gemmd/gemmd.conf"]
