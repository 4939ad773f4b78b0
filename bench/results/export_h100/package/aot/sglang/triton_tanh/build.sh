#!/usr/bin/env bash
# libtriton_tanh.so from the generated C (run generate.sh first). CUDA's cuda.h comes from $CUDA_HOME,
# else /usr/local/cuda, else the copy inside the triton package; libcuda is the driver's.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
CC="${CC:-$(command -v cc || command -v gcc || command -v clang || echo cc)}"
INC="${CUDA_HOME:-/usr/local/cuda}/include"
if [ ! -f "$INC/cuda.h" ]; then
  INC="$("$PY" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include"))')"
fi
LIBDIR="$("$PY" -c 'from triton.backends.nvidia.driver import libcuda_dirs; print(libcuda_dirs()[0])' 2>/dev/null || true)"
LINK=()
if [ -n "$LIBDIR" ]; then LINK=(-L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -l:libcuda.so.1); fi
"$CC" -O2 -shared -fPIC -I"$INC" -I. src/*.c -o libtriton_tanh.so "${LINK[@]}"
echo "built $(pwd)/libtriton_tanh.so"
