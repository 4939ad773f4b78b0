#!/usr/bin/env bash
# trusted runner forked (this tree) vs ae2c973 (.ext/before), same GPU, alternating
set -u
dpkg -x .ext/bubblewrap_*.deb /tmp/bw && export PATH=/tmp/bw/usr/bin:$PATH
which bwrap; bwrap --ro-bind / / true && echo "bwrap ok"
nvidia-smi --query-gpu=name --format=csv,noheader
root=$PWD

for i in 3; do
  for tree in after before; do
    dir=$root; [ $tree = before ] && dir=$root/.ext/before
    o=$OUT/$tree$i; mkdir -p $o
    ( cd $dir && HOME=/tmp/home-$tree$i PYTHONPATH=$dir timeout 200 python bench/throughput_gpu.py $o --phase after --sources demo --max-tasks 6 --ops-per-device 3 > $o/log.txt 2>&1; echo "rc=$?" >> $o/log.txt )
    echo "== $tree$i"; tail -4 $o/log.txt
    python - "$o" <<'P'
import json, sys, glob
for f in glob.glob(sys.argv[1] + "/throughput_*.json"):
    d = json.load(open(f))
    ph = d["after"] if "after" in d else d
    v = {}
    for o in ph.get("ops", []):
        for c in (o.get("per_candidate") or {}).values():
            v[c["verdict"]] = v.get(c["verdict"], 0) + 1
    print("wall", round(ph.get("wall_s", 0), 1), "median cpdm", round(ph.get("median_candidates_per_device_minute", 0), 2),
          "batch cpdm", round(ph.get("batch_candidates_per_device_minute", 0), 2), "verdicts", v,
          "stages", {k: round(x, 3) for k, x in (ph.get("stage_median_s") or {}).items()})
P
  done
done
