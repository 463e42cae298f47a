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

# System packages the tests use, installed where we may (root with apt): the multi-node Ray
# cluster lives in network namespaces (iproute2), tests find workers with pgrep (procps), and the
# metrics tests run a real Prometheus and Pushgateway on loopback.
if [[ $extras == *dev* ]]; then
  missing=()
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v pgrep >/dev/null 2>&1 || missing+=(procps)
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=(prometheus-pushgateway)
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # keep the packages' services from starting: the tests start their own on loopback
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d; made_policy=1; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
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
# an import hook for the one package `orchestrator` (setuptools' default editable mode), not the
# checkout on sys.path: its other folders (cache/, jobs/, tests/) are no import names of ours
pip numpy -e ".[${extras}]"
echo "installed: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), .venv/bin/orchestrate" >&2
