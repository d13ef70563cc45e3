#!/usr/bin/env bash
# H200: matmul's H200 table checked at the file's final text (one-atom EPILOGUE 3 only), every
# variant compiled at once first; then bench/peers at 4096^3 twice and once at the HF shapes
# whose rows are EPILOGUE 3 or the file's defaults.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call5; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
pack() { tar -C /tmp -czf $OUT/call5.tgz call5; }
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
for d in bf16 f16; do
  timeout 240 build/ci/kforge check --table $t --dtype $d --compile-only > $o/compile-$d.log 2>&1 &
done
wait; echo "compiled at $SECONDS s"
for d in bf16 f16; do
  timeout $((330 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-table-$d.log 2>&1
  echo "check --table $d rc $? at $SECONDS s"; grep -cE "^  PASS" $o/check-table-$d.log; grep -E "FAIL|CRASH" $o/check-table-$d.log | head -3
  pack
done
cp $t $o/
for p in 1 2; do
  timeout $((420 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $o/peers-$p > $o/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s"; grep -E "^- matmul" $o/peers-$p.log | cut -c1-250
  pack
done
timeout $((540 - SECONDS)) python3 bench/peers --ops matmul \
  --shapes 4096x32000x2048,4096x2048x2048,4096x2048x5632 \
  --no-compile --kernel-times --out $o/peers-hf > $o/peers-hf.log 2>&1
echo "peers hf rc $? at $SECONDS s"; grep -E "^- matmul.*×" $o/peers-hf.log | cut -c1-170
pack
