"""kernel_failure from Python: runs alternate between an input the kernel refuses and a
good one, on one Worker. A bad run raises simpler.RunError with the kernel's own message
and leaves its dependent unrun; every good run is correct (numpy golden)."""

import numpy as np

import simpler

SQRT, SCALE = 0, 1
N = 4096
BAD_INDEX = 1234
FACTOR = np.float32(2.0)
POISON = -12345.0


def orchestrate(o, args):
    x, z = args.tensor(0), args.tensor(1)
    sqrt_task = o.submit_aiv(SQRT, [(x, simpler.Tag.Input), simpler.Output(x.shape, np.float32)])
    # The runtime-allocated output of the first task is the input of the second: that is the edge.
    o.submit_aiv(SCALE, [(sqrt_task.outputs[0], simpler.Tag.Input), (z, simpler.Tag.OutputExisting),
                         np.float32(FACTOR)])


def run(runs=6, runtime="host_build_graph"):
    lib = simpler.KernelLibrary()
    lib.add_file(SQRT, simpler.CoreType.AIV, simpler.example_kernel("kernel_failure_checked_sqrt"))
    lib.add_file(SCALE, simpler.CoreType.AIV, simpler.example_kernel("kernel_failure_scale"))
    good = np.random.default_rng(21).uniform(0, 4, N).astype(np.float32)
    bad = good.copy()
    bad[BAD_INDEX] = -1
    want = FACTOR * np.sqrt(good)
    with simpler.Worker(level=2, runtime=runtime) as w:
        h = w.register(simpler.ChipCallable("kernel_failure", orchestrate, lib, ["in", "out", "scalar"]))
        w.init()
        x, z = w.malloc(N * 4), w.malloc(N * 4)
        failed = 0
        for r in range(runs):
            is_bad = r % 2 == 0
            w.copy_to(x, bad if is_bad else good)
            w.copy_to(z, np.full(N, POISON, np.float32))
            args = [(x.view([N], np.float32), simpler.Tag.Input), (z.view([N], np.float32), simpler.Tag.OutputExisting),
                    FACTOR]
            got_error = None
            try:
                w.run(h, args)
            except simpler.RunError as e:
                got_error = e
            zs = w.copy_from(z, [N], np.float32)
            if is_bad:
                assert got_error is not None, f"run {r}: the bad input did not fail"
                assert got_error.code == simpler.StatusCode.KERNEL_FAILED, got_error
                assert f"x[{BAD_INDEX}] = -1 is negative" in got_error.message, got_error.message
                assert np.all(zs == POISON), f"run {r}: the dependent of the failed task ran"
                failed += 1
            else:
                assert got_error is None, f"run {r}: {got_error}"
                np.testing.assert_allclose(zs, want, rtol=1e-6, err_msg=f"kernel_failure run {r}")
    return (f"kernel_failure: {runs} runs, {failed} failed with the kernel's message and left their dependent unrun, "
            f"the others z = 2 sqrt(x) over {N} f32")


if __name__ == "__main__":
    print(run())
