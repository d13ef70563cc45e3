#!/usr/bin/env bash
# Non-causal 4x32x4096x128 with LAZY_RESCALE: wider key tiles (176, a block per tile) and
# ping-pong off, against the row; exploration only (no final check, no table update).
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/flash_attention/flash_attention_wgmma.cu
timeout 200 build/ci/kforge tune $f --shape 4x32x4096x128,causal=0 --dtype bf16 --strategy given \
  --no-final-check --db $o/tune.sqlite --json $o/tune-noncausal.json \
  --start "$f:BLOCK_N=128,STAGES=2,PINGPONG=1,PERSISTENT=1,HEADS_PER_SECTION=2" \
          "$f:BLOCK_N=176,STAGES=2,PINGPONG=1,PERSISTENT=0,HEADS_PER_SECTION=2" \
          "$f:BLOCK_N=176,STAGES=2,PINGPONG=0,PERSISTENT=0,HEADS_PER_SECTION=2" \
          "$f:BLOCK_N=128,STAGES=2,PINGPONG=0,PERSISTENT=1,HEADS_PER_SECTION=2" \
  > $o/tune-noncausal.log 2>&1
echo "tune rc $? at $SECONDS s"
sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-noncausal.log | head -8
grep -i "pruned\|skip\|fail" $o/tune-noncausal.log | head -5
gzip $o/tune.sqlite 2>/dev/null
