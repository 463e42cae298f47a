#!/usr/bin/env bash
# The GPU-only tests and a warmup per example, on a GPU machine without network access. Needs a
# wheelhouse in .whl/: the dependencies that machine lacks, built for Python 3.12 x86_64 on a
# machine with network access (e.g. with a gpu-wheels tool). Installs it, runs the tests that
# skip without CUDA, then `orchestrate warmup --no-ray --device cuda` per example, keeping each
# report. Everything lands in OUT_DIR/device-tests.tar.gz.
#   bench/device_tests.sh OUT_DIR [example ...]        # default examples: mlp resnet18
set -uo pipefail
out=${1:?usage: bench/device_tests.sh OUT_DIR [example ...]}; shift
logs=$(mktemp -d)
pip install --quiet --no-deps --target /tmp/site .whl/*.whl >"$logs/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'; } >"$logs/machine.txt" 2>&1
timeout 480 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gate.py tests/test_gpu_e2e.py tests/test_gpu_serving.py tests/test_layouts_ahead.py \
    >"$logs/pytest.txt" 2>&1
echo "pytest: exit $?" >>"$logs/status.txt"
examples=("$@"); [ ${#examples[@]} -gt 0 ] || examples=(mlp resnet18)
for example in "${examples[@]}"; do
    timeout 300 python3 -m orchestrator warmup --no-ray --model "examples/$example.yaml" --device cuda --fresh \
        --cache-dir "$logs/cache" --json >"$logs/warmup-$example.json" 2>"$logs/warmup-$example.log"
    echo "$example: exit $?" >>"$logs/status.txt"
done
rm -rf "$logs/cache"
mkdir -p "$out" && tar -czf "$out/device-tests.tar.gz" -C "$logs" .
cat "$logs/status.txt"
