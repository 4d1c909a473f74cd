"""Level 2 (one chip) from Python: memory, TaskArgs, submit/wait, orchestration in Python, errors."""

import threading

import numpy as np
import pytest

import simpler
from conftest import ADD, DEADLINE_S, SQRT, add_orch, kernels, rng_floats, upload

N = 4096
F32 = np.float32


def vec(buf, n=N):
    return buf.view([n], F32)


def add_args(a, b, c, n=N):
    return simpler.TaskArgs((vec(a, n), simpler.Tag.Input), (vec(b, n), simpler.Tag.Input),
                            (vec(c, n), simpler.Tag.OutputExisting))


def test_vector_add_matches_numpy(chip):
    w, add = chip
    a, b = rng_floats(N, 1), rng_floats(N, 2)
    da, db, dc = upload(w, a), upload(w, b), upload(w, np.full(N, -12345.0, F32))
    h = w.submit(add, add_args(da, db, dc))
    assert isinstance(h, simpler.RunHandle)
    h.wait(timeout=DEADLINE_S)
    assert h.done()
    assert h.result().ok and h.result().code == simpler.StatusCode.OK
    np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + b)
    st = h.stats
    assert (st.tasks, st.executed) == (1, 1)
    assert st.build_us >= 0 and st.device_us >= 0


def test_run_is_submit_and_wait(chip):
    w, add = chip
    a, b = rng_floats(N, 3), rng_floats(N, 4)
    da, db, dc = upload(w, a), upload(w, b), w.malloc(N * 4)
    h = w.run(add, add_args(da, db, dc))
    assert h.done()
    out = np.zeros(N, F32)
    assert w.copy_from(dc, out=out) is out
    np.testing.assert_array_equal(out, a + b)


def test_copy_round_trip_with_offsets_and_dtypes(chip):
    w, _ = chip
    buf = w.malloc(64)
    src = np.arange(8, dtype=np.int64)
    w.copy_to(buf, src)
    np.testing.assert_array_equal(w.copy_from(buf, [8], np.int64), src)
    w.copy_to(buf, np.array([7, 9], np.int32), dst_offset=8)
    np.testing.assert_array_equal(w.copy_from(buf, [2], "int32", src_offset=8), [7, 9])
    # A non-contiguous source is copied in C order.
    m = np.arange(16, dtype=np.float32).reshape(4, 4)
    w.copy_to(buf, m.T)
    np.testing.assert_array_equal(w.copy_from(buf, [4, 4], F32), np.ascontiguousarray(m.T))
    w.free(buf)


def test_copy_out_of_bounds_is_a_value_error(chip):
    w, _ = chip
    buf = w.malloc(16)
    with pytest.raises(ValueError, match="copy_to"):
        w.copy_to(buf, np.zeros(8, F32))
    with pytest.raises(simpler.InvalidArgumentError) as e:
        w.copy_from(buf, [8], F32)
    assert e.value.code in (simpler.StatusCode.OUT_OF_RANGE, simpler.StatusCode.INVALID_ARGUMENT)


def test_copy_from_argument_errors(chip):
    w, _ = chip
    buf = w.malloc(16)
    with pytest.raises(TypeError, match="shape and dtype"):
        w.copy_from(buf)
    with pytest.raises(ValueError, match="C-contiguous"):
        w.copy_from(buf, out=np.zeros((2, 2), F32).T)
    with pytest.raises(TypeError, match="dtype"):
        w.copy_from(buf, [4], np.complex64)


def test_chip_orchestration_in_python_with_alloc_scope_and_outputs():
    # c = (a + b) + b through an intermediate allocated in a scope; the second task
    # waits on the first through the intermediate's tags. A third task writes a
    # runtime-allocated output, which the orchestration receives as a TensorView.
    seen = {}

    def orch(o, args):
        assert isinstance(o, simpler.ChipOrchestrator)
        a, b, c = args.tensor(0), args.tensor(1), args.tensor(2)
        with o.scope():
            t = o.alloc([N], F32)
            first = o.submit_aiv(ADD, simpler.TaskArgs((a, simpler.Tag.Input), (b, simpler.Tag.Input),
                                                       (t, simpler.Tag.Output)))
            o.submit_aiv(ADD, [(t, simpler.Tag.Input), (b, simpler.Tag.Input), (c, simpler.Tag.OutputExisting)])
        ref = o.submit_aiv(ADD, [(a, simpler.Tag.Input), (b, simpler.Tag.Input), simpler.Output([N], F32)])
        seen["ids"] = (first.id, ref.id)
        seen["outputs"] = [(v.shape, v.dtype) for v in ref.outputs]
        seen["tasks"] = o.task_count

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("chain", orch, kernels(), ["in", "in", "out"]))
        w.init()
        a, b = rng_floats(N, 5), rng_floats(N, 6)
        da, db, dc = upload(w, a), upload(w, b), w.malloc(N * 4)
        run = w.run(h, add_args(da, db, dc))
        np.testing.assert_allclose(w.copy_from(dc, [N], F32), (a + b) + b, rtol=0, atol=0)
        assert run.stats.tasks == 3
    assert seen == {"ids": (0, 2), "outputs": [((N,), simpler.DType.F32)], "tasks": 3}


@pytest.mark.parametrize("runtime", [name for name, _ in simpler.available_runtimes()])
def test_every_runtime_by_keyword(runtime):
    # Issue 14: every runtime of this build is reached from Python by its C++ name.
    with simpler.Worker(level=2, runtime=runtime, pipeline_depth=2) as w:
        assert w.runtime == runtime
        add = w.register(simpler.ChipCallable("vector_add", add_orch, kernels(), ["in", "in", "out"]))
        w.init()
        a, b = rng_floats(N, 7), rng_floats(N, 8)
        da, db = upload(w, a), upload(w, b)
        outs = [w.malloc(N * 4) for _ in range(4)]
        handles = [w.submit(add, add_args(da, db, c)) for c in outs]
        for h in handles:
            h.wait(timeout=DEADLINE_S)
        for c in outs:
            np.testing.assert_array_equal(w.copy_from(c, [N], F32), a + b)


def test_kernel_failure_raises_run_error_with_code_and_text():
    def orch(o, args):
        o.submit_aiv(SQRT, args)

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("sqrt", orch, kernels(), ["in", "out"]))
        w.init()
        x = np.array([4.0, -2.0, 9.0, 1.0], F32)
        dx, dy = upload(w, x), w.malloc(16)
        args = simpler.TaskArgs((vec(dx, 4), simpler.Tag.Input), (vec(dy, 4), simpler.Tag.OutputExisting))
        run = w.submit(h, args)
        with pytest.raises(simpler.RunError) as e:
            run.wait(timeout=DEADLINE_S)
        assert e.value.code == simpler.StatusCode.KERNEL_FAILED
        assert "x[1] = -2 is negative" in e.value.message and "x[1] = -2 is negative" in str(e.value)
        assert run.result().code == simpler.StatusCode.KERNEL_FAILED
        assert isinstance(e.value, simpler.Error)
        # The worker goes on.
        w.copy_to(dx, np.abs(x))
        w.run(h, args)
        np.testing.assert_allclose(w.copy_from(dy, [4], F32), np.sqrt(np.abs(x)))


def test_orchestration_that_raises_fails_only_its_run():
    calls = []

    def orch(o, args):
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("bad tile count 7")
        o.submit_aiv(ADD, args)

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("raises", orch, kernels(), ["in", "in", "out"]))
        w.init()
        a = rng_floats(N, 9)
        da, db, dc = upload(w, a), upload(w, a), w.malloc(N * 4)
        with pytest.raises(simpler.RunError) as e:
            w.run(h, add_args(da, db, dc))
        assert e.value.code == simpler.StatusCode.USER_CODE_FAILED
        assert "ZeroDivisionError" in e.value.message and "bad tile count 7" in e.value.message
        w.run(h, add_args(da, db, dc))
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + a)


def test_refused_submit_inside_orchestration_names_the_field_and_fails_the_run():
    caught = {}

    def orch(o, args):
        try:
            o.submit_aiv(99, args)
        except simpler.Error as e:
            caught["error"] = e

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("unknown_func", orch, kernels(), []))
        w.init()
        with pytest.raises(simpler.RunError) as e:
            w.run(h)
        assert "99" in str(caught["error"]) and "submit_aiv" in str(caught["error"])
        # A refusal is the run's error even if the orchestration swallows it.
        assert "99" in e.value.message


def test_orchestrator_is_invalid_after_the_call():
    kept = []

    def orch(o, args):
        kept.append(o)

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("keeps", orch, kernels(), []))
        w.init()
        w.run(h)
        with pytest.raises(simpler.Error, match="after its orchestration returned"):
            kept[0].submit_aiv(ADD, [])
        assert kept[0] is not None


def test_orchestration_that_runs_another_workers_run_keeps_its_orchestrator(chip):
    # The inner run's Python orchestration runs on this thread inside the
    # outer's: the outer's `o` must still work after the inner call returns
    # (orchestrator objects are reused from call to call on a thread).
    inner, add = chip
    a, b = rng_floats(N, 11), rng_floats(N, 12)
    ia, ib, ic = upload(inner, a), upload(inner, b), inner.malloc(N * 4)
    seen = {}

    def orch(o, args):
        o.submit_aiv(ADD, args)
        inner.run(add, add_args(ia, ib, ic))
        o.submit_aiv(ADD, args)
        seen["tasks"] = o.task_count

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("nested", orch, kernels(), ["in", "in", "out"]))
        w.init()
        da, db, dc = upload(w, a), upload(w, b), w.malloc(N * 4)
        w.run(h, add_args(da, db, dc))
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + b)
    np.testing.assert_array_equal(inner.copy_from(ic, [N], F32), a + b)
    assert seen == {"tasks": 2}


def test_signature_mismatch_is_a_refused_run(chip):
    w, add = chip
    run = w.submit(add, simpler.TaskArgs(1, 2))
    assert run.done()
    with pytest.raises(simpler.RunError) as e:
        run.wait(timeout=DEADLINE_S)
    assert e.value.code == simpler.StatusCode.INVALID_ARGUMENT


def test_worker_keywords_are_checked_naming_the_field():
    with pytest.raises(TypeError, match="pipeline_depth must be an int"):
        simpler.Worker(level=2, pipeline_depth="2")
    with pytest.raises(ValueError, match="pipeline_depth = -1"):
        simpler.Worker(level=2, pipeline_depth=-1)
    with pytest.raises(TypeError, match="unknown keyword argument 'pipline_depth'"):
        simpler.Worker(level=2, pipline_depth=2)
    with pytest.raises(ValueError, match="level = 5"):
        simpler.Worker(level=5)
    with pytest.raises(ValueError, match="geometry"):
        simpler.Worker(level=2, geometry="huge")
    w = simpler.Worker(level=2, pipeline_depth=0)
    with pytest.raises(simpler.InvalidArgumentError, match="pipeline_depth"):
        w.init()
    w = simpler.Worker(level=2, runtime="no_such_runtime")
    with pytest.raises(simpler.Error, match="no_such_runtime"):
        w.init()


def test_worker_config_keywords_reach_the_worker():
    env = simpler.RuntimeEnv(task_window=64, heap_ring_bytes=1 << 20)
    with simpler.Worker(level=2, geometry="small", runtime="tensormap_and_ringbuffer", pipeline_depth=3,
                        launch_depth=1, device_memory_bytes=64 << 20, max_tasks_per_run=128, run_timeout=30.0,
                        close_timeout=10, guard_device_memory=True, runtime_env=env) as w:
        assert (w.level, w.pipeline_depth) == (2, 3)
        add = w.register(simpler.ChipCallable("vector_add", add_orch, kernels(), ["in", "in", "out"]))
        w.init()
        total, free = w.memory_info()
        assert total == 64 << 20 and 0 < free <= total
        a = rng_floats(N, 10)
        da, dc = upload(w, a), w.malloc(N * 4)
        w.run(add, add_args(da, da, dc))
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + a)


def test_taskargs_items_are_checked_naming_the_index(chip):
    w, _ = chip
    buf = w.malloc(64)
    with pytest.raises(TypeError, match="TaskArgs item 1"):
        simpler.TaskArgs(1, "x")
    with pytest.raises(TypeError, match="TaskArgs item 0: a tensor is given as"):
        simpler.TaskArgs((vec(buf, 4), "in"))
    with pytest.raises(TypeError, match="shared heap"):
        simpler.TaskArgs((np.zeros(4, F32), simpler.Tag.Input))
    with pytest.raises(ValueError, match="more than 32"):
        simpler.TaskArgs(*range(33))
    with pytest.raises(ValueError, match="view"):
        buf.view([1000], F32)
    with pytest.raises(ValueError, match="negative extent"):
        buf.view([-1], F32)


def test_taskargs_scalars_keep_their_width():
    args = simpler.TaskArgs(-3, 2.5, np.float32(1.5), np.uint64(2**64 - 1), True)
    args.add_scalar(7).add_scalar_f32(0.25).add_scalar_u64(5).add_scalar_f64(0.5)
    assert len(args) == 9
    assert args.scalar(8) == np.array([0.5]).view(np.int64)[0]
    assert args.scalar(0) == -3
    assert args.scalar(1) == np.array([2.5]).view(np.int64)[0]
    assert args.scalar(2) == np.array([1.5], np.float32).view(np.uint32)[0]
    assert args.scalar(3) == -1
    assert args.scalar(4) == 1
    assert args.scalar(6) == np.array([0.25], np.float32).view(np.uint32)[0]
    with pytest.raises(ValueError, match="not a tensor"):
        args.tensor(0)


def test_tile_and_view_shape(chip):
    w, _ = chip
    buf = w.malloc(16 * 16 * 4)
    v = buf.view([16, 16], F32)
    t = v.tile([4, 8], [4, 4])
    assert t.shape == (4, 4) and t.strides == (16, 1) and t.offset == 4 * 16 + 8 and t.numel == 16
    with pytest.raises(ValueError, match="tile"):
        v.tile([15, 0], [4, 4])


def test_kernel_library_errors():
    lib = simpler.KernelLibrary()
    with pytest.raises(simpler.Error, match="/no/such/kernel.so"):
        lib.add_file(0, simpler.CoreType.AIV, "/no/such/kernel.so")
    with pytest.raises(simpler.NotFoundError, match="no_such_kernel"):
        simpler.example_kernel("no_such_kernel")
    lib.add_noop(3, simpler.CoreType.AIC)
    assert lib.func_ids() == [3]


def test_worker_used_after_close():
    w = simpler.Worker(level=2)
    add = w.register(simpler.ChipCallable("vector_add", add_orch, kernels(), ["in", "in", "out"]))
    w.init()
    buf = w.malloc(64)
    w.close()
    w.close()  # idempotent
    for call in (lambda: w.malloc(64), lambda: w.copy_to(buf, np.zeros(4, F32)), lambda: w.init()):
        with pytest.raises(simpler.Error) as e:
            call()
        assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION
    run = w.submit(add, [])
    with pytest.raises(simpler.RunError) as e:
        run.wait(timeout=DEADLINE_S)
    assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION


def test_register_after_init_is_refused(chip):
    w, _ = chip
    with pytest.raises(simpler.Error) as e:
        w.register(simpler.ChipCallable("late", add_orch, kernels(), []))
    assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION
    with pytest.raises(TypeError, match="register: expected"):
        w.register(42)


def held_tmr_worker(release, pipeline_depth=2):
    """A tensormap_and_ringbuffer worker whose orchestration (on a device thread) waits for `release`."""
    def orch(o, args):
        if not release.wait(timeout=DEADLINE_S):
            raise RuntimeError("the test never released the orchestration")
        o.submit_aiv(ADD, args)

    w = simpler.Worker(level=2, runtime="tensormap_and_ringbuffer", pipeline_depth=pipeline_depth)
    h = w.register(simpler.ChipCallable("held", orch, kernels(), ["in", "in", "out"]))
    w.init()
    return w, h


def test_wait_timeout_raises_timeout_error_and_the_run_goes_on():
    # The orchestration runs on a device thread and needs the GIL: wait() must
    # release it, or this test would deadlock instead of timing out.
    release = threading.Event()
    w, h = held_tmr_worker(release)
    with w:
        a = rng_floats(N, 11)
        da, dc = upload(w, a), w.malloc(N * 4)
        run = w.submit(h, add_args(da, da, dc))
        with pytest.raises(TimeoutError, match="goes on"):
            run.wait(timeout=0.05)
        assert not run.done()
        assert run.result().code == simpler.StatusCode.FAILED_PRECONDITION
        release.set()
        run.wait(timeout=DEADLINE_S)
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + a)


@pytest.fixture
def python_sigint():
    """Python's Ctrl-C handler for one test. Python installs it only where
    SIGINT was not ignored at startup (a job a shell without job control
    starts in the background inherits SIG_IGN), and without it
    _thread.interrupt_main() does nothing."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_during_wait_reaches_python_and_the_run_goes_on(python_sigint):
    import _thread
    import sys

    release = threading.Event()
    w, h = held_tmr_worker(release)
    main = threading.get_ident()
    in_wait = threading.Event()

    def interrupter():
        # Interrupt only once the main thread is inside RunHandle.wait (its
        # frame stands on the wait line while the C++ call has the GIL released).
        deadline = threading.Event()
        for _ in range(int(DEADLINE_S * 1000)):
            frame = sys._current_frames().get(main)
            if frame is not None and frame.f_code.co_name == "waiting" and frame.f_lineno == wait_line:
                in_wait.set()
                _thread.interrupt_main()
                return
            deadline.wait(0.001)

    def waiting(run):
        run.wait(timeout=DEADLINE_S)  # wait_line

    wait_line = waiting.__code__.co_firstlineno + 1
    with w:
        a = rng_floats(N, 12)
        da, dc = upload(w, a), w.malloc(N * 4)
        run = w.submit(h, add_args(da, da, dc))
        t = threading.Thread(target=interrupter)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            waiting(run)
        t.join(DEADLINE_S)
        assert in_wait.is_set()
        assert not run.done()
        release.set()
        run.wait(timeout=DEADLINE_S)
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), a + a)


def test_spmd_mix_and_manual_scope_from_python():
    lib = kernels()
    lib.add_noop(7, simpler.CoreType.AIC)
    lib.add_noop(8, simpler.CoreType.AIV)
    kept = {}

    def orch(o, args):
        a, c = args.tensor(0), args.tensor(1)
        o.submit_aiv_spmd(8, [], 4)
        o.submit_aic_spmd(7, None, 2)
        o.submit_mix(7, 8, 8, [])
        o.submit_aic(7)
        with o.scope(manual=True):
            t = o.alloc([N], F32)
            first = o.submit_aiv(ADD, [(a, simpler.Tag.Input), (a, simpler.Tag.Input), (t, simpler.Tag.OutputExisting)])
            o.set_dependencies([first.id])
            o.submit_aiv(ADD, [(t, simpler.Tag.Input), (a, simpler.Tag.Input), (c, simpler.Tag.OutputExisting)])
        kept["scope"] = o.scope()

    with simpler.Worker(level=2) as w:
        h = w.register(simpler.ChipCallable("mixed", orch, lib, ["in", "out"]))
        w.init()
        a = rng_floats(N, 13)
        da, dc = upload(w, a), w.malloc(N * 4)
        run = w.run(h, [(vec(da), simpler.Tag.Input), (vec(dc), simpler.Tag.OutputExisting)])
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), (a + a) + a)
        assert run.stats.tasks == 6
        # 4 + 2 SPMD blocks, the mix task's 3 subtasks, the AIC task and the 2 adds.
        assert run.stats.executed == 12
        with pytest.raises(simpler.Error, match="after its orchestration returned"):
            with kept["scope"]:
                pass


def test_module_facts():
    assert simpler.version() and isinstance(simpler.version(), str)
    assert "sim" in [name for name, _ in simpler.available_backends()]
    names = [g.name for g in simpler.Geometry.presets()]
    assert names[:1] == ["small"] and "a2a3" in names
    g = simpler.Geometry.by_name("a2a3")
    assert (g.clusters, g.aicpu_threads) == (24, 4)
    with pytest.raises(simpler.Error, match="nope"):
        simpler.Geometry.by_name("nope")
    with simpler.Worker(level=2, geometry=simpler.Geometry("tiny", 1, 1)) as w:
        w.register(simpler.ChipCallable("vector_add", add_orch, kernels(), ["in", "in", "out"]))
        w.init()
        with pytest.raises(simpler.Error) as e:
            w.memory_info_on(0)
        assert e.value.code == simpler.StatusCode.FAILED_PRECONDITION


def release_when_main_reaches(release, main, code_name, line):
    """A thread that sets `release` once the main thread's frame `code_name` stands on `line`
    (inside a blocking C++ call), polling with a deadline."""
    import sys

    def watch():
        tick = threading.Event()
        for _ in range(int(DEADLINE_S * 1000)):
            frame = sys._current_frames().get(main)
            if frame is not None and frame.f_code.co_name == code_name and frame.f_lineno == line:
                release.set()
                return
            tick.wait(0.001)

    t = threading.Thread(target=watch)
    t.start()
    return t


def test_submit_and_close_release_the_gil_while_they_block():
    # pipeline_depth=1: the second submit blocks until the first run, whose orchestration
    # (on a device thread) needs the GIL, finishes; close() drains a run the same way.
    release = threading.Event()
    w, h = held_tmr_worker(release, pipeline_depth=1)
    a = rng_floats(N, 14)
    da, dc = upload(w, a), w.malloc(N * 4)
    main = threading.get_ident()

    def second_submit():
        return w.submit(h, add_args(da, da, dc))  # blocks

    first = w.submit(h, add_args(da, da, dc))
    t = release_when_main_reaches(release, main, "second_submit", second_submit.__code__.co_firstlineno + 1)
    second = second_submit()
    t.join(DEADLINE_S)
    first.wait(timeout=DEADLINE_S)
    second.wait(timeout=DEADLINE_S)

    release.clear()
    third = w.submit(h, add_args(da, da, dc))

    def closing():
        w.close()  # drains the held run

    t = release_when_main_reaches(release, main, "closing", closing.__code__.co_firstlineno + 1)
    closing()
    t.join(DEADLINE_S)
    assert third.done() and third.result().ok


def test_run_stats_count_the_chain_links_posted_behind_their_predecessor():
    # A chain a -> i0 -> ... -> c: each add waits on the one before alone, so
    # each after the first is posted behind it on its core (RunStats.chained).
    # Guards off: a task whose guard check may still fail it gets no link.
    steps = 8

    def orch(o, args):
        a, c = args.tensor(0), args.tensor(1)
        prev = a
        for i in range(steps):
            out = c if i == steps - 1 else o.alloc([N], F32)
            o.submit_aiv(ADD, [(prev, simpler.Tag.Input), (a, simpler.Tag.Input), (out, simpler.Tag.OutputExisting)])
            prev = out

    with simpler.Worker(level=2, guard_device_memory=False) as w:
        h = w.register(simpler.ChipCallable("chain", orch, kernels(), ["in", "out"]))
        w.init()
        a = rng_floats(N, 21)
        da, dc = upload(w, a), w.malloc(N * 4)
        run = w.run(h, [(vec(da), simpler.Tag.Input), (vec(dc), simpler.Tag.OutputExisting)])
        expected = a.copy()
        for _ in range(steps):
            expected = expected + a
        np.testing.assert_array_equal(w.copy_from(dc, [N], F32), expected)
        assert run.stats.tasks == steps
        assert 0 < run.stats.chained < steps
        assert run.stats.taken_back == 0
