"""Shared fixtures of the Python suite: the examples' kernels and small chip workers.

Every blocking call in these tests has a deadline (RunHandle.wait(timeout=...),
threading.Event.wait(timeout=...)), so a broken runtime fails a test instead of
hanging the suite.
"""

import faulthandler
import sys

import numpy as np
import pytest

import simpler

# Every wait in the suite is bounded by this many seconds.
DEADLINE_S = 30.0

ADD = 0  # func_id of vector_add's kernel (c = a + b, 1-D f32)
SQRT = 1  # func_id of kernel_failure's checked_sqrt (y = sqrt(x); fails on x < 0)


# A test that deadlocks with the GIL held (say a blocking call that forgot to
# release it) cannot run any Python deadline: faulthandler's watchdog thread
# needs no GIL, prints every thread's traceback and ends the process instead.
TEST_WATCHDOG_S = 120


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(TEST_WATCHDOG_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


def kernels():
    lib = simpler.KernelLibrary()
    lib.add_file(ADD, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))
    lib.add_file(SQRT, simpler.CoreType.AIV, simpler.example_kernel("kernel_failure_checked_sqrt"))
    return lib


def add_orch(o, args):
    o.submit_aiv(ADD, args)


def rng_floats(n, seed):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, n).astype(np.float32)


def upload(w, array):
    """A device buffer holding `array`."""
    buf = w.malloc(array.nbytes)
    w.copy_to(buf, array)
    return buf


@pytest.fixture
def chip():
    """An initialised Level 2 worker with vector_add's callable registered, as (worker, handle)."""
    w = simpler.Worker(level=2)
    handle = w.register(simpler.ChipCallable("vector_add", add_orch, kernels(), ["in", "in", "out"]))
    w.init()
    yield w, handle
    w.close()
