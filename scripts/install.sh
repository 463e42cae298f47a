#!/usr/bin/env bash
# Set up .venv with the orchestrator, on a fresh machine; one progress line per step on stderr.
#   scripts/install.sh            # the main job: torch, this package and its runtime dependencies; no apt
#   scripts/install.sh --tests    # also the test extras, and the tests' system packages (tests/setup-system.sh)
#   scripts/install.sh --examples # also what examples/ needs: torchvision built for this torch, transformers
#   TORCH_VERSION=2.11.0 scripts/install.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install.sh   # CPU wheels from PyTorch's index
#   INSTALL_WITH_PIP=1 scripts/install.sh   # pip for every package, not uv (which pip installs first)
# CPU torch where no NVIDIA GPU answers (from PyTorch's CPU index where it answers, else the default
# index, saying so), else the default CUDA build. torch goes in first and by itself: a plain `torch`
# requirement resolved from PyPI on a machine with no GPU would pull a multi-GB CUDA build nobody uses.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=
examples=
for arg in "$@"; do
  case $arg in
    --tests) tests=1 ;;
    --examples) examples=1 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg'; use --tests to set up the test suite too, --examples for the examples" >&2; exit 2 ;;
  esac
done
# `orchestrate warmup` needs no extra (ray[default] is a core dependency); `orchestrate serve` needs
# Ray Serve, which the README's first command is expected to have set up too
extras=${EXTRAS:-serve${tests:+,dev}}
python=${PYTHON:-python3}
step() { echo "install: $*" >&2; }
CPU_INDEX=https://download.pytorch.org/whl/cpu
torch_index=  # the index torch came from, where it is not the default one

if [ -n "$tests" ]; then
  tests/setup-system.sh
fi

step "venv .venv ($("$python" --version 2>&1))"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# pip talks on stdout; here everything it says is progress, so it goes to stderr with the rest
pip() { .venv/bin/python -m pip install --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2) >&2; }

# uv installs the same packages from the same sources in seconds where pip takes minutes (it
# downloads and unpacks in parallel); where it cannot be had (no index serves it), pip does it all
uv=
if [ -z "${INSTALL_WITH_PIP:-}" ] && .venv/bin/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 \
  && [ -x .venv/bin/uv ]; then
  uv=.venv/bin/uv
  step "installer: uv $("$uv" --version 2>/dev/null | cut -d' ' -f2)"
else
  step "installer: pip"
fi
# pip's own settings (pip.conf and PIP_* variables: indexes, local wheels, pins, certificates) as
# uv's variables, so that both installers see the same packages; a variable beats a file, as for pip
uv_settings() {
  local key value
  while IFS='=' read -r key value; do
    value=${value#\'}; value=${value%\'}
    case ${key##*.} in
      index-url) echo "UV_DEFAULT_INDEX=$value" ;;
      extra-index-url) echo "UV_EXTRA_INDEX_URL=$value" ;;
      find-links) echo "UV_FIND_LINKS=${value// /,}" ;;
      constraint) echo "UV_CONSTRAINT=$value" ;;
      cert) echo "SSL_CERT_FILE=$value" ;;
    esac
  done < <(
    settings=$(.venv/bin/python -m pip config list 2>/dev/null)
    for scope in global user site :env:; do grep "^$scope\." <<<"$settings" || true; done
  )
  echo "UV_INDEX_STRATEGY=unsafe-best-match"  # pip's choice: the best version across every index
}
# install PACKAGES...: with uv where it is here, else pip with its progress bar
install() {
  if [ -n "$uv" ]; then
    local settings
    mapfile -t settings < <(uv_settings)
    # bytecode compiled at install, as pip does: without it every process compiles what it imports
    # again wherever .pyc files are not written (PYTHONDONTWRITEBYTECODE, a read-only image), which
    # is seconds per process for torch alone
    env "${settings[@]}" "$uv" pip install --python .venv/bin/python --compile-bytecode "$@" 2>&1 | narrate
  else
    pip --progress-bar on "$@"
  fi
}
# what uv and pip say while they install, cut to one line per package pip collects, per build step
# and per stage of uv's: the download and build noise is dropped
narrate() {
  while IFS= read -r line; do
    case $line in
      "Collecting "*) line=${line#Collecting }; echo "install:   collecting ${line%% (*}" ;;
      *": started") line=${line#"${line%%[! ]*}"}; echo "install:   ${line%: started}" ;;  # a build step
      "Installing collected packages: "*) echo "install:   installing what was collected" ;;
      # uv's stages
      "Resolved "* | "Prepared "* | "Installed "* | "Audited "* | "Bytecode compiled "*) echo "install:   ${line,}" ;;
      "error:"* | "  × "* | "  ╰─▶ "* | "      "*) echo "$line" ;;  # why uv failed
    esac
  done >&2
}

if .venv/bin/python -c "import torch" 2>/dev/null; then
  step "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') (already installed)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  step "torch ${TORCH_VERSION:-latest} (cuda): a multi-GB download"
  install "torch${TORCH_VERSION:+==$TORCH_VERSION}"
else
  # PyTorch's own index of CPU wheels where it answers: the default index (PyPI) has only the CUDA
  # build for Linux x86_64, several GB with its NVIDIA libraries
  cpu_index=${TORCH_INDEX_URL:-}
  if [ -z "$cpu_index" ] && .venv/bin/python - "$CPU_INDEX" <<'PROBE' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5).close()
PROBE
    cpu_index=$CPU_INDEX
  fi
  if [ -n "$cpu_index" ]; then
    step "torch ${TORCH_VERSION:-2.13.0} (cpu) from $cpu_index"
    install "torch==${TORCH_VERSION:-2.13.0}" --index-url "$cpu_index"
    torch_index=$cpu_index
  else
    step "torch ${TORCH_VERSION:-2.13.0} (cpu): $CPU_INDEX does not answer, so from the default index;" \
      "from PyPI on Linux x86_64 that is the CUDA build (GBs): set TORCH_INDEX_URL to a CPU wheel index to avoid it"
    install "torch==${TORCH_VERSION:-2.13.0}"
  fi
fi
# an import hook for the one package `orchestrator` (setuptools' default editable mode), not the
# checkout on sys.path: its other folders (cache/, jobs/, tests/) are no import names of ours
step "package + extras: -e .${extras:+[$extras]}"
if [ -n "$uv" ]; then
  install numpy -e ".${extras:+[$extras]}"
else
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off numpy -e ".${extras:+[$extras]}" \
    2> >(grep -v "is ignored: it is neither" >&2) | narrate
fi
if [ -n "$examples" ]; then
  # torchvision ships compiled operators for one torch build: 0.(N+15) for torch 2.N, from the index
  # that build came from (PyPI's torchvision beside a CPU torch imports, then fails with "operator
  # torchvision::nms does not exist"); so it comes without its dependencies, which the default
  # index serves, as it does transformers
  version=$(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')
  version=${version##* }
  minor=${version#2.}
  minor=${minor%%.*}
  if [ -z "$torch_index" ] && [[ $version == *+* ]]; then  # torch was here already, a build of PyTorch's index
    torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${version#*+}}
  fi
  vision="torchvision==0.$((minor + 15)).*"
  step "examples: $vision for torch $version${torch_index:+ from $torch_index}, pillow, transformers"
  install "$vision" --no-deps ${torch_index:+--index-url "$torch_index"}
  install pillow transformers
fi
step "done: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), .venv/bin/orchestrate"
