#!/usr/bin/env bash
# H200: check --table of fused_mlp's H200 table in bf16 with the prebuild (both variants
# compiled at once, then checked), timed.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
t=kernels/fused_mlp/tuned/bf16-NVIDIA-H200-cc-9-0.json
start=$SECONDS
timeout 215 build/ci/kforge check --table $t --dtype bf16 2>&1 | while IFS= read -r l; do echo "[$((SECONDS - start)) s] $l"; done > $o/check-fused_mlp-bf16.log
cat $o/check-fused_mlp-bf16.log | cut -c1-160
cp $t $o/fused_mlp.json
