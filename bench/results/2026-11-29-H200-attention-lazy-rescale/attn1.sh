#!/usr/bin/env bash
# flash_attention_wgmma.cu's LAZY_RESCALE at the H200 table's three sizes: given points (the
# row with 0 and with 1), the winner to the table; then the table's f16 check if time remains.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/flash_attention/flash_attention_wgmma.cu
t=kernels/flash_attention/tuned/bf16-NVIDIA-H200-cc-9-0.json
base=BLOCK_N=128,STAGES=2,PINGPONG=1,PERSISTENT=1
i=0
for spec in 4x32x4096x128,causal=1:4 4x32x4096x128,causal=0:2 1x32x2048x128,causal=1:8; do
  i=$((i + 1)); shape=${spec%:*}; h=${spec##*:}
  extra=()
  ((i == 1)) && extra=("$f:BLOCK_N=128,STAGES=2,PINGPONG=0,PERSISTENT=1,HEADS_PER_SECTION=$h,LAZY_RESCALE=1")
  timeout $((560 - SECONDS)) build/ci/kforge tune $f --shape $shape --dtype bf16 --strategy given \
    --update-table --db $o/tune.sqlite --json $o/tune-$i.json \
    --start "$f:$base,HEADS_PER_SECTION=$h,LAZY_RESCALE=0" "$f:$base,HEADS_PER_SECTION=$h,LAZY_RESCALE=1" \
    "${extra[@]}" > $o/tune-$i.log 2>&1
  echo "tune $shape rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$i.log | head -6
  grep "^check\|sanitize\|final" $o/tune-$i.log | head -3
  cp $t $o/flash_attention.json
done
if ((SECONDS < 420)); then
  timeout $((580 - SECONDS)) build/ci/kforge check --table $t --dtype f16 > $o/check-f16.log 2>&1
  echo "check f16 rc $? at $SECONDS s"; tail -4 $o/check-f16.log
  cp $t $o/flash_attention.json
fi
gzip $o/tune.sqlite 2>/dev/null
