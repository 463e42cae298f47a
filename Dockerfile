# syntax=docker/dockerfile:1
# The orchestrate image: the warmup RayJob, the serving pods' init container (`orchestrate pull`) and
# `orchestrate serve`. docs/image.md says how to build it and why each pin is what it is; the
# pins are checked against pyproject.toml by tests/test_image.py.
#
#   docker build -t ghcr.io/your-org/orchestrate:0.1.0 .
#
# torch 2.11.0's cu130 build wants CUDA 13.0 (its wheels carry the CUDA 13.0.2 libraries and
# Triton 3.6.0); the base gives the matching runtime, a driver-facing environment for the NVIDIA
# container toolkit, and Ubuntu 24.04's Python 3.12. Both stages start from it, so the venv built
# in the first finds the same /usr/bin/python3.12 in the second.
ARG BASE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

FROM ${BASE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
ARG TORCH_VERSION=2.11.0+cu130
ARG TRITON_VERSION=3.6.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/orchestrate/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/orchestrate
# torch first and alone, from PyTorch's CUDA 13.0 index: PyPI's torch could be another CUDA build.
# The constraints keep the package's own install below from moving torch or Triton.
RUN pip install --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple \
        "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" \
    && printf 'torch==%s\ntriton==%s\n' "${TORCH_VERSION}" "${TRITON_VERSION}" > /opt/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cache ./cache
COPY jobs ./jobs
COPY orchestrator ./orchestrator
# boto3 (the S3 store) and fsspec are core dependencies: there is no s3 extra to ask for
RUN pip install --constraint /opt/constraints.txt numpy ".[k8s,metrics,serve]" \
    && python -c "import torch, triton; assert torch.__version__ == '${TORCH_VERSION}', torch.__version__; assert triton.__version__ == '${TRITON_VERSION}', triton.__version__" \
    && orchestrate --version

FROM ${BASE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
ARG BASE
LABEL org.opencontainers.image.title="torch-warmup-orchestrator" \
      org.opencontainers.image.description="Pre-compile torch.compile models per input bucket, share the compile cache across a fleet, serve warm." \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}"
# gcc, libc headers and Python.h: Triton builds its small C launcher for a kernel the first time a
# process loads one, warm cache or not. The base's uid 1000 (ubuntu) makes way for the pods' user.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && if getent passwd 1000 >/dev/null; then userdel --remove "$(getent passwd 1000 | cut -d: -f1)"; fi \
    && if getent group 1000 >/dev/null; then groupdel "$(getent group 1000 | cut -d: -f1)"; fi \
    && groupadd --gid 1000 orchestrate \
    && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin orchestrate
COPY --from=build /opt/orchestrate /opt/orchestrate
# The pods run with a read-only root filesystem and writable /tmp, /dev/shm and cache volume: HOME
# on /tmp gives Triton, torch and Ray a writable home. TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR
# stay unset: orchestrate points them at each namespace's directory itself.
ENV PATH=/opt/orchestrate/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
# numeric, so that the kubelet can check runAsNonRoot against the image
USER 1000:1000
ENTRYPOINT ["orchestrate"]
CMD ["--help"]
