#!/usr/bin/env bash
# What a busy host and a second process on the GPU do to the per-call figures of ops whose
# forward synchronises with the host (issue 19: AKG's events-mode ops read 1.1-1.6x in a
# six-op search and 0.96-1.06x when re-timed alone).
#
#   OUT=dir bash bench/contention_gpu.sh AKG_ROOT [OPS...]
#
# Reference data and a short search of the ops (sglang source of AKG's corpus), the independent
# re-timing (bench/retime.py), then `farm eval` of each op's best passing kernel three times:
# quiet, with every core busy (one Python spin loop per core), and with another process keeping
# the GPU busy (back-to-back matmuls). Each eval's ratio to the Model with its interval and its
# Model per-call figure go to $OUT/contention.md.
set -uo pipefail
akg=${1:?AKG checkout}; shift
ops=${*:-compute_position create_flashinfer_kv_indices_triton write_req_to_token_pool}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/contention-out}; mkdir -p "$OUT"
printf 'corpus:\n  akg_root: %s\n' "$akg" > /tmp/contention.yaml
export FARM_CONFIG=/tmp/contention.yaml
store=file:///tmp/contention-store; run=contention
# shellcheck disable=SC2086 # ops is a list
python3 -m farm reference --source sglang --ops $ops --store "$store" --device 0 --jobs 4 --json > "$OUT/reference.json" 2> "$OUT/reference.err"
# shellcheck disable=SC2086
timeout 240 python3 -m farm search --source sglang --target cuda --max-tasks "${MAX_TASKS:-2}" \
  --generators "${GENERATORS:-tune}" --store "$store" --run $run --ops-per-device 4 --json > "$OUT/search.json" 2> "$OUT/search.err"
timeout 150 python3 bench/retime.py "$store" --target cuda --run $run --passing --json "$OUT/retime.json" > "$OUT/retime.log" 2>&1

load_cpu() { for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & done; }
load_gpu() { python3 -c 'import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
while True:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()' & }
for cond in quiet cpu gpu; do
  pids=""
  if [ "$cond" = cpu ]; then load_cpu; pids=$(jobs -p); fi
  if [ "$cond" = gpu ]; then load_gpu; pids=$(jobs -p); sleep 5; fi
  for op in $ops; do
    best=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); b = r.get("best") or {}
print(sys.argv[2] + "/candidates/" + b["id"] + ".py" if b.get("verdict") == "pass" else "")' \
      "/tmp/contention-store/runs/$run/sglang/$op/report.json" "/tmp/contention-store/runs/$run/sglang/$op" 2>/dev/null)
    [ -n "$best" ] || { echo "$op: no passing kernel"; continue; }
    timeout 120 python3 -m farm eval --candidate "$best" --source sglang --op "$op" --store "$store" --target cuda \
      --json > "$OUT/eval_${cond}_$op.json" 2> "$OUT/eval_${cond}_$op.err"
  done
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill $pids 2>/dev/null; wait 2>/dev/null
done
python3 - "$OUT" $ops <<'EOF' | tee "$OUT/contention.md"
import json, sys
from pathlib import Path
out, ops = Path(sys.argv[1]), sys.argv[2:]
indep = {}
try:
    for row in json.load(open(out / "retime.json"))["rows"]:
        indep[row["op"]] = row
except Exception as exc:  # noqa: BLE001 - the table says what is missing
    print("retime.json:", exc)
print("| op | condition | vs Model [95% CI] | Model per call us | mode | independent (Model us / best us) |")
print("|---|---|---|---|---|---|")
for op in ops:
    for cond in ("quiet", "cpu", "gpu"):
        try:
            d = json.load(open(out / f"eval_{cond}_{op}.json"))
        except Exception:  # noqa: BLE001
            print(f"| {op} | {cond} | - | - | - | - |")
            continue
        m = (d.get("comparison") or {}).get("model") or {}
        base = (d.get("baseline") or {}).get("model_ms")
        i = indep.get(f"sglang/{op}", {})
        print(f"| {op} | {cond} | {m.get('ratio', 0):.3f} [{m.get('ci_low', 0):.3f}, {m.get('ci_high', 0):.3f}] | "
              f"{(base or 0) * 1e3:.1f} | {m.get('mode')} | {i.get('independent', 0):.3f} ({(i.get('model_ms') or 0) * 1e3:.1f} / "
              f"{(i.get('best_ms') or 0) * 1e3:.1f}) |")
EOF
