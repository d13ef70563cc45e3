#!/usr/bin/env bash
# H200: the EPILOGUE 3 rows at 4096x32000x2048 and 4096x2048x2048 (tuned at the file's text
# before) checked at its present text, bf16 and f16 built at once first.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call7; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call7.tgz call7; }
t=kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json
for d in bf16 f16; do
  timeout 100 build/ci/kforge check --table $t --dtype $d --compile-only > $o/compile-$d.log 2>&1 &
done
wait; echo "compiled at $SECONDS s"
for d in bf16 f16; do
  timeout $((118 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-table-$d.log 2>&1
  echo "check --table $d rc $? at $SECONDS s"; grep -E "^  (PASS|FAIL|CRASH)" $o/check-table-$d.log | grep -v "checked before)" | cut -c1-120
  cp $t $o/; pack
done
