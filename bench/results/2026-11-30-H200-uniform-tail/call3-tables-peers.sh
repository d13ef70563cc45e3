#!/usr/bin/env bash
# H200: the library against PyTorch at every row of matmul's, fused_mlp's and flash_attention's
# H200 tables (bench/tensor-core-run tables-peers: cuBLAS, the eager MLP, SDPA; no
# torch.compile), every row's variant compiled at once first.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
mkdir -p $OUT/call3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/call3/gpu.txt
for op in matmul fused_mlp flash_attention; do
  timeout 200 build/ci/kforge check --table kernels/$op/tuned/bf16-NVIDIA-H200-cc-9-0.json \
    --dtype bf16 --compile-only > $OUT/call3/compile-$op.log 2>&1 &
done
wait
echo "compiled at $SECONDS s: $(grep -h -c COMPILES $OUT/call3/compile-*.log | tr '\n' ' ')"
timeout $((585 - SECONDS)) bench/tensor-core-run $OUT tables-peers matmul fused_mlp flash_attention
echo "tables-peers rc $? at $SECONDS s"
