#!/usr/bin/env bash
# H200: matmul 4096^3, the TMA epilogue's store buffers (EPI_STAGES) and its alpha multiply
# (EPI_SCALE) at the row's tile, given points, two rounds (separate databases), no table change.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,EPILOGUE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
pts=("$f:$b,EPI_N=32,EPI_STAGES=2,EPI_SCALE=1"
     "$f:$b,EPI_N=32,EPI_STAGES=2,EPI_SCALE=0"
     "$f:$b,EPI_N=32,EPI_STAGES=4,EPI_SCALE=0"
     "$f:$b,EPI_N=32,EPI_STAGES=3,EPI_SCALE=0"
     "$f:$b,EPI_N=64,EPI_STAGES=2,EPI_SCALE=0"
     "$f:$b,EPI_N=32,EPI_STAGES=4,EPI_SCALE=1"
     "$f:$b,EPI_N=16,EPI_STAGES=4,EPI_SCALE=0")
for r in 1 2; do
  ((SECONDS < 420)) || break
  timeout $((560 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --db $o/tune-$r.sqlite --json $o/tune-$r.json --start "${pts[@]}" \
    > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -12
  grep -i "final\|reject\|fail\|error" $o/tune-$r.log | head -8
done
xz $o/*.sqlite 2>/dev/null
