#!/usr/bin/env bash
# Replica start against the eager floor (bench/replica_start.py) on a GPU machine without network
# access. Installs the wheelhouse in .whl/ when there is one (see bench/device_tests.sh; once per
# machine), records the GPU and the versions, then runs the bench with its caches under
# .bench-cache/replica-cache (ignored by git: it survives between calls on a machine still warm, so
# a later call can pass --no-warm). Everything it wrote, logs and JSON, lands in one tarball,
# OUT_DIR/replica-start.tar.gz; each model's summary is printed as it ends, the machine and exit status last.
#   bench/replica_start.sh OUT_DIR [--no-warm] [--profile-loads] [--compare-early-imports] [--compare-late-triton-hash] [--compare KIND] [--starts N]
#                          [--device cuda|cpu] [--switch-interval SECONDS] [name ...]
#   # default names: mlp resnet18 vit_s16 bert_base gpt2_bf16 mixnet_l (more than one call's worth:
#   # pass a few per call)
# REPLICA_START_BUDGET (seconds, default 540): from this script's start, when the bench starts
# nothing more (a warmup or a floor+replica pair that would end later is skipped, and says so), so
# the tarball is written inside a 10-minute call.
set -uo pipefail
out=${1:?usage: bench/replica_start.sh OUT_DIR [--no-warm] [--starts N] [--switch-interval S] [name ...]}; shift
budget=${REPLICA_START_BUDGET:-540}
logs=$(mktemp -d)
options=(); names=()
while [ $# -gt 0 ]; do
    case $1 in
        --no-warm|--profile-loads|--compare-early-imports|--compare-late-triton-hash) options+=("$1") ;;
        --starts|--device|--switch-interval|--compare) options+=("$1" "${2:?$1 needs a value}"); shift ;;
        -*) echo "replica_start.sh: unknown option $1" >&2; exit 2 ;;
        *) names+=("$1") ;;
    esac
    shift
done
[ ${#names[@]} -gt 0 ] || names=(mlp resnet18 vit_s16 bert_base gpt2_bf16 mixnet_l)

# shellcheck source=bench/device_env.sh
. bench/device_env.sh

left=$((budget - SECONDS))
# the bench keeps to --budget itself; the timeout is only there should a process hang past it
timeout --kill-after=10 $((left + 30)) python3 bench/replica_start.py "$logs" --budget "$left" \
    --cache-root "$PWD/.bench-cache/replica-cache" "${options[@]}" "${names[@]}" 2>"$logs/replica_start.log"
echo "replica_start.py ${options[*]} ${names[*]}: exit $?, $SECONDS s in all" >>"$logs/status.txt"
mkdir -p "$out" && tar -czf "$out/replica-start.tar.gz" -C "$logs" .
cat "$logs/machine.txt" "$logs/status.txt"
