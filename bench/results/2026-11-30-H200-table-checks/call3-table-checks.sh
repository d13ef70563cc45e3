#!/usr/bin/env bash
# H200: check --table of the H200 tables whose rows hold no check of their files' present code,
# in both dtypes, while time allows; the tables and logs come back in one archive.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/checks; mkdir -p $o  # only the archive goes to OUT
nvidia-smi --query-gpu=name,driver_version --format=csv > $o/gpu.txt
for job in softmax:bf16 softmax:f16 reduce:bf16 reduce:f16 rotary_embedding:bf16 \
  rotary_embedding:f16 rotary_embedding_half:bf16 rotary_embedding_half:f16 \
  matmul_residual:bf16 matmul_residual:f16; do
  op=${job%%:*}; d=${job##*:}
  ((SECONDS < 470)) || { echo "skipped $job (time)" | tee -a $o/skipped.txt; continue; }
  t=kernels/$op/tuned/bf16-NVIDIA-H200-cc-9-0.json
  timeout $((585 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-$op-$d.log 2>&1
  echo "check $op $d rc $? at $SECONDS s: $(grep -c '  PASS' $o/check-$op-$d.log) PASS"
  grep -E "^  (FAIL|ERROR)" $o/check-$op-$d.log | cut -c1-160
  cp $t $o/$op.json
  tar -C /tmp -czf $OUT/checks.tgz checks
done
