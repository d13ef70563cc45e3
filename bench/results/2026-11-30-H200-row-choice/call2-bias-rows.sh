#!/usr/bin/env bash
# H200: rows for Qwen2's q projections in matmul_bias's table (4096x1536x1536, 4096x3584x3584),
# which had none: a local search at the first (from the table's rows and the 4096x512x3584 row's
# variant, the fastest row there in call 1), the table's rows as given points at the second;
# --update-table --check-dtypes f16. Then bench/peers: matmul_bias at both against addmm, and
# matmul at Llama-2-7B's projections (rows chosen by busy:) against cuBLAS.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call2; mkdir -p $o
bt=kernels/matmul_bias/tuned/bf16-NVIDIA-H200-cc-9-0.json
pack() { cp $bt $o/matmul_bias-table.json; tar -C /tmp -czf $OUT/call2.tgz call2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/matmul_bias/matmul_bias_wgmma.cu
row512=BIAS_PREFETCH=1,CLUSTER_M=1,CLUSTER_N=1,EPILOGUE=0,RASTER=0,SCHEDULE=1,SPLIT=0,STAGES=6,SWIZZLE=1,TILE_K=64,TILE_M=128,TILE_N=128
row4096=CLUSTER_M=2,CLUSTER_N=1,EPILOGUE=0,RASTER=0,SCHEDULE=0,SPLIT=0,STAGES=4,SWIZZLE=1,TILE_K=64,TILE_M=128,TILE_N=256
row256=BIAS_PREFETCH=1,CLUSTER_M=1,CLUSTER_N=1,EPILOGUE=0,RASTER=0,SCHEDULE=0,SPLIT=0,STAGES=8,SWIZZLE=1,TILE_K=64,TILE_M=128,TILE_N=64
tune() {  # shape log-name extra-args...
  local s=$1 name=$2; shift 2
  build/ci/kforge tune $f --shape $s --dtype bf16 --update-table --check-dtypes f16 \
    --db $o/tune.sqlite --json $o/tune-$name.json "$@" > $o/tune-$name.log 2>&1
  echo "tune $name rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$name.log | head -6 | cut -c1-240
  grep -E "PASS|FAIL|wrote" $o/tune-$name.log | tail -4 | cut -c1-200
  pack
}
tune 4096x1536x1536 q1536 --strategy local --time 150 --start $f:$row512
tune 4096x3584x3584 q3584 --strategy given --no-starts --start $f:$row512 --start $f:$row4096 \
  --start $f:$row256
timeout $((570 - SECONDS)) python3 bench/peers --ops matmul_bias --shapes 4096x1536x1536,4096x3584x3584 \
  --no-compile --kernel-times --out $o/peers-bias > $o/peers-bias.log 2>&1
echo "peers bias rc $? at $SECONDS s"; grep "× PyTorch" $o/peers-bias.log | cut -c1-150; pack
timeout $((590 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x11008x4096,4096x4096x11008 \
  --no-compile --kernel-times --out $o/peers-mm > $o/peers-mm.log 2>&1
echo "peers matmul rc $? at $SECONDS s"; grep "× PyTorch" $o/peers-mm.log | cut -c1-150
xz $o/*.sqlite; pack
