// The example registry behind `simpler demo` and `simpler run`: each example
// opens its own Worker (chip level, or node level for node_pipeline, which
// forks), runs it pipelined, verifies every output against a host reference
// and closes. Call from one thread at a time; the progress callback runs on
// that thread. Owns nothing between calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <simpler/simpler.h>

namespace simpler::examples {

struct ExampleProgress {
  const std::string& name;
  int runs_done;
  int runs_total;
  uint64_t tasks;  // tasks of the finished runs
};

struct ExampleOptions {
  Geometry geometry = Geometry::small();
  std::string runtime = WorkerConfig().runtime;  // chip runtime: one of available_runtimes()
  std::string backend = WorkerConfig().backend;  // device backend: one of available_backends()
  int runs = 0;                                  // 0: the example's default (ExampleInfo::default_runs)
  uint32_t tasks_per_run = 0;   // a sized example's tasks per run; 0: its default (ExampleInfo::default_tasks)
  uint32_t pipeline_depth = 4;  // the Worker's; also runs kept in flight (at most `runs`)
  // Every wait is bounded so a broken runtime fails the example instead of hanging it.
  std::chrono::seconds run_timeout{60};
  // Every run's diagnostics (the Worker's default CallConfig).
  CallConfig call;
  // Called after each finished run; the caller throttles its own output.
  std::function<void(const ExampleProgress&)> progress;
};

struct ExampleReport {
  std::string name;
  int runs = 0;        // device runs submitted, failing ones included
  uint64_t tasks = 0;  // tasks over all runs
  double wall_s = 0;   // submit of the first run to the last verified output
  bool verified = false;
  std::string detail;  // what was checked, or the first mismatch
};

struct ExampleInfo {
  std::string name;
  std::string description;
  int default_runs;
  // A sized example's tasks per run for `simpler run` and for `simpler demo`;
  // 0 for an example of fixed size, which refuses ExampleOptions::tasks_per_run.
  uint32_t default_tasks = 0;
  uint32_t demo_tasks = 0;
  // Runs only on a streaming runtime (one whose orchestration runs on the
  // device as its tasks execute); elsewhere run_example refuses it at once
  // with FAILED_PRECONDITION, saying why.
  bool needs_streaming = false;
  // Runs only as an MPI job of two or more ranks (`mpirun -np N simpler run
  // NAME`): rank 0 runs it, the others serve its nodes (serve_example).
  // Outside one it does not apply, as a streaming example on another runtime.
  bool needs_mpi = false;
};

std::vector<ExampleInfo> example_list();
std::vector<std::string> example_names();

// Whether chip runtime `runtime` streams a run through a task window rather
// than building its whole graph before launch.
bool is_streaming_runtime(const std::string& runtime);
// Whether `example` runs on chip runtime `runtime` in this process (else it
// refuses there): a streaming example on a streaming runtime, an MPI example
// in an MPI job.
bool applies_to(const ExampleInfo& example, const std::string& runtime);
// An MPI example on a rank other than 0: this process serves its nodes
// (serve_example) rather than running it.
bool serves_on_this_rank(const std::string& example);
Status serve_example(const std::string& example, const ExampleOptions& options);

// The directory the examples' kernels are loaded from (see common.h's
// kernel_path), or NOT_FOUND naming every place looked at.
Result<std::string> kernel_dir();

// An error when the example could not run as designed (unknown name, a
// runtime it does not apply to, a refused Worker call, an unexpected run
// failure, a timeout); a report with verified == false when it ran but an
// output did not match its reference.
Result<ExampleReport> run_example(const std::string& name, const ExampleOptions& options);

}  // namespace simpler::examples
