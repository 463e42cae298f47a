#!/usr/bin/env bash
# The variant choice and the runtime's per-call cost on a GPU machine: a warmup of
# bench/models/two_input_linear.yaml (which variant each bucket chose, and why), then
# bench/runtime_overhead.py and bench/serving.py with more host-side calls. One tarball,
# OUT_DIR/choice.tar.gz; the summaries are printed.
set -uo pipefail
out=${1:?usage: bench/choice_device.sh OUT_DIR}
logs=$(mktemp -d)
# shellcheck source=bench/device_env.sh
. bench/device_env.sh
for run in 1 2; do  # the second run starts from the first's published plan: does it hold?
    python3 -m orchestrator warmup --no-ray --model bench/models/two_input_linear.yaml --device cuda \
        --cache-dir "$logs/cache" --report "$logs/two_input_linear-$run.json" >"$logs/two_input_linear-$run.txt" 2>&1
done
python3 bench/runtime_overhead.py --calls 50000 >"$logs/runtime_overhead.txt" 2>&1
python3 bench/serving.py "$logs/serving" --starts 0 --host-calls 20000 mlp >"$logs/serving.txt" 2>&1
echo "exit $?, $SECONDS s" >>"$logs/serving.txt"
mkdir -p "$out" && tar -czf "$out/choice.tar.gz" --exclude=cache -C "$logs" .
tail -n 25 "$logs"/two_input_linear-*.txt; cat "$logs/runtime_overhead.txt" "$logs/serving.txt"
