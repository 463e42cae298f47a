#!/usr/bin/env bash
# bench/warmup_cost.py on the GPU machine: installs the carried wheelhouse (bench/device_env.sh),
# runs the comparison with its options, and leaves OUT_DIR/warmup_cost.tar.gz (the table, the JSON,
# every process's log, the machine) with the table printed last.
#   bench/warmup_cost.sh OUT_DIR --models examples/mlp.yaml,examples/resnet18.yaml [--rounds 2]
set -uo pipefail
out=${1:?usage: bench/warmup_cost.sh OUT_DIR [warmup_cost.py options]}; shift
logs=$(mktemp -d)

# shellcheck source=bench/device_env.sh
. bench/device_env.sh

timeout --kill-after=10 "${COST_TIMEOUT:-570}" python3 bench/warmup_cost.py "$logs/cost" "$@" 2>"$logs/progress.log"
echo "warmup_cost.py $*: exit $?, $SECONDS s in all" >>"$logs/status.txt"
mkdir -p "$out" && tar -czf "$out/warmup_cost.tar.gz" -C "$logs" .
cat "$logs/progress.log" "$logs/cost/warmup_cost.md" "$logs/machine.txt" "$logs/status.txt" 2>/dev/null
