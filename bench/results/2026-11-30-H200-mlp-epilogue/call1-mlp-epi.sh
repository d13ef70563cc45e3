#!/usr/bin/env bash
# H200: fused_mlp's gate-up epilogue. EPI 0: silu by IEEE division, every store bounds-checked
# (the file before); 1: ex2/rcp.approx silu, unchecked stores in whole tiles; 2: tanh.approx
# silu (measurement only). Given points at the headline (two rounds) and Llama's MLP, then
# bench/peers of the library rows (EPI at its default, 1) with per-kernel activity records.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $o/gpu.txt
f=kernels/fused_mlp/fused_mlp_wgmma.cu
d=DOWN_TILE_N=256,DOWN_STAGES=4,DOWN_CLUSTER_M=2,DOWN_SWIZZLE=8,DOWN_SPLIT=0,PERSISTENT=1,STAGES=4,CLUSTER_M=2
head="$f:TILE_M=256,TILE_N=96,$d"
llama="$f:TILE_M=128,TILE_N=128,$d"
run_tune() {  # name shape points...
  local name=$1 shape=$2; shift 2
  timeout $((580 - SECONDS)) build/ci/kforge tune $f --shape $shape --dtype bf16 \
    --strategy given --db $o/tune-$name.sqlite --json $o/tune-$name.json --start "$@" \
    > $o/tune-$name.log 2>&1
  echo "tune $name rc $? at $SECONDS s"
  sed -n '/^rank\|^ *[0-9]\+ /p' $o/tune-$name.log | head -6
  grep -i "final\|reject\|fail\|error" $o/tune-$name.log | head -6
}
run_tune head-1 2048x4096x11008 "$head,EPI=0" "$head,EPI=1" "$head,EPI=2"
run_tune llama 4096x2048x5632 "$llama,EPI=0" "$llama,EPI=1"
((SECONDS < 400)) && run_tune head-2 2048x4096x11008 "$head,EPI=1" "$head,EPI=0"
if ((SECONDS < 430)); then
  timeout $((585 - SECONDS)) python3 bench/peers --ops fused_mlp \
    --shapes 2048x4096x11008,4096x2048x5632 --kernel-times --out $o/peers > $o/peers.log 2>&1
  echo "peers rc $? at $SECONDS s"; tail -12 $o/peers.log
  python3 - $o/peers/peers.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    for who, t in r.get("kernel_times", {}).items():
        for k, us in t.get("kernel_median_us", {}).items():
            print(r["shape"], who, f"{us:9.2f}", k[:90])
PY
fi
xz $o/*.sqlite 2>/dev/null
