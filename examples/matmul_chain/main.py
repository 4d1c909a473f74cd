"""matmul_chain from Python: C = relu(A·B + bias) as a tiled graph built by a Python
orchestration. Per output tile, AIC matmul tasks accumulate over K into a run-owned
intermediate (InOut), then AIV tasks add the bias in place and write the ReLU into C.
Checked against numpy's f32 matmul."""

import numpy as np

import simpler

MATMUL, BIAS_ADD, RELU = 0, 1, 2
M, N, K, TILE = 256, 256, 128, 32
IN, OUT, INOUT = simpler.Tag.Input, simpler.Tag.OutputExisting, simpler.Tag.InOut


def orchestrate(o, args):
    a, b, bias, c = (args.tensor(i) for i in range(4))
    t = args.scalar(4)
    m, k = a.shape
    n = b.shape[1]
    if t <= 0 or m % t or n % t or k % t:
        raise ValueError(f"matmul_chain: tile {t} must divide M={m}, N={n} and K={k}")
    # The intermediate lives in a scope so its memory goes back once the last ReLU read it.
    with o.scope():
        acc = o.alloc([m, n], np.float32)
        for i in range(0, m, t):
            for j in range(0, n, t):
                acc_tile = acc.tile([i, j], [t, t])
                for kk in range(0, k, t):
                    first = kk == 0
                    o.submit_aic(MATMUL, [(a.tile([i, kk], [t, t]), IN), (b.tile([kk, j], [t, t]), IN),
                                          (acc_tile, OUT if first else INOUT), 0 if first else 1])
                o.submit_aiv(BIAS_ADD, [(acc_tile, INOUT), (bias.tile([0, j], [1, t]), IN)])
                o.submit_aiv(RELU, [(acc_tile, IN), (c.tile([i, j], [t, t]), OUT)])


def run(runs=2, runtime="host_build_graph"):
    lib = simpler.KernelLibrary()
    lib.add_file(MATMUL, simpler.CoreType.AIC, simpler.example_kernel("matmul_chain_matmul"))
    lib.add_file(BIAS_ADD, simpler.CoreType.AIV, simpler.example_kernel("matmul_chain_bias_add"))
    lib.add_file(RELU, simpler.CoreType.AIV, simpler.example_kernel("matmul_chain_relu"))
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    bias = rng.uniform(-1, 1, (1, N)).astype(np.float32)
    want = np.maximum(a @ b + bias, 0)
    sig = [simpler.Param.input().with_dtype(np.float32).with_rank(2)] * 3 + [simpler.Param.output(), "scalar"]
    tasks = 0
    with simpler.Worker(level=2, runtime=runtime) as w:
        h = w.register(simpler.ChipCallable("matmul_chain", orchestrate, lib, sig))
        w.init()
        bufs = []
        for x in (a, b, bias):
            buf = w.malloc(x.nbytes)
            w.copy_to(buf, x)
            bufs.append(buf.view(list(x.shape), np.float32))
        c = w.malloc(M * N * 4)
        for r in range(runs):
            w.copy_to(c, np.full((M, N), -12345.0, np.float32))
            done = w.run(h, [(bufs[0], IN), (bufs[1], IN), (bufs[2], IN), (c.view([M, N], np.float32), OUT), TILE])
            tasks += done.stats.tasks
            got = w.copy_from(c, [M, N], np.float32)
            # Tiles accumulate over K in another order than numpy: f32 rounding differs.
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"matmul_chain run {r}")
    return f"matmul_chain: {runs} runs of {tasks // runs} tasks, C = relu(A·B + bias) [{M}x{K}]·[{K}x{N}] within 1e-4"


if __name__ == "__main__":
    print(run())
