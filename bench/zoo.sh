#!/usr/bin/env bash
# The model zoo (bench/zoo.py) on a GPU machine without network access. Installs the wheelhouse in
# .whl/ when there is one (see bench/device_tests.sh; once per machine), records the GPU and the
# versions, then runs the zoo with its caches under .bench-cache/zoo-cache (ignored by git). What it
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

# shellcheck source=bench/device_env.sh
. bench/device_env.sh

left=$((budget - SECONDS))
# the zoo keeps to --budget itself; the timeout is only there should a process hang past it
timeout --kill-after=10 $((left + 30)) python3 bench/zoo.py "$logs/zoo" --budget "$left" \
    --cache-root "$PWD/.bench-cache/zoo-cache" "$@" 2>"$logs/zoo.log"
echo "zoo.py $*: exit $?, $SECONDS s in all" >>"$logs/status.txt"
mkdir -p "$out" && tar -czf "$out/zoo.tar.gz" -C "$logs" .
cp "$logs/zoo/zoo.md" "$logs/zoo/zoo.json" "$out/" 2>/dev/null
cat "$logs/zoo.log" "$logs/machine.txt" "$logs/status.txt"
