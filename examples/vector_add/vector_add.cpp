// vector_add: one AIV task per run, c = a + b.
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kAddFunc = 0;
constexpr int64_t kLength = 1 << 16;
constexpr uint64_t kBytes = kLength * sizeof(float);

Status orchestrate(ChipOrchestrator& o, const TaskArgs& run_args) {
  // The run's arguments (a, b as inputs, c as the existing output) are exactly the task's.
  return o.submit_aiv(kAddFunc, run_args).status();
}

}  // namespace

Result<ExampleReport> run_vector_add(const ExampleOptions& options) {
  const std::string name = "vector_add";
  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kAddFunc, CoreType::AIV, "vector_add_add"}}), kernels); !s.ok()) return s;
  OpenWorker w;
  if (Status s = take(open_worker(options, ChipCallable(name, orchestrate, std::move(kernels),
                                                        {Param::input(), Param::input(), Param::output()})),
                      w);
      !s.ok()) {
    return s;
  }
  Worker& worker = *w.worker;

  const std::vector<float> a = random_floats(kLength, 1, -1.f, 1.f);
  const std::vector<float> b = random_floats(kLength, 2, -1.f, 1.f);
  std::vector<float> want(kLength);
  for (int64_t i = 0; i < kLength; ++i) want[i] = a[i] + b[i];

  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);
  DeviceBuffer da, db;
  std::vector<DeviceBuffer> dc(slots);
  if (Status s = take(worker.malloc(kBytes), da); !s.ok()) return with_context(s, "malloc a");
  if (Status s = take(worker.malloc(kBytes), db); !s.ok()) return with_context(s, "malloc b");
  for (DeviceBuffer& c : dc) {
    if (Status s = take(worker.malloc(kBytes), c); !s.ok()) return with_context(s, "malloc c");
  }
  if (Status s = worker.copy_to(da, a.data(), kBytes); !s.ok()) return with_context(s, "copy a");
  if (Status s = worker.copy_to(db, b.data(), kBytes); !s.ok()) return with_context(s, "copy b");

  // Each run starts from a poisoned output so a run that writes nothing cannot pass.
  const std::vector<float> poison(kLength, -12345.f);
  std::vector<float> got(kLength);
  auto submit = [&](int, int slot) -> Result<RunHandle> {
    if (Status s = worker.copy_to(dc[slot], poison.data(), kBytes); !s.ok()) return with_context(s, "clear c");
    TaskArgs args;
    args.add_tensor(da.view({kLength}, DType::F32), Tag::Input)
        .add_tensor(db.view({kLength}, DType::F32), Tag::Input)
        .add_tensor(dc[slot].view({kLength}, DType::F32), Tag::OutputExisting);
    return worker.submit(w.callable, args);
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    if (Status s = worker.copy_from(got.data(), dc[out.slot], kBytes); !s.ok()) return with_context(s, "copy c");
    if (std::string m = compare_floats(got, want, kLength, 0.f, 0.f); !m.empty()) {
      *mismatch = fmt::format("run {}: {}", out.run, m);
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = worker.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) r.detail = fmt::format("c = a + b over {} f32, every run exact", kLength);
  return r;
}

}  // namespace simpler::examples
