#!/usr/bin/env bash
# H200: matmul_wgmma.cu's text changed (MMA_ORDER, EPILOGUE 2 addressed through CuTe's layout),
# so every variant of matmul's H200 table is checked again, bf16 and f16 at once; fused_mlp's
# table in f16 (its Qwen2-1.5B row was checked in bf16 only). Then bench/peers: matmul at 4096^3
# and at every HF Llama-2 / Qwen2 GEMM shape, one process, activity records on.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call3; mkdir -p $o
mt=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
ft=kernels/fused_mlp/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $mt $o/matmul-table.json; cp $ft $o/fused_mlp-table.json; tar -C /tmp -czf $OUT/call3.tgz call3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
table_check() {  # table dtype name
  timeout 420 build/ci/kforge check --table $1 --dtype $2 > $o/check-$3-$2.log 2>&1
  echo "check --table $3 $2 rc $? at $SECONDS s: $(grep -c '  PASS' $o/check-$3-$2.log) PASS"
  grep -E "^  (FAIL|ERROR)|skipped|checked before" $o/check-$3-$2.log | cut -c1-160 | head -8
}
table_check $mt bf16 matmul > $o/t1.txt &
table_check $mt f16 matmul > $o/t2.txt &
table_check $ft f16 fused_mlp > $o/t3.txt &
wait; cat $o/t1.txt $o/t2.txt $o/t3.txt; pack
shapes=4096x4096x4096,4096x2048x2048,4096x32000x2048,4096x5632x2048,4096x2048x5632,4096x256x1536,4096x1536x1536,4096x32000x1536,4096x8960x1536,4096x1536x8960
timeout $((590 - SECONDS)) python3 bench/peers --ops matmul --shapes $shapes --no-compile \
  --kernel-times --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep "x PyTorch" $o/peers.log | cut -c1-150
pack
