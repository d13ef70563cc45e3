#!/usr/bin/env bash
# H200: bench/peers at 4096^3 twice, at the file's final text (the row: EPILOGUE 3, TAIL 0).
set -u
usage="call4-peers.sh"
source bench/run-steps.sh "$OUT" call4
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $out/gpu.txt
$kforge build matmul --dtype bf16 --shape 4096x4096x4096 > $out/build.log 2>&1
for p in 1 2; do
  timeout $((200 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $out/peers-$p > $out/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s" | tee -a $summary
  grep -E "^- matmul" $out/peers-$p.log | cut -c1-250 | tee -a $summary
  archive
done
