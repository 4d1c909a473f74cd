// Shared plumbing of the examples: kernel lookup, the run pipeline and host
// reference checks. Used by the example implementations on the caller's thread
// only; holds no state between calls.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "examples.h"

namespace simpler::examples {

// `<kernel>.so` from $SIMPLER_KERNEL_DIR when set, else from the install tree
// the running executable is in (`kKernelDirFromExecutable` from its directory),
// else from the build tree; NOT_FOUND names every place looked at.
Result<std::string> kernel_path(const std::string& kernel);

// Loads each {func_id, core, kernel} into one library.
struct KernelSpec {
  uint32_t func_id;
  CoreType core;
  const char* kernel;
};
Result<KernelLibrary> load_kernels(const std::vector<KernelSpec>& specs);

// Opens, registers and inits a chip Worker for one example.
struct OpenWorker {
  std::unique_ptr<Worker> worker;
  CallableHandle callable;
};
// The chip Worker config the options ask for, for an example to adjust.
WorkerConfig worker_config(const ExampleOptions& options);
Result<OpenWorker> open_worker(const WorkerConfig& config, ChipCallable callable);
inline Result<OpenWorker> open_worker(const ExampleOptions& options, ChipCallable callable) {
  return open_worker(worker_config(options), std::move(callable));
}

template <typename T>
Status take(Result<T> r, T& out) {
  if (!r.ok()) return r.status();
  out = std::move(r).value();
  return Status();
}

inline Status with_context(const Status& s, const std::string& what) {
  return s.ok() ? s : Status(s.code(), fmt::format("{}: {}", what, s.message()));
}

// One finished run, handed to the example's check.
struct RunOutcome {
  int run;
  int slot;
  Status status;
  RunStats stats;
};

struct PipelineTotals {
  uint64_t tasks = 0;
  double wall_s = 0;
  std::string mismatch;  // the first one reported by a check; empty when all matched
};

// Runs `runs` runs with up to `slots` in flight: submit(run, slot) starts one,
// and check(outcome, &mismatch) judges it once waited. A slot is reused only after
// its previous run was checked, so each slot may own its output buffers. An
// error from check, a failed submit or a timeout stops the pipeline (after
// draining what is in flight) and is returned.
using SubmitFn = std::function<Result<RunHandle>(int run, int slot)>;
using CheckFn = std::function<Status(const RunOutcome& outcome, std::string* mismatch)>;
Result<PipelineTotals> run_pipelined(const std::string& name, const ExampleOptions& options, int runs, int slots,
                                     const SubmitFn& submit, const CheckFn& check);

int pipeline_slots(const ExampleOptions& options, int runs);

// Deterministic inputs in [lo, hi).
std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi);

// The first element where |got - want| > atol + rtol * |want|, described with its
// row and column; empty when all match.
std::string compare_floats(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, float atol,
                           float rtol);

Result<ExampleReport> run_vector_add(const ExampleOptions& options);
Result<ExampleReport> run_matmul_chain(const ExampleOptions& options);
Result<ExampleReport> run_kernel_failure(const ExampleOptions& options);
Result<ExampleReport> run_node_pipeline(const ExampleOptions& options);
Result<ExampleReport> run_network_pipeline(const ExampleOptions& options);
Result<ExampleReport> run_network_mpi(const ExampleOptions& options);

// attention_stream's tasks per run under `simpler run` and under `simpler demo`.
inline constexpr uint32_t kAttentionStreamTasks = 1'000'000;
inline constexpr uint32_t kAttentionStreamDemoTasks = 100'000;
Result<ExampleReport> run_attention_stream(const ExampleOptions& options);

}  // namespace simpler::examples
