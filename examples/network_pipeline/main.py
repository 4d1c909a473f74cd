"""network_pipeline from Python: a Level 4 worker with two nodes (each a Level 3 worker
with one chip child and one sub worker, forked at init and initialised in its own
process) and a sub worker of its own. Each run hands every node one NodeCallable run,
whose Python orchestration (in the node's process) has the chip compute y = a_k + b_k
into the node's heap and the node's sub worker square it into z_k in the network's
heap; the network's sub worker then sums z0 + z1."""

import numpy as np

import simpler

ADD = 0
N = 1 << 12
NODES = 2
IN, OUT = simpler.Tag.Input, simpler.Tag.OutputExisting


def chip_orchestrate(o, args):
    o.submit_aiv(ADD, args)


def square(args):
    """A node's sub function, in that node's sub worker process: z = y * y."""
    y, z = args
    np.multiply(y, y, out=z)


def sum_nodes(args):
    """The network's sub function: out = z0 + z1."""
    z0, z1, out = args
    np.add(z0, z1, out=out)


def run(runs=3, runtime="host_build_graph"):
    lib = simpler.KernelLibrary()
    lib.add_file(ADD, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))
    net = simpler.Worker(level=4, sub_workers=1, shared_heap_bytes=16 << 20)
    handles = {}
    for k in range(NODES):
        node = simpler.Worker(level=3, chips=1, sub_workers=1, runtime=runtime, device_memory_bytes=64 << 20,
                              max_tasks_per_run=16, shared_heap_bytes=8 << 20)
        handles["add"] = node.register(simpler.ChipCallable("network_pipeline_add", chip_orchestrate, lib,
                                                            ["in", "in", "out"]))
        handles["square"] = node.register(square)
        net.add_next_level_worker(node)

    def node_orchestrate(o, args):
        # In the node's process: args are (a, b, z) in the network's heap.
        with o.scope():
            y = o.alloc([N], np.float32)
            o.submit_next_level(handles["add"], [(args.tensor(0), IN), (args.tensor(1), IN), (y, OUT)], 0)
            o.submit_sub(handles["square"], [(y, IN), (args.tensor(2), OUT)])

    with net:
        per_node = net.register(simpler.NodeCallable("network_pipeline_node", node_orchestrate))
        total = net.register(sum_nodes)
        net.init()
        rng = np.random.default_rng(200)
        a = [net.shared_array([N], np.float32) for _ in range(NODES)]
        b = [net.shared_array([N], np.float32) for _ in range(NODES)]
        z = [net.shared_array([N], np.float32) for _ in range(NODES)]
        out = net.shared_array([N], np.float32)
        for r in range(runs):
            for k in range(NODES):
                a[k][:] = rng.uniform(-1, 1, N).astype(np.float32)
                b[k][:] = rng.uniform(-1, 1, N).astype(np.float32)
            want = np.square(a[0] + b[0]) + np.square(a[1] + b[1])
            out[:] = -12345.0

            def orchestrate(o):
                for k in range(NODES):
                    o.submit_next_level(per_node, [(a[k], IN), (b[k], IN), (z[k], OUT)], k)
                o.submit_sub(total, [(z[0], IN), (z[1], IN), (out, OUT)])

            net.submit(orchestrate).wait(timeout=60)
            if not np.array_equal(out, want):
                i = int(np.flatnonzero(out != want)[0])
                raise AssertionError(f"network_pipeline run {r}: out[{i}] = {out[i]}, want {want[i]}")
    return (f"network_pipeline: {runs} runs over {NODES} nodes (chip + Python sub function each) and the network's "
            f"sub worker, out = (a0 + b0)^2 + (a1 + b1)^2 over {N} f32; every run exact")


if __name__ == "__main__":
    print(run())
