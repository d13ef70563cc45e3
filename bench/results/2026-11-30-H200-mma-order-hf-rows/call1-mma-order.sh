#!/usr/bin/env bash
# H200: matmul 4096^3, MMA_ORDER 1 (two accumulator halves, the second issued after the wait:
# cuBLAS's order) against the row. First five stages (with the new TMA-aligned edge sizes) and
# the sanitizers of MMA_ORDER 1 in both dtypes, and five stages of the row at the file's new text;
# then given points at 4096^3, three rounds (separate databases), no table change.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call1; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call1.tgz call1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWIZZLE=8,SWAP_AB=0
check() {  # name dtype sanitize params...
  local name=$1 d=$2 san=$3; shift 3
  local params=(); for kv in ${b//,/ } "$@"; do params+=(--param $kv); done
  [[ $san == 1 ]] && params+=(--sanitize)
  timeout 330 build/ci/kforge check $f --dtype $d "${params[@]}" > $o/check-$name.log 2>&1
  echo "check $name rc $? at $SECONDS s"; grep -E "^\[edge_cases\].*(ragged|short_m|one_row_aligned)|sanitize\]|verdict" $o/check-$name.log | head -12
}
check mo1-e2-bf16 bf16 1 EPILOGUE=2 EPI_N=32 EPI_STAGES=4 MMA_ORDER=1 > $o/c1.txt &
check mo1-e0-f16 f16 1 EPILOGUE=0 EPI_N=32 EPI_STAGES=4 MMA_ORDER=1 > $o/c2.txt &
check row-bf16 bf16 0 EPILOGUE=2 EPI_N=32 EPI_STAGES=4 MMA_ORDER=0 > $o/c3.txt &
wait; cat $o/c1.txt $o/c2.txt $o/c3.txt; pack
pts=("$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4,MMA_ORDER=0"
     "$f:$b,EPILOGUE=2,EPI_N=32,EPI_STAGES=4,MMA_ORDER=1"
     "$f:$b,EPILOGUE=0,EPI_N=32,EPI_STAGES=4,MMA_ORDER=1"
     "$f:$b,EPILOGUE=2,EPI_N=64,EPI_STAGES=2,MMA_ORDER=1")
for r in 1 2 3; do
  ((SECONDS < 470)) || break
  timeout $((575 - SECONDS)) build/ci/kforge tune $f --shape 4096x4096x4096 --dtype bf16 \
    --strategy given --no-final-check --db $o/tune-$r.sqlite --json $o/tune-$r.json \
    --start "${pts[@]}" > $o/tune-$r.log 2>&1
  echo "tune $r rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$r.log | head -7
  pack
done
xz $o/*.sqlite 2>/dev/null; pack
