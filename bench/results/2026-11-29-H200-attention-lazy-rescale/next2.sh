#!/usr/bin/env bash
# Next session (H200): matmul_bias's table checked again under the committed text (its rows were
# checked under the text before the tidy, e75f335b), bf16 then f16; then fused_mlp's and
# matmul's f16 rows if time remains. Each table comes back under its op's name.
set -u
o=$OUT; export KFORGE_GIT_SHA=$(cat .device/sha)
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
key=NVIDIA-H200-cc-9-0
for d in bf16 f16; do
  ((SECONDS < 480)) || break
  t=kernels/matmul_bias/tuned/bf16-$key.json
  timeout $((570 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-matmul_bias-$d.log 2>&1
  echo "matmul_bias $d rc $? at $SECONDS s"; tail -5 $o/check-matmul_bias-$d.log
  cp $t $o/matmul_bias.json
done
