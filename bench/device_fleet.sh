#!/usr/bin/env bash
# The fleet benchmark as run on the lent GPU machine (no network): install the wheelhouse that
# ../shared/tools/gpu-wheels built into .whl/, then run bench/fleet_warmup.py per model.
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
