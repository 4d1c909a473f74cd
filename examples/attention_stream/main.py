"""attention_stream from Python: one run of an attention-style loop longer than the task
window, on the streaming runtime (tensormap_and_ringbuffer), built by a Python
orchestration that runs on the device's orchestrator thread while the tasks execute.
Per step j and head h: s = q_h·k_jᵀ, m = its row max, p = an integer softmax numerator
of s - m, o_h = 3·o_h + p·v_j (u32, wrapping). A step's three intermediates live in the
step's scope, so they stream through a heap ring. Checked exactly against numpy."""

import numpy as np

import simpler

SCORE, ROWMAX, WEIGHT, ACCUMULATE = 0, 1, 2, 3
HEADS, TILE, DIM, KV_TILES = 4, 8, 8, 61
TASKS_PER_STEP = 4 * HEADS
WINDOW = 4096
HEAP_RING_BYTES = 512 << 10
IN, OUT, INOUT = simpler.Tag.Input, simpler.Tag.OutputExisting, simpler.Tag.InOut
U32 = np.uint32


def orchestrate(o, args):
    q, k, v, out = (args.tensor(i) for i in range(4))
    steps = args.scalar(4)
    q_tiles = [q.tile([h * TILE, 0], [TILE, DIM]) for h in range(HEADS)]
    out_tiles = [out.tile([h * TILE, 0], [TILE, DIM]) for h in range(HEADS)]
    k_tiles = [k.tile([t * TILE, 0], [TILE, DIM]) for t in range(KV_TILES)]
    v_tiles = [v.tile([t * TILE, 0], [TILE, DIM]) for t in range(KV_TILES)]
    for step in range(steps):
        with o.scope():
            k_tile, v_tile = k_tiles[step % KV_TILES], v_tiles[step % KV_TILES]
            first = step == 0
            for h in range(HEADS):
                s = o.alloc([TILE, TILE], U32)
                m = o.alloc([TILE, 1], U32)
                p = o.alloc([TILE, TILE], U32)
                o.submit_aic(SCORE, [(q_tiles[h], IN), (k_tile, IN), (s, OUT)])
                o.submit_aiv(ROWMAX, [(s, IN), (m, OUT)])
                o.submit_aiv(WEIGHT, [(s, IN), (m, IN), (p, OUT)])
                o.submit_aic(ACCUMULATE, [(p, IN), (v_tile, IN), (out_tiles[h], OUT if first else INOUT),
                                          1 if first else 0])


def reference(q, k, v, steps):
    out = np.zeros((HEADS * TILE, DIM), U32)
    for h in range(HEADS):
        qh = q[h * TILE:(h + 1) * TILE]
        pv = []
        for t in range(KV_TILES):
            s = qh @ k[t * TILE:(t + 1) * TILE].T
            shift = np.minimum(7, (s.max(axis=1, keepdims=True) - s) // 128)
            p = (U32(128) >> shift).astype(U32)
            pv.append(p @ v[t * TILE:(t + 1) * TILE])
        o = out[h * TILE:(h + 1) * TILE]
        for step in range(steps):
            o[:] = U32(3) * o + pv[step % KV_TILES]
    return out


def run(runs=1, runtime="tensormap_and_ringbuffer", tasks=4800):
    if runtime != "tensormap_and_ringbuffer":
        # The run is larger than a graph built before launch may be: only a streaming runtime holds it.
        return f"attention_stream: skipped on {runtime} (needs the streaming runtime tensormap_and_ringbuffer)"
    if tasks % TASKS_PER_STEP or tasks <= WINDOW:
        raise ValueError(f"attention_stream: tasks = {tasks} must be a multiple of {TASKS_PER_STEP} above {WINDOW}")
    steps = tasks // TASKS_PER_STEP
    lib = simpler.KernelLibrary()
    lib.add_file(SCORE, simpler.CoreType.AIC, simpler.example_kernel("attention_stream_score"))
    lib.add_file(ROWMAX, simpler.CoreType.AIV, simpler.example_kernel("attention_stream_rowmax"))
    lib.add_file(WEIGHT, simpler.CoreType.AIV, simpler.example_kernel("attention_stream_weight"))
    lib.add_file(ACCUMULATE, simpler.CoreType.AIC, simpler.example_kernel("attention_stream_accumulate"))
    rng = np.random.default_rng(21)
    q = rng.integers(0, 16, (HEADS * TILE, DIM), dtype=U32)
    k = rng.integers(0, 16, (KV_TILES * TILE, DIM), dtype=U32)
    v = rng.integers(0, 16, (KV_TILES * TILE, DIM), dtype=U32)
    want = reference(q, k, v, steps)
    env = simpler.RuntimeEnv(task_window=WINDOW, heap_ring_bytes=HEAP_RING_BYTES)
    with simpler.Worker(level=2, runtime=runtime, max_tasks_per_run=WINDOW, runtime_env=env) as w:
        h = w.register(simpler.ChipCallable("attention_stream", orchestrate, lib, ["in", "in", "in", "out", "scalar"]))
        w.init()
        views = []
        for x in (q, k, v):
            buf = w.malloc(x.nbytes)
            w.copy_to(buf, x)
            views.append(buf.view(list(x.shape), U32))
        dout = w.malloc(want.nbytes)
        for r in range(runs):
            w.copy_to(dout, np.full(want.shape, 0xDEADBEEF, U32))
            done = w.run(h, [(views[0], IN), (views[1], IN), (views[2], IN), (dout.view(list(want.shape), U32), OUT),
                             steps])
            assert done.stats.tasks == tasks, done.stats.tasks
            got = w.copy_from(dout, list(want.shape), U32)
            if not np.array_equal(got, want):
                i, j = (int(x[0]) for x in np.nonzero(got != want))
                raise AssertionError(f"attention_stream run {r}: out[{i}, {j}] = {got[i, j]}, want {want[i, j]}")
    return (f"attention_stream: {runs} run(s) of {tasks} tasks through a {WINDOW}-task window and a "
            f"{HEAP_RING_BYTES >> 10} KiB heap ring, u32 out exact")


if __name__ == "__main__":
    print(run())
