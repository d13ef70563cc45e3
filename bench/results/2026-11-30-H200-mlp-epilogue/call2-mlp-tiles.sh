#!/usr/bin/env bash
# H200: fused_mlp after the gate-up epilogue change: the gate-up tiles at the headline and
# Llama's MLP into the table, eager in two processes (bench/tensor-core-run mlp-tiles), then the
# table's f16 check while time allows.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
timeout 480 bench/tensor-core-run $OUT mlp-tiles
echo "mlp-tiles rc $? at $SECONDS s"
t=kernels/fused_mlp/tuned/bf16-NVIDIA-H200-cc-9-0.json
if ((SECONDS < 440)); then
  timeout $((590 - SECONDS)) build/ci/kforge check --table $t --dtype f16 > $OUT/check-f16.log 2>&1
  echo "check f16 rc $? at $SECONDS s"; grep -c "PASS" $OUT/check-f16.log; grep FAIL $OUT/check-f16.log | head
fi
cp $t $OUT/fused_mlp-table.json
