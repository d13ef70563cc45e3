#!/usr/bin/env bash
# H200: Qwen2's k/v projection (4096x256x1536), where the kernel is 2.5-2.7% longer than
# cuBLAS's: the row against clusters of two along N (A multicast to both of a row's tiles) and
# the swapped cooperative tile (cuBLAS's 128x64 arrangement), given points, the winner to the
# table; then bench/peers there (two processes) and at every attention shape, GQA included.
set -u
usage="call6-kv-gqa.sh"
source bench/run-steps.sh "$OUT" call6
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
r=TILE_M=64,TILE_N=128,TILE_K=64,STAGES=8,EPILOGUE=0,EPI_N=32,RASTER=0,SPLIT=0,SWIZZLE=8
timeout 300 $kforge tune $f --shape 4096x256x1536 --dtype bf16 --strategy given --no-starts \
  --db $out/tune-kv.sqlite --json $out/tune-kv.json --update-table \
  --start "$f:$r,SCHEDULE=1,CLUSTER_M=1,CLUSTER_N=1" "$f:$r,SCHEDULE=1,CLUSTER_M=1,CLUSTER_N=2" \
  "$f:$r,SCHEDULE=0,SWAP_AB=1,CLUSTER_M=1,CLUSTER_N=1" "$f:$r,SCHEDULE=0,SWAP_AB=1,CLUSTER_M=2,CLUSTER_N=1" \
  "$f:$r,SCHEDULE=0,SWAP_AB=1,CLUSTER_M=1,CLUSTER_N=2" > $out/tune-kv.log 2>&1
echo "tune rc $? at $SECONDS s" | tee -a $summary
sed -n '/^rank/,/^$/p' $out/tune-kv.log | cut -c1-60,150-420 | tee -a $summary
grep -i "final\|reject\|fail\|error\|prune" $out/tune-kv.log | head -8 | cut -c1-250 | tee -a $summary
cp $t $out/; archive
$kforge build matmul --dtype bf16 --shape 4096x256x1536 > $out/build.log 2>&1
for p in 1 2; do
  timeout 100 python3 bench/peers --ops matmul --shapes 4096x256x1536 --no-compile --kernel-times \
    --out $out/kv-$p > $out/kv-$p.log 2>&1
  grep -E "^- matmul" $out/kv-$p.log | cut -c1-300 | tee -a $summary
done
archive
s="4x32x4096x128,causal=1,4x32x4096x128,causal=0,4x32x4096x128,kv_heads=8,causal=1,1x32x2048x128,causal=1,2x32x1024x128,kv_heads=8,causal=0"
((SECONDS < 470)) && timeout $((570 - SECONDS)) python3 bench/peers --ops flash_attention --shapes "$s" \
  --no-compile --kernel-times --out $out/attention > $out/attention.log 2>&1
echo "attention rc $? at $SECONDS s" | tee -a $summary
grep -E "^- flash|^  - SDPA" $out/attention.log | cut -c1-300 | tee -a $summary
xz $out/*.sqlite 2>/dev/null; archive
