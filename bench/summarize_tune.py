#!/usr/bin/env python3
"""Compares a guided tune with an exhaustive one (JSON reports of `kforge tune --json`).

Prints a Markdown summary: the winners, the share of the exhaustive optimum the guided search
reached and the share of evaluations it used, compile throughput, pruning counts.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def variant_row(label, report):
    best = report.get("best") or {}
    t = best.get("time_us", {})
    return (f"| {label} | {report['strategy']} | {report['evaluated']} | {report['valid']} | "
            f"{t.get('median', float('nan')):.2f} | {t.get('p10', float('nan')):.2f}-"
            f"{t.get('p90', float('nan')):.2f} | `{json.dumps(best.get('params', {}), sort_keys=True)}` |")


def main():
    guided, exhaustive = load(sys.argv[1]), load(sys.argv[2])
    run = guided.get("run", {})
    print(f"# Tuning {guided['problem']} on {guided['device']}\n")
    print(f"git {run.get('kforge_git_sha', '?')}{' (dirty)' if run.get('kforge_git_dirty') else ''}, "
          f"{run.get('date', '?')}\n")
    space = exhaustive["space"]
    print(f"Space: {space['raw']:.0f} raw combinations, {space['feasible']} feasible "
          f"(solved in {space['solve_ms']:.1f} ms).\n")
    print("| run | strategy | evaluated | valid | best median us | p10-p90 us | best variant |")
    print("|---|---|---|---|---|---|---|")
    print(variant_row("guided", guided))
    print(variant_row("exhaustive", exhaustive))
    g = guided["best"]["time_us"]["median"]
    e = exhaustive["best"]["time_us"]["median"]
    share = e / g
    evals = guided["evaluated"] / exhaustive["evaluated"]
    print(f"\nGuided reached {100 * share:.1f}% of the exhaustive optimum "
          f"(target >= 95%) with {100 * evals:.1f}% of its evaluations (target <= 25%): "
          f"{'MET' if share >= 0.95 and evals <= 0.25 else 'NOT MET'}.\n")
    for name, r in (("guided", guided), ("exhaustive", exhaustive)):
        c = r["compile"]
        print(f"- {name}: compiled {c['compiled']} variants, {c['seconds_per_variant']:.2f} s each "
              f"on {c['jobs']} threads: capacity {c['capacity_variants_per_second']:.1f} "
              f"variants/s, achieved {c['variants_per_second']:.2f}/s over {c['busy_seconds']:.0f} s "
              f"busy; the device waited {r['device_wait_seconds']:.1f} s for compiles; tune took "
              f"{r['wall_seconds']:.0f} s; final check {r['final_check']}")
    print("\nPruned before compiling (raw combinations):\n")
    for why, n in sorted(space["pruned_before_compile"].items(), key=lambda kv: -kv[1]):
        print(f"- {n:.0f}: {why}")
    print("\nRejected after compiling / failed (exhaustive run):\n")
    for why, n in exhaustive["rejected_after_compile"].items():
        print(f"- {n}: {why}")
    for why, n in exhaustive["failed"].items():
        print(f"- {n}: {why}")
    return 0 if share >= 0.95 and evals <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
