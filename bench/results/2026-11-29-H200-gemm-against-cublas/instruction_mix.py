#!/usr/bin/env python3
"""Instruction mix and warp-stall shares of the two 4096^3 GEMM kernels in ncu-source.csv.xz.

The file is Nsight Compute's source page (`--page source --csv --print-source sass`) of call 1's
report: one block per kernel, one row per SASS instruction with its executions and its warp-state
samples. Counts are printed per (tile, K step, consumer warp): 512 tiles x 64 K steps x 8
consumer warps = 262144 units in both kernels, so a loop's per-step instructions read as small
numbers.

    python3 instruction_mix.py [ncu-source.csv.xz] [--loop]

--loop also prints each kernel's instructions executed at least 100000 times, in address order
(the consumers' K loop).
"""
import collections
import csv
import io
import lzma
import pathlib
import re
import sys

UNITS = 512 * 64 * 8
MNEMONIC = re.compile(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)")


def kernels(text):
    """(name, rows) per kernel block of the source page."""
    blocks = []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    for block in blocks:
        name = "kforge (CUTLASS)" if "cutlass" in block[0] else "cuBLAS (nvjet)"
        yield name, list(csv.DictReader(io.StringIO("\n".join(block[1:]))))


def number(text):
    return float(text.replace(",", "") or 0)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = pathlib.Path(args[0] if args else pathlib.Path(__file__).parent / "ncu-source.csv.xz")
    text = lzma.open(path, "rt").read()
    for name, rows in kernels(text):
        samples = sum(number(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        executed = collections.Counter()
        stalled = collections.Counter()
        for r in rows:
            match = MNEMONIC.match(r["Source"].strip())
            op = match.group(2) if match else r["Source"].strip()
            executed[op] += number(r["Instructions Executed"])
            stalled[op] += number(r["Warp Stall Sampling (All Samples)"])
        print(f"## {name}: {samples:.0f} warp-state samples")
        print("| instruction | executed per unit | share of samples |")
        print("|---|---|---|")
        for op, count in executed.most_common(16):
            print(f"| {op} | {count / UNITS:.2f} | {100 * stalled[op] / samples:.1f}% |")
        if "--loop" in sys.argv:
            for r in rows:
                if number(r["Instructions Executed"]) >= 100000:
                    share = 100 * number(r["Warp Stall Sampling (All Samples)"]) / samples
                    print(f"    {number(r['Instructions Executed']):9.0f} {share:5.1f}%  "
                          f"{r['Source'].strip()[:90]}")
        print()


if __name__ == "__main__":
    main()
