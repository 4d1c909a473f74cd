"""The examples' Python versions, each against its numpy golden, and the demo entry."""

import importlib
import os
import subprocess
import sys

import pytest

import simpler
from simpler.examples import NAMES


@pytest.mark.parametrize("name", NAMES)
def test_example_matches_its_numpy_golden(name):
    module = importlib.import_module(f"simpler.examples.{name}")
    detail = module.run(runs=2)
    assert detail.startswith(name)


def test_every_example_with_a_python_version_is_in_the_package():
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    with_main = sorted(d for d in os.listdir(examples) if os.path.isfile(os.path.join(examples, d, "main.py")))
    assert with_main == sorted(NAMES)


def test_demo_runs_the_examples_and_fails_on_an_unknown_name():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(simpler.__file__)))
    ok = subprocess.run([sys.executable, "-m", "simpler.demo", "vector_add", "kernel_failure"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("ok   ") == 2
    bad = subprocess.run([sys.executable, "-m", "simpler.demo", "no_such_example"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "unknown example" in bad.stderr


def test_bench_measures_python_driven_runs():
    from simpler import bench

    with simpler.Worker(level=2) as w:
        lib = simpler.KernelLibrary()
        lib.add_noop(0, simpler.CoreType.AIV)
        h = w.register(simpler.ChipCallable("noop", lambda o, a: o.submit_aiv(0), lib, []))
        w.init()
        samples = bench.timed_runs(w, h, 2, 20)
    s = bench.summarize(samples)
    assert s["n"] == 20 and 0 < s["min"] <= s["p50"] <= s["p99"] <= s["max"]
    # Level 3: one node orchestration, reused from run to run, as py_l3_sub_latency times it.
    with simpler.Worker(level=3, sub_workers=1) as w:
        fn = w.register(bench.noop_sub)
        w.init()
        s = bench.summarize(bench.timed_runs(w, lambda o: o.submit_sub(fn), 2, 20))
    assert s["n"] == 20 and 0 < s["min"] <= s["p50"] <= s["max"]
    r = bench.compare("x", {"p50": 10.0, "p99": 20.0}, {"p50": 11.5, "p99": 30.0})
    assert bench.median_of([{"min": 1, "p50": 5, "p99": 9}, {"min": 2, "p50": 3, "p99": 7}, {"min": 3, "p50": 4, "p99": 8}]) \
        == {"min": 2, "p50": 4, "p99": 8}
    assert r["python_adds_p50_us"] == 1.5 and r["goal"]["met"] and r["ratio_vs_cpp"]["p50"] == 1.15
    assert bench.main(["--simpler", "/no/such/simpler"]) == 2
