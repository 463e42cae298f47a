#!/usr/bin/env bash
# The runtime's per-call cost on a GPU machine: bench/runtime_overhead.py (host side, eager and
# copy-out routes) and bench/serving.py (a CUDA replica's buckets against their variants alone).
# Everything lands in OUT_DIR/overhead.tar.gz; the summaries are printed.
#   bench/overhead_device.sh OUT_DIR [serving.py examples]
set -uo pipefail
out=${1:?usage: bench/overhead_device.sh OUT_DIR [example ...]}; shift
logs=$(mktemp -d)
# shellcheck source=bench/device_env.sh
. bench/device_env.sh
python3 bench/runtime_overhead.py >"$logs/runtime_overhead.txt" 2>&1
python3 bench/serving.py "$logs/serving" --starts 0 "${@:-mlp}" >"$logs/serving.txt" 2>&1
echo "exit $?, $SECONDS s" >>"$logs/serving.txt"
mkdir -p "$out" && tar -czf "$out/overhead.tar.gz" -C "$logs" .
cat "$logs/runtime_overhead.txt" "$logs/serving.txt"
