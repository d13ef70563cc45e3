#!/usr/bin/env bash
# H200: five stages of matmul_wgmma.cu with SWAP_AB 1 (bf16 with the sanitizers, then f16).
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/matmul/matmul_wgmma.cu
p=(--param TILE_M=128 --param TILE_N=256 --param CLUSTER_M=2 --param SWIZZLE=8 --param SWAP_AB=1)
timeout 300 build/ci/kforge check $f "${p[@]}" --dtype bf16 --sanitize > $o/check-swap-bf16.log 2>&1
echo "bf16 rc $? at $SECONDS s"; tail -12 $o/check-swap-bf16.log
p2=(--param TILE_M=64 --param TILE_N=128 --param SCHEDULE=1 --param CLUSTER_M=1 --param STAGES=6 --param SWAP_AB=1)
timeout $((560 - SECONDS)) build/ci/kforge check $f "${p2[@]}" --dtype f16 > $o/check-swap-f16.log 2>&1
echo "f16 ping-pong rc $? at $SECONDS s"; tail -8 $o/check-swap-f16.log
