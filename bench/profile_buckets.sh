#!/usr/bin/env bash
# `warmup --profile` on a GPU machine: examples/mlp.yaml, buckets 1, 8 and 32, in one process
# (no Ray). Installs the wheelhouse in .whl/ when there is one (as bench/device_tests.sh does),
# keeps the report, the console output and every Chrome trace, prints each bucket's profile
# (served variant, Inductor against ATen kernels, the costliest kernels) and tars it all.
#   bench/profile_buckets.sh OUT_DIR            -> OUT_DIR/profile-buckets.tar.gz
set -uo pipefail
out=${1:?usage: bench/profile_buckets.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if compgen -G ".whl/*.whl" >/dev/null; then
    pip install --quiet --no-deps --target /tmp/site .whl/*.whl >"$out/pip.log" 2>&1
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
    export PYTHONPATH=$PWD
fi
export RAY_USAGE_STATS_ENABLED=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'; } >"$out/machine.txt" 2>&1
timeout 400 python3 -m orchestrator warmup --no-ray --model examples/mlp.yaml --buckets 1,8,32 \
    --cache-dir "$out/cache" --profile "$out/prof" --report "$out/report.json" \
    >"$out/warmup.txt" 2>"$out/warmup.log"
echo "warmup: exit $?" | tee "$out/status.txt"
cat "$out/machine.txt" "$out/warmup.txt"
# the profile, as the report records it: what to compare across torch versions and GPUs
python3 - "$out/report.json" <<'PY' | tee "$out/profile-summary.txt"
import json, sys

report = json.load(open(sys.argv[1]))
print(f"{report['model']} on {report['gpu'] or report['device']}, torch {report['torch_version']}")
for r in report["results"]:
    profile = r.get("profile") or {}
    print(f"bucket {r['bucket']}: status {r['status']}, serves {r.get('variant')}, "
          f"unavailable {profile.get('unavailable')}")
    for name, v in profile.get("variants", {}).items():
        print(f"  {name}: {v['time_kind']} {v['per_call_us']:.1f} us/call; inductor {v['inductor_kernels']} "
              f"({v['inductor_share']:.0%}), aten {v['aten_kernels']} ({v['aten_share']:.0%}), "
              f"other {v['other_kernels']} ({v['other_share']:.0%}); {v['trace']}")
        for k in v["top"][:5]:
            print(f"    {k['share']:5.1%} {k['calls']:5d} calls  {k['kind']:<8} {k['name']}")
PY
rm -rf "$out/cache"
# written beside, then moved in: tar fails a directory that changes while it reads it
tar -czf "/tmp/profile-buckets.$$.tar.gz" -C "$out" --exclude profile-buckets.tar.gz . \
    && mv "/tmp/profile-buckets.$$.tar.gz" "$out/profile-buckets.tar.gz"
