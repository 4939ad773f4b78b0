#!/usr/bin/env bash
# Issue 19's bar on one GPU, one corpus per call: reference data, a time-boxed search, and the
# independent re-timing (bench/retime.py, a fresh process) of every op that got a passing
# kernel, promoted or not; then the table (bench/issue19_table.py).
#
#   OUT=dir bash bench/truth_gpu.sh bundled SEARCH_S
#   OUT=dir bash bench/truth_gpu.sh akg SEARCH_S AKG_ROOT [REF_S]
#
# bundled: tasks/{demo,sglang,vllm_triton,vllm_torch}; akg: every source of corpus.akg_root
# (farm/corpus/akg.py), AKG's files unchanged. The store lives in /tmp/truth-<corpus> so that a
# later call on the same (warm) machine can go on: STEPS (default "reference search retime") picks
# the steps of this call, and a search given the same run resumes where the last one stopped.
# SOURCES: the sources of an akg call (default: every AKG source; issue 22's bar is over
# "sglang vllm_triton vllm_torch", AKG's three original folders).
# SEARCH_ARGS: more `farm search` options (e.g. --ops-per-device 4 for a corpus of 100 ops). Timing: the evaluator's default
# (--timing-mode auto: a CUDA graph for ops whose original runs under 20 us, else events with a
# 256 MB flush), and retime.py follows the mode each figure was taken in. JOBS (default 1): ops
# whose reference data is made at once (farm reference --jobs), not yet tried on a GPU.
set -uo pipefail
corpus=${1:?bundled or akg}; search_s=${2:-300}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/truth-out}; mkdir -p "$OUT"
store=file:///tmp/truth-$corpus; run=truth-$corpus
start=$(date +%s)
farm() { python3 -m farm "$@"; }
if [ "$corpus" = akg ]; then
  printf 'corpus:\n  akg_root: %s\n' "${3:?AKG checkout}" > /tmp/truth-akg.yaml
  export FARM_CONFIG=/tmp/truth-akg.yaml
  sources=${SOURCES:-$(farm ops list --json | python3 -c 'import json,sys; print(" ".join(sorted({r["source"] for r in json.load(sys.stdin) if r.get("origin") == "akg"})))')}
else
  sources="demo sglang vllm_triton vllm_torch"
fi
src_args=$(for s in $sources; do printf -- "--source %s " "$s"; done)
echo "corpus $corpus: sources $sources"
steps=" ${STEPS:-reference search retime} "
has() { [[ "$steps" == *" $1 "* ]]; }
if has reference; then
timeout "${4:-600}" python3 -m farm reference $src_args --store "$store" --device 0 --jobs "${JOBS:-1}" --json \
  > "$OUT/${corpus}_reference.json" 2> "$OUT/${corpus}_reference.err"
echo "reference rc=$? at $(( $(date +%s) - start ))s"
python3 - "$OUT/${corpus}_reference.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
ok = [r for r in rows if r.get("success")]
print(f"reference: {len(ok)}/{len(rows)} ok; elapsed per op (s): median "
      f"{sorted(r.get('elapsed_s') or 0 for r in rows)[len(rows) // 2]:.1f}")
for r in rows:
    if not r.get("success"):
        print("  failed", r["source"], r["op_name"], r.get("stage"), (r.get("error") or "").splitlines()[-1:])
EOF
fi
if has search; then
# progress: ops the batch has recorded so far, every 30 s (the search prints JSON only at its end)
( while sleep 30; do python3 -c 'import json, sys
d = json.load(open(sys.argv[1])).get("ops", {})
ok = sum(1 for r in d.values() if (r.get("result") or {}).get("status") == "succeeded")
print("search:", len(d), "ops done,", ok, "succeeded", flush=True)' "/tmp/truth-$corpus/runs/$run/ledger.json" 2>/dev/null
  done ) &
watcher=$!
# shellcheck disable=SC2086 # src_args and SEARCH_ARGS are lists of options
timeout "$search_s" python3 -m farm search $src_args --target cuda --max-tasks "${MAX_TASKS:-2}" --max-concurrent 1 \
  --generators "${GENERATORS:-tune}" --store "$store" --run "$run" ${SEARCH_ARGS:-} --json \
  > "$OUT/${corpus}_search.json" 2> "$OUT/${corpus}_search.err"
echo "search rc=$? at $(( $(date +%s) - start ))s"
kill "$watcher" 2>/dev/null
fi
has retime || exit 0
timeout "${RETIME_S:-240}" python3 bench/retime.py "$store" --target cuda --run "$run" --passing \
  --json "$OUT/${corpus}_retime.json" ${RETIME_ARGS:-} 2>&1 | tee "$OUT/${corpus}_retime.log"
echo "retime at $(( $(date +%s) - start ))s"
python3 bench/issue19_table.py "$store" "$run" "$OUT/${corpus}_retime.json" > "$OUT/${corpus}_table.md" 2>&1
