#!/usr/bin/env bash
# The H200 attention table checked again under the committed text (LAZY_RESCALE's default and
# the exact 1), bf16 then f16; the defaults under the sanitizers; the causal headline against SDPA.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
f=kernels/flash_attention/flash_attention_wgmma.cu
t=kernels/flash_attention/tuned/bf16-NVIDIA-H200-cc-9-0.json
timeout 300 build/ci/kforge check --table $t --dtype bf16 > $o/check-bf16.log 2>&1
echo "check bf16 rc $? at $SECONDS s"; tail -4 $o/check-bf16.log; cp $t $o/flash_attention.json
timeout $((560 - SECONDS)) build/ci/kforge check $f --dtype bf16 --stage smoke --sanitize > $o/sanitize.log 2>&1
echo "sanitize rc $? at $SECONDS s"; grep "sanitize\|verdict" $o/sanitize.log | tail -6
if ((SECONDS < 330)); then
  timeout $((560 - SECONDS)) build/ci/kforge check --table $t --dtype f16 > $o/check-f16.log 2>&1
  echo "check f16 rc $? at $SECONDS s"; tail -4 $o/check-f16.log; cp $t $o/flash_attention.json
fi
if ((SECONDS < 540)); then
  timeout $((590 - SECONDS)) bench/peers --ops flash_attention --shapes 4x32x4096x128,causal=1 \
    --no-compile --kernel-times --out $o/peers > $o/peers.log 2>&1
  echo "peers rc $? at $SECONDS s"; grep "met\|missed\|by backend" $o/peers/peers.md | head -4
fi
