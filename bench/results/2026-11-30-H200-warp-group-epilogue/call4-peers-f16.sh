#!/usr/bin/env bash
# H200: bench/peers matmul 4096^3 against cuBLAS in two processes with the EPILOGUE 2 row, then
# check --table of matmul's H200 table in f16.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call4; mkdir -p $o
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $t $o/matmul-table.json; tar -C /tmp -czf $OUT/call4.tgz call4; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
for run in 1 2; do
  timeout $((330 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "activity records\|x PyTorch" $o/peers-$run.log | tail -3
  pack
done
timeout $((585 - SECONDS)) build/ci/kforge check --table $t --dtype f16 > $o/check-f16.log 2>&1
echo "check --table f16 rc $? at $SECONDS s: $(grep -c '  PASS' $o/check-f16.log) PASS"
grep -E "^  (FAIL|ERROR)|skipped" $o/check-f16.log | cut -c1-200 | head
pack
