# syntax=docker/dockerfile:1.7
# Two images from one file:
#   docker build --target cpu  -t gpt-oss-gateway:0.1.0 .        (gateway + remote backends, CPU engine)
#   docker build --target cuda -t gpt-oss-gateway:0.1.0-cuda .   (adds CUDA 12 / cuDNN 9 for onnxruntime-gpu)
# Both run as uid 10001 with nothing writable but /tmp, so a read-only root filesystem works.

ARG PYTHON_VERSION=3.11
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---- build: a virtual environment holding the gateway and its dependencies, nothing else ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS build-cpu
WORKDIR /src
RUN python -m venv /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backends backends
COPY harmony harmony
COPY state state
RUN /opt/gateway/bin/pip install --no-cache-dir . \
    && /opt/gateway/bin/pip uninstall --yes pip

# ---- cpu: the runtime image ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS cpu
RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gateway
COPY --from=build-cpu /opt/gateway /opt/gateway
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_VOCAB_DOWNLOAD=0
USER 10001:10001
EXPOSE 8000 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["gpt-oss-gateway"]
CMD ["serve"]

# ---- build-cuda: the same environment on the CUDA base (its Python is Ubuntu's), with onnxruntime-gpu ----
FROM ${CUDA_IMAGE} AS build-cuda
RUN apt-get update \
    && apt-get install --yes --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3 -m venv /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backends backends
COPY harmony harmony
COPY state state
RUN /opt/gateway/bin/pip install --no-cache-dir '.[cuda]' \
    && /opt/gateway/bin/pip uninstall --yes pip

# ---- cuda: the runtime image for GPU nodes ----
FROM ${CUDA_IMAGE} AS cuda
RUN apt-get update \
    && apt-get install --yes --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gateway
COPY --from=build-cuda /opt/gateway /opt/gateway
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_VOCAB_DOWNLOAD=0
USER 10001:10001
EXPOSE 8000 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["gpt-oss-gateway"]
CMD ["serve"]
