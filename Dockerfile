# elastic-ring for a GPU node: CUDA 13 toolkit, torch 2.14.1 (cu130), Horovod 0.28.1 built with
# NCCL (GPU allreduce) and Gloo (controller), through the same scripts/setup.sh as the README and CI.
#
#   docker build -t elastic-ring .                      # GPUs of compute capability 8.0 and 9.0
#   docker build --build-arg CUDA_CC_LIST=90 -t elastic-ring .   # H100/H200 only: a shorter build
#   docker run --gpus all --ipc=host -v $PWD/data:/app/data elastic-ring \
#       elastic-ring train --gpus 4 --resize-at 5000 --to 8
#
# Layers: system packages, then the Python stack (torch, the Horovod wheel, the package's
# dependencies) from pyproject.toml and scripts/ alone, and only then the source: a code change
# rebuilds neither torch nor Horovod. .dockerignore keeps a local .venv, runs and .git out.
# NCCL: Horovod is built against the NCCL that torch's own wheel (nvidia-nccl-cu13) ships, header
# included (scripts/find_nccl.py), so both load the same libnccl.so.2; the image's libnccl2 is left
# as it is (it is held). To build against a system NCCL instead, name pinned packages, e.g.
#   --build-arg NCCL_APT="libnccl2=2.28.3-1+cuda13.0 libnccl-dev=2.28.3-1+cuda13.0"
# (installed with --allow-change-held-packages).
#
# Not built in this project's CI (its machines have no Docker engine): see README.
FROM nvidia/cuda:13.0.0-cudnn-devel-ubuntu22.04

ARG CUDA_CC_LIST=80,90
ARG NCCL_APT=""
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
       build-essential cmake git openssh-client make \
    && if [ -n "$NCCL_APT" ]; then \
         apt-get install -y --no-install-recommends --allow-change-held-packages $NCCL_APT; fi \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The GPU build of Horovod: NCCL for GPU tensors, Gloo as controller (no MPI needed), compiled
# for CUDA_CC_LIST only (no GPU at build time, so setup.sh cannot ask nvidia-smi).
ENV CUDA_HOME=/usr/local/cuda HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_BUILD_CUDA_CC_LIST=${CUDA_CC_LIST} \
    PYTHON=python3.11 ELASTIC_RING_CACHE=/opt/elastic-ring-cache
# no headless browser in the image: it is only for the web page's test
ENV SETUP_BROWSER=0
# Dependencies first, from what declares them: an empty package stands in for the source, so the
# editable install brings every dependency; the real source replaces it below.
COPY pyproject.toml constraints.txt /app/
COPY scripts/setup.sh scripts/find_nccl.py /app/scripts/
RUN mkdir -p elastic_ring && touch elastic_ring/__init__.py && bash scripts/setup.sh
COPY . /app
# Seconds: everything is installed; this checks the stack again with the real source in place.
RUN bash scripts/setup.sh
ENV PATH=/app/.venv/bin:$PATH

# Smoke check of the image.
RUN elastic-ring --help && horovodrun --check-build
CMD ["elastic-ring", "--help"]
