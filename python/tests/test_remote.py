"""Remote nodes over MPI from Python: the bindings' argument checks. The example
(examples/network_mpi/main.py, under `mpirun -np 3`) is run by test_examples."""

import pytest

import simpler


def test_outside_mpirun_this_is_rank_0_of_1():
    assert (simpler.mpi_rank(), simpler.mpi_size()) == (0, 1)


def test_add_remote_worker_checks_its_arguments_naming_them():
    net = simpler.Worker(level=4)
    with pytest.raises(TypeError, match="add_remote_worker: heartbeat_timeout"):
        net.add_remote_worker(1, heartbeat_timeout="5 s")
    with pytest.raises(ValueError, match="add_remote_worker: ready_timeout"):
        net.add_remote_worker(1, ready_timeout=-1)
    with pytest.raises(simpler.InvalidArgumentError, match="rank = 0"):
        net.add_remote_worker(0)
    # Accepted before init: the first remote node is next-level worker 0.
    assert net.add_remote_worker(1, heartbeat_timeout=2.5, ready_timeout=10) == 0


def test_serve_node_refuses_what_it_cannot_serve():
    with pytest.raises(simpler.InvalidArgumentError, match="not a Level::Node worker"):
        simpler.serve_node(simpler.Worker(level=2), [])
    with pytest.raises(ValueError, match="serve_node: tensor_heap_bytes"):
        simpler.serve_node(simpler.Worker(level=3), [], tensor_heap_bytes=-1)
    with pytest.raises(TypeError, match="serve_node: network_timeout"):
        simpler.serve_node(simpler.Worker(level=3), [], network_timeout="never")
    # Rank 0 is the network's: a node is served on the other ranks only.
    with pytest.raises(simpler.Error, match="MPI rank 0"):
        simpler.serve_node(simpler.Worker(level=3), [])
