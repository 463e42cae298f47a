#!/usr/bin/env bash
# The serving pod's own command lines (orchestrator/deployment/k8s.py renders them) on a GPU machine, in
# order, as Kubernetes would run them: a warmup publishes to a store, the init container's
# `orchestrate pull --cache-dir`, then the server's `orchestrate serve --require-warm`, probed as
# the kubelet probes it (/info for startup and readiness, /-/healthz for liveness), asked for one
# prediction and scraped once on its metrics port. Reports how long each step took and keeps every
# log. Needs the wheelhouse in .whl/ (see bench/device_tests.sh); everything lands in
# OUT_DIR/pod-start.tar.gz.
#   bench/pod_start.sh OUT_DIR [example]        # default example: mlp
set -uo pipefail
out=${1:?usage: bench/pod_start.sh OUT_DIR [example]}; example=${2:-mlp}
logs="$out/pod-start"; mkdir -p "$logs"; work=$(mktemp -d)
pip install --quiet --no-deps --target /tmp/site .whl/*.whl >"$logs/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0
orchestrate() { python3 -m orchestrator "$@"; }
now() { date +%s.%N; }
step() { echo "$1: exit $2, $(python3 -c "print(f'{$4 - $3:.2f}')") s" | tee -a "$logs/status.txt"; }
config="examples/$example.yaml"; store="file://$work/store"; root="$work/pod-cache"; mkdir -p "$work/store"

orchestrate keys new "$work/keys" >"$logs/keys.log" 2>&1
export ORCHESTRATE_CACHE_SIGNING_KEY_FILE="$work/keys/cache-signing.key"
t0=$(now)
timeout 600 python3 -m orchestrator warmup --no-ray --model "$config" --device cuda --cache-dir "$work/warmup-cache" \
    --remote "$store" --json >"$logs/warmup.json" 2>"$logs/warmup.log"
step warmup $? "$t0" "$(now)"
unset ORCHESTRATE_CACHE_SIGNING_KEY_FILE

# the pod: only the public key, a fresh cache root
export ORCHESTRATE_CACHE_TRUSTED_KEYS="$work/keys/cache-signing.key.pub" HOME="$work/home"; mkdir -p "$HOME"
t0=$(now)
timeout 300 python3 -m orchestrator pull --model "$config" --cache-dir "$root" --device cuda --remote "$store" \
    --json >"$logs/pull.json" 2>"$logs/pull.log"
step init-pull $? "$t0" "$(now)"

t0=$(now)
python3 -m orchestrator serve --model "$config" --cache-dir "$root" --device cuda --require-warm \
    --host 127.0.0.1 --port 8000 --metrics-port 9400 >"$logs/serve.out" 2>"$logs/serve.log" &
server=$!
ready=1
for _ in $(seq 1 240); do
    if curl -sf http://127.0.0.1:8000/info >"$logs/info.json" 2>/dev/null; then ready=0; break; fi
    kill -0 $server 2>/dev/null || break
    sleep 0.5
done
step serve-ready "$ready" "$t0" "$(now)"
curl -s -m 10 -o /dev/null -w "liveness /-/healthz: %{http_code}\n" http://127.0.0.1:8000/-/healthz | tee -a "$logs/status.txt"
python3 - "$config" >"$logs/predict.txt" 2>&1 <<'PY'
import json, sys, urllib.error, urllib.request, yaml
shape = yaml.safe_load(open(sys.argv[1]))["inputs"][0]["shape"]
def filled(dims):
    return 0.5 if not dims else [filled(dims[1:]) for _ in range(dims[0])]
row = filled(shape[1:])
body = json.dumps({"inputs": [[row] * 3]}).encode()  # one array per model input, 3 rows
request = urllib.request.Request("http://127.0.0.1:8000/predict", body, {"Content-Type": "application/json"})
try:
    answer = json.load(urllib.request.urlopen(request, timeout=60))
except urllib.error.HTTPError as error:
    sys.exit(f"predict: HTTP {error.code}: {error.read().decode()}")
print("predict ok:", len(answer["outputs"]), "rows out")
PY
echo "predict: exit $?" >>"$logs/status.txt"
curl -s -m 10 http://127.0.0.1:9400/metrics >"$logs/metrics.txt"; echo "metrics: exit $?" >>"$logs/status.txt"
for _ in $(seq 1 120); do grep -q "^orchestrate: serving" "$logs/serve.log" && break; sleep 0.5; done
# SIGTERM, as the kubelet stops a pod (a background job of a script ignores SIGINT)
kill -TERM $server; timeout 60 tail --pid=$server -f /dev/null; wait $server; echo "serve: exit $? after SIGTERM" >>"$logs/status.txt"
tar -czf "$out/pod-start.tar.gz" -C "$logs" .
cat "$logs/status.txt"
