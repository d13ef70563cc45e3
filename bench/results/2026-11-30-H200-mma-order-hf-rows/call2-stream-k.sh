#!/usr/bin/env bash
# H200: matmul 4096^3 with stream-K forced (SPLIT 2: the last two waves' tiles split over one
# wave of blocks) against the row and MMA_ORDER 1. Five stages and the sanitizers of SPLIT 2 in
# bf16 first; then given points, three rounds (separate databases), no table change.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call2; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call2.tgz call2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,CLUSTER_M=2,CLUSTER_N=1,SWAP_AB=0,EPI_N=32,EPI_STAGES=4
params=(); for kv in ${b//,/ } SWIZZLE=8 EPILOGUE=0 MMA_ORDER=0 SPLIT=2; do params+=(--param $kv); done
( timeout 300 build/ci/kforge check $f --dtype bf16 "${params[@]}" --sanitize > $o/check-split2-bf16.log 2>&1
  echo "check split2 bf16 rc $? at $SECONDS s" ) &
pts=("$f:$b,SWIZZLE=8,EPILOGUE=2,MMA_ORDER=0,SPLIT=0"
     "$f:$b,SWIZZLE=8,EPILOGUE=0,MMA_ORDER=1,SPLIT=0"
     "$f:$b,SWIZZLE=8,EPILOGUE=0,MMA_ORDER=0,SPLIT=2"
     "$f:$b,SWIZZLE=8,EPILOGUE=0,MMA_ORDER=1,SPLIT=2"
     "$f:$b,SWIZZLE=4,EPILOGUE=0,MMA_ORDER=0,SPLIT=2"
     "$f:$b,SWIZZLE=1,EPILOGUE=0,MMA_ORDER=0,SPLIT=2"
     "$f:$b,SWIZZLE=8,EPILOGUE=0,MMA_ORDER=0,SPLIT=1")
wait
grep -E "^\[edge_cases\]|sanitize\]|verdict|^\[" $o/check-split2-bf16.log | tail -14; pack
for r in 1 2 3; do
  ((SECONDS < 470)) || break
  timeout $((575 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-final-check --no-starts --db $o/tune-$r.sqlite --json $o/tune-$r.json \
    --start "${pts[@]}" > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -9
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
