#!/usr/bin/env bash
# H200: EPILOGUE 3 at the HF shapes whose rows run the file's defaults (128 x 256, clusters of 2,
# SWIZZLE 1): its bf16 form checked with the sanitizers and its f16 form checked, both at once;
# then a given-point tune per shape (the row against EPILOGUE 3) writing the winner into the
# table with an f16 check; then bench/peers at 4096^3 and those shapes.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call3; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
pack() { tar -C /tmp -czf $OUT/call3.tgz call3; }
f=kernels/matmul/matmul_wgmma.cu
e3=EPILOGUE=3,EPI_N=32,EPI_STAGES=2,SWIZZLE=1
params=(); for kv in ${e3//,/ }; do params+=(--param $kv); done
timeout 200 build/ci/kforge check $f --dtype bf16 "${params[@]}" --sanitize > $o/check-bf16.log 2>&1 &
timeout 200 build/ci/kforge check $f --dtype f16 "${params[@]}" > $o/check-f16.log 2>&1 &
wait; echo "checks at $SECONDS s"; for d in bf16 f16; do tail -2 $o/check-$d.log; done
pack
for s in 4096x2048x5632 4096x32000x2048 4096x2048x2048; do
  ((SECONDS < 380)) || { echo "tune $s skipped (time)"; continue; }
  timeout $((430 - SECONDS)) build/ci/kforge tune $f --shape $s --dtype bf16 --strategy given \
    --no-starts --start "$f:$e3" --update-table --check-dtypes f16 --db $o/tune-$s.sqlite \
    --json $o/tune-$s.json > $o/tune-$s.log 2>&1
  echo "tune $s rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$s.log | cut -c1-60 | head -4
  grep -i "final\|reject\|fail\|error\|wrote\|table" $o/tune-$s.log | cut -c1-200 | head -4
  pack
done
cp kernels/matmul/tuned/bf16-NVIDIA-H200-cc-9-0.json $o/
timeout $((585 - SECONDS)) python3 bench/peers --ops matmul \
  --shapes 4096x4096x4096,4096x2048x5632,4096x32000x2048,4096x2048x2048 \
  --no-compile --kernel-times --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep -E "^- matmul.*×" $o/peers.log | cut -c1-170
xz $o/*.sqlite 2>/dev/null; pack
