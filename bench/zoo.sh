#!/usr/bin/env bash
# The model zoo (bench/zoo.py) on a GPU machine without network access. Installs the wheelhouse in
# .whl/ when there is one (see bench/device_tests.sh; once per machine), records the GPU and the
# versions, then runs the zoo with its caches under .devscratch/zoo-cache (ignored by git). What it
# wrote (zoo.json, zoo.md, each warmup's report, every process's log, the effective configs) lands
# in one tarball, OUT_DIR/zoo.tar.gz, with zoo.md and zoo.json beside it; the table is printed,
# the machine and exit status last.
#   bench/zoo.sh OUT_DIR [zoo.py options]       # e.g. --only half1, then --only half2 in another call
#   # the whole zoo is more than one 10-minute call's worth: pass --only half1 or half2 (or names)
# ZOO_BUDGET (seconds, default 540): from this script's start, when the zoo starts no further model
# (one that would end later is skipped, and its row says so), so the tarball is written inside a
# 10-minute call.
set -uo pipefail
out=${1:?usage: bench/zoo.sh OUT_DIR [--only NAME[,NAME]] [--buckets 1,8] [zoo.py options]}; shift
budget=${ZOO_BUDGET:-540}
logs=$(mktemp -d)

if compgen -G ".whl/*.whl" >/dev/null; then
    installed=/tmp/site/.wheels-$(printf '%s\n' .whl/*.whl | md5sum | cut -c1-12)
    if [ ! -e "$installed" ]; then
        python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl >"$logs/pip.log" 2>&1 && touch "$installed"
    fi
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# Bytecode cached as in an image whose packages were compiled at install (pip's default): the GPU
# machine's torch has no __pycache__, and compiling torch's, Dynamo's and transformers' sources in
# every warmup and replica process would add seconds to each.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$PWD/.devscratch/pycache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  for package in timm transformers torchvision; do
      python3 -c "import $package; print('$package', $package.__version__)" 2>&1 | tail -1
  done
  echo "cores $(nproc)"; } >"$logs/machine.txt" 2>&1

left=$((budget - SECONDS))
# the zoo keeps to --budget itself; the timeout is only there should a process hang past it
timeout --kill-after=10 $((left + 30)) python3 bench/zoo.py "$logs/zoo" --budget "$left" \
    --cache-root "$PWD/.devscratch/zoo-cache" "$@" 2>"$logs/zoo.log"
echo "zoo.py $*: exit $?, $SECONDS s in all" >>"$logs/status.txt"
mkdir -p "$out" && tar -czf "$out/zoo.tar.gz" -C "$logs" .
cp "$logs/zoo/zoo.md" "$logs/zoo/zoo.json" "$out/" 2>/dev/null
cat "$logs/zoo.log" "$logs/machine.txt" "$logs/status.txt"
