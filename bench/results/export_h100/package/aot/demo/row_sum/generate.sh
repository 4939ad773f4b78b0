#!/usr/bin/env bash
# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.
# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
mkdir -p src
rm -f src/row_sum_row_sum_kernel.*
"$PY" -m triton.tools.compile kernel.py -n _row_sum_kernel -w 4 -ns 3 -s '*fp32:16, *fp32:16, i32:16, i32:16, 128' -g 4096,1,1 -on row_sum_row_sum_kernel -o src/row_sum_row_sum_kernel
"$PY" -m triton.tools.compile kernel.py -n _row_sum_kernel -w 4 -ns 3 -s '*fp32, *fp32, i32, i32, 128' -g 4096,1,1 -on row_sum_row_sum_kernel -o src/row_sum_row_sum_kernel
"$PY" -m triton.tools.link src/row_sum_row_sum_kernel.*.h -o src/row_sum_row_sum_kernel
