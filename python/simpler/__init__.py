"""simpler from Python: the hierarchical task runtime's API with numpy arrays.

    import numpy as np, simpler

    lib = simpler.KernelLibrary()
    lib.add_file(0, simpler.CoreType.AIV, simpler.example_kernel("vector_add_add"))

    def orch(o, args):          # runs on the submitting thread, builds one run
        o.submit_aiv(0, args)

    with simpler.Worker(level=2, runtime="host_build_graph") as w:
        add = w.register(simpler.ChipCallable("add", orch, lib, ["in", "in", "out"]))
        w.init()
        ...

Levels: 2 (a chip), 3 (a node: chip children and sub workers, forked at
init), 4 (a network of nodes). Errors: a refused argument raises
simpler.InvalidArgumentError (a ValueError) naming the field, any other
refused call simpler.Error (.code, .message), a failed run simpler.RunError
from RunHandle.wait(), a wait that runs out of time TimeoutError.
"""

import os as _os

from . import _simpler
from ._simpler import (  # noqa: F401
    CallableHandle,
    ChipCallable,
    ChipOrchestrator,
    CallConfig,
    CoreType,
    DeadlineExceededError,
    DeviceBuffer,
    DType,
    DumpArgs,
    Error,
    FunctionHandle,
    Geometry,
    InvalidArgumentError,
    KernelLibrary,
    NodeCallable,
    NotFoundError,
    Orchestrator,
    Output,
    Param,
    RunError,
    RunHandle,
    RunStats,
    RuntimeEnv,
    Scope,
    SharedAllocation,
    Status,
    StatusCode,
    Tag,
    TaskArgs,
    TaskRef,
    TensorView,
    Worker,
    available_backends,
    available_runtimes,
    mpi_rank,
    mpi_size,
    serve_node,
    version,
)


def example_kernel(name):
    """The path of one of the examples' kernels (e.g. "vector_add_add"): from
    $SIMPLER_KERNEL_DIR when set, else the kernels installed with this package
    (pip) or beside its prefix (make install), else the build tree's."""
    if not _os.environ.get("SIMPLER_KERNEL_DIR"):
        here = _os.path.dirname(_os.path.abspath(__file__))
        dirs = [_os.path.join(here, "kernels")]
        try:
            from ._install_paths import KERNEL_DIR_FROM_PACKAGE

            dirs.append(_os.path.normpath(_os.path.join(here, KERNEL_DIR_FROM_PACKAGE)))
        except ImportError:
            pass
        for d in dirs:
            path = _os.path.join(d, name + ".so")
            if _os.path.isfile(path):
                return path
    return _simpler.example_kernel(name)


__all__ = [name for name in dir() if not name.startswith("_")]
