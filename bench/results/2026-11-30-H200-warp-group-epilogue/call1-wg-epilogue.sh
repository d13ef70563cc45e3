#!/usr/bin/env bash
# H200: matmul 4096^3, kforge's per-warp-group TMA epilogue (EPILOGUE 2) against the row's
# CUTLASS epilogue, given points, two rounds (separate databases), no table change; then five
# stages with the sanitizers of two EPILOGUE 2 forms, one per dtype.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call1; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
pts=("$f:$b,EPILOGUE=0,EPI_N=32,EPI_STAGES=4"
     "$f:$b,EPILOGUE=2,EPI_N=64,EPI_STAGES=2"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=3"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=2"
     "$f:$b,EPILOGUE=2,EPI_N=16,EPI_STAGES=4")
pack() { tar -C /tmp -czf $OUT/call1.tgz call1; }
for r in 1 2; do
  ((SECONDS < 330)) || break
  timeout $((480 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --db $o/tune-$r.sqlite --json $o/tune-$r.json --start "${pts[@]}" \
    > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -12
  grep -i "final\|reject\|fail\|error" $o/tune-$r.log | head -8
  pack
done
for job in bf16:EPI_N=64:EPI_STAGES=2 f16:EPI_N=32:EPI_STAGES=4; do
  ((SECONDS < 470)) || { echo "skipped check $job (time)"; continue; }
  IFS=: read d n s <<< "$job"
  params=(); for kv in ${b//,/ } EPILOGUE=2 $n $s; do params+=(--param $kv); done
  timeout $((585 - SECONDS)) build/ci/kforge check $f --dtype $d "${params[@]}" --sanitize \
    > $o/check-$d.log 2>&1
  echo "check $job rc $? at $SECONDS s"; tail -4 $o/check-$d.log
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
