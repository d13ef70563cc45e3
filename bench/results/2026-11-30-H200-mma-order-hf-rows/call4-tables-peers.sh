#!/usr/bin/env bash
# H200: after the fix that keeps MMA_ORDER 1's collective out of other variants' builds: every
# variant of matmul's H200 table checked again, bf16 and f16 at once; then bench/peers at 4096^3
# and every HF Llama-2 / Qwen2 GEMM shape in two processes; then two rounds of the row against
# MMA_ORDER 1 with CUTLASS's epilogue at 4096^3 (given points, no table change).
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call4; mkdir -p $o
mt=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $mt $o/matmul-table.json; tar -C /tmp -czf $OUT/call4.tgz call4; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
table_check() {  # dtype
  timeout 420 build/ci/kforge check --table $mt --dtype $1 > $o/check-matmul-$1.log 2>&1
  echo "check --table matmul $1 rc $? at $SECONDS s: $(grep -c '  PASS' $o/check-matmul-$1.log) PASS"
  grep -E "^  (FAIL|ERROR)|skipped" $o/check-matmul-$1.log | cut -c1-160 | head -8
}
table_check bf16 > $o/t1.txt &
table_check f16 > $o/t2.txt &
wait; cat $o/t1.txt $o/t2.txt; pack
shapes=4096x4096x4096,4096x2048x2048,4096x32000x2048,4096x5632x2048,4096x2048x5632,4096x256x1536,4096x1536x1536,4096x32000x1536,4096x8960x1536,4096x1536x8960
for run in 1 2; do
  timeout $((470 - SECONDS)) python3 bench/peers --ops matmul --shapes $shapes --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "x PyTorch" $o/peers-$run.log | cut -c1-150
  pack
done
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0,EPI_N=32,EPI_STAGES=4
for r in 1 2; do
  ((SECONDS < 480)) || break
  timeout $((585 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-final-check --no-starts --db $o/tune-$r.sqlite --json $o/tune-$r.json \
    --start "$f:$b,EPILOGUE=2,MMA_ORDER=0" "$f:$b,EPILOGUE=0,MMA_ORDER=1" "$f:$b,EPILOGUE=0,MMA_ORDER=0" \
    > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -5
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
