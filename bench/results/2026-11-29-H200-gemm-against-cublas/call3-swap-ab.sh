#!/usr/bin/env bash
# H200: matmul 4096^3, SWAP_AB given points against the row; the winner to the table
# (five stages + sanitizers), then bench/peers against cuBLAS in two processes.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,EPILOGUE=0,EPI_N=32,RASTER=0,SPLIT=0
timeout 400 build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 --strategy given \
  --update-table --db $o/tune.sqlite --json $o/tune.json \
  --start "$f:$b,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0" \
          "$f:$b,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=1" \
          "$f:$b,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=1,SWAP_AB=1" \
          "$f:$b,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=4,SWAP_AB=1" \
          "$f:$b,CLUSTER_M=1,CLUSTER_N=2,SWIZZLE=8,SWAP_AB=1" \
          "$f:$b,CLUSTER_M=1,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=1" > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | head -10
grep -i "^check\|sanitiz\|final\|reject\|fail" $o/tune.log | head -8
cp $t $o/matmul.json
for run in 1 2; do
  ((SECONDS < 520)) || break
  timeout $((585 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "TFLOP/s,\|x PyTorch" $o/peers-$run.log | tail -2
done
gzip $o/tune.sqlite 2>/dev/null
