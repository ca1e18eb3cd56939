# gemmd in a container: build with the CUDA toolkit, run on the slim CUDA runtime.
#
#   docker build -t gemmd .
#   docker run --gpus all -p 8080:8080 gemmd
#   docker run --gpus all -p 8080:8080 -v $PWD/my.conf:/etc/gemmd/gemmd.conf:ro gemmd
#
# The host needs the NVIDIA Container Toolkit and an NVIDIA driver of branch 580 or newer
# (the minimum for CUDA 13.x on Linux).
#
# Build arguments: CUDA_VERSION (13.0.x, the same in both stages), CUDA_ARCHS (SASS
# targets; PTX of the highest plain one is embedded too, so newer GPUs still run).
ARG CUDA_VERSION=13.0.1

# ---------------------------------------------------------------- build stage
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_ARCHS="80 90 90a"
# Everything the build runs, named rather than trusted to the base image: make, the C
# compiler, g++ (nvcc compiles the host side of every .cu file with it), pkg-config and
# the libraries' headers (scripts/deps.sh --list build cuda; tests/e2e/test_docs.py checks
# that this list covers it).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        make gcc g++ binutils pkg-config libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The same invocation as on a development machine; CUDA=1 makes a missing nvcc an error.
RUN make CUDA=1 CUDA_ARCHS="${CUDA_ARCHS}" -j"$(nproc)" build
# The image's config is the shipped one listening on every interface (a container's
# loopback is unreachable from outside), so no flag has to override it at run time.
RUN sed -e 's/^listen = .*/listen = 0.0.0.0/' config/gemmd.conf > gemmd-container.conf \
 && grep -q '^listen = 0.0.0.0$' gemmd-container.conf

# ---------------------------------------------------------------- runtime stage
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
# The shared libraries of gemmd and gemm (libcurl: gemm, which the health check runs).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12t64 libcjson1 libcurl4t64 libopenblas0-pthread ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system gemmd \
 && useradd --system --gid gemmd --home-dir /nonexistent --shell /usr/sbin/nologin gemmd \
 && mkdir -p /etc/gemmd
COPY --from=build /src/bin/gemmd /src/bin/gemm /usr/local/bin/
COPY --from=build /src/gemmd-container.conf /etc/gemmd/gemmd.conf
USER gemmd
EXPOSE 8080
# Liveness through the client shipped in the image: GET /healthz on 127.0.0.1:8080 (the
# default server of gemm), exit 0 when it answers 2xx. --live leaves /readyz out: a full
# queue is a reason to wait, not to restart the container.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["gemm", "--timeout", "4", "--retries", "0", "health", "--live"]
# Mount another config over /etc/gemmd/gemmd.conf (keep listen = 0.0.0.0 in it), or override
# keys with GEMMD_* variables (-e GEMMD_STREAMS_PER_DEVICE=8): no flag below outranks them.
# The health check and EXPOSE assume port 8080. Beyond a trusted network, set tokens_file
# in the config to require bearer tokens.
CMD ["gemmd", "--config", "/etc/gemmd/gemmd.conf"]
