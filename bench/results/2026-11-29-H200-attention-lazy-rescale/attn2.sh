#!/usr/bin/env bash
# The H200 attention table with LAZY_RESCALE rows against SDPA, two processes.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
shapes=4x32x4096x128,causal=1,4x32x4096x128,causal=0,1x32x2048x128,causal=1
for i in 1 2; do
  ((SECONDS < 400)) || break
  timeout $((590 - SECONDS)) bench/peers --ops flash_attention --shapes "$shapes" --no-compile \
    --kernel-times --out $o/peers-$i > $o/peers-$i.log 2>&1
  echo "peers $i rc $? at $SECONDS s"; grep -i "flash_attention\|4096x128\|2048x128" $o/peers-$i/peers.md | head -12
done
