#!/usr/bin/env bash
# H200: matmul's H200 table checked at the file's new text (every variant compiled at once
# first, bf16 and f16 together), then bench/peers at 4096^3 against cuBLAS, two processes.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call2; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
pack() { tar -C /tmp -czf $OUT/call2.tgz call2; }
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
for d in bf16 f16; do
  timeout 240 build/ci/kforge check --table $t --dtype $d --compile-only > $o/compile-$d.log 2>&1 &
done
wait; echo "compiled at $SECONDS s"; tail -2 $o/compile-*.log
for d in bf16 f16; do
  timeout $((420 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-$d.log 2>&1
  echo "check $d rc $? at $SECONDS s"; grep -E "PASS|FAIL|passed|of [0-9]" $o/check-$d.log | tail -3
  pack
done
cp $t $o/
for p in 1 2; do
  ((SECONDS < 520)) || break
  timeout $((590 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --kernel-times --out $o/peers-$p > $o/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s"; grep -E "× |kernel" $o/peers-$p.log | cut -c1-170 | head -6
  pack
done
