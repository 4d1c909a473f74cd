#!/usr/bin/python3
"""Renders the figures of `make bench` as PNG curves.

  plot_bench.py --lines build/bench-results.jsonl --out build/bench-results.json --img docs/img

--lines: the `simpler bench --json` output, one JSON object per line (a
`--compare-load` object holds "quiet", "loaded" and "loaded_over_quiet").
Writes --out (one object: benchmark name -> its figures; a compared one under
"<name>@load") and, for the figures present, --img/scaling.png (ns/task
against graph size, one panel per geometry and runtime, plus runs/s of a node
against its chip count) and --img/load.png (runs/s against runs in flight,
quiet and loaded, for runs_in_flight and l3_pipelined). Debian's
python3-matplotlib; nothing is drawn for a figure that is missing.
"""
import argparse
import json
import os
import sys

SHAPES = ("independent", "chain", "layered")


def read_lines(path):
    results = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            name = obj.get("bench", f"line{n}")
            key = f"{name}@load" if "loaded_over_quiet" in obj or "loaded" in obj else name
            results[key] = obj
    return results


def plot_scaling(plt, scaling, path):
    geometries = scaling.get("geometries", {})
    panels = [(g, r) for g, per in geometries.items() for r in per]
    node = scaling.get("node", {}).get("chips", {})
    count = len(panels) + (1 if node else 0)
    if count == 0:
        return False
    cols = min(3, count)
    rows = (count + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (g, r) in zip(flat, panels):
        for shape in SHAPES:
            sizes = geometries[g][r].get(shape, {}).get("sizes", {})
            xs = sorted((int(k), v["ns_per_task"]) for k, v in sizes.items() if "ns_per_task" in v)
            if xs:
                ax.plot([x for x, _ in xs], [y for _, y in xs], marker="o", label=shape)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        failed = "error" in geometries[g][r] or any(
            "error" in v for sh in SHAPES for v in geometries[g][r].get(sh, {}).get("sizes", {}).values())
        ax.set_title(f"{g} / {r}" + (" (a cell failed: see the JSON)" if failed else ""), fontsize=9)
        ax.set_xlabel("tasks per graph")
        ax.set_ylabel("ns per task")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if node:
        ax = flat[len(panels)]
        chips = sorted((c for c in node if "runs_per_s" in node[c]), key=int)
        ax.bar([str(c) for c in chips], [node[c]["runs_per_s"] for c in chips], label="runs/s")
        ax.plot([str(c) for c in chips], [node[c]["chip_tasks_per_s"] for c in chips], "k--o",
                label="chip tasks/s")
        ax.set_title(f"node, depth {scaling['node'].get('depth', '?')}: one task per chip per run", fontsize=9)
        ax.set_xlabel("chip children")
        ax.set_ylabel("per second")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in flat[count:]:
        ax.axis("off")
    fig.suptitle("scaling: cost per task as the graph grows (flat is the goal)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_load(plt, results, path):
    benches = [b for b in ("runs_in_flight", "l3_pipelined") if f"{b}@load" in results]
    if not benches:
        return False
    fig, axes = plt.subplots(1, len(benches), figsize=(6 * len(benches), 4), squeeze=False)
    for ax, b in zip(axes[0], benches):
        obj = results[f"{b}@load"]
        for which, style in (("quiet", "-o"), ("loaded", "--s")):
            depths = obj.get(which, {}).get("in_flight", {})
            xs = sorted((int(k), v["runs_per_s"]) for k, v in depths.items())
            if xs:
                ax.plot([x for x, _ in xs], [y for _, y in xs], style,
                        label=f"{which}" + (f" ({obj.get('busy_neighbours')} busy neighbours)"
                                            if which == "loaded" else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(b, fontsize=10)
        ax.set_xlabel("runs in flight")
        ax.set_ylabel("runs per second")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("under load: quiet vs busy neighbours (goal: loaded >= 1/5 of quiet)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--img", required=True)
    a = p.parse_args()
    results = read_lines(a.lines)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(f"{a.out}: {len(results)} benchmarks")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("python3-matplotlib is missing (apt-get install python3-matplotlib); no plot drawn")
    os.makedirs(a.img, exist_ok=True)
    if "scaling" in results and plot_scaling(plt, results["scaling"], os.path.join(a.img, "scaling.png")):
        print(f"{a.img}/scaling.png")
    if plot_load(plt, results, os.path.join(a.img, "load.png")):
        print(f"{a.img}/load.png")


if __name__ == "__main__":
    main()
