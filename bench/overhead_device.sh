#!/usr/bin/env bash
# The runtime's per-call cost on a GPU machine: bench/runtime_overhead.py (host side, eager and
# copy-out routes) and bench/serving.py (a CUDA replica's buckets against their variants alone).
# Everything lands in OUT_DIR/overhead.tar.gz; the summaries are printed.
#   bench/overhead_device.sh OUT_DIR [serving.py examples]
set -uo pipefail
out=${1:?usage: bench/overhead_device.sh OUT_DIR [example ...]}; shift
logs=$(mktemp -d)
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl >"$logs/pip.log" 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# bytecode cached as in an image whose packages were compiled at install (see bench/zoo.sh)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$PWD/.devscratch/pycache
python3 bench/runtime_overhead.py >"$logs/runtime_overhead.txt" 2>&1
python3 bench/serving.py "$logs/serving" --starts 0 "${@:-mlp}" >"$logs/serving.txt" 2>&1
echo "exit $?, $SECONDS s" >>"$logs/serving.txt"
mkdir -p "$out" && tar -czf "$out/overhead.tar.gz" -C "$logs" .
cat "$logs/runtime_overhead.txt" "$logs/serving.txt"
