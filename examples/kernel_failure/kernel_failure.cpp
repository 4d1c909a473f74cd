// kernel_failure: runs that alternate between an input the kernel refuses and a
// good one, on one Worker. Passes when every bad run fails with the kernel's own
// message and leaves its dependent unrun, and every good run is correct.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kSqrtFunc = 0;
constexpr uint32_t kScaleFunc = 1;
constexpr int64_t kLength = 4096;
constexpr uint64_t kBytes = kLength * sizeof(float);
constexpr int64_t kBadIndex = 1234;
constexpr float kFactor = 2.f;
constexpr float kPoison = -12345.f;

Status orchestrate(ChipOrchestrator& o, const TaskArgs& args) {
  const TensorView& x = args[0].tensor;
  const TensorView& z = args[1].tensor;
  TaskArgs sqrt_args;
  sqrt_args.add_tensor(x, Tag::Input).add_output({x.shape(0)}, DType::F32);
  TaskRef sqrt_task;
  if (Status s = take(o.submit_aiv(kSqrtFunc, sqrt_args), sqrt_task); !s.ok()) return s;
  // The bound Output of the first task is the input of the second: that is the edge.
  TaskArgs scale_args;
  scale_args.add_tensor(sqrt_task.outputs[0], Tag::Input)
      .add_tensor(z, Tag::OutputExisting)
      .add_scalar(static_cast<int64_t>(args[2].scalar));
  return o.submit_aiv(kScaleFunc, scale_args).status();
}

bool is_bad_run(int run) { return run % 2 == 0; }

}  // namespace

Result<ExampleReport> run_kernel_failure(const ExampleOptions& options) {
  const std::string name = "kernel_failure";
  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kSqrtFunc, CoreType::AIV, "kernel_failure_checked_sqrt"},
                                    {kScaleFunc, CoreType::AIV, "kernel_failure_scale"}}),
                      kernels);
      !s.ok()) {
    return s;
  }
  OpenWorker w;
  ChipCallable callable(name, orchestrate, std::move(kernels), {Param::input(), Param::output(), Param::scalar()});
  if (Status s = take(open_worker(options, std::move(callable)), w); !s.ok()) return s;
  Worker& worker = *w.worker;

  std::vector<float> good = random_floats(kLength, 21, 0.f, 4.f);
  std::vector<float> bad = good;
  bad[kBadIndex] = -1.f;
  std::vector<float> want(kLength);
  for (int64_t i = 0; i < kLength; ++i) want[i] = kFactor * std::sqrt(good[i]);
  const std::vector<float> poison(kLength, kPoison);
  const std::string expected_message = fmt::format("x[{}] = -1 is negative", kBadIndex);

  // At least one bad run and the good run after it.
  const int runs = std::max(2, options.runs);
  const int slots = pipeline_slots(options, runs);
  DeviceBuffer dgood, dbad;
  std::vector<DeviceBuffer> dz(slots);
  if (Status s = take(worker.malloc(kBytes), dgood); !s.ok()) return with_context(s, "malloc x");
  if (Status s = take(worker.malloc(kBytes), dbad); !s.ok()) return with_context(s, "malloc x");
  for (DeviceBuffer& z : dz) {
    if (Status s = take(worker.malloc(kBytes), z); !s.ok()) return with_context(s, "malloc z");
  }
  if (Status s = worker.copy_to(dgood, good.data(), kBytes); !s.ok()) return with_context(s, "copy x");
  if (Status s = worker.copy_to(dbad, bad.data(), kBytes); !s.ok()) return with_context(s, "copy x");

  std::string first_failure;
  std::vector<float> got(kLength);
  auto submit = [&](int run, int slot) -> Result<RunHandle> {
    if (Status s = worker.copy_to(dz[slot], poison.data(), kBytes); !s.ok()) return with_context(s, "clear z");
    TaskArgs args;
    args.add_tensor((is_bad_run(run) ? dbad : dgood).view({kLength}, DType::F32), Tag::Input)
        .add_tensor(dz[slot].view({kLength}, DType::F32), Tag::OutputExisting)
        .add_scalar_f32(kFactor);
    return worker.submit(w.callable, args);
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (Status s = worker.copy_from(got.data(), dz[out.slot], kBytes); !s.ok()) return with_context(s, "copy z");
    if (!is_bad_run(out.run)) {
      if (!out.status.ok()) return with_context(out.status, fmt::format("good run {} after a failed one", out.run));
      if (std::string m = compare_floats(got, want, kLength, 1e-6f, 1e-6f); !m.empty()) {
        *mismatch = fmt::format("good run {}: {}", out.run, m);
      }
      return Status();
    }
    if (out.status.code() != StatusCode::kKernelFailed ||
        out.status.message().find(expected_message) == std::string::npos) {
      *mismatch = fmt::format("bad run {}: want KERNEL_FAILED with \"{}\", got {}", out.run, expected_message,
                              out.status.to_string());
    } else if (std::string m = compare_floats(got, poison, kLength, 0.f, 0.f); !m.empty()) {
      *mismatch = fmt::format("bad run {}: the task after the failed one ran ({})", out.run, m);
    } else if (first_failure.empty()) {
      first_failure = out.status.to_string();
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = worker.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail = fmt::format("{} bad runs failed as expected ({}); {} good runs correct", (runs + 1) / 2, first_failure,
                           runs / 2);
  }
  return r;
}

}  // namespace simpler::examples
