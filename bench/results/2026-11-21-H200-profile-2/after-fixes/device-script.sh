#!/usr/bin/env bash
# Device call: GPU tests for profile/trace, LLaMA and CUDA example profiles, plan, extract, tune.
set -u
ROOT=$PWD
export KFORGE_INCLUDE_DIR=$ROOT/build/snapshot/include
export KFORGE_GIT_SHA=$(cat build/snapshot/SHA)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
K=$ROOT/build/run/kforge
EX=$ROOT/build/snapshot/python/examples
R=/tmp/res17; mkdir -p $R; cd $R
T0=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - T0 ))s)" | tee -a $R/summary.txt; }
step ceilings; timeout 60 $K ceilings --json $R/ceilings.json > $R/ceilings.out 2>&1
step gtests
timeout 300 $ROOT/build/run/tests/kforge_gpu_tests --gtest_filter='ProfileGpu*:TorchTraceGpu*' > $R/gtests.out 2>&1; echo "rc $?" >> $R/gtests.out
step cuda
timeout 60 $K profile --range step --skip 2 --out $R/p-cuda.json -- $ROOT/build/run/kforge_example_cuda --iters 10 --warmup 2 > $R/p-cuda.out 2>&1; echo "rc $?" >> $R/p-cuda.out
step llama
timeout 180 $K profile --range step --skip 3 --out $R/p-llama.json -- python3 $EX/llama.py --nvtx --iters 10 --warmup 3 > $R/p-llama.out 2>&1; echo "rc $?" >> $R/p-llama.out
timeout 60 $K plan $R/p-llama.json --ceilings $R/ceilings.json --json $R/plan-llama.json > $R/plan-llama.out 2>&1
timeout 60 $K plan $R/p-llama.json --ceilings $R/ceilings.json --extract 4 --workspace $R/ws > $R/extract.out 2>&1
step tune-task
for t in $(ls $R/ws/*/task.json | head -4); do n=$(basename $(dirname $t)); timeout 100 $K tune --task $t --budget 3 --time 30 --db $R/t.sqlite > $R/tune-$n.out 2>&1; echo "rc $?" >> $R/tune-$n.out; done
step llama-train-trace
timeout 150 python3 $EX/llama.py --train --kv-heads 4 --iters 2 --warmup 1 --torch-trace $R/train-trace.json > $R/train-trace.out 2>&1
timeout 60 $K profile --torch-trace $R/train-trace.json --out $R/p-train.json > $R/p-train.out 2>&1
timeout 60 $K plan $R/p-train.json --ceilings $R/ceilings.json > $R/plan-train.out 2>&1
step gpt2
timeout 120 $K profile --range step --skip 2 --out $R/p-gpt2.json -- python3 $EX/gpt2.py --nvtx --iters 5 --warmup 2 > $R/p-gpt2.out 2>&1
timeout 60 $K plan $R/p-gpt2.json --ceilings $R/ceilings.json > $R/plan-gpt2.out 2>&1
step done
rm -f $R/train-trace.json; gzip -f $R/p-llama.json $R/p-train.json 2>/dev/null
tar -czf $OUT/res17.tgz -C /tmp res17
cat $R/summary.txt
grep -E "PASSED|FAILED|^rc" $R/gtests.out | tail -5
grep -E "gpu_time_ms|kernel time|GPU busy|^rc" $R/p-cuda.out $R/p-llama.out
cat $R/plan-llama.out
tail -6 $R/extract.out
for f in $R/tune-*.out; do echo "-- $f"; tail -4 $f; done
head -16 $R/plan-train.out
