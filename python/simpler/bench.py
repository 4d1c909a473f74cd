"""`python3 -m simpler.bench [--json] [--simpler PATH]`: the 1-task latencies of
`simpler bench l2_latency` and `l3_sub_latency`, driven from Python, beside the C++
figures measured in the same run (the `simpler` binary, run as a subprocess just
before each Python measurement), as a ratio and as the microseconds Python adds
to the p50 (goal: <= 2 us).

py_l2_latency: Worker(level=2), default config; one run = submit a ChipCallable
whose native orchestration (native/one_noop_task.cpp, as the C++ bench's)
submits one no-op AIV task, then wait: the cost of driving a run from Python.
py_l2_latency_python_orchestration: the same with the orchestration a Python
function (`o.submit_aiv(0)`): what a Python orchestration adds on top.
py_l3_sub_latency: Worker(level=3, sub_workers=1, pipeline_depth=2); one run =
submit a Python node orchestration `lambda o: o.submit_sub(fn)` (made once and
reused from run to run, as the C++ bench reuses its std::function) that submits
one Python no-op sub function (which runs in the forked sub worker), then wait. Both as the C++ benches do:
200 warm-up runs, then 2000 (L2) / 3000 (L3) measured runs."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import simpler

GOAL_ADDED_P50_US = 2.0


def summarize(samples_us):
    s = sorted(samples_us)
    n = len(s)

    def pct(p):
        return s[min(n - 1, int(p * (n - 1) + 0.5))]

    return {"n": n, "min": round(s[0], 3), "p50": round(pct(0.5), 3), "p99": round(pct(0.99), 3),
            "max": round(s[-1], 3), "mean": round(sum(s) / n, 3)}


def timed_runs(worker, what, warmup, runs):
    """`runs` latencies of `worker.submit(what).wait()` in us, after `warmup`
    untimed ones. As the C++ benches do, the timed span is the submit and the
    wait alone, and `what` (a callable handle, or a node orchestration made
    once, like the C++ bench's std::function) is reused from run to run."""
    clock = time.perf_counter_ns
    submit = worker.submit
    for _ in range(warmup):
        submit(what).wait()
    out = [0] * runs
    for i in range(runs):
        t0 = clock()
        submit(what).wait()
        out[i] = clock() - t0
    return [t / 1000.0 for t in out]


def native_one_noop_task():
    """The native orchestration of one no-op AIV task, shipped with the package."""
    return os.path.join(os.path.dirname(os.path.abspath(simpler.__file__)), "native", "simpler_py_one_noop_task.so")


def py_l2_latency(python_orchestration=False):
    lib = simpler.KernelLibrary()
    lib.add_noop(0, simpler.CoreType.AIV)

    def one_noop_task(o, args):
        o.submit_aiv(0)

    if python_orchestration:
        callable_ = simpler.ChipCallable("bench_one_task", one_noop_task, lib, [])
    else:
        callable_ = simpler.ChipCallable.from_file("bench_one_task", native_one_noop_task(), lib, [])
    with simpler.Worker(level=2) as w:
        h = w.register(callable_)
        w.init()
        return summarize(timed_runs(w, h, 200, 2000))


def noop_sub(args):
    pass


def py_l3_sub_latency():
    with simpler.Worker(level=3, sub_workers=1, pipeline_depth=2, launch_depth=2, shared_heap_bytes=16 << 20) as w:
        fn = w.register(noop_sub)
        w.init()
        return summarize(timed_runs(w, lambda o: o.submit_sub(fn), 200, 3000))


def find_simpler(explicit):
    if explicit:
        return explicit
    if os.environ.get("SIMPLER_BIN"):
        return os.environ["SIMPLER_BIN"]
    # The build tree: <build>/python/simpler/ beside <build>/src/cli/simpler.
    here = os.path.dirname(os.path.abspath(simpler.__file__))
    candidate = os.path.normpath(os.path.join(here, "..", "..", "src", "cli", "simpler"))
    if os.path.isfile(candidate):
        return candidate
    return shutil.which("simpler")


def cpp_bench(binary, name):
    out = subprocess.run([binary, "bench", "--json", name], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout)


def median_of(summaries):
    def med(key):
        v = sorted(r[key] for r in summaries)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    return {key: round(med(key), 3) for key in ("min", "p50", "p99")}


def compare(name, cpp, py):
    added = round(py["p50"] - cpp["p50"], 3)
    return {"python": py, "cpp": cpp, "ratio_vs_cpp": {"p50": round(py["p50"] / cpp["p50"], 3),
                                                      "p99": round(py["p99"] / cpp["p99"], 3)},
            "python_adds_p50_us": added, "goal": {"added_p50_us_max": GOAL_ADDED_P50_US,
                                                  "met": added <= GOAL_ADDED_P50_US}}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m simpler.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--rounds", type=int, default=5, help="C++/Python rounds, alternated (default 5)")
    parser.add_argument("--simpler", help="the simpler binary (default: $SIMPLER_BIN, the build tree's, or PATH's)")
    args = parser.parse_args(argv)
    binary = find_simpler(args.simpler)
    if not binary or not os.path.isfile(binary):
        print("python3 -m simpler.bench: the `simpler` binary was not found (give --simpler PATH or $SIMPLER_BIN); "
              "the C++ figures are measured in the same run, so nothing is reported without them", file=sys.stderr)
        return 2
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    result = {"context": {"simpler": binary, "version": simpler.version(), "python": sys.version.split()[0],
                          "load_1m_before": load, "unit": "us"}}
    # Rounds alternate the C++ and the Python measurements so that both see
    # the same machine; each figure is the median over the rounds of that
    # round's p50 (p99, min), and the ratio and difference are of those medians.
    rounds = {"py_l2_latency": ([], []), "py_l2_latency_python_orchestration": ([], []), "py_l3_sub_latency": ([], [])}
    # The machine may be shared: the C++ runs' neighbour_cpu_pct (CPU time of
    # other processes while they ran) tells how busy it was, round by round.
    neighbours = []
    for _ in range(args.rounds):
        cpp_l2 = cpp_bench(binary, "l2_latency")
        result["context"]["cpp_context"] = cpp_l2.get("context")
        neighbours.append(cpp_l2.get("context", {}).get("neighbour_cpu_pct"))
        for name, py in (("py_l2_latency", py_l2_latency()),
                         ("py_l2_latency_python_orchestration", py_l2_latency(True))):
            rounds[name][0].append(cpp_l2["simpler"])
            rounds[name][1].append(py)
        cpp_l3 = cpp_bench(binary, "l3_sub_latency")
        neighbours.append(cpp_l3.get("context", {}).get("neighbour_cpu_pct"))
        rounds["py_l3_sub_latency"][0].append(cpp_l3["simpler"])
        rounds["py_l3_sub_latency"][1].append(py_l3_sub_latency())
    result["context"]["rounds"] = args.rounds
    result["context"]["neighbour_cpu_pct_per_cpp_run"] = neighbours
    try:
        result["context"]["load_1m_after"] = os.getloadavg()[0]
    except OSError:
        pass
    for name, (cpp, py) in rounds.items():
        result[name] = compare(name, median_of(cpp), median_of(py))
        result[name]["per_round_p50"] = {"cpp": [r["p50"] for r in cpp], "python": [r["p50"] for r in py]}
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("py_l2_latency", "py_l2_latency_python_orchestration", "py_l3_sub_latency"):
            r = result[name]
            print(f"{name:<34} python min {r['python']['min']:>7.3f} p50 {r['python']['p50']:>8.3f} "
                  f"p99 {r['python']['p99']:>9.3f}  C++ min {r['cpp']['min']:>7.3f} p50 {r['cpp']['p50']:>8.3f} "
                  f"p99 {r['cpp']['p99']:>9.3f}  "
                  f"ratio p50 {r['ratio_vs_cpp']['p50']:.3f}  adds {r['python_adds_p50_us']:+.3f} us  "
                  f"goal <= {GOAL_ADDED_P50_US} us {'met' if r['goal']['met'] else 'NOT met'}")
        print(f"medians over {args.rounds} alternated rounds; load average before: {load}, after: "
              f"{result['context'].get('load_1m_after')}; neighbour_cpu_pct of the C++ runs: {neighbours}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
