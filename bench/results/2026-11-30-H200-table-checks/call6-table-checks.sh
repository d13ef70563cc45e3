#!/usr/bin/env bash
# H200: check --table of the H200 tables whose checks are not of their files' present code:
# fused_mlp f16, layernorm bf16, rmsnorm bf16, cross_entropy f16, while time allows.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
for job in fused_mlp:f16 layernorm:bf16 rmsnorm:bf16 cross_entropy:f16; do
  op=${job%%:*}; d=${job##*:}
  ((SECONDS < 480)) || break
  t=kernels/$op/tuned/bf16-NVIDIA-H200-cc-9-0.json
  timeout $((560 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-$op-$d.log 2>&1
  echo "check $op $d rc $? at $SECONDS s"; grep -c "PASS" $o/check-$op-$d.log; grep "FAIL" $o/check-$op-$d.log | cut -c1-160
  cp $t $o/$op.json
done
