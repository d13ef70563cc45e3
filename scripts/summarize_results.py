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
    print(f"{'bench (bf16)':<44} {'median us':>10} {'p10':>9} {'p90':>9} {'GB/s':>7} {'%copy':>6} "
          f"{'TFLOP/s':>8} {'%mm':>5} {'baseline us':>11} {'speedup':>8}")
    nan = float("nan")
    for b in summary["benches"]:
        t = b["time_us"]
        if b["verdict"] != "OK":
            print(f"{b['op'] + ' ' + b['shape']:<44.44} {b['verdict']}: {b['detail'][:60]}")
            continue
        base = b.get("baseline") or {}
        base_us = base.get("time_us", {}).get("median", nan) if base.get("ok") else nan
        pct_c = b["pct_of_copy_ceiling"]
        pct_m = b["pct_of_matmul_ceiling"]
        print(f"{b['op'] + ' ' + b['shape']:<44.44} {t['median']:>10.2f} {t['p10']:>9.2f} {t['p90']:>9.2f} "
              f"{b['gbps']:>7.0f} {pct_c if pct_c is not None else nan:>6.1f} {b['tflops']:>8.2f} "
              f"{pct_m if pct_m is not None else nan:>5.1f} {base_us:>11.2f} {base.get('speedup', nan):>8.3f}")


if __name__ == "__main__":
    main()
