#!/usr/bin/env bash
# H200: matmul_wgmma.cu TAIL 1 (the last wave's tiles split along K over every cluster).
# Five stages + sanitizers: TAIL 1 in bf16 and f16, and the 4096^3 row (TAIL 0) in bf16 (its
# first run at the shallow_k edge size); then given points at 4096^3, two rounds; then peers.
set -u
usage="call1-tail.sh"
source bench/run-steps.sh "$OUT" call1
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $out/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0,MMA_ORDER=0,EPILOGUE=3,EPI_STAGES=2
for job in bf16:EPI_N=32:TAIL=1 f16:EPI_N=64:TAIL=1 bf16:EPI_N=32:TAIL=0; do
  IFS=: read d n t <<< "$job"
  params=(); for kv in ${b//,/ } $n $t; do params+=(--param $kv); done
  timeout 330 $kforge check $f --dtype $d "${params[@]}" --sanitize > $out/check-$d-$t.log 2>&1 &
done
wait
echo "checks done at $SECONDS s" | tee -a $summary
for l in $out/check-*.log; do echo "== $l"; grep -E "^(smoke|shape_sweep|stability|determinism|edge_cases|sanitize) |verdict|error|Error" $l | head -12; done | tee -a $summary
archive
pts=("$f:$b,EPI_N=32,TAIL=0" "$f:$b,EPI_N=32,TAIL=1" "$f:${b/SWIZZLE=8/SWIZZLE=1},EPI_N=32,TAIL=1")
for r in 1 2; do
  ((SECONDS < 430)) || { echo "round $r skipped (time)" | tee -a $summary; break; }
  extra=(); [ $r = 2 ] && extra=(--update-table)
  timeout $((560 - SECONDS)) $kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-starts --db $out/tune-$r.sqlite --json $out/tune-$r.json --start "${pts[@]}" \
    "${extra[@]}" > $out/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s" | tee -a $summary
  sed -n '/^rank\|^ *[0-9]\+ /p' $out/tune-$r.log | head -8 | tee -a $summary
  grep -i "final\|reject\|fail\|error" $out/tune-$r.log | head -6 | tee -a $summary
  archive
done
cp kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json $out/
if ((SECONDS < 500)); then
  timeout $((590 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $out/peers-1 > $out/peers-1.log 2>&1
  echo "peers rc $? at $SECONDS s" | tee -a $summary
  grep -E "^- matmul" $out/peers-1.log | cut -c1-250 | tee -a $summary
fi
xz $out/*.sqlite 2>/dev/null; for g in $out/check-*; do mv "$g" "${g//=/}"; done; archive
