#!/usr/bin/env bash
# H200: the synccheck fixture's GPU test; matmul 4096^3 given points (the row's CUTLASS epilogue
# and EPILOGUE 2) with --update-table (the winner's final check: five stages, memcheck,
# racecheck, synccheck); then check --table of matmul's H200 table in bf16 (the file's text
# changed, so every variant is checked again).
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call3; mkdir -p $o
pack() { cp kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json $o/matmul-table.json; tar -C /tmp -czf $OUT/call3.tgz call3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
( timeout 200 build/ci/tests/kforge_gpu_tests --gtest_filter='Faults/SanitizerStage.*' \
    > $o/gpu-sanitizer-tests.log 2>&1; echo "gpu tests rc $?" >> $o/gpu-sanitizer-tests.log ) &
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
timeout 280 build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 --strategy given \
  --update-table --db $o/tune.sqlite --json $o/tune.json \
  --start "$f:$b,EPILOGUE=0,EPI_N=32,EPI_STAGES=4" "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4" \
          "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=3" > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | head -5; grep -i "final\|PASS\|FAIL" $o/tune.log | tail -3
wait; tail -6 $o/gpu-sanitizer-tests.log; pack
timeout $((585 - SECONDS)) build/ci/kforge check --table kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json \
  --dtype bf16 > $o/check-bf16.log 2>&1
echo "check --table bf16 rc $? at $SECONDS s: $(grep -c '  PASS' $o/check-bf16.log) PASS"
grep -E "^  (FAIL|ERROR)|skipped|time" $o/check-bf16.log | cut -c1-200 | head
xz $o/*.sqlite 2>/dev/null; pack
