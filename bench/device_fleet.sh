#!/usr/bin/env bash
# The fleet benchmark on a GPU machine without network access. Needs a wheelhouse in .whl/: the
# dependencies that machine lacks, built for Python 3.12 x86_64 on a machine with network access
# (e.g. with a gpu-wheels tool). Installs it, then runs bench/fleet_warmup.py per model.
#   [BENCH_ROUNDS=3] [BENCH_TIMEOUT=s] [BENCH_ARGS="--no-naive ..."] bench/device_fleet.sh OUT_DIR [example ...]
set -uo pipefail
out=${1:?usage: bench/device_fleet.sh OUT_DIR [example ...]}; shift
mkdir -p "$out"
pip install --quiet --no-deps --target /tmp/site .whl/*.whl >"$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
examples=("$@"); [ ${#examples[@]} -gt 0 ] || examples=(mlp resnet18)
for example in "${examples[@]}"; do
    timeout "${BENCH_TIMEOUT:-420}" python bench/fleet_warmup.py --example "$example" --save "$out/$example" \
        --rounds "${BENCH_ROUNDS:-1}" ${BENCH_ARGS:-} \
        >"$out/fleet-$example.txt" 2>&1
    echo "$example: exit $?" >>"$out/status.txt"
done
