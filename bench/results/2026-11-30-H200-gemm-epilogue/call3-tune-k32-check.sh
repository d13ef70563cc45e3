#!/usr/bin/env bash
# H200: matmul 4096^3, fewer epilogue barriers (EPI_N 64) with more store buffers, paid for in
# K depth or stages; the winner (the table's row among the starts) to the table. Then
# check --table of matmul's H200 table in bf16, its variants compiled at once first.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
b=TILE_M=128,TILE_N=256,SCHEDULE=0,EPILOGUE=0,RASTER=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0,SPLIT=0
timeout 300 build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 --strategy given \
  --update-table --db $o/tune.sqlite --json $o/tune.json \
  --start "$f:$b,TILE_K=64,STAGES=4,EPI_N=32,EPI_STAGES=4" \
          "$f:$b,TILE_K=32,STAGES=7,EPI_N=64,EPI_STAGES=3" \
          "$f:$b,TILE_K=32,STAGES=8,EPI_N=32,EPI_STAGES=4" \
          "$f:$b,TILE_K=32,STAGES=6,EPI_N=64,EPI_STAGES=4" \
          "$f:$b,TILE_K=64,STAGES=3,EPI_N=64,EPI_STAGES=4" > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | head -8
grep -A40 "^final check" $o/tune.log | grep -c ": OK"; grep -i "FAIL\|error" $o/tune.log | head -5
timeout $((585 - SECONDS)) build/ci/kforge check --table $t --dtype bf16 > $o/check-bf16.log 2>&1
echo "check bf16 rc $? at $SECONDS s"; grep "PASS\|FAIL" $o/check-bf16.log | cut -c1-120
cp $t $o/matmul.json
xz $o/*.sqlite 2>/dev/null
