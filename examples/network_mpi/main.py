"""network_mpi from Python: the network level across MPI ranks. Under
`mpirun -np N python3 main.py`, rank 0 runs a Level 4 worker with one forked local
node and one remote node per other rank, and every other rank serves its node
(simpler.serve_node). Each run hands every node one NodeCallable run, c_k = a_k + b_k
on the node's chip: a remote node's inputs travel with its request and c_k comes back
with its terminal; the local node reads the shared heap in place. Outside mpirun,
run() starts this file under `mpirun -np 3` and returns rank 0's report."""

import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

import simpler

ADD = 0
N = 1 << 14
RANKS = 3
POISON = -12345.0
IN, OUT = simpler.Tag.Input, simpler.Tag.OutputExisting


def chip_orchestrate(o, args):
    o.submit_aiv(ADD, args)


def make_node(runtime):
    """A node as every rank builds it: one chip with the add callable, registered first,
    so its handle is the same on every node."""
    lib = simpler.KernelLibrary()
    lib.add_file(ADD, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))
    node = simpler.Worker(level=3, chips=1, runtime=runtime, device_memory_bytes=64 << 20, max_tasks_per_run=16,
                          shared_heap_bytes=4 << 20)
    add = node.register(simpler.ChipCallable("network_mpi_add", chip_orchestrate, lib, ["in", "in", "out"]))
    return node, add


def step_callable(add):
    """The one NodeCallable, registered by the same name on the network and on every server."""

    def step(o, args):
        o.submit_next_level(add, [(args.tensor(0), IN), (args.tensor(1), IN), (args.tensor(2), OUT)], 0)

    return simpler.NodeCallable("network_mpi_step", step)


def run_on_ranks(runs, runtime):
    """This process's part of the MPI job: rank 0's report, or None on a serving rank."""
    rank, ranks = simpler.mpi_rank(), simpler.mpi_size()
    if rank != 0:
        node, add = make_node(runtime)
        simpler.serve_node(node, [step_callable(add)], tensor_heap_bytes=64 << 20)
        return None
    nodes = ranks  # the local node and one per other rank
    net = simpler.Worker(level=4, shared_heap_bytes=(4 << 20) + 3 * N * 4 * nodes)
    local, add = make_node(runtime)
    net.add_next_level_worker(local)
    for r in range(1, ranks):
        net.add_remote_worker(r)
    with net:
        step = net.register(step_callable(add))
        net.init()
        a = [net.shared_array([N], np.float32) for _ in range(nodes)]
        b = [net.shared_array([N], np.float32) for _ in range(nodes)]
        c = [net.shared_array([N], np.float32) for _ in range(nodes)]
        rng = np.random.default_rng(5000)
        for r in range(runs):
            for k in range(nodes):
                a[k][:] = rng.uniform(-1, 1, N).astype(np.float32)
                b[k][:] = rng.uniform(-1, 1, N).astype(np.float32)
                c[k][:] = POISON  # a run that returns nothing cannot pass

            def orchestrate(o):
                for k in range(nodes):
                    o.submit_next_level(step, [(a[k], IN), (b[k], IN), (c[k], OUT)], k)

            net.submit(orchestrate).wait(timeout=60)
            for k in range(nodes):
                want = a[k] + b[k]
                if not np.array_equal(c[k], want):
                    i = int(np.flatnonzero(c[k] != want)[0])
                    raise AssertionError(f"network_mpi run {r}, node {k}: c[{i}] = {c[k][i]}, want {want[i]}")
    return (f"network_mpi: {runs} runs, c = a + b over {N} f32 on 1 local node + {ranks - 1} remote node(s) on MPI "
            f"ranks 1..{ranks - 1}; every run exact")


def run(runs=3, runtime="host_build_graph"):
    if simpler.mpi_size() >= 2:
        return run_on_ranks(runs, runtime)
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("network_mpi runs under mpirun, which is not on PATH (Debian's openmpi-bin)")
    cmd = [mpirun, "--oversubscribe", "-np", str(RANKS)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    cmd += [sys.executable, os.path.abspath(__file__), "--runs", str(runs), "--runtime", runtime]
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(simpler.__file__)))
    path = os.environ.get("PYTHONPATH")
    # Shared memory between the ranks of this one host, as the C++ MPI tests run.
    env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""),
               OMPI_MCA_btl=os.environ.get("OMPI_MCA_btl", "self,vader"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"network_mpi under mpirun exited with {done.returncode}:\n{done.stdout}{done.stderr}")
    reports = [line for line in done.stdout.splitlines() if line.startswith("network_mpi: ")]
    if len(reports) != 1:
        raise RuntimeError(f"network_mpi under mpirun printed no report from rank 0:\n{done.stdout}{done.stderr}")
    return reports[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtime", default="host_build_graph")
    options = parser.parse_args()
    report = run(options.runs, options.runtime)
    if report is not None:
        print(report, flush=True)
