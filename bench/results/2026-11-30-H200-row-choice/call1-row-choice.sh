#!/usr/bin/env bash
# H200: how good is the library's row at sizes without one? Every variant of matmul's,
# fused_mlp's and matmul_bias's H200 tables compiled first (check --table --compile-only, the
# three at once, host only), then bench/row-choice: the library's choice (busy: lines) and every
# row's variant timed at shapes of Llama-2-7B, Llama-3-8B, Qwen2-7B and small squares.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call1; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call1.tgz call1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
for op in matmul fused_mlp matmul_bias; do
  build/ci/kforge check --table kernels/$op/tuned/bf16-NVIDIA-H200-cc-9-0.json --dtype bf16 \
    --compile-only > $o/compile-$op.log 2>&1 &
done
wait
echo "compiled at $SECONDS s: $(cat $o/compile-*.log | grep -c COMPILES) COMPILES, $(cat $o/compile-*.log | grep -c 'COMPILE_ERROR\|REJECTED') errors"
rc_run() {  # op shapes limit
  timeout $3 bench/row-choice --op $1 --shapes $2 --out $o/$1 > $o/row-choice-$1.log 2>&1
  echo "row-choice $1 rc $? at $SECONDS s"; sed -n '/^shape /,$p' $o/row-choice-$1.log
  pack
}
rc_run matmul 4096x11008x4096,4096x4096x11008,4096x14336x4096,4096x1024x4096,4096x18944x3584,1024x1024x1024,2048x2048x2048 $((440 - SECONDS))
rc_run matmul_bias 4096x1536x1536,4096x3584x3584 $((510 - SECONDS))
rc_run fused_mlp 4096x4096x14336,1024x4096x11008 $((575 - SECONDS))
xz $o/*/row-choice.sqlite 2>/dev/null; pack
