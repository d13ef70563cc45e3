#!/usr/bin/env bash
# H200: TAIL 0 against TAIL 1 where the split should pay more than at 4096^3: a last wave 18%
# full (4096x2304x4096, 288 tiles of 128 x 256, SWIZZLE 1 so that no band pads them) and
# twice the K steps (4096x4096x8192). Given points, one process per shape.
set -u
usage="call2-tail-shapes.sh"
source bench/run-steps.sh "$OUT" call2
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $out/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWAP_AB=0,MMA_ORDER=0,EPILOGUE=3,EPI_STAGES=2,EPI_N=32
for job in 4096x2304x4096:SWIZZLE=1 4096x4096x8192:SWIZZLE=8; do
  IFS=: read shape sw <<< "$job"
  timeout $((280 - SECONDS)) $kforge tune $f --shape $shape --dtype bf16 --strategy given --no-starts \
    --db $out/tune-$shape.sqlite --json $out/tune-$shape.json \
    --start "$f:$b,$sw,TAIL=0" "$f:$b,$sw,TAIL=1" > $out/tune-$shape.log 2>&1
  echo "$shape rc $? at $SECONDS s" | tee -a $summary
  archive
done
for l in $out/tune-*.log; do echo "== $l"; sed -n '/^rank\|^ *[0-9]\+ /p' $l | head -5 | cut -c1-60; grep -i "final\|reject\|fail\|error" $l | head -4; done | tee -a $summary
xz $out/*.sqlite 2>/dev/null; archive
