# syntax=docker/dockerfile:1.7
# Two images from one file:
#   docker build --target cpu  -t gpt-oss-gateway:0.1.0 .        (gateway, remote backends, engine on CPU)
#   docker build --target cuda -t gpt-oss-gateway:0.1.0-cuda .   (adds the CUDA 13 / cuDNN 9 wheels)
# Both run as uid 10001 with nothing writable but /tmp, so a read-only root filesystem works.
# The python sandbox (hosted tools) confines itself in a user namespace: run the container with
# --security-opt seccomp=unconfined --security-opt apparmor=unconfined (the Helm chart does the same), or
# the gateway does not offer python (docs/hosted-tools.md).

ARG PYTHON_VERSION=3.11

# ---- build stages: a virtual environment holding the gateway and its dependencies, nothing else ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS build-cpu
WORKDIR /src
# g++ compiles the engine's MXFP4 MoE kernels here; the runtime images carry the library, not the compiler
RUN apt-get update && apt-get install --yes --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backends backends
COPY harmony harmony
COPY state state
RUN /opt/gateway/bin/pip install --no-cache-dir '.[engine,mcp]' \
    && /opt/gateway/bin/pip uninstall --yes pip
# every CPU variant (x86-64, -v3 with AVX2, -v4 with AVX-512, -v4 with VNNI), not only the building machine's:
# the engine loads the best one the node's CPU runs
RUN HOME=/tmp /opt/gateway/bin/gpt-oss-gateway build-kernels --variants --output /opt/gateway/kernels

# the same, plus CUDA 13 and cuDNN 9 as the NVIDIA wheels onnxruntime-gpu is built against
FROM build-cpu AS build-cuda
RUN /opt/gateway/bin/python -m ensurepip \
    && /opt/gateway/bin/python -m pip install --no-cache-dir '.[cuda,mcp]' \
    && /opt/gateway/bin/python -m pip uninstall --yes pip
# again, now with nvcc (from the cuda extra's wheels): every variant gains the CUDA kernels (sm_80, sm_90)
RUN HOME=/tmp /opt/gateway/bin/gpt-oss-gateway build-kernels --variants --output /opt/gateway/kernels

# ---- runtime: what both images share ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gateway
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_VOCAB_DOWNLOAD=0 \
    GATEWAY_ENGINE_KERNELS=/opt/gateway/kernels
USER 10001:10001
EXPOSE 8000 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["gpt-oss-gateway"]
CMD ["serve"]

FROM runtime AS cpu
COPY --from=build-cpu /opt/gateway /opt/gateway

# the GPU driver comes from the host, through the NVIDIA container runtime
FROM runtime AS cuda
COPY --from=build-cuda /opt/gateway /opt/gateway
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
