#!/usr/bin/env bash
# H200: check --table of matmul's H200 table in bf16 (its file changed: SWAP_AB).
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
timeout 560 build/ci/kforge check --table $t --dtype bf16 > $o/check-matmul-bf16.log 2>&1
echo "rc $? at $SECONDS s"; grep "PASS\|FAIL" $o/check-matmul-bf16.log | cut -c1-150
cp $t $o/matmul.json
