#!/usr/bin/env bash
# H200: EPILOGUE 3 with two accumulator halves (MMA_ORDER 2: split at a tile's edges; 1: every
# step) against the one-atom row at 4096^3. First, all at once: five stages with the
# sanitizers (MMA_ORDER 2 bf16, MMA_ORDER 1 f16), MMA_ORDER 1's bf16 build, and the table's
# variants compiled in bf16 and f16. Then two rounds of given points (round 2 writes the winner
# into the table, checked in f16 too), the table checked at the file's new text, and
# bench/peers at 4096^3 twice.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call4; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
pack() { tar -C /tmp -czf $OUT/call4.tgz call4; }
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0,EPILOGUE=3,EPI_N=32
args() { local r=(); for kv in ${1//,/ }; do r+=(--param $kv); done; echo "${r[@]}"; }
timeout 250 build/ci/kforge check $f --dtype bf16 $(args $b,EPI_STAGES=2,MMA_ORDER=2) --sanitize > $o/check-m2-bf16.log 2>&1 &
timeout 250 build/ci/kforge check $f --dtype f16 $(args $b,EPI_STAGES=2,MMA_ORDER=1) --sanitize > $o/check-m1-f16.log 2>&1 &
timeout 250 build/ci/kforge check $f --dtype bf16 $(args $b,EPI_STAGES=2,MMA_ORDER=1) > $o/check-m1-bf16.log 2>&1 &
for d in bf16 f16; do
  timeout 250 build/ci/kforge check --table $t --dtype $d --compile-only > $o/compile-$d.log 2>&1 &
done
wait; echo "checks and builds at $SECONDS s"
for c in m2-bf16 m1-f16 m1-bf16; do echo "== $c"; tail -2 $o/check-$c.log; done
pack
pts=("$f:$b,EPI_STAGES=2,MMA_ORDER=0"
     "$f:$b,EPI_STAGES=2,MMA_ORDER=2"
     "$f:$b,EPI_STAGES=2,MMA_ORDER=1")
for r in 1 2; do
  ((SECONDS < 300)) || { echo "round $r skipped (time)"; break; }
  extra=(); [ $r = 2 ] && extra=(--update-table --check-dtypes f16)
  timeout $((400 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-starts --db $o/tune-$r.sqlite --json $o/tune-$r.json --start "${pts[@]}" \
    "${extra[@]}" > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | cut -c1-60 | head -5
  grep -i "final\|reject\|fail\|error" $o/tune-$r.log | cut -c1-120 | head -4
  pack
done
for d in bf16 f16; do
  ((SECONDS < 480)) || { echo "check --table $d skipped (time)"; continue; }
  timeout $((520 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-table-$d.log 2>&1
  echo "check --table $d rc $? at $SECONDS s"; grep -cE "^  PASS" $o/check-table-$d.log; grep -E "FAIL|CRASH" $o/check-table-$d.log | head -3
  pack
done
cp $t $o/
for p in 1 2; do
  ((SECONDS < 550)) || break
  timeout $((590 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $o/peers-$p > $o/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s"; grep -E "^- matmul" $o/peers-$p.log | cut -c1-250
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
