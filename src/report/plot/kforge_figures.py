"""Figures of a kforge report, drawn with matplotlib from the report's data (report.json).

    python3 kforge_figures.py REPORT_JSON OUT_DIR

writes OUT_DIR/NAME.svg and NAME.png for every figure the data allows, and the manifest
OUT_DIR/figures.json (a list of {name, title, caption, svg, png, data_uri}; data_uri is the
SVG, for a page that must open offline). A figure is a function registered
by name with @figure; it returns (title, caption) after drawing on the axes it is given, or
None when the report has nothing for it. Adding a figure is adding one function here.
"""
import base64
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable SVGs
import matplotlib.pyplot as plt  # noqa: E402

FIGURES = []  # (name, per_task, function), in the page's order

VERDICT_STYLE = {  # marker, colour of an experiment by its verdict
    "KEEP": ("o", "#1b9e77"),
    "OK": ("o", "#7570b3"),  # a tune's evaluation that passed and was timed
    "REVERT": ("o", "#7570b3"),
    "UNCHANGED": ("o", "#999999"),
    "COMPILE_ERROR": ("x", "#d95f02"),
    "WRONG": ("X", "#e7298a"),
    "CRASH": ("^", "#a6761d"),
    "TIMEOUT": ("v", "#a6761d"),
    "INVALID": ("s", "#e6ab02"),
    "BAD_FILE": ("D", "#666666"),
}


def figure(name, per_task=False):
    def register(fn):
        FIGURES.append((name, per_task, fn))
        return fn
    return register


@figure("progress", per_task=True)
def progress(ax, report, task):
    """Every experiment of a task: timed ones at their time, failed ones on the bottom edge
    marked by verdict; the frontier of kept, passing experiments as a step line."""
    points = task["points"]
    if not points:
        return None
    timed = [p for p in points if p.get("time_us")]
    top = max([p["time_us"] for p in timed] + [task["start_us"] or 0]) * 1.08 or 1.0
    bottom = min([p["time_us"] for p in timed] + [task["best_us"] or top]) * 0.85
    seen = set()
    for p in points:
        marker, colour = VERDICT_STYLE.get(p["verdict"], ("o", "#000000"))
        y = p["time_us"] if p.get("time_us") else bottom
        label = p["verdict"] if p["verdict"] not in seen else None
        seen.add(p["verdict"])
        ax.scatter([p["n"]], [y], marker=marker, color=colour, label=label, zorder=3,
                   s=36 if p.get("time_us") else 48)
    frontier = task["frontier"]
    xs = [f["n"] for f in frontier] + [points[-1]["n"]]
    ys = [f["time_us"] for f in frontier] + [frontier[-1]["time_us"]]
    tune = task.get("source") == "tune database"
    ax.step(xs, ys, where="post", color="#1b9e77", linewidth=2,
            label="best so far (timed, passing)" if tune else "best kept (passing)")
    ax.set_ylim(bottom * 0.97, top)
    ax.set_xlabel("evaluation" if tune else "experiment")
    ax.set_ylabel("time per call (µs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    if tune:
        return (f"{task['name']}: every evaluation",
                f"{task['experiments']} evaluations, {task['kept']} of them a new best; first "
                f"timed {task['start_us']:.2f} µs, best {task['best_us']:.2f} µs "
                f"({task['speedup']:.2f}x). Failed evaluations sit on the bottom edge, marked by "
                f"verdict; the line is the best timed, passing variant so far.")
    return (f"{task['name']}: every experiment",
            f"{task['experiments']} experiments, {task['kept']} kept; {task['start_us']:.2f} → "
            f"{task['best_us']:.2f} µs ({task['speedup']:.2f}x). Failed experiments sit on the "
            f"bottom edge, marked by verdict; the line is the best kept, passing kernel.")


@figure("roofline")
def roofline(ax, report, _task=None):
    """Each task's kernel before and after against the measured copy and matmul ceilings."""
    ceilings = report.get("ceilings") or {}
    tasks = [t for t in report.get("tasks", []) if t.get("flops") and t.get("bytes")]
    if not tasks or not ceilings.get("copy_gbps"):
        return None
    copy_tbps = ceilings["copy_gbps"] / 1e3
    peak = ceilings.get("matmul_tflops")
    intensities = [t["flops"] / t["bytes"] for t in tasks]
    lo = min(intensities + [0.1]) / 4
    hi = max(intensities + [(peak or 1) / copy_tbps]) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roof = [min(copy_tbps * x, peak) if peak else copy_tbps * x for x in xs]
    ax.plot(xs, roof, color="#333333", linewidth=1.5,
            label=f"copy {ceilings['copy_gbps']:.0f} GB/s" +
                  (f", matmul {peak:.0f} TFLOP/s" if peak else ""))
    for t, x in zip(tasks, intensities):
        before = t["flops"] / (t["start_us"] * 1e-6) / 1e12 if t.get("start_us") else None
        after = t["flops"] / (t["best_us"] * 1e-6) / 1e12 if t.get("best_us") else None
        line, = ax.plot([x, x], [before or after, after or before], color="#999999", zorder=2)
        if before:
            ax.scatter([x], [before], marker="o", facecolors="none", edgecolors="#7570b3", zorder=3)
        if after:
            ax.scatter([x], [after], marker="o", color="#1b9e77", zorder=3)
        ax.annotate(t["name"], (x, after or before), textcoords="offset points", xytext=(6, 4),
                    fontsize=7)
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="#7570b3", label="start")
    ax.scatter([], [], marker="o", color="#1b9e77", label="best kept")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    return ("Roofline: each task's kernel before and after",
            f"Against the ceilings measured on {report.get('device', 'the device')} "
            f"({ceilings.get('source', '')}). A kernel on the slanted line moves its bytes at "
            f"the copy ceiling.")


@figure("waterfall")
def waterfall(ax, report, _task=None):
    """The model's kernel time by op group, and what each group becomes with kforge's kernels."""
    plan = report.get("plan")
    if not plan or not plan.get("groups"):
        return None
    groups = plan["groups"]
    labels, starts, heights, colours = [], [], [], []
    total = plan["kernel_time_us"]
    labels.append("model kernel time")
    starts.append(0)
    heights.append(total)
    colours.append("#7570b3")
    level = total
    for g in groups:
        if g.get("after_us") is None:
            continue
        saving = g["time_us"] - g["after_us"]
        level -= saving
        labels.append(f"{g['name']}\n{g['time_us']:.0f} → {g['after_us']:.0f} µs")
        starts.append(level)
        heights.append(saving)
        colours.append("#1b9e77" if saving >= 0 else "#d95f02")
    labels.append("predicted")
    starts.append(0)
    heights.append(level)
    colours.append("#66a61e")
    measured = plan.get("measured_speedup")
    if measured:
        labels.append("measured (verify)")
        starts.append(0)
        heights.append(total / measured)
        colours.append("#e6ab02")
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, heights, left=starts, color=colours)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("time (µs)")
    ax.grid(alpha=0.3, axis="x")
    caption = (f"Kernel time of one step by op group ({plan.get('source', 'the plan')}); each "
               f"green bar is what a group saves with its kforge kernel "
               f"({plan.get('after_source', '')}).")
    if measured:
        caption += f" Measured by kforge verify: {measured:.2f}x on the whole step."
    return "Plan: where the time goes, and what is left", caption


def main():
    report = json.loads(pathlib.Path(sys.argv[1]).read_text())
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, per_task, fn in FIGURES:
        targets = report.get("tasks", []) if per_task else [None]
        for i, task in enumerate(targets):
            fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
            made = fn(ax, report, task)
            if made is None:
                plt.close(fig)
                continue
            title, caption = made
            ax.set_title(title, fontsize=10)
            fig.tight_layout()
            stem = f"{name}-{i + 1:02d}" if per_task else name
            fig.savefig(out / f"{stem}.svg")
            fig.savefig(out / f"{stem}.png")
            plt.close(fig)
            svg = (out / f"{stem}.svg").read_bytes()
            manifest.append({"name": stem, "figure": name, "title": title, "caption": caption,
                             "svg": f"{stem}.svg", "png": f"{stem}.png",
                             "data_uri": "data:image/svg+xml;base64," +
                                         base64.b64encode(svg).decode("ascii"),
                             "task": task["name"] if task else None})
    (out / "figures.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
