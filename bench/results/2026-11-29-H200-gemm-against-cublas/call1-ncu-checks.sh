#!/usr/bin/env bash
# H200, call 1: where kforge's 4096^3 GEMM spends its time against cuBLAS's (ncu warp-state
# sampling per SASS instruction, both kernels in one bench/peers process), then table checks.
set -u
o=$OUT; export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $o/gpu.txt
timeout 300 ncu --profile-from-start off --cache-control none --clock-control none \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
  -o $o/mm -f python3 bench/peers --ops matmul --shapes 4096x4096x4096 --profile-calls \
  --no-compile --out $o/peers > $o/ncu.log 2>&1
echo "ncu rc $? at $SECONDS s"
ncu -i $o/mm.ncu-rep --page details --csv > $o/details.csv 2>&1
ncu -i $o/mm.ncu-rep --page source --csv --print-source sass > $o/source.csv 2>&1
ls -la $o; xz -T0 $o/source.csv
key=NVIDIA-H200-cc-9-0
for job in flash_attention:bf16 matmul:bf16 fused_mlp:bf16; do
  op=${job%%:*}; d=${job##*:}; t=kernels/$op/tuned/bf16-$key.json
  ((SECONDS < 420)) || break
  timeout $((560 - SECONDS)) build/ci/kforge check --table $t --dtype $d > $o/check-$op-$d.log 2>&1
  echo "$op $d rc $? at $SECONDS s: $(grep -c '^  PASS' $o/check-$op-$d.log) pass, $(grep -c '^  FAIL' $o/check-$op-$d.log) fail"
  cp $t $o/$op.json
done
