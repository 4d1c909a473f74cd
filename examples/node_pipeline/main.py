"""node_pipeline from Python: a Level 3 worker with two chip children and one sub worker,
all forked at init. Each run adds a fresh input to a vector resident on each chip
(y_k = a_k + b_k, vector_add, one task per chip) and a Python sub function, in the sub
worker's process, sums both into z over numpy views of the shared heap (no copy),
waiting on both chip tasks through the tags of y0 and y1."""

import numpy as np

import simpler

ADD = 0
N = 1 << 14
CHIPS = 2
IN, OUT = simpler.Tag.Input, simpler.Tag.OutputExisting


def chip_orchestrate(o, args):
    o.submit_aiv(ADD, args)


def sum_outputs(args):
    """Runs in the sub worker process: z = y0 + y1, in place in the shared heap."""
    y0, y1, z = args
    np.add(y0, y1, out=z)


def run(runs=4, runtime="host_build_graph"):
    lib = simpler.KernelLibrary()
    lib.add_file(ADD, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))
    rng = np.random.default_rng(100)
    b = [rng.uniform(-1, 1, N).astype(np.float32) for _ in range(CHIPS)]
    with simpler.Worker(level=3, chips=CHIPS, sub_workers=1, runtime=runtime, device_memory_bytes=64 << 20,
                        max_tasks_per_run=16, shared_heap_bytes=16 << 20) as w:
        add = w.register(simpler.ChipCallable("node_pipeline_add", chip_orchestrate, lib, ["in", "in", "out"]))
        total = w.register(sum_outputs)  # before init: the sub worker gets it through the fork
        w.init()
        db = []
        for k in range(CHIPS):  # b_k stays resident on chip k
            db.append(w.malloc_on(k, N * 4).view([N], np.float32))
            w.copy_to(db[k].buffer, b[k])
        a = [w.shared_array([N], np.float32) for _ in range(CHIPS)]
        z = w.shared_array([N], np.float32)
        for r in range(runs):
            for k in range(CHIPS):
                a[k][:] = rng.uniform(-1, 1, N).astype(np.float32)
            want = (a[0] + b[0]) + (a[1] + b[1])
            z[:] = -12345.0

            def orchestrate(o):
                with o.scope():  # y0 and y1 go back to the heap once the sub task read them
                    y = [o.alloc([N], np.float32) for _ in range(CHIPS)]
                    for k in range(CHIPS):
                        o.submit_next_level(add, [(a[k], IN), (db[k], IN), (y[k], OUT)], k)
                    o.submit_sub(total, [(y[0], IN), (y[1], IN), (z, OUT)])

            w.submit(orchestrate).wait(timeout=60)
            if not np.array_equal(z, want):
                i = int(np.flatnonzero(z != want)[0])
                raise AssertionError(f"node_pipeline run {r}: z[{i}] = {z[i]}, want {want[i]}")
    return (f"node_pipeline: {runs} runs, z = (a0 + b0 on chip 0) + (a1 + b1 on chip 1) summed by a Python sub "
            f"function over {N} f32; every run exact")


if __name__ == "__main__":
    print(run())
