#!/usr/bin/env bash
# farm export on a CUDA GPU, end to end: search a few ops (one candidate each: the original Model, enough to promote
# a verified kernel), export them with AOT C, install the package into a fresh virtualenv and run
# its generated tests there (kernel on the stored seed set and fresh inputs, fallback, AOT C
# built with build.sh and replayed through ctypes against the stored outputs).
# Usage (device machine, repo root): OUT=results_dir bash bench/export_gpu.sh
# Writes $OUT/env.txt, log.txt, run_demo.json, search_sglang.json, export.json, pytest.txt, package.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
S=/tmp/kfarm_store; R=gpu_export; PKGDIR=/tmp/kf_h100
farm() { python3 -m farm "$@"; }
exec > >(tee "$OUT/log.txt") 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  (cc --version || gcc --version) 2>/dev/null | head -1; } > "$OUT/env.txt"
cat "$OUT/env.txt"
t0=$(date +%s)
time farm run --source demo --target cuda --max-tasks 1 --generators tune --run $R --store $S --json > "$OUT/run_demo.json"
echo "run demo rc=$?"
time farm reference --source sglang --op fused_softcap_kernel --op fused_rmsnorm_kernel --op triton_tanh --store $S --json > /dev/null
echo "reference rc=$?"
time farm search --source sglang --target cuda --max-tasks 1 --generators tune --run $R --store $S --json > "$OUT/search_sglang.json"
echo "search rc=$?"
time farm export --run $R --target cuda --store $S --out $PKGDIR --name kf_h100 --json > "$OUT/export.json"
echo "export rc=$?"
# The image's python3 is itself a virtualenv holding torch, so the package goes into it (CI does
# the fresh-virtualenv install: tests/export/test_export.py).
time python3 -m pip install -q --no-index --no-build-isolation --no-deps $PKGDIR; echo "pip rc=$?"
cd /tmp
XN=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 6")
time python3 -m pytest -q -rs -p no:cacheprovider $XN $PKGDIR/tests 2>&1 | tee "$OUT/pytest.txt"
echo "pytest rc=${PIPESTATUS[0]}"
tar czf "$OUT/package.tgz" --exclude='*.pt' --exclude='*.so' --exclude='__pycache__' -C /tmp kf_h100
echo "total $(( $(date +%s) - t0 )) s"
