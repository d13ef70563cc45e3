#!/usr/bin/env bash
# H200: two changes to TAIL 1's partial sums, in a copy of matmul_wgmma.cu (tail_exp.cu): the
# finishing block loads 16 float4s per thread at a time (8 before), and a block raises its flag
# once its next piece's first wgmmas are issued rather than before them. Five stages with the
# sanitizers; given points against the present text (before.cu) at three shapes.
set -u
usage="call7-tail-exp.sh"
source bench/run-steps.sh "$OUT" call7
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
x=.device/tail_exp.cu
o=.device/before.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWAP_AB=0,MMA_ORDER=0,EPILOGUE=3,EPI_STAGES=2,EPI_N=32
args() { for kv in ${1//,/ }; do echo --param $kv; done; }
timeout 300 $kforge check $x --dtype bf16 $(args $b,SWIZZLE=8,TAIL=1) --sanitize > $out/check-exp-sw8.log 2>&1 &
timeout 300 $kforge check $x --dtype f16 $(args $b,SWIZZLE=1,TAIL=1) > $out/check-exp-f16-sw1.log 2>&1 &
for sw in 8 1; do
  timeout 200 $kforge check $o --dtype bf16 $(args $b,SWIZZLE=$sw,TAIL=1) --stage smoke > $out/smoke-before-$sw.log 2>&1 &
  timeout 200 $kforge check $x --dtype bf16 $(args $b,SWIZZLE=$sw,TAIL=0) --stage smoke > $out/smoke-exp0-$sw.log 2>&1 &
done
wait
echo "checked at $SECONDS s" | tee -a $summary
for l in $out/check-*.log; do echo "== $l"; grep -E "^(smoke|shape_sweep|stability|determinism|edge_cases|sanitize) |verdict|error" $l | head -9; done | tee -a $summary
archive
for job in 4096x4096x4096:8 4096x2304x4096:1 4096x32000x2048:1; do
  IFS=: read shape sw <<< "$job"
  ((SECONDS < 330)) || { echo "$shape skipped (time)" | tee -a $summary; continue; }
  timeout $((370 - SECONDS)) $kforge tune $x --also $o --shape $shape --dtype bf16 --strategy given \
    --no-starts --no-final-check --db $out/tune-$shape.sqlite --json $out/tune-$shape.json \
    --start "$x:$b,SWIZZLE=$sw,TAIL=1" "$o:$b,SWIZZLE=$sw,TAIL=1" "$x:$b,SWIZZLE=$sw,TAIL=0" > $out/tune-$shape.log 2>&1
  echo "$shape rc $? at $SECONDS s" | tee -a $summary
  sed -n '/^rank/,/^$/p' $out/tune-$shape.log | cut -c1-60 | head -6 | tee -a $summary
  sed -n '/^rank/,/^$/p' $out/tune-$shape.log | grep -o "^ *[0-9]* \|[a-z_]*\.cu\|TAIL=[01]" | paste - - - | head -6 | tee -a $summary
  archive
done
xz $out/*.sqlite 2>/dev/null; archive
