#!/usr/bin/env bash
# H200: 4096x32000x2048 again, the file's defaults (the row before) against EPILOGUE 3 (the
# row now), given points without a final check or table change; then bench/peers at 4096^3.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call6; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call6.tgz call6; }
f=kernels/matmul/matmul_wgmma.cu
timeout 170 build/ci/kforge tune $f --shape 4096x32000x2048 --dtype bf16 --strategy given \
  --no-starts --start "$f:EPILOGUE=3,EPI_N=32,EPI_STAGES=2,SWIZZLE=1" --no-final-check \
  --db $o/tune.sqlite > $o/tune.log 2>&1
echo "tune rc $? at $SECONDS s"; sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune.log | cut -c1-60,150-300 | head -3
pack
timeout $((235 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
  --no-compile --kernel-times --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep -E "^- matmul" $o/peers.log | cut -c1-250
xz $o/*.sqlite 2>/dev/null; pack
