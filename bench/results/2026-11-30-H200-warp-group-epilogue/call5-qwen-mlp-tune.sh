#!/usr/bin/env bash
# H200: fused_mlp at Qwen2-1.5B's MLP (4096 tokens, hidden 1536, intermediate 8960): given points
# from Llama's row with the down GEMM's tile narrowed (DOWN_TILE_N 128: 336 tiles, 2.55 waves,
# against 192 in 1.45) or stream-K, --update-table; then bench/peers against eager.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call5; mkdir -p $o
t=kernels/fused_mlp/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $t $o/fused_mlp-table.json; tar -C /tmp -czf $OUT/call5.tgz call5; }
f=kernels/fused_mlp/fused_mlp_wgmma.cu
l=TILE_M=128,TILE_N=128,STAGES=4,CLUSTER_M=2,PERSISTENT=1,DOWN_CLUSTER_M=2,DOWN_SWIZZLE=8
timeout 270 build/ci/kforge tune $f --shape 4096x1536x8960 --dtype bf16 --strategy given \
  --update-table --db $o/tune.sqlite --json $o/tune.json \
  --start "$f:$l,DOWN_TILE_N=256,DOWN_STAGES=4,DOWN_SPLIT=0" \
          "$f:$l,DOWN_TILE_N=128,DOWN_STAGES=4,DOWN_SPLIT=0" \
          "$f:$l,DOWN_TILE_N=128,DOWN_STAGES=5,DOWN_SPLIT=0" \
          "$f:$l,DOWN_TILE_N=256,DOWN_STAGES=4,DOWN_SPLIT=1" > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | head -6; grep -i "final\|PASS\|FAIL" $o/tune.log | tail -3
pack
timeout $((375 - SECONDS)) python3 bench/peers --ops fused_mlp --shapes 4096x1536x8960 \
  --kernel-times --no-compile --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep -E "GPU time|x PyTorch" $o/peers.log | cut -c1-300
pack
