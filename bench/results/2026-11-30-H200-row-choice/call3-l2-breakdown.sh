#!/usr/bin/env bash
# H200: what makes up the L2 throughput of kforge's 4096^3 GEMM and cuBLAS's (both in one
# bench/peers process under Nsight Compute, clocks and caches left alone): the breakdown of
# lts__throughput into its sub-metrics, then L2 sectors and requests by operation and DRAM bytes.
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/call3; mkdir -p $o
pack() { tar -C /tmp -czf $OUT/call3.tgz call3; }
prof() {  # name metrics
  timeout $((280 - SECONDS)) ncu --profile-from-start off --cache-control none --clock-control none \
    --metrics $2 -o $o/$1 -f python3 bench/peers --ops matmul --shapes 4096x4096x4096 \
    --profile-calls --no-compile --out $o/peers-$1 > $o/ncu-$1.log 2>&1
  echo "ncu $1 rc $? at $SECONDS s"
  ncu -i $o/$1.ncu-rep --page raw --csv > $o/$1.csv 2>&1
  python3 - $o/$1.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
for r in data:
    print("kernel:", r[head.index("Kernel Name")][:60])
    for i, name in enumerate(head):
        if name.startswith(("lts__", "dram__", "gpu__time", "l1tex__", "sm__")):
            print(f"  {name:70s} {r[i]:>16s} {units[i]}")
PY
  pack
}
prof breakdown breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum
prof sectors lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_requests_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
