#!/usr/bin/env bash
# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.
# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
mkdir -p src
rm -f src/vector_add_scale_add_scale_kernel.*
"$PY" -m triton.tools.compile kernel.py -n _add_scale_kernel -w 4 -ns 3 -s '*fp32:16, *fp32:16, *fp32:16, i32:16, fp32, 256' -g '(n_elements + 256 - 1) / 256,1,1' -on vector_add_scale_add_scale_kernel -o src/vector_add_scale_add_scale_kernel
"$PY" -m triton.tools.compile kernel.py -n _add_scale_kernel -w 4 -ns 3 -s '*fp32, *fp32, *fp32, i32, fp32, 256' -g '(n_elements + 256 - 1) / 256,1,1' -on vector_add_scale_add_scale_kernel -o src/vector_add_scale_add_scale_kernel
"$PY" -m triton.tools.link src/vector_add_scale_add_scale_kernel.*.h -o src/vector_add_scale_add_scale_kernel
