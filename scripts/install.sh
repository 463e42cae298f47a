#!/usr/bin/env bash
# Set up .venv with the orchestrator and what its tests need, on a fresh machine.
#   scripts/install.sh            # CPU torch where no NVIDIA GPU answers, else the default CUDA build
#   TORCH_VERSION=2.11.0 scripts/install.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install.sh   # CPU wheels from PyTorch's index
# torch goes in first and by itself: a plain `torch` requirement resolved from PyPI on a machine
# with no GPU would pull a multi-GB CUDA build nobody uses.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${EXTRAS:-dev}
python=${PYTHON:-python3}

# The test suite's multi-node Ray cluster lives in network namespaces (iproute2) and its tests find
# worker processes with pgrep (procps): system packages, installed where we may.
if [[ $extras == *dev* ]]; then
  missing=()
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v pgrep >/dev/null 2>&1 || missing+=(procps)
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip "torch${TORCH_VERSION:+==$TORCH_VERSION}"
  else
    pip "torch==${TORCH_VERSION:-2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  fi
fi
pip numpy -e ".[${extras}]"
echo "installed: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), .venv/bin/orchestrate" >&2
