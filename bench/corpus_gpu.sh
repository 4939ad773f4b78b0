#!/usr/bin/env bash
# Check every corpus task at benchmark shapes and generate its reference data on one GPU.
# Usage (device machine, repo root): OUT=results_dir bash bench/corpus_gpu.sh [device]
# Writes $OUT/check.json, $OUT/reference.json, $OUT/manifest.json, $OUT/env.txt.
set -uo pipefail
dev=${1:-0}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
farm() { python3 -m farm "$@"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt"
cat "$OUT/env.txt"
time farm ops check --device "cuda:$dev" --shapes bench --json > "$OUT/check.json"; echo "ops check rc=$?"
refs=$(mktemp -d)
time farm reference --device "$dev" --output-dir "$refs" --json > "$OUT/reference.json"; echo "reference rc=$?"
cp "$refs/manifest.json" "$OUT/manifest.json"
python3 bench/corpus_table.py "$OUT"
