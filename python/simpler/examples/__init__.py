"""The examples' Python versions: simpler.examples.<name> is examples/<name>/main.py,
copied here by the build. Each has run(runs=..., runtime=...) that raises on a mismatch
against its numpy golden and returns what it checked."""

NAMES = [
    "vector_add", "matmul_chain", "kernel_failure", "attention_stream", "node_pipeline", "network_pipeline",
    "network_mpi",
]
