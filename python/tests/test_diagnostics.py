"""Diagnostics from Python (issue 12): CallConfig per Worker or per run, a chip run's trace and argument dump,
a node run's one trace with its host lanes and every chip, and the refusals that name the field."""

import json
import os

import numpy as np
import pytest

import simpler
from conftest import ADD, DEADLINE_S, kernels, rng_floats, upload

N = 1024
F32 = np.float32
IN, OUT = simpler.Tag.Input, simpler.Tag.OutputExisting


def read_trace(directory):
    with open(os.path.join(directory, "trace.json")) as f:
        return json.load(f)


def process_names(trace):
    return {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}


def task_slices(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "task"]


def test_call_config_checks_its_fields():
    c = simpler.CallConfig(swimlane_level=2, trace_dir="/tmp/x", dump_args="hybrid")
    assert (c.swimlane_level, c.trace_dir, c.dump_args) == (2, "/tmp/x", simpler.DumpArgs.Hybrid)
    assert simpler.CallConfig(dump_args=simpler.DumpArgs.Full).dump_args == simpler.DumpArgs.Full
    with pytest.raises(ValueError, match="dump_args"):
        simpler.CallConfig(dump_args="most")
    with pytest.raises(TypeError, match="call"):
        simpler.Worker(level=2, call="trace please")


def test_chip_run_traces_and_dumps_per_run(chip, tmp_path):
    w, add = chip
    a, b = rng_floats(N, 1), rng_floats(N, 2)
    da, db, dc = upload(w, a), upload(w, b), w.malloc(N * 4)
    args = simpler.TaskArgs((da.view([N], F32), IN), (db.view([N], F32), IN), (dc.view([N], F32), OUT))
    call = simpler.CallConfig(swimlane_level=1, trace_dir=str(tmp_path), dump_args="full")
    w.run(add, args, call=call)
    np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + b)
    trace = read_trace(tmp_path)
    assert process_names(trace) == {"chip0"}
    assert len(task_slices(trace)) == 1
    with open(tmp_path / "args_dump" / "manifest.json") as f:
        manifest = json.load(f)
    assert manifest["complete"] is True
    assert len(manifest["records"]) == 3  # a and b before, c after
    out = [x for x in manifest["records"] if x["stage"] == "after"]
    assert len(out) == 1
    raw = np.fromfile(tmp_path / "args_dump" / "args.bin", dtype=np.uint8)
    got = raw[out[0]["bin_offset"]:out[0]["bin_offset"] + out[0]["bytes"]].view(F32)
    np.testing.assert_array_equal(got, a + b)
    # The same Worker with no call records nothing new.
    os.remove(tmp_path / "trace.json")
    w.run(add, args)
    assert not (tmp_path / "trace.json").exists()


def test_a_refused_call_names_the_field(chip):
    w, add = chip
    da = w.malloc(N * 4)
    args = simpler.TaskArgs((da.view([N], F32), IN), (da.view([N], F32), IN), (da.view([N], F32), OUT))
    h = w.submit(add, args, call=simpler.CallConfig(swimlane_level=1))
    with pytest.raises(simpler.RunError, match="trace_dir") as refused:
        h.wait(timeout=DEADLINE_S)
    assert refused.value.code == simpler.StatusCode.INVALID_ARGUMENT
    with pytest.raises(TypeError, match="call"):
        w.submit(add, args, call=3)


def test_node_run_trace_holds_host_lanes_and_both_chips(tmp_path):
    def chip_orch(o, args):
        o.submit_aiv(ADD, args)

    call = simpler.CallConfig(swimlane_level=1, trace_dir=str(tmp_path))
    with simpler.Worker(level=3, chips=2, sub_workers=0, device_memory_bytes=64 << 20, max_tasks_per_run=16,
                        call=call) as w:
        add = w.register(simpler.ChipCallable("add", chip_orch, kernels(), ["in", "in", "out"]))
        w.init()
        a = [w.shared_array([N], F32) for _ in range(2)]
        z = [w.shared_array([N], F32) for _ in range(2)]
        for k in range(2):
            a[k][:] = rng_floats(N, k)

        def orch(o):
            for k in range(2):
                o.submit_next_level(add, [(a[k], IN), (a[k], IN), (z[k], OUT)], k)

        w.run(orch)
        for k in range(2):
            np.testing.assert_array_equal(z[k], a[k] + a[k])
    trace = read_trace(tmp_path)
    assert process_names(trace) == {"node", "chip0", "chip1"}
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"Orchestrator", "Scheduler", "Serve chip0", "Serve chip1"} <= lanes
    assert len(task_slices(trace)) == 2
