#include "common.h"

namespace simpler::examples {
namespace {

struct Entry {
  ExampleInfo info;
  Result<ExampleReport> (*run)(const ExampleOptions&);
};

const std::vector<Entry>& entries() {
  // node_pipeline and network_pipeline come first: their Workers fork at
  // init, so `simpler demo` runs them while the process has no other thread
  // yet (each closes its Worker, joining its threads, before the next; the
  // chip examples' Workers start device threads).
  static const std::vector<Entry> kEntries = {
      {{"node_pipeline", "L3: 2 chip children + 1 sub worker; per run a vector_add per chip, then a sub task sums both",
        64},
       run_node_pipeline},
      {{"network_pipeline",
        "L4: 2 forked nodes (1 chip + 1 sub worker each) run a NodeCallable per run; a network "
        "sub task sums both",
        32},
       run_network_pipeline},
      {{"network_mpi",
        "L4 across MPI ranks (mpirun -np N): 1 local node + 1 remote node per other rank run c = a + b per run", 16, 0,
        0, /*needs_streaming=*/false, /*needs_mpi=*/true},
       run_network_mpi},
      {{"vector_add", "one AIV task: c = a + b over 65536 f32", 200}, run_vector_add},
      {{"matmul_chain", "tiled relu(A·B + bias): 384 AIC/AIV tasks per run with per-tile chains", 32},
       run_matmul_chain},
      {{"kernel_failure", "a kernel fails with a message; later runs on the same Worker succeed", 8},
       run_kernel_failure},
      {{"attention_stream",
        "1M tasks of an attention-style loop, a scope per step, through a 4096-task window and a 512 KiB heap ring", 1,
        kAttentionStreamTasks, kAttentionStreamDemoTasks, /*needs_streaming=*/true},
       run_attention_stream},
  };
  return kEntries;
}

}  // namespace

std::vector<ExampleInfo> example_list() {
  std::vector<ExampleInfo> out;
  for (const Entry& e : entries()) out.push_back(e.info);
  return out;
}

bool is_streaming_runtime(const std::string& runtime) {
  // The public API does not say whether a runtime streams; the examples'
  // tests compare this list with the runtime registry's, so a new streaming
  // runtime cannot be missed.
  return runtime == "tensormap_and_ringbuffer";
}

bool applies_to(const ExampleInfo& example, const std::string& runtime) {
  return (!example.needs_streaming || is_streaming_runtime(runtime)) && (!example.needs_mpi || mpi_size() >= 2);
}

std::vector<std::string> example_names() {
  std::vector<std::string> out;
  for (const Entry& e : entries()) out.push_back(e.info.name);
  return out;
}

Result<ExampleReport> run_example(const std::string& name, const ExampleOptions& options) {
  if (options.runs < 0) {
    return Status(StatusCode::kInvalidArgument, fmt::format("runs = {} must be >= 0", options.runs));
  }
  if (options.pipeline_depth == 0) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("pipeline_depth = {} must be >= 1", options.pipeline_depth));
  }
  if (Status s = options.geometry.validate(); !s.ok()) return s;
  for (const Entry& e : entries()) {
    if (e.info.name != name) continue;
    ExampleOptions resolved = options;
    if (resolved.runs == 0) resolved.runs = e.info.default_runs;
    if (e.info.default_tasks == 0 && resolved.tasks_per_run != 0) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("{} has a fixed size: tasks_per_run = {} applies only to a sized example", name,
                                resolved.tasks_per_run));
    }
    if (resolved.tasks_per_run == 0) resolved.tasks_per_run = e.info.default_tasks;
    return e.run(resolved);
  }
  return Status(StatusCode::kNotFound, fmt::format("unknown example '{}'", name));
}

}  // namespace simpler::examples
