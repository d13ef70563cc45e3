#!/usr/bin/env bash
# H200: rows for the three HF GEMM shapes matmul's H200 table lacked (Llama-2 down 4096x2048x5632
# and the two lm_heads), which ran the nearest row's variant: the tune's starts from the tables
# (the nearest row of each same-architecture table) and the defaults as given points (--update-table, the winner checked in bf16 with the sanitizers and in
# f16); then bench/peers at the three shapes.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call5; mkdir -p $o
mt=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $mt $o/matmul-table.json; tar -C /tmp -czf $OUT/call5.tgz call5; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
for s in 4096x2048x5632 4096x32000x2048 4096x32000x1536; do
  ((SECONDS < 330)) || { echo "skipped $s (time)"; continue; }
  timeout $((440 - SECONDS)) build/ci/kforge tune $f --shape $s --dtype bf16 --strategy given \
    --update-table --check-dtypes f16 --db $o/tune-$s.sqlite --json $o/tune-$s.json \
    > $o/tune-$s.log 2>&1
  echo "tune $s rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$s.log | head -4 | cut -c1-230
  grep -E "PASS|FAIL|wrote|row" $o/tune-$s.log | tail -3 | cut -c1-200
  pack
done
timeout $((560 - SECONDS)) python3 bench/peers --ops matmul --no-compile --kernel-times \
  --shapes 4096x2048x5632,4096x32000x2048,4096x32000x1536 --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep "× PyTorch" $o/peers.log | cut -c1-150
xz $o/*.sqlite 2>/dev/null; pack
