#!/usr/bin/env python3
"""Folds one gpu-check run's JSON files into a single results file and prints a short table.

usage: summarize_results.py RESULTS_DIR TAG
"""
import glob
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    results, tag = sys.argv[1], sys.argv[2]
    summary = {"tag": tag, "checks": [], "benches": [], "ceilings": None, "gpu_tests": None}
    for path in sorted(glob.glob(os.path.join(results, f"*-{tag}.json"))):
        name = os.path.basename(path)
        data = load(path)
        if name.startswith("ceilings-"):
            summary["ceilings"] = data
        elif name.startswith("check-"):
            summary["checks"].append({k: data.get(k) for k in ("file", "op", "verdict", "seed", "detail")}
                                     | {"stages": [(s["name"], s["passed"], s["cases"]) for s in data["stages"]],
                                        "device": data["device"]["name"], "run": data["run"]})
        elif name.startswith("bench-"):
            summary["benches"].append(data)
        elif name.startswith("gpu-tests-"):
            summary["gpu_tests"] = {"tests": data.get("tests"), "failures": data.get("failures"),
                                    "disabled": data.get("disabled")}
    out = os.path.join(results, f"gpu-check-{tag}.json")
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)

    print(f"\nresults: {out}")
    if summary["gpu_tests"]:
        g = summary["gpu_tests"]
        print(f"gpu tests: {g['tests']} run, {g['failures']} failed")
    if summary["ceilings"]:
        c = summary["ceilings"]["ceilings"]
        print(f"ceilings: copy {c['copy_gbps']:.0f} GB/s, matmul {c.get('matmul_tflops') or 0:.0f} TFLOP/s")
    for c in summary["checks"]:
        print(f"check {c['op']:<8} {c['verdict']:<8} stages " +
              " ".join(f"{n}:{'ok' if p else 'FAIL'}" for n, p, _ in c["stages"]))
    print(f"{'bench':<40} {'median us':>10} {'p10':>9} {'p90':>9} {'GB/s':>8} {'% copy':>7}")
    for b in summary["benches"]:
        t = b["time_us"]
        label = f"{b['op']} {b['shape']} {b['dtype']} [{b['variant'].split('[')[1].split(']')[0]}]"
        pct = b["pct_of_copy_ceiling"]
        print(f"{label:<40.40} {t['median']:>10.2f} {t['p10']:>9.2f} {t['p90']:>9.2f} "
              f"{b['gbps']:>8.0f} {pct if pct is not None else float('nan'):>7.1f}")


if __name__ == "__main__":
    main()
