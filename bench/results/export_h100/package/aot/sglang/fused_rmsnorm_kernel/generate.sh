#!/usr/bin/env bash
# C sources and headers of this op's Triton kernels, by Triton's AOT compiler and linker.
# Needs triton and a CUDA GPU of the target architecture (Triton compiles for the current device).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
mkdir -p src
rm -f src/fused_rmsnorm_kernel_fused_rmsnorm_kernel.*
"$PY" -m triton.tools.compile kernel.py -n fused_rmsnorm_kernel -w 8 -ns 3 -s '*fp16:16, *fp16:16, *fp16:16, i32:16, i32:16, i32:16, fp32, 4096' -g 32,1,1 -on fused_rmsnorm_kernel_fused_rmsnorm_kernel -o src/fused_rmsnorm_kernel_fused_rmsnorm_kernel
"$PY" -m triton.tools.compile kernel.py -n fused_rmsnorm_kernel -w 8 -ns 3 -s '*fp16, *fp16, *fp16, i32, i32, i32, fp32, 4096' -g 32,1,1 -on fused_rmsnorm_kernel_fused_rmsnorm_kernel -o src/fused_rmsnorm_kernel_fused_rmsnorm_kernel
"$PY" -m triton.tools.link src/fused_rmsnorm_kernel_fused_rmsnorm_kernel.*.h -o src/fused_rmsnorm_kernel_fused_rmsnorm_kernel
