#!/usr/bin/env bash
# What a user sees on a GPU machine, kept for reading: the main job on Ray (the README's first
# command on buckets 1, 8 and 32: its screen, stdout and the report), then `--no-ray` on the same
# cache root (which must only hit), then the profiled buckets (bench/profile_buckets.sh), then the
# GPU-only tests. Needs the wheelhouse in .whl/ (as bench/device_tests.sh). Everything lands in
# OUT_DIR/device-report.tar.gz.
#   bench/device_report.sh OUT_DIR
set -uo pipefail
out=${1:?usage: bench/device_report.sh OUT_DIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
logs=$(mktemp -d)
pip install --quiet --no-deps --target /tmp/site .whl/*.whl >"$logs/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0 COLUMNS=80
cache=$(mktemp -d)
step() { echo "$1: exit $2" | tee -a "$logs/status.txt"; }
timeout 300 python3 -m orchestrator warmup --model examples/mlp.yaml --buckets 1,8,32 --cache-dir "$cache" \
    --report "$logs/ray.json" >"$logs/ray.stdout" 2>"$logs/ray.stderr"
step "ray warmup" $?
timeout 200 python3 -m orchestrator warmup --no-ray --model examples/mlp.yaml --buckets 1,8,32 --cache-dir "$cache" \
    --json >"$logs/no-ray.json" 2>"$logs/no-ray.stderr"
step "no-ray warmup on the Ray run's cache" $?
python3 -m orchestrator report "$logs/no-ray.json" >"$logs/no-ray.table" 2>&1
python3 -m orchestrator report "$logs/ray.json" --wide >"$logs/ray.wide" 2>&1
find "$cache" -maxdepth 2 >"$logs/cache-tree.txt"
rm -rf "$cache"
bash bench/profile_buckets.sh /tmp/profile-buckets >"$logs/profile.txt" 2>&1
step "profile" $?
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu_e2e.py tests/test_gpu_serving.py \
    >"$logs/pytest.txt" 2>&1
step "gpu tests" $?
cp /tmp/profile-buckets/profile-buckets.tar.gz "$logs/" 2>/dev/null
tar -czf "$out/device-report.tar.gz" -C "$logs" .
