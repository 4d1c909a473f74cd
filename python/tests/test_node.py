"""Levels 3 and 4 from Python: node orchestrations `def orch(o)`, Python sub functions
in the forked sub workers over numpy views of the shared heap, chips as next-level
workers, groups, scopes, and a network of nodes."""

import os

import numpy as np
import pytest

import simpler
from conftest import ADD, DEADLINE_S, kernels, rng_floats

N = 1024
F32 = np.float32
IN, OUT, INOUT = simpler.Tag.Input, simpler.Tag.OutputExisting, simpler.Tag.InOut


def double_into(args):
    """y = 2 x, in the sub worker's process; also reports where it ran and what it saw."""
    x, y, info = args[0], args[1], args[2]
    y[:] = 2 * x
    info[0] = os.getpid()
    info[1] = x.ctypes.data  # the host address the child sees: the parent's, no copy
    info[2] = int(x.flags.owndata)
    info[3] = args[3]  # a scalar arrives as an int


def fails(args):
    raise ValueError(f"tile {args[0]} is not square")


def test_sub_function_runs_in_a_forked_process_over_the_shared_heap():
    with simpler.Worker(level=3, sub_workers=1, shared_heap_bytes=4 << 20) as w:
        fn = w.register(double_into)
        assert isinstance(fn, simpler.FunctionHandle)
        w.init()
        x = w.shared_array([N], F32)
        y = w.shared_array([N], F32)
        info = w.shared_array([4], np.int64)
        x[:] = rng_floats(N, 1)
        y[:] = -1
        run = w.submit(lambda o: o.submit_sub(fn, [(x, IN), (y, OUT), (info, OUT), 41]))
        run.wait(timeout=DEADLINE_S)
        np.testing.assert_array_equal(y, 2 * x)
        assert info[0] != os.getpid() and info[0] > 0
        assert info[1] == x.ctypes.data
        assert info[2] == 0
        assert info[3] == 41
        assert run.stats.tasks == 1


def test_sub_function_that_raises_fails_the_run_with_its_text():
    with simpler.Worker(level=3, sub_workers=1) as w:
        bad = w.register(fails)
        good = w.register(double_into)
        w.init()
        with pytest.raises(simpler.RunError) as e:
            w.run(lambda o: o.submit_sub(bad, [7]))
        assert e.value.code == simpler.StatusCode.USER_CODE_FAILED
        assert "ValueError" in e.value.message and "tile 7 is not square" in e.value.message
        # The sub worker survived: the next run works.
        x, y, info = w.shared_array([4], F32), w.shared_array([4], F32), w.shared_array([4], np.int64)
        x[:] = [1, 2, 3, 4]
        w.run(lambda o: o.submit_sub(good, [(x, IN), (y, OUT), (info, OUT), 0]))
        np.testing.assert_array_equal(y, [2, 4, 6, 8])


def test_node_orchestration_that_raises_fails_its_run():
    with simpler.Worker(level=3, sub_workers=1) as w:
        w.register(fails)
        w.init()

        def orch(o):
            raise KeyError("no such layer")

        with pytest.raises(simpler.RunError) as e:
            w.run(orch)
        assert e.value.code == simpler.StatusCode.USER_CODE_FAILED and "no such layer" in e.value.message
        with pytest.raises(TypeError, match="takes no args"):
            w.submit(orch, [1])


def noop(args):
    pass


def test_node_orchestrator_kept_past_its_run_stays_invalid_while_later_runs_get_their_own():
    # The orchestrator object may be reused from run to run on a thread; one
    # that an orchestration kept must never come back to life in a later run.
    kept, seen = [], {}
    with simpler.Worker(level=3, sub_workers=1) as w:
        fn = w.register(noop)
        w.init()
        w.run(lambda o: kept.append(o))

        def second(o):
            seen["same_object"] = o is kept[0]
            try:
                kept[0].submit_sub(fn)
                seen["kept_refused"] = False
            except simpler.Error as e:
                seen["kept_refused"] = "after its orchestration returned" in str(e)
            o.submit_sub(fn)

        w.run(second)
        assert seen == {"same_object": False, "kept_refused": True}
        with pytest.raises(simpler.Error, match="after its orchestration returned"):
            kept[0].submit_sub(fn)
        # Runs after that one (which kept nothing) still work.
        for _ in range(3):
            w.run(lambda o: o.submit_sub(fn))


def test_the_per_run_calls_in_their_short_forms_behave_as_in_their_long_forms():
    # submit(orch), o.submit_sub(fn) and wait() have fast paths; every other
    # form goes to the general binding. Both must succeed, fail and refuse alike.
    with simpler.Worker(level=3, sub_workers=1) as w:
        bad = w.register(fails)
        good = w.register(noop)
        w.init()
        assert w.submit(lambda o: o.submit_sub(good)).wait() is None
        assert w.submit(lambda o: o.submit_sub(good, []), call=None).wait(timeout=DEADLINE_S) is None
        for short in (True, False):
            h = w.submit(lambda o: o.submit_sub(bad)) if short else w.submit(lambda o: o.submit_sub(bad, None), call=None)
            with pytest.raises(simpler.RunError) as e:
                h.wait() if short else h.wait(timeout=DEADLINE_S)
            assert e.value.code == simpler.StatusCode.USER_CODE_FAILED and "IndexError" in e.value.message
        with pytest.raises(TypeError, match="expected a CallableHandle"):
            w.submit(42)
        with pytest.raises(TypeError, match="takes no args"):
            w.submit(lambda o: None, [1])
        caught = {}

        def refused(o):
            try:
                o.submit_sub(42)
            except TypeError as e:
                caught["error"] = str(e)

        w.submit(refused).wait()
        assert "submit_sub" in caught["error"]


def test_chips_and_sub_worker_with_scope_alloc_and_python_chip_orchestration():
    # node_pipeline from Python: y_k = a_k + b_k on chip k (the chip's orchestration is a
    # Python function, run in the chip child's process), z = y0 + y1 by the sub worker;
    # y0 and y1 are run intermediates in the shared heap, freed when the scope ends.
    def chip_orch(o, args):
        o.submit_aiv(ADD, args)

    def sum_into(args):
        args[2][:] = args[0] + args[1]

    with simpler.Worker(level=3, chips=2, sub_workers=1, device_memory_bytes=64 << 20, max_tasks_per_run=16) as w:
        add = w.register(simpler.ChipCallable("add", chip_orch, kernels(), ["in", "in", "out"]))
        total = w.register(sum_into)
        w.init()
        b = [rng_floats(N, 10 + k) for k in range(2)]
        db = []
        for k in range(2):
            db.append(w.malloc_on(k, N * 4))
            w.copy_to(db[k], b[k])
        a = [w.shared_array([N], F32) for _ in range(2)]
        z = w.shared_array([N], F32)
        for run_index in range(3):
            for k in range(2):
                a[k][:] = rng_floats(N, 100 * run_index + k)
            z[:] = -12345

            def orch(o):
                assert isinstance(o, simpler.Orchestrator)
                with o.scope():
                    y = [o.alloc([N], F32) for _ in range(2)]
                    for k in range(2):
                        o.submit_next_level(add, [(a[k], IN), (db[k].view([N], F32), IN), (y[k], OUT)], k)
                    o.submit_sub(total, [(y[0], IN), (y[1], IN), (z, OUT)])
                assert o.task_count == 3

            run = w.submit(orch)
            run.wait(timeout=DEADLINE_S)
            np.testing.assert_array_equal(z, (a[0] + b[0]) + (a[1] + b[1]))
        np.testing.assert_array_equal(w.copy_from(db[1], [N], F32), b[1])
        total0, free0 = w.memory_info_on(0)
        total_all, _ = w.memory_info()
        assert total0 == 64 << 20 and free0 < total0 and total_all == 2 * total0
        with pytest.raises(ValueError, match="5"):
            w.memory_info_on(5)


def test_groups_of_sub_and_chip_tasks():
    def chip_orch(o, args):
        o.submit_aiv(ADD, args)

    def mark(args):
        args[0][args[1]] = os.getpid()

    with simpler.Worker(level=3, chips=2, sub_workers=2, device_memory_bytes=64 << 20) as w:
        add = w.register(simpler.ChipCallable("add", chip_orch, kernels(), ["in", "in", "out"]))
        fn = w.register(mark)
        w.init()
        pids = w.shared_array([2], np.int64)
        x = [w.shared_array([N], F32) for _ in range(2)]
        y = [w.shared_array([N], F32) for _ in range(2)]
        for k in range(2):
            x[k][:] = rng_floats(N, 20 + k)
        w.run(lambda o: (o.submit_sub_group(fn, [[(pids, INOUT), 0], [(pids, INOUT), 1]]),
                         o.submit_next_level_group(add, [[(x[k], IN), (x[k], IN), (y[k], OUT)] for k in range(2)],
                                                   [0, 1])) and None)
        assert pids[0] != pids[1] and os.getpid() not in pids.tolist()
        for k in range(2):
            np.testing.assert_array_equal(y[k], 2 * x[k])
        with pytest.raises(simpler.RunError):
            w.run(lambda o: o.submit_sub_group(fn, [[(pids, INOUT), 0]] * 3) and None)


def test_shared_arrays_views_and_free():
    with simpler.Worker(level=3, sub_workers=1) as w:
        w.register(double_into)
        w.init()
        m = w.shared_array([8, 8], F32)
        assert isinstance(m.base, simpler.SharedAllocation)
        args = simpler.TaskArgs((m[2:4, 1:5], IN))
        v = args.tensor(0)
        assert v.shape == (2, 4) and v.strides == (8, 1) and v.offset == 17 and v.buffer.addr == m.ctypes.data
        with pytest.raises(ValueError, match="negative or unaligned stride"):
            simpler.TaskArgs((m[::-1], IN))
        with pytest.raises(TypeError, match="not the start"):
            w.free(m[1:])
        w.free(m)
        with pytest.raises(simpler.Error):
            w.malloc(64)  # Level 3 has no device of its own: malloc_on names the chip


def test_node_worker_used_after_close():
    w = simpler.Worker(level=3, sub_workers=1)
    fn = w.register(double_into)
    w.init()
    w.close()
    with pytest.raises(simpler.Error) as e:
        w.shared_array([4], F32)
    assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION
    with pytest.raises(simpler.RunError) as e:
        w.run(lambda o: o.submit_sub(fn, []))
    assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION
    with pytest.raises(simpler.Error) as e:
        w.register(fails)
    assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION


def test_network_of_nodes_runs_python_node_callables():
    # Level 4: each node (a forked Level 3 worker) runs a NodeCallable whose Python
    # orchestration hands the network's shared-heap tensors to its own sub worker.
    def scale(args):
        args[0][:] *= args[1]

    net = simpler.Worker(level=4, shared_heap_bytes=4 << 20)
    handles = []
    for _ in range(2):
        node = simpler.Worker(level=3, sub_workers=1)
        fn = node.register(scale)
        handles.append(fn)
        net.add_next_level_worker(node)
        with pytest.raises(simpler.Error, match="closed") as e:
            node.init()  # it belongs to the network worker now
        assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION

    def node_orch(o, args):
        o.submit_sub(handles[0], args)

    callable_ = net.register(simpler.NodeCallable("scale_on_node", node_orch))
    assert isinstance(callable_, simpler.CallableHandle)
    with net:
        net.init()
        x = [net.shared_array([N], F32) for _ in range(2)]
        for k in range(2):
            x[k][:] = rng_floats(N, 30 + k)
        want = [3 * x[0], 5 * x[1]]
        run = net.submit(lambda o: [o.submit_next_level(callable_, [(x[k], INOUT), 3 + 2 * k], k) for k in range(2)]
                         and None)
        run.wait(timeout=DEADLINE_S)
        for k in range(2):
            np.testing.assert_array_equal(x[k], want[k])


def test_chip_orchestration_that_raises_in_the_chip_child_fails_the_run():
    def chip_orch(o, args):
        if args.scalar(0) < 0:
            raise ArithmeticError(f"negative block count {args.scalar(0)}")

    with simpler.Worker(level=3, chips=1, device_memory_bytes=64 << 20) as w:
        h = w.register(simpler.ChipCallable("raises_in_child", chip_orch, kernels(), ["scalar"]))
        w.init()
        with pytest.raises(simpler.RunError) as e:
            w.run(lambda o: o.submit_next_level(h, [-3], 0))
        assert e.value.code == simpler.StatusCode.USER_CODE_FAILED
        assert "ArithmeticError" in e.value.message and "negative block count -3" in e.value.message
        w.run(lambda o: o.submit_next_level(h, [3], 0))  # the chip child survived
