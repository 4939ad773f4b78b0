#!/usr/bin/env bash
# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.
# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
mkdir -p src
rm -f src/swiglu_swiglu_kernel.*
"$PY" -m triton.tools.compile kernel.py -n _swiglu_kernel -w 4 -ns 3 -s '*fp16:16, *fp16:16, *fp16:16, i32:16, i32:16, i32:16, i32:16, 256' -g '2048,(n_cols + 256 - 1) / 256,1' -on swiglu_swiglu_kernel -o src/swiglu_swiglu_kernel
"$PY" -m triton.tools.compile kernel.py -n _swiglu_kernel -w 4 -ns 3 -s '*fp16, *fp16, *fp16, i32, i32, i32, i32, 256' -g '2048,(n_cols + 256 - 1) / 256,1' -on swiglu_swiglu_kernel -o src/swiglu_swiglu_kernel
"$PY" -m triton.tools.link src/swiglu_swiglu_kernel.*.h -o src/swiglu_swiglu_kernel
