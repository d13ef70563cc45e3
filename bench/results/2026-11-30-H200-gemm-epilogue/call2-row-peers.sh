#!/usr/bin/env bash
# H200: matmul 4096^3 with the conversion-only epilogue: EPI_STAGES and stream-K given points,
# the winner to the table (five stages + sanitizers); bench/peers against cuBLAS in two
# processes; then check --table of matmul's H200 table in bf16 while time allows.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,EPILOGUE=0,EPI_N=32,RASTER=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
timeout 330 build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 --strategy given \
  --update-table --db $o/tune.sqlite --json $o/tune.json \
  --start "$f:$b,SPLIT=0,EPI_STAGES=4" "$f:$b,SPLIT=0,EPI_STAGES=2" \
          "$f:$b,SPLIT=1,EPI_STAGES=4" "$f:$b,SPLIT=0,EPI_STAGES=3" > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | head -8
grep -A40 "^final check" $o/tune.log | grep -c ": OK"; grep -i "FAIL\|error" $o/tune.log | head -5
cp $t $o/matmul-after-tune.json
for run in 1 2; do
  ((SECONDS < 400)) || break
  timeout $((470 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "TFLOP/s,\|x PyTorch" $o/peers-$run.log | tail -2
done
if ((SECONDS < 440)); then
  timeout $((590 - SECONDS)) build/ci/kforge check --table $t --dtype bf16 > $o/check-bf16.log 2>&1
  echo "check rc $? at $SECONDS s"; grep "PASS\|FAIL" $o/check-bf16.log | cut -c1-160
  cp $t $o/matmul.json
fi
xz $o/*.sqlite 2>/dev/null
