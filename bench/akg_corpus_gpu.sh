#!/usr/bin/env bash
# AKG's corpus, unchanged, through the farm on one GPU: list, reference data, a short offline
# search per op, in a time budget.
# Usage (device machine, repo root):
#   OUT=results_dir bash bench/akg_corpus_gpu.sh AKG_CHECKOUT [DEADLINE_S] [SEARCH_MAX_TASKS] [DEVICE] [REF_DEADLINE_S]
# AKG_CHECKOUT: an AKG checkout (or a folder holding its benchmark/akg_kernels_bench/thirdparty/).
# DEADLINE_S (default 600): seconds from the start after which no further search starts; the
# search still running is stopped, and every op searched so far is counted from the store.
# REF_DEADLINE_S (default DEADLINE_S): likewise for `farm reference` (the ops done so far are
# read from the store's manifest, which is merged after every op).
# Writes $OUT/env.txt, list.json, reference.json, search.json, summary.md (bench/akg_corpus_table.py).
# Timing mode: the evaluator's default (device events, a 256 MB write flush before each rep,
# no CUDA graph), as every farm search.
set -uo pipefail
akg=${1:?AKG checkout path}; deadline=${2:-600}; max_tasks=${3:-2}; dev=${4:-0}; ref_deadline=${5:-$deadline}
start=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d)
printf 'corpus:\n  akg_root: %s\n' "$akg" > "$work/farm.yaml"
export FARM_CONFIG=$work/farm.yaml FARM_STORE=file://$work/store
farm() { python3 -m farm "$@"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "akg_root $akg; seed_sets ${FARM_REFERENCE_SEED_SETS:-4 (default)}; search max_tasks $max_tasks; deadline ${deadline}s"
} > "$OUT/env.txt"
cat "$OUT/env.txt"
time farm ops list --json > "$OUT/list.json"; echo "ops list rc=$? at $(( $(date +%s) - start ))s"
# every source of the checkout (farm/corpus/akg.py: AKG adds folders between releases)
sources=$(python3 -c 'import json,sys; print(" ".join(sorted({r["source"] for r in json.load(open(sys.argv[1])) if r.get("origin") == "akg"})))' "$OUT/list.json")
src_args=$(for s in $sources; do printf -- "--source %s " "$s"; done)
time timeout "$ref_deadline" python3 -m farm reference --device "$dev" $src_args --json > "$work/reference.json"
echo "reference rc=$? at $(( $(date +%s) - start ))s"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); json.dump({"results": list(m["entries"].values())}, sys.stdout, indent=1)' \
  "$work/store/refs/manifest.json" > "$OUT/reference.json"
# one batch search per source (every op with reference data), stopped at the deadline
for src in $sources; do
  left=$(( deadline - ($(date +%s) - start) ))
  [ "$left" -le 5 ] && { echo "deadline reached before $src"; break; }
  timeout "$left" python3 -m farm search --source "$src" --target cuda --devices "$dev" --max-tasks "$max_tasks" \
    --max-concurrent 1 --generators tune,port --run akg --json > "$work/search_$src.json"
  echo "search $src rc=$? at $(( $(date +%s) - start ))s"
done
python3 bench/akg_corpus_table.py "$OUT" "$work/store" | tee "$OUT/summary.md"
