#!/usr/bin/env bash
# H200: five stages and all four sanitizers of EPILOGUE 2 (named barrier ids fixed), one form per
# dtype, beside the sanitizer-stage GPU tests (the new barrier_past_16.cu fixture); then three
# rounds of given points at 4096^3 (separate databases), no table change.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call2; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call2.tgz call2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
( timeout 300 build/ci/tests/kforge_gpu_tests --gtest_filter='Faults/SanitizerStage.*' \
    > $o/gpu-sanitizer-tests.log 2>&1; echo "gpu tests rc $?" >> $o/gpu-sanitizer-tests.log ) &
check() {  # dtype EPI_N EPI_STAGES
  local params=(); for kv in ${b//,/ } EPILOGUE=2 EPI_N=$2 EPI_STAGES=$3; do params+=(--param $kv); done
  timeout 300 build/ci/kforge check $f --dtype $1 "${params[@]}" --sanitize > $o/check-$1-$2-$3.log 2>&1
  echo "check $1 EPI_N=$2 EPI_STAGES=$3 rc $? at $SECONDS s"; tail -3 $o/check-$1-$2-$3.log
}
check bf16 32 4 & check f16 64 2 & wait
tail -8 $o/gpu-sanitizer-tests.log; pack
pts=("$f:$b,EPILOGUE=0,EPI_N=32,EPI_STAGES=4"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4"
     "$f:$b,EPILOGUE=2,EPI_N=64,EPI_STAGES=2"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=3")
for r in 1 2 3; do
  ((SECONDS < 480)) || break
  timeout $((570 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-final-check --db $o/tune-$r.sqlite --json $o/tune-$r.json \
    --start "${pts[@]}" > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -6
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
