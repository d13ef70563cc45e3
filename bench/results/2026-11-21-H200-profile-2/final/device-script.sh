#!/usr/bin/env bash
# Final check: GPU tests of profile/trace/example plans, and the LLaMA profile -> plan.
set -u
ROOT=$PWD
export KFORGE_INCLUDE_DIR=$ROOT/build/snapshot/include
export KFORGE_GIT_SHA=$(cat build/snapshot/SHA)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
K=$ROOT/build/run/kforge
EX=$ROOT/build/snapshot/python/examples
R=/tmp/res20; mkdir -p $R; cd $R
timeout 300 $ROOT/build/run/tests/kforge_gpu_tests --gtest_filter='*ExamplePlan*:ProfileGpu*:TorchTraceGpu*' > $R/gtests.out 2>&1; echo "rc $?" >> $R/gtests.out
timeout 60 $K ceilings --json $R/ceilings.json > $R/ceilings.out 2>&1
timeout 180 $K profile --range step --skip 3 --out $R/p-llama.json -- python3 $EX/llama.py --nvtx --iters 10 --warmup 3 > $R/p-llama.out 2>&1; echo "rc $?" >> $R/p-llama.out
timeout 60 $K plan $R/p-llama.json --ceilings $R/ceilings.json --json $R/plan-llama.json > $R/plan-llama.out 2>&1
python3 -c "
import json; p=json.load(open('$R/p-llama.json')); c=p['metadata']['cupti']
print('kernels', len(p['kernels']), 'no_launch', c['kernels_without_launch_call'], 'api_recorded', c['api_calls_recorded'])
print('top', [(a['name'], a['calls']) for a in c['api_calls_by_name'][:6]])" > $R/api.txt
rm -f $R/p-llama.json
tar -czf $OUT/res20.tgz -C /tmp res20
grep -E "^\[ *(OK|FAILED|PASSED) |^rc" $R/gtests.out
cat $R/api.txt; grep -E "kernel time|GPU busy|gpu_time" $R/p-llama.out; cat $R/plan-llama.out
