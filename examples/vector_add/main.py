"""vector_add from Python: one AIV task per run, c = a + b, checked exactly against numpy.

Run it with `python3 examples/vector_add/main.py` (the module importable, e.g.
PYTHONPATH=build/default/python) or through `python3 -m simpler.demo`.
"""

import numpy as np

import simpler

ADD = 0
N = 1 << 16
POISON = -12345.0


def orchestrate(o, args):
    # The run's arguments (a, b as inputs, c as the existing output) are exactly the task's.
    o.submit_aiv(ADD, args)


def run(runs=8, runtime="host_build_graph"):
    lib = simpler.KernelLibrary()
    lib.add_file(ADD, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, N).astype(np.float32)
    b = rng.uniform(-1, 1, N).astype(np.float32)
    want = a + b
    with simpler.Worker(level=2, runtime=runtime, pipeline_depth=2) as w:
        add = w.register(simpler.ChipCallable("vector_add", orchestrate, lib, ["in", "in", "out"]))
        w.init()
        da, db = w.malloc(a.nbytes), w.malloc(b.nbytes)
        w.copy_to(da, a)
        w.copy_to(db, b)
        slots = [w.malloc(a.nbytes) for _ in range(2)]  # two runs in flight, each with its own c

        def check(r, c, handle):
            handle.wait(timeout=60)
            got = w.copy_from(c, [N], np.float32)
            if not np.array_equal(got, want):
                i = int(np.flatnonzero(got != want)[0])
                raise AssertionError(f"vector_add run {r}: c[{i}] = {got[i]}, want {want[i]}")

        in_flight = []
        for r in range(runs):
            if len(in_flight) == len(slots):
                check(*in_flight.pop(0))
            c = slots[r % len(slots)]
            w.copy_to(c, np.full(N, POISON, np.float32))  # a run that writes nothing cannot pass
            args = simpler.TaskArgs((da.view([N], np.float32), simpler.Tag.Input),
                                    (db.view([N], np.float32), simpler.Tag.Input),
                                    (c.view([N], np.float32), simpler.Tag.OutputExisting))
            in_flight.append((r, c, w.submit(add, args)))
        for pending in in_flight:
            check(*pending)
    return f"vector_add: {runs} runs, c = a + b over {N} f32, every run exact"


if __name__ == "__main__":
    print(run())
