#!/usr/bin/env bash
# Profiler overhead: every API call recorded vs query calls left out, on host-bound llama.py.
set -u
ROOT=$PWD
export KFORGE_INCLUDE_DIR=$ROOT/build/snapshot/include
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
K=$ROOT/build/run/kforge
EX=$ROOT/build/snapshot/python/examples
R=/tmp/res19; mkdir -p $R; cd $R
L="--iters 10 --warmup 3"
summ() {  # summ NAME: one line from the profile and the program output
  python3 - "$1" <<'PY'
import json, re, sys
n = sys.argv[1]
out = open(f"{n}.out").read()
g = re.findall(r"gpu_time_ms=([0-9.]+)", out)
w = re.findall(r"wall_s=([0-9.]+)", out)
line = f"{n:24s} events_ms={g[-1] if g else '?':>8} wall_s={w[-1] if w else '?':>6}"
try:
    p = json.load(open(f"{n}.json"))
    c = p["metadata"]["cupti"]
    line += f" kernels={len(p['kernels'])} no_launch={c['kernels_without_launch_call']} api_recorded={c.get('api_calls_recorded')}"
    top = ", ".join(f"{a['name']}:{a['calls']}" for a in c.get("api_calls_by_name", [])[:8])
    line += "\n    top: " + top
except Exception as e:
    pass
print(line)
PY
}
run_plain() { ( /usr/bin/time -f "wall_s=%e" timeout 120 python3 $EX/llama.py $L $2 ) > $R/$1.out 2>&1; }
run_prof() { ( /usr/bin/time -f "wall_s=%e" env KFORGE_PROFILE_ALL_APIS=${3:-0} timeout 180 $K profile --range step --skip 3 --out $R/$1.json -- python3 $EX/llama.py $L $2 ) > $R/$1.out 2>&1; }
for rep in 1 2 3; do
  run_plain plain-nvtx-$rep --nvtx
  run_prof filtered-nvtx-$rep --nvtx
  run_prof all-nvtx-$rep --nvtx 1
  run_plain plain-$rep ""
  run_prof filtered-$rep ""
  run_prof all-$rep "" 1
done
for v in plain-nvtx filtered-nvtx all-nvtx plain filtered all; do for rep in 1 2 3; do summ $v-$rep; done; done | tee $R/table.txt
timeout 100 $ROOT/build/run/tests/kforge_gpu_tests --gtest_filter='ProfileGpu*' > $R/gtests.out 2>&1; echo "rc $?" >> $R/gtests.out
grep -E "PASSED|FAILED|^rc" $R/gtests.out | tail -4
rm -f $R/*.json
tar -czf $OUT/res19.tgz -C /tmp res19
