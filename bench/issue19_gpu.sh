#!/bin/bash
# Issue 19 on the device machine (repo root): the device tool's commands, recorded.
#   bash bench/issue19_gpu.sh baseline   # before/after of the inflated baselines (bench/baseline_gpu.py)
#   bash bench/issue19_gpu.sh search     # references, a time-boxed search of the bundled corpus, independent re-timing
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/issue19}
mkdir -p "$OUT"
case "$1" in
baseline)
    python3 bench/baseline_gpu.py "$OUT/baseline_h100.json" --repeats "${REPEATS:-1}" --ops \
        ${BASELINE_OPS:-sglang/fused_rmsnorm_kernel sglang/merge_state_triton sglang/experts_combine_kernel demo/row_sum} \
        2>&1 | tee "$OUT/baseline.log"
    ;;
search)
    STORE=file:///tmp/issue19-store
    SOURCES=${SOURCES:-"demo sglang vllm_torch vllm_triton"}
    src_args=$(for s in $SOURCES; do printf -- "--source %s " "$s"; done)
    ops_args=$(for o in ${OPS:-}; do printf -- "--ops %s " "$o"; done)
    python3 -m farm reference $src_args $ops_args --store $STORE --device cuda:0 --json > "$OUT/reference.json" 2> "$OUT/reference.err"
    timeout "${SEARCH_S:-300}" python3 -m farm search $src_args --target cuda --max-tasks "${MAX_TASKS:-3}" \
        --max-concurrent 1 --generators "${GENERATORS:-tune}" --store $STORE --run issue19 --json \
        > "$OUT/search.json" 2> "$OUT/search.err"
    echo "search exit $?"
    python3 bench/retime.py $STORE --target cuda --run issue19 --json "$OUT/retime_h100.json" ${RETIME_ARGS:-} \
        2>&1 | tee "$OUT/retime.log"
    python3 bench/issue19_table.py $STORE issue19 "$OUT/retime_h100.json" > "$OUT/table.md" 2>&1
    ;;
esac
