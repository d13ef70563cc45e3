#!/usr/bin/env bash
# H200: bench/peers matmul 4096^3 against cuBLAS in two processes with the committed row, then
# check --table of matmul's H200 table in f16.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
for run in 1 2; do
  timeout $((300 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "activity records\|x PyTorch" $o/peers-$run.log | tail -2
done
timeout $((560 - SECONDS)) build/ci/kforge check --table $t --dtype f16 > $o/check-f16.log 2>&1
echo "check f16 rc $? at $SECONDS s"; grep "PASS\|FAIL" $o/check-f16.log | cut -c1-120
cp $t $o/matmul.json
tar -C $o -cJf $o/peers.tar.xz peers-1 peers-2 && rm -rf $o/peers-1 $o/peers-2
