#!/usr/bin/env bash
# Device call: recorded test data (raw CUPTI files, torch trace), GPU-bound LLaMA busy vs events,
# gpt2/bert profiles, GPU gtests for profile/trace.
set -u
ROOT=$PWD
export KFORGE_INCLUDE_DIR=$ROOT/build/snapshot/include
export KFORGE_GIT_SHA=$(cat build/snapshot/SHA)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
K=$ROOT/build/run/kforge
EX=$ROOT/build/snapshot/python/examples
R=/tmp/res16; mkdir -p $R; cd $R
T0=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - T0 ))s)" | tee -a $R/summary.txt; }
keep_raw() {  # keep_raw NAME OUTFILE : copy the raw dir printed in OUTFILE to $R/raw-NAME
  d=$(sed -n 's/^raw records in //p' $2 | tail -1); [ -n "$d" ] && cp -r "$d" $R/raw-$1 && rm -rf "$d"; }
step ceilings; timeout 60 $K ceilings --json $R/ceilings.json > $R/ceilings.out 2>&1
step gtests
timeout 400 $ROOT/build/run/tests/kforge_gpu_tests --gtest_filter='ProfileGpu*:TorchTraceGpu*' > $R/gtests.out 2>&1; echo "rc $?" >> $R/gtests.out
step cuda-small
timeout 60 $K profile --keep-raw --range step --skip 1 --out $R/p-cuda-small.json -- $ROOT/build/run/kforge_example_cuda --iters 2 --warmup 1 > $R/p-cuda-small.out 2>&1; echo "rc $?" >> $R/p-cuda-small.out
keep_raw cuda $R/p-cuda-small.out
step llama-small
timeout 120 $K profile --keep-raw --range step --skip 1 --out $R/p-llama-small.json -- python3 $EX/llama.py --nvtx --layers 2 --iters 1 --warmup 1 > $R/p-llama-small.out 2>&1; echo "rc $?" >> $R/p-llama-small.out
keep_raw llama $R/p-llama-small.out
timeout 120 python3 $EX/llama.py --layers 2 --iters 1 --warmup 1 --torch-trace $R/llama-small-trace.json > $R/llama-small-trace.out 2>&1
step gpt2-bert-small
for m in gpt2 bert; do
  timeout 120 $K profile --keep-raw --range step --skip 1 --out $R/p-$m-small.json -- python3 $EX/$m.py --nvtx --layers 2 --iters 1 --warmup 1 > $R/p-$m-small.out 2>&1; echo "rc $?" >> $R/p-$m-small.out
  keep_raw $m $R/p-$m-small.out
  timeout 120 python3 $EX/$m.py --layers 2 --iters 1 --warmup 1 --torch-trace $R/$m-small-trace.json > $R/$m-small-trace.out 2>&1
  timeout 60 $K plan $R/p-$m-small.json --ceilings $R/ceilings.json --top 15 > $R/plan-$m-small.out 2>&1
done
step llama-gpu-bound
for run in 1 2; do
  timeout 150 python3 $EX/llama.py --batch 32 --seq 1024 --iters 5 --warmup 2 > $R/llama-big-plain-$run.out 2>&1
  timeout 200 $K profile --range step --skip 2 --out $R/p-llama-big-$run.json -- python3 $EX/llama.py --batch 32 --seq 1024 --iters 5 --warmup 2 > $R/p-llama-big-$run.out 2>&1; echo "rc $?" >> $R/p-llama-big-$run.out
done
timeout 150 python3 $EX/llama.py --nvtx --batch 32 --seq 1024 --iters 5 --warmup 2 > $R/llama-big-nvtx-plain.out 2>&1
timeout 200 $K profile --range step --skip 2 --out $R/p-llama-big-nvtx.json -- python3 $EX/llama.py --nvtx --batch 32 --seq 1024 --iters 5 --warmup 2 > $R/p-llama-big-nvtx.out 2>&1; echo "rc $?" >> $R/p-llama-big-nvtx.out
timeout 60 $K plan $R/p-llama-big-nvtx.json --ceilings $R/ceilings.json --top 15 > $R/plan-llama-big.out 2>&1
step done
gzip -f $R/p-llama-big-*.json 2>/dev/null
tar -czf $OUT/res16.tgz -C /tmp res16
cat $R/summary.txt
grep -E "PASSED|FAILED|SKIPPED|^rc" $R/gtests.out | tail -12
for f in p-cuda-small p-llama-small p-gpt2-small p-bert-small; do echo "-- $f"; tail -4 $R/$f.out; done
du -sh $R/raw-* $R/*-small-trace.json
for f in llama-big-plain-1 llama-big-plain-2 llama-big-nvtx-plain; do grep gpu_time_ms $R/$f.out; done
for f in p-llama-big-1 p-llama-big-2 p-llama-big-nvtx; do echo "-- $f"; grep -E "gpu_time_ms|kernel time|busy|rc" $R/$f.out; done
head -20 $R/plan-llama-big.out
