#!/bin/bash
# one farm run of two demo ops on the CPU, its process tree's CPU via the sampler
# usage: [TREE=checkout] onerun.sh TAG   (TREE: the farm to run, this checkout by default)
here=$(cd "$(dirname "$0")" && pwd)
TREE=${TREE:-$(cd "$here/../../../.." && pwd)}
out=${OUT:-/tmp/onerun}; mkdir -p "$out"
tag=$1; shift
rm -rf /tmp/fr && mkdir /tmp/fr && cd /tmp/fr
python "$here/sampler.py" "$out/procs-$tag.json" 0.1 & sp=$!
sleep 0.5
/usr/bin/time -f "%e s wall %U user %S sys" env TRITON_INTERPRET=1 FARM_STORE=file:///tmp/fr/store HOME=/tmp/fr PYTHONPATH=$TREE python -m farm run --source demo --ops row_sum --ops vector_add_scale --target cpu --max-tasks 4 --json > out.json 2> err.txt
kill $sp; sleep 0.5
tail -1 err.txt
python - "$out/procs-$tag.json" <<'PY'
import json,sys
procs=json.load(open(sys.argv[1]))
bypid={p['pid']:p for p in procs.values()}
rp={p['pid'] for p in procs.values() if '-m farm run' in p['cmd']}
def anc(p):
    n=0
    while p and n<40:
        if p['pid'] in rp: return True
        p=bypid.get(p['ppid']); n+=1
    return False
tot=sum(p['cpu'] for p in procs.values() if anc(p))
z=sum(1 for p in procs.values() if anc(p) and 'zygote' in p['cmd'] and 'zygote' not in bypid.get(p['ppid'],{'cmd':''})['cmd'])
f=sum(1 for p in procs.values() if anc(p) and 'runner_child' in p['cmd'])
print(f"tree CPU {tot:.1f} s, servers {z}, fresh runners {f}")
PY
