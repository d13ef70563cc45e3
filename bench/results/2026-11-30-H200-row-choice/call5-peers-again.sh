#!/usr/bin/env bash
# H200: bench/peers again (a second process) at matmul_bias's new Qwen2 q-projection rows.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call5; mkdir -p $o
timeout 170 python3 bench/peers --ops matmul_bias --shapes 4096x1536x1536,4096x3584x3584 \
  --no-compile --kernel-times --out $o/peers-bias > $o/peers-bias.log 2>&1
echo "peers bias rc $? at $SECONDS s"; grep "× PyTorch" $o/peers-bias.log | cut -c1-150
tar -C /tmp -czf $OUT/call5.tgz call5
