// node_pipeline: the node level (L3). A Level::Node Worker with two chip
// children and one sub worker, all forked at init. Each run adds a fresh input
// to a vector resident on each chip (y_k = a_k + b_k, the vector_add kernel,
// one task per chip) and a sub task sums both results in the shared heap
// (z = y0 + y1), waiting on both chip tasks through the tags of y0 and y1.
#include <algorithm>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kAddFunc = 0;
constexpr int64_t kLength = 1 << 14;
constexpr uint64_t kBytes = kLength * sizeof(float);
constexpr uint32_t kChips = 2;
constexpr float kPoison = -12345.f;

Status orchestrate_chip(ChipOrchestrator& o, const TaskArgs& run_args) {
  return o.submit_aiv(kAddFunc, run_args).status();
}

// The sub worker's function, in its own process: z = y0 + y1 over host
// addresses in the shared heap.
Status sum_outputs(const TaskArgsView& a) {
  const int64_t n = a[2].tensor.numel();
  if (a[0].tensor.numel() != n || a[1].tensor.numel() != n) {
    return Status(StatusCode::kInvalidArgument, "sum_outputs: y0, y1 and z differ in length");
  }
  const float* y0 = a.data<float>(0);
  const float* y1 = a.data<float>(1);
  float* z = a.data<float>(2);
  for (int64_t i = 0; i < n; ++i) z[i] = y0[i] + y1[i];
  return Status();
}

TaskArgs add_args(const TensorView& a, const TensorView& b, const TensorView& y) {
  TaskArgs args;
  args.add_tensor(a, Tag::Input).add_tensor(b, Tag::Input).add_tensor(y, Tag::OutputExisting);
  return args;
}

TensorView vec(const DeviceBuffer& b) { return b.view({kLength}, DType::F32); }

}  // namespace

Result<ExampleReport> run_node_pipeline(const ExampleOptions& options) {
  const std::string name = "node_pipeline";
  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kAddFunc, CoreType::AIV, "vector_add_add"}}), kernels); !s.ok()) return s;
  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);

  WorkerConfig config;
  config.geometry = options.geometry;
  config.runtime = options.runtime;
  config.backend = options.backend;
  config.chips = kChips;
  config.sub_workers = 1;
  config.pipeline_depth = options.pipeline_depth;
  config.device_memory_bytes = 64ull << 20;
  config.max_tasks_per_run = 16;  // each chip run is one task
  config.call = options.call;     // --trace: one trace.json with the node's and both chips' lanes
  // Per slot a0, a1 and z, plus the y0, y1 intermediates of every admitted
  // run: no more runs than slots are ever in flight, whatever the depth.
  config.shared_heap_bytes = (16ull << 20) + 8ull * kBytes * static_cast<uint64_t>(slots);
  // Created and initialised before this function starts any thread: init forks the children.
  Worker worker(Level::Node, config);
  CallableHandle add;
  if (Status s = take(worker.register_callable(ChipCallable(name + "_add", orchestrate_chip, std::move(kernels),
                                                            {Param::input(), Param::input(), Param::output()})),
                      add);
      !s.ok()) {
    return with_context(s, "register_callable");
  }
  FunctionHandle sum;
  if (Status s = take(worker.register_function(sum_outputs), sum); !s.ok()) return with_context(s, "register_function");
  if (Status s = worker.init(); !s.ok()) return with_context(s, "Worker::init");

  // b_k stays resident on chip k; a_k and z are per-slot shared-heap buffers
  // the host writes and reads directly.
  std::vector<std::vector<float>> b(kChips);
  std::vector<DeviceBuffer> db(kChips);
  for (uint32_t k = 0; k < kChips; ++k) {
    b[k] = random_floats(kLength, 100 + k, -1.f, 1.f);
    if (Status s = take(worker.malloc_on(k, kBytes), db[k]); !s.ok()) return with_context(s, "malloc_on b");
    if (Status s = worker.copy_to(db[k], b[k].data(), kBytes); !s.ok()) return with_context(s, "copy b");
  }
  std::vector<std::vector<DeviceBuffer>> a(slots, std::vector<DeviceBuffer>(kChips));
  std::vector<DeviceBuffer> z(slots);
  for (int s = 0; s < slots; ++s) {
    for (DeviceBuffer& ak : a[s]) {
      if (Status st = take(worker.malloc_shared(kBytes), ak); !st.ok()) return with_context(st, "malloc_shared a");
    }
    if (Status st = take(worker.malloc_shared(kBytes), z[s]); !st.ok()) return with_context(st, "malloc_shared z");
  }
  std::vector<std::vector<float>> want(slots, std::vector<float>(kLength));

  auto submit = [&](int run, int slot) -> Result<RunHandle> {
    std::vector<float> y[kChips];
    for (uint32_t k = 0; k < kChips; ++k) {
      const std::vector<float> in = random_floats(kLength, 1000 + 2 * static_cast<uint32_t>(run) + k, -1.f, 1.f);
      std::copy(in.begin(), in.end(), reinterpret_cast<float*>(a[slot][k].addr));
      y[k].resize(kLength);
      for (int64_t i = 0; i < kLength; ++i) y[k][i] = in[i] + b[k][i];
    }
    for (int64_t i = 0; i < kLength; ++i) want[slot][i] = y[0][i] + y[1][i];
    // Poisoned first, so a run that writes nothing cannot pass.
    std::fill_n(reinterpret_cast<float*>(z[slot].addr), kLength, kPoison);
    return worker.submit([&, slot](Orchestrator& o) -> Status {
      Scope scope(o);  // y0 and y1 return to the heap once the sub task read them
      TensorView y0, y1;
      if (Status s = take(o.alloc({kLength}, DType::F32), y0); !s.ok()) return s;
      if (Status s = take(o.alloc({kLength}, DType::F32), y1); !s.ok()) return s;
      if (Status s = o.submit_next_level(add, add_args(vec(a[slot][0]), vec(db[0]), y0), 0).status(); !s.ok()) return s;
      if (Status s = o.submit_next_level(add, add_args(vec(a[slot][1]), vec(db[1]), y1), 1).status(); !s.ok()) return s;
      TaskArgs sum_args;
      sum_args.add_tensor(y0, Tag::Input).add_tensor(y1, Tag::Input).add_tensor(vec(z[slot]), Tag::OutputExisting);
      return o.submit_sub(sum, sum_args).status();
    });
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    const auto* got = reinterpret_cast<const float*>(z[out.slot].addr);
    if (std::string m = compare_floats(std::vector<float>(got, got + kLength), want[out.slot], kLength, 0.f, 0.f);
        !m.empty()) {
      *mismatch = fmt::format("run {}: {}", out.run, m);
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = worker.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail = fmt::format(
        "z = (a0 + b0 on chip 0) + (a1 + b1 on chip 1), summed by the sub worker over {} f32; "
        "2 chip children + 1 sub worker, every run exact",
        kLength);
  }
  return r;
}

}  // namespace simpler::examples
