#!/usr/bin/env bash
# H200: what limits the SM clock during 4096^3 (nvidia-smi sampled every 50 ms while kforge
# bench times TAIL 0 and TAIL 1 for a few seconds each), then bench/peers at 4096^3 in eight
# processes.
set -u
usage="call2-clocks-peers.sh"
source bench/run-steps.sh "$OUT" call2
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
q=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$q --format=csv > /dev/null 2>&1 || q=${q/clocks_event_reasons/clocks_throttle_reasons}
nvidia-smi --query-gpu=$q --format=csv,nounits -lms 50 > $out/smi.csv 2>&1 &
smi=$!
nvidia-smi -q -d PERFORMANCE,POWER,CLOCK > $out/smi-q-before.txt 2>&1
f=kernels/matmul/matmul_wgmma.cu
b=TILE_M=128,TILE_N=256,TILE_K=64,STAGES=4,SCHEDULE=0,RASTER=0,SPLIT=0,CLUSTER_M=2,CLUSTER_N=1,SWAP_AB=0,MMA_ORDER=0,EPILOGUE=3,EPI_STAGES=2,EPI_N=32,SWIZZLE=8
args() { for kv in ${1//,/ }; do echo --param $kv; done; }
for tail in 0 1 0 1; do
  echo "bench TAIL $tail from $(date +%T.%N)" | tee -a $summary
  timeout 120 $kforge bench $f --shape 4096x4096x4096 --dtype bf16 $(args $b,TAIL=$tail) \
    --max-time 4 --target-stderr 0 --no-baseline > $out/bench-tail$tail-$SECONDS.log 2>&1
  echo "bench TAIL $tail to $(date +%T.%N) rc $?" | tee -a $summary
  grep -iE "median|µs" $out/bench-tail$tail-$SECONDS.log | head -3 | tee -a $summary
done
nvidia-smi -q -d PERFORMANCE,POWER,CLOCK > $out/smi-q-during.txt 2>&1
archive
$kforge build matmul --dtype bf16 --shape 4096x4096x4096 > $out/build.log 2>&1
for p in 1 2 3 4 5 6 7 8; do
  ((SECONDS < 480)) || break
  echo "peers $p from $(date +%T.%N)" >> $summary
  timeout $((560 - SECONDS)) python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --no-compile --kernel-times --out $out/peers-$p > $out/peers-$p.log 2>&1
  echo "peers $p rc $? at $SECONDS s" | tee -a $summary
  grep -E "^- matmul" $out/peers-$p.log | cut -c1-250 | tee -a $summary
  archive
done
kill $smi; archive
