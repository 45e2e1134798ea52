# EVS Video Chat on a Hugging Face Docker Space with a dedicated GPU.
#
# These pins go together; change them together:
#   CUDA 13.0     PyPI's torch 2.14.1 wheel for Linux x86_64 is the CUDA 13.0 build: it pulls
#                 cuda-toolkit 13.0.3 and nvidia-cudnn-cu13 from PyPI, so the base image only has to
#                 match the CUDA major/minor (the host driver must be 580 or newer).
#   Python 3.12   Ubuntu 24.04's python3.
#   torch 2.14.1 + torchvision 0.29.1, the same pins as requirements.txt (tests/test_space.py checks).
#   flash-attn    2.8.3 from mjun0812/flash-attention-prebuild-wheels release v0.10.0, the wheel built for
#                 torch 2.14 + CUDA 13.0 + CPython 3.12 + the C++11 ABI (ABI=TRUE, as torch's
#                 manylinux_2_28 wheels use) on linux x86_64:
#                 flash_attn-2.8.3+cu130torch2.14-cp312-cp312-linux_x86_64.whl
#                 The build derives the torch minor, CUDA tag and Python tag from what is installed, so
#                 a mismatched combination asks for a wheel name that does not exist instead of
#                 installing a wrong one. Without flash-attn the app runs on sdpa and logs so.
#
# Build args: PRELOAD_MODEL=1 downloads EVS_MODEL into the image's Hugging Face cache at build time
# (a Space passes its variables as build args). INSTALL_FLASH_ATTN=0 skips flash-attn.

FROM nvidia/cuda:13.0.1-base-ubuntu24.04

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

# torch first, in its own layer: it is the largest download and changes least often.
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
RUN pip install torch==${TORCH_VERSION} torchvision==${TORCHVISION_VERSION} \
    && python -c "import torch; assert torch.version.cuda == '13.0', torch.version.cuda"

COPY requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

ARG INSTALL_FLASH_ATTN=1
ARG FLASH_ATTN_VERSION=2.8.3
ARG FLASH_ATTN_RELEASE=v0.10.0
ARG EINOPS_VERSION=0.8.2
# Any failure here (no such wheel, download error, a wheel that does not import) leaves flash-attn out
# and the image still builds; the app then runs attention on sdpa and says so in its log. The wheel URL
# carries its version (DL3013), and the `|| fallback` after the && chain is meant (SC2015).
# hadolint ignore=DL3013,SC2015
RUN if [ "${INSTALL_FLASH_ATTN}" != "1" ]; then exit 0; fi; \
    py_tag="$(python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')" \
    && torch_tag="$(python -c 'import torch; assert torch._C._GLIBCXX_USE_CXX11_ABI; \
print("cu" + torch.version.cuda.replace(".", "") + "torch" + ".".join(torch.__version__.split(".")[:2]))')" \
    && wheel="flash_attn-${FLASH_ATTN_VERSION}+${torch_tag}-${py_tag}-${py_tag}-linux_x86_64.whl" \
    && url="https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/${FLASH_ATTN_RELEASE}/${wheel}" \
    && echo "flash-attn wheel: ${url}" \
    && pip install --no-deps "${url}" einops==${EINOPS_VERSION} \
    && python -c "import flash_attn, flash_attn_2_cuda, flash_attn.bert_padding; print('flash-attn', flash_attn.__version__)" \
    || { echo "flash-attn is not installed: attention will run on sdpa"; pip uninstall -y flash-attn || true; }

# Spaces run the container as uid 1000; Ubuntu 24.04 images ship a user "ubuntu" with that uid.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel ubuntu && rm -rf /home/ubuntu; fi \
    && useradd --create-home --uid 1000 --shell /bin/bash user \
    && install -d -o user -g user /home/user/app
USER 1000:1000

# The Hugging Face cache lives under $HOME so a persistent volume mounted there keeps the weights.
ARG EVS_MODEL=Qwen/Qwen3-VL-4B-Instruct
ENV HOME=/home/user \
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
