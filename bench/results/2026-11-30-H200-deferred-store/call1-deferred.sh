#!/usr/bin/env bash
# H200: matmul 4096^3 with EPILOGUE 3 (each tile's stores issued during the next tile's first K
# steps, from a 16-bit copy of its accumulators in registers). Five stages with the four
# sanitizers in bf16 and f16 (both at once), then given points against the row (EPILOGUE 2),
# two rounds in separate databases; round 2 writes the winner into the table (--update-table).
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call1; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
pack() { tar -C /tmp -czf $OUT/call1.tgz call1; }
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0,MMA_ORDER=0
for job in bf16:EPI_N=32:EPI_STAGES=2 f16:EPI_N=64:EPI_STAGES=2; do
  IFS=: read d n s <<< "$job"
  params=(); for kv in ${b//,/ } EPILOGUE=3 $n $s; do params+=(--param $kv); done
  timeout 300 build/ci/kforge check $f --dtype $d "${params[@]}" --sanitize > $o/check-$d.log 2>&1 &
done
wait
echo "checks done at $SECONDS s"
for d in bf16 f16; do echo "== $d"; tail -5 $o/check-$d.log; done
pack
pts=("$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4"
     "$f:$b,EPILOGUE=3,EPI_N=32,EPI_STAGES=2"
     "$f:$b,EPILOGUE=3,EPI_N=32,EPI_STAGES=3"
     "$f:$b,EPILOGUE=3,EPI_N=64,EPI_STAGES=2"
     "$f:$b,EPILOGUE=3,EPI_N=16,EPI_STAGES=4")
for r in 1 2; do
  ((SECONDS < 380)) || { echo "round $r skipped (time)"; break; }
  extra=(); [ $r = 2 ] && extra=(--update-table)
  timeout $((585 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-starts --db $o/tune-$r.sqlite --json $o/tune-$r.json --start "${pts[@]}" \
    "${extra[@]}" > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -8
  grep -i "final\|reject\|fail\|error" $o/tune-$r.log | head -6
  pack
done
cp kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json $o/ 2>/dev/null
xz $o/*.sqlite 2>/dev/null; pack
