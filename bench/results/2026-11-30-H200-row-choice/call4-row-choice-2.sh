#!/usr/bin/env bash
# H200: bench/row-choice again at shapes the slot count (d13df65) was not derived from: Llama-2-13B
# and Llama-3-70B projections, a small batch, a ragged square and a wide short GEMM; fused_mlp at
# Llama-2-13B's MLP and at a small batch.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call4; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call4.tgz call4; }
for op in matmul fused_mlp; do
  build/ci/kforge check --table kernels/$op/tuned/bf16-NVIDIA-H200-cc-9-0.json --dtype bf16 \
    --compile-only > $o/compile-$op.log 2>&1 &
done
wait
echo "compiled at $SECONDS s: $(cat $o/compile-*.log | grep -c COMPILES) COMPILES"
rc_run() {  # op shapes limit
  timeout $3 bench/row-choice --op $1 --shapes $2 --out $o/$1 > $o/row-choice-$1.log 2>&1
  echo "row-choice $1 rc $? at $SECONDS s"; sed -n '/^shape /,$p' $o/row-choice-$1.log
  pack
}
rc_run matmul 2048x5120x5120,2048x13824x5120,2048x5120x13824,4096x8192x8192,512x4096x4096,3000x3000x3000,8192x1024x1024 $((430 - SECONDS))
rc_run fused_mlp 2048x5120x13824,512x4096x11008 $((560 - SECONDS))
xz $o/*/row-choice.sqlite 2>/dev/null; pack
