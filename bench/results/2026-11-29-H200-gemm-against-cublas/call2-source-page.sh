#!/usr/bin/env bash
# The source page (SASS, warp-state samples per instruction) of call 1's report, one file.
set -u
ncu -i .device/mm.ncu-rep --page source --csv --print-source sass 2>&1 | xz -T0 > $OUT/source.csv.xz
ls -la $OUT
