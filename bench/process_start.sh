#!/usr/bin/env bash
# What any torch process pays before it can compile anything on this machine, alone and with
# neighbours: the floor under "alone" in bench/fleet_warmup.py, and the cost of starting several
# such processes at once on one GPU (a fleet's compile units and ranks do).
#   bench/process_start.sh OUT_DIR        (PYTHONPATH set up as bench/device_fleet.sh does)
set -uo pipefail
out=${1:?usage: bench/process_start.sh OUT_DIR}
mkdir -p "$out"
device=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
probe="import time, torch; t = time.time(); torch.zeros(1, device='$device'); import torch._inductor.compile_fx, torch._dynamo; print(round(time.time() - t, 2))"

stamp() { date +%s.%N; }
seconds() { python -c "print(f'{$2 - $1:.2f}')"; }

{
    echo "device: $device, $(nproc) cores"
    for what in "import torch" "import ray"; do
        for attempt in 1 2; do
            start=$(stamp); python -c "$what"; end=$(stamp)
            echo "$what (run $attempt): $(seconds "$start" "$end") s"
        done
    done
    for n in 1 4 8; do
        start=$(stamp)
        for _ in $(seq "$n"); do python -c "$probe" >"$out/probe-$n-$RANDOM.txt" & done
        wait
        end=$(stamp)
        echo "$n processes at once (import torch, device, inductor imports): $(seconds "$start" "$end") s;" \
             "device + inductor part per process: $(cat "$out"/probe-"$n"-*.txt | tr '\n' ' ')"
        rm -f "$out"/probe-"$n"-*.txt
    done
} >"$out/process_start.txt" 2>&1
python -X importtime -c "import torch" 2>"$out/importtime.txt"
sort -t'|' -k2 -n -r "$out/importtime.txt" | head -25 >"$out/importtime-top.txt"
