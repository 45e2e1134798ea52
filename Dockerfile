# EVS Video Chat on a Hugging Face Docker Space with a dedicated GPU.
#
# These pins go together; change them together (tests/test_space.py checks that they agree):
#   CUDA 12.6     The Space GPU hosts run NVIDIA driver 575 (CUDA 12.9): CUDA 13 builds cannot start
#                 there. So torch comes from PyTorch's own cu126 wheel index (PyPI's torch 2.14.1 is
#                 the CUDA 13.0 build, right for CPU users and requirements.txt, wrong here), and the
#                 base image is CUDA 12.6. The torch wheel bundles its CUDA runtime, so a `base` image is
#                 enough. Driver floor: 525.60 (CUDA 12 minor-version compatibility; 560 or newer runs
#                 CUDA 12.6 natively); NVIDIA_DISABLE_REQUIRE below lets the app's own check judge it.
#   Python 3.12   Ubuntu 24.04's python3.
#   torch 2.14.1 + torchvision 0.29.1, the same pins as requirements.txt.
#   flash-linear-attention 0.6.0 (and its fla-core): pure Python and Triton, so no wheel matrix; it runs the
#                 Gated DeltaNet layers of Qwen3.5 / Qwen3.6 (transformers picks it up when it imports; it
#                 asks for transformers >=5.6.2,<6 and triton >=3.3, which torch's cu126 wheel brings).
#                 causal-conv1d (their short convolution) ships as source only and needs nvcc, which a
#                 `base` image lacks: it stays out, and transformers runs that convolution in torch.
#                 Neither belongs in requirements.txt: on a CPU transformers would call their kernels on
#                 CPU tensors (tests/test_attention.py checks the CPU environment keeps them out).
#   mamba-ssm     left out, with causal-conv1d: neither has a wheel for torch 2.14, both compile CUDA for
#                 a long time and need nvcc, which a `base` image lacks. Nemotron-H Omni's Mamba-2 layers
#                 then run on transformers' torch path (its chunked scan for prefill, a step per token in
#                 decode), slower but the same numbers; the app logs which path runs.
#   flash-attn    2.8.3, the prebuilt wheel of mjun0812/flash-attention-prebuild-wheels release v0.10.0
#                 for exactly torch 2.14 + CUDA 12.6 + CPython 3.12 on linux x86_64 (C++11 ABI, as
#                 torch's own wheels). The build checks the installed torch, CUDA and Python against the
#                 wheel's name and leaves flash-attn out, saying so, when they differ or the wheel is
#                 missing; the app then runs attention without it and logs so.
#
# Build args: PRELOAD_MODEL=1 downloads EVS_MODEL into the image's Hugging Face cache at build time
# (a Space passes its variables as build args). INSTALL_FLASH_ATTN=0 skips flash-attn.

FROM nvidia/cuda:12.6.3-base-ubuntu24.04

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive

# Package versions follow the pinned base image (Ubuntu 24.04 point releases only carry fixes).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ffmpeg ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A virtual environment: Ubuntu's system Python refuses pip installs (PEP 668).
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv

# torch first, in its own layer: it is the largest download and changes least often. Its CUDA must be
# the base image's ($CUDA_VERSION is set by the nvidia/cuda image).
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
ARG TORCH_CUDA=cu126
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" \
        "torch==${TORCH_VERSION}+${TORCH_CUDA}" "torchvision==${TORCHVISION_VERSION}+${TORCH_CUDA}" \
    && python -c "import os, torch; image = '.'.join(os.environ['CUDA_VERSION'].split('.')[:2]); \
assert torch.version.cuda == image, f'torch is built for CUDA {torch.version.cuda}, the image has {image}'"

# requirements.txt pins torch==2.14.1, which the installed 2.14.1+cu126 satisfies (PEP 440 ignores the
# local label), so pip keeps the CUDA 12 build.
COPY requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

ARG FLASH_LINEAR_ATTENTION_VERSION=0.6.0
ARG EINOPS_VERSION=0.8.2
RUN pip install "flash-linear-attention==${FLASH_LINEAR_ATTENTION_VERSION}" \
        "fla-core==${FLASH_LINEAR_ATTENTION_VERSION}" "einops==${EINOPS_VERSION}" \
    && python -c "import fla; print('flash-linear-attention', fla.__version__, 'installed')"

ARG INSTALL_FLASH_ATTN=1
ARG FLASH_ATTN_RELEASE=v0.10.0
ARG FLASH_ATTN_WHEEL=flash_attn-2.8.3+cu126torch2.14-cp312-cp312-linux_x86_64.whl
# The wheel must be built for exactly the installed torch minor, CUDA and Python; the name is compared
# with what is installed before anything is fetched. Any failure (another combination, no such wheel, a
# download error, a wheel that does not import) leaves flash-attn out and the image still builds. The
# wheel URL carries its version (DL3013), and the `|| fallback` after the && chain is meant (SC2015).
# hadolint ignore=DL3013,SC2015
RUN if [ "${INSTALL_FLASH_ATTN}" != "1" ]; then echo "flash-attn: skipped (INSTALL_FLASH_ATTN=0)"; exit 0; fi; \
    python -c "import sys, torch; assert torch._C._GLIBCXX_USE_CXX11_ABI; \
built = '+cu%storch%s-cp%d%d-' % (torch.version.cuda.replace('.', ''), '.'.join(torch.__version__.split('.')[:2]), *sys.version_info[:2]); \
sys.exit(0 if built in sys.argv[1] else f'flash-attn: {sys.argv[1]} is not built for the installed {built}')" "${FLASH_ATTN_WHEEL}" \
    && url="https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/${FLASH_ATTN_RELEASE}/${FLASH_ATTN_WHEEL/+/%2B}" \
    && echo "flash-attn wheel: ${url}" \
    && pip install --no-deps "${url}" einops==${EINOPS_VERSION} \
    && python -c "import flash_attn, flash_attn_2_cuda, flash_attn.bert_padding; print('flash-attn', flash_attn.__version__, 'installed')" \
    || { echo "flash-attn is not installed: attention will run without it (the app logs which kernel it uses)"; pip uninstall -y flash-attn || true; }

# Spaces run the container as uid 1000; Ubuntu 24.04 images ship a user "ubuntu" with that uid.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel ubuntu && rm -rf /home/ubuntu; fi \
    && useradd --create-home --uid 1000 --shell /bin/bash user \
    && install -d -o user -g user /home/user/app
USER 1000:1000

# The Hugging Face cache lives under $HOME so a persistent volume mounted there keeps the weights.
ARG EVS_MODEL=Qwen/Qwen3-VL-4B-Instruct
# The base image asks the NVIDIA container runtime to refuse drivers older than CUDA 12.6's (560);
# torch's CUDA 12 runtime runs on 525+ (minor-version compatibility), and the app's start-up check names
# the driver and what to do in one line when it cannot, so the runtime's own refusal is turned off.
ENV NVIDIA_DISABLE_REQUIRE=1 \
    HOME=/home/user \
    HF_HOME=/home/user/.cache/huggingface \
    PYTHONUNBUFFERED=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    EVS_PORT=7860 \
    EVS_MODEL=${EVS_MODEL} \
    EVS_STRICT_MODEL=1
WORKDIR /home/user/app

# Before the app is copied, so code changes do not throw away a downloaded checkpoint.
ARG PRELOAD_MODEL=0
RUN if [ "${PRELOAD_MODEL}" = "1" ]; then hf download "${EVS_MODEL}"; fi

COPY --chown=1000:1000 . /home/user/app

EXPOSE 7860
# /healthz answers only once the model is loaded and warmed up.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/healthz', timeout=4)"]
CMD ["python", "app.py"]
