#!/usr/bin/env bash
# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.
# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
mkdir -p src
rm -f src/triton_tanh_tanh_kernel.*
"$PY" -m triton.tools.compile kernel.py -n tanh_kernel -w 4 -ns 3 -s '*fp32:16, *fp32:16, i32:16, 1024' -g '(n_elements + 1024 - 1) / 1024,1,1' -on triton_tanh_tanh_kernel -o src/triton_tanh_tanh_kernel
"$PY" -m triton.tools.compile kernel.py -n tanh_kernel -w 4 -ns 3 -s '*fp32, *fp32, i32, 1024' -g '(n_elements + 1024 - 1) / 1024,1,1' -on triton_tanh_tanh_kernel -o src/triton_tanh_tanh_kernel
"$PY" -m triton.tools.link src/triton_tanh_tanh_kernel.*.h -o src/triton_tanh_tanh_kernel
