#include "common.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <random>

#include "kernel_paths.h"

namespace simpler::examples {

namespace {

// Where an installed executable's kernels are: beside it in its own prefix,
// wherever that prefix was installed or moved to. Empty when the executable
// cannot be named.
std::string installed_kernel_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return (exe.parent_path() / kKernelDirFromExecutable).lexically_normal().string();
}

}  // namespace

Result<std::string> kernel_path(const std::string& kernel) {
  const std::string file = kernel + ".so";
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SIMPLER_KERNEL_DIR"); env != nullptr && *env != '\0') {
    // An explicit directory is the only place looked at, so a stale build tree
    // cannot shadow the kernels the user pointed to.
    dirs.emplace_back(env);
  } else {
    // The installed place first, so an installed simpler never loads kernels
    // from a build tree it was installed from; a build tree's executables have
    // nothing there.
    if (std::string dir = installed_kernel_dir(); !dir.empty()) dirs.push_back(std::move(dir));
    dirs.emplace_back(kKernelBuildDir);
  }
  std::error_code ec;
  for (const std::string& dir : dirs) {
    std::filesystem::path p = std::filesystem::path(dir) / file;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  std::string looked;
  for (const std::string& dir : dirs) looked += fmt::format("{}{}", looked.empty() ? "" : ", ", dir);
  return Status(
      StatusCode::kNotFound,
      fmt::format("kernel {} not found in {} (set SIMPLER_KERNEL_DIR to the kernels directory)", file, looked));
}

Result<std::string> kernel_dir() {
  Result<std::string> path = kernel_path("vector_add_add");
  if (!path.ok()) return path.status();
  return std::filesystem::path(*path).parent_path().string();
}

Result<KernelLibrary> load_kernels(const std::vector<KernelSpec>& specs) {
  KernelLibrary lib;
  for (const KernelSpec& k : specs) {
    std::string path;
    if (Status s = take(kernel_path(k.kernel), path); !s.ok()) return s;
    if (Status s = lib.add_file(k.func_id, k.core, path); !s.ok()) return with_context(s, path);
  }
  return lib;
}

WorkerConfig worker_config(const ExampleOptions& options) {
  WorkerConfig config;
  config.geometry = options.geometry;
  config.runtime = options.runtime;
  config.backend = options.backend;
  config.pipeline_depth = options.pipeline_depth;
  config.call = options.call;
  return config;
}

Result<OpenWorker> open_worker(const WorkerConfig& config, ChipCallable callable) {
  OpenWorker w{std::make_unique<Worker>(Level::Chip, config), {}};
  if (Status s = take(w.worker->register_callable(std::move(callable)), w.callable); !s.ok()) {
    return with_context(s, "register_callable");
  }
  if (Status s = w.worker->init(); !s.ok()) return with_context(s, "Worker::init");
  return w;
}

int pipeline_slots(const ExampleOptions& options, int runs) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(options.pipeline_depth, runs)));
}

Result<PipelineTotals> run_pipelined(const std::string& name, const ExampleOptions& options, int runs, int slots,
                                     const SubmitFn& submit, const CheckFn& check) {
  struct InFlight {
    int run;
    int slot;
    RunHandle handle;
  };
  PipelineTotals totals;
  std::deque<InFlight> in_flight;
  std::vector<int> free_slots;
  for (int s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  int done = 0;
  const auto start = std::chrono::steady_clock::now();

  auto wait = [&](const InFlight& f) -> Status {
    Status s = f.handle.wait_for(options.run_timeout);
    if (s.code() == StatusCode::kDeadlineExceeded && !f.handle.done()) {
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("{} run {} did not finish within {} s", name, f.run, options.run_timeout.count()));
    }
    return s;
  };
  // Waits for the oldest run and checks it; returns the first reason to stop.
  auto finish_oldest = [&]() -> Status {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    Status run_status = wait(f);
    if (run_status.code() == StatusCode::kDeadlineExceeded && !f.handle.done()) return run_status;
    RunOutcome outcome{f.run, f.slot, run_status, f.handle.stats()};
    totals.tasks += outcome.stats.tasks;
    free_slots.push_back(f.slot);
    ++done;
    std::string mismatch;
    Status c = check(outcome, &mismatch);
    if (totals.mismatch.empty()) totals.mismatch = std::move(mismatch);
    if (options.progress) options.progress(ExampleProgress{name, done, runs, totals.tasks});
    return c;
  };

  Status error;
  for (int run = 0; run < runs && error.ok(); ++run) {
    if (free_slots.empty()) {
      error = finish_oldest();
      if (!error.ok()) break;
    }
    const int slot = free_slots.back();
    free_slots.pop_back();
    RunHandle handle;
    error = take(submit(run, slot), handle);
    if (error.ok()) in_flight.push_back(InFlight{run, slot, std::move(handle)});
  }
  if (error.ok()) {
    while (!in_flight.empty() && error.ok()) error = finish_oldest();
  }
  // After an error the remaining runs are only drained, unchecked; a run that
  // times out here leaves the rest to Worker::close.
  while (!in_flight.empty()) {
    Status s = wait(in_flight.front());
    in_flight.pop_front();
    if (s.code() == StatusCode::kDeadlineExceeded) break;
  }
  totals.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!error.ok()) return error;
  return totals;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::string compare_floats(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, float atol,
                           float rtol) {
  if (got.size() != want.size()) return fmt::format("got {} elements, want {}", got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Written so that a NaN in either fails the check.
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      return fmt::format("element [{}, {}]: got {}, want {}", static_cast<int64_t>(i) / cols,
                         static_cast<int64_t>(i) % cols, got[i], want[i]);
    }
  }
  return {};
}

}  // namespace simpler::examples
