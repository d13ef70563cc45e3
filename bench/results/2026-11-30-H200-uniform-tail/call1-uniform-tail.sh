#!/usr/bin/env bash
# H200: TAIL 1 with warp-uniform flags. Every variant compiled at once (matmul's table in bf16
# and f16, TAIL 1 at SWIZZLE 8 and 1) while TAIL 1 is checked; given points TAIL 0 against 1
# at 4096^3 and Llama-2's lm_head (both --update-table), 4096x4096x8192 and 4096x2304x4096;
# the table checked in both dtypes; bench/peers at 4096^3 twice.
set -u
usage="call1-uniform-tail.sh"
source bench/run-steps.sh "$OUT" call1
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $out/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWAP_AB=0,MMA_ORDER=0,EPILOGUE=3,EPI_STAGES=2,EPI_N=32
for d in bf16 f16; do
  timeout 240 $kforge check --table $t --dtype $d --compile-only > $out/compile-$d.log 2>&1 &
done
args() { for kv in ${1//,/ }; do echo --param $kv; done; }
timeout 300 $kforge check $f --dtype bf16 $(args $b,SWIZZLE=8,TAIL=1) --sanitize > $out/check-bf16-sw8.log 2>&1 &
timeout 300 $kforge check $f --dtype f16 $(args $b,SWIZZLE=8,TAIL=1) > $out/check-f16-sw8.log 2>&1 &
timeout 300 $kforge check $f --dtype bf16 $(args $b,SWIZZLE=1,TAIL=1) > $out/check-bf16-sw1.log 2>&1 &
wait
echo "compiled and checked at $SECONDS s" | tee -a $summary
for l in $out/check-*.log; do echo "== $l"; grep -E "^(smoke|shape_sweep|stability|determinism|edge_cases|sanitize) |verdict|SERIAL|error" $l | head -9; done | tee -a $summary
grep -c COMPILES $out/compile-*.log | tee -a $summary
archive
for job in 4096x4096x4096:8:--update-table 4096x32000x2048:1:--update-table 4096x2304x4096:1: 4096x4096x8192:8:; do
  IFS=: read shape sw upd <<< "$job"
  ((SECONDS < 300)) || { echo "$shape skipped (time)" | tee -a $summary; continue; }
  timeout $((330 - SECONDS)) $kforge tune $f --shape $shape --dtype bf16 --strategy given --no-starts \
    --db $out/tune-$shape.sqlite --json $out/tune-$shape.json $upd \
    --start "$f:$b,SWIZZLE=$sw,TAIL=0" "$f:$b,SWIZZLE=$sw,TAIL=1" > $out/tune-$shape.log 2>&1
  echo "$shape rc $? at $SECONDS s" | tee -a $summary
  sed -n '/^rank/,/^$/p' $out/tune-$shape.log | cut -c1-60,150-400 | head -4 | tee -a $summary
  grep -i "final\|reject\|fail\|error" $out/tune-$shape.log | head -4 | cut -c1-200 | tee -a $summary
  archive
done
for d in bf16 f16; do
  timeout $((470 - SECONDS)) $kforge check --table $t --dtype $d > $out/check-table-$d.log 2>&1
  echo "check --table $d rc $? at $SECONDS s" | tee -a $summary
  grep -E "^  (PASS|FAIL|CRASH|TIMEOUT)" $out/check-table-$d.log | cut -c1-60 | sort | uniq -c | tee -a $summary
  cp $t $out/
  archive
done
$kforge build matmul --dtype bf16 --shape 4096x4096x4096 > $out/build.log 2>&1
for p in 1 2; do
  ((SECONDS < 520)) || break
  timeout $((585 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $out/peers-$p > $out/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s" | tee -a $summary
  grep -E "^- matmul" $out/peers-$p.log | cut -c1-250 | tee -a $summary
  archive
done
xz $out/*.sqlite 2>/dev/null; archive
