# elastic-ring for a GPU node: CUDA 13 toolkit, torch 2.14.1 (cu130), Horovod 0.28.1 built with
# NCCL (GPU allreduce) and Gloo (controller), through the same scripts/setup.sh as the README and CI.
#
#   docker build -t elastic-ring .
#   docker run --gpus all --ipc=host -v $PWD/data:/app/data elastic-ring \
#       elastic-ring train --gpus 4 --resize-at 5000 --to 8
#
# Not built in this project's CI (its machines have no Docker engine): see README.
FROM nvidia/cuda:13.0.0-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
       build-essential cmake git libnccl2 libnccl-dev openssh-client make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
# The GPU build of Horovod: NCCL for GPU tensors, Gloo as controller (no MPI needed).
ENV CUDA_HOME=/usr/local/cuda HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    PYTHON=python3.11 ELASTIC_RING_CACHE=/opt/elastic-ring-cache
RUN bash scripts/setup.sh
ENV PATH=/app/.venv/bin:$PATH

# Smoke check of the image.
RUN elastic-ring --help && horovodrun --check-build
CMD ["elastic-ring", "--help"]
