// network_pipeline: the network level (L4). A Level::Network Worker with two
// next-level workers, each a Level::Node Worker (one chip child, one sub
// worker) forked at init and initialised in its own process, plus a sub
// worker of its own. Each run hands every node one NodeCallable run: the
// node's chip computes y = a_k + b_k (vector_add) into the node's own heap,
// and the node's sub worker squares it into z_k in the network's heap. The
// network's sub worker then sums z0 + z1, waiting on both node runs through
// the tags of z0 and z1.
#include <algorithm>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kAddFunc = 0;
constexpr int64_t kLength = 1 << 12;
constexpr uint64_t kBytes = kLength * sizeof(float);
constexpr uint32_t kNodes = 2;
constexpr float kPoison = -12345.f;

Status orchestrate_chip(ChipOrchestrator& o, const TaskArgs& run_args) {
  return o.submit_aiv(kAddFunc, run_args).status();
}

// A node's sub function, in the node's sub worker process: z = y * y.
Status square(const TaskArgsView& a) {
  const int64_t n = a[1].tensor.numel();
  if (a[0].tensor.numel() != n) return Status(StatusCode::kInvalidArgument, "square: y and z differ in length");
  const float* y = a.data<float>(0);
  float* z = a.data<float>(1);
  for (int64_t i = 0; i < n; ++i) z[i] = y[i] * y[i];
  return Status();
}

// The network's sub function: out = z0 + z1.
Status sum_nodes(const TaskArgsView& a) {
  const int64_t n = a[2].tensor.numel();
  if (a[0].tensor.numel() != n || a[1].tensor.numel() != n) {
    return Status(StatusCode::kInvalidArgument, "sum_nodes: z0, z1 and out differ in length");
  }
  for (int64_t i = 0; i < n; ++i) a.data<float>(2)[i] = a.data<float>(0)[i] + a.data<float>(1)[i];
  return Status();
}

TensorView vec(const DeviceBuffer& b) { return b.view({kLength}, DType::F32); }

}  // namespace

Result<ExampleReport> run_network_pipeline(const ExampleOptions& options) {
  const std::string name = "network_pipeline";
  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);
  const uint32_t depth = options.pipeline_depth;

  WorkerConfig net_config;
  net_config.sub_workers = 1;
  net_config.pipeline_depth = depth;
  net_config.call = options.call;  // --trace: the network's, each node's and each chip's lanes in one file
  // Per slot a0, b0, a1, b1, z0, z1 and out, in the network's heap.
  net_config.shared_heap_bytes = (4ull << 20) + 8ull * kBytes * static_cast<uint64_t>(slots);
  Worker net(Level::Network, net_config);

  WorkerConfig node_config;
  node_config.geometry = options.geometry;
  node_config.runtime = options.runtime;
  node_config.backend = options.backend;
  node_config.chips = 1;
  node_config.sub_workers = 1;
  node_config.pipeline_depth = depth;  // a node admits as many runs as the network may hand it
  node_config.device_memory_bytes = 64ull << 20;
  node_config.max_tasks_per_run = 16;
  // Each admitted run's y: no more runs than slots are ever in flight.
  node_config.shared_heap_bytes = (4ull << 20) + 2ull * kBytes * static_cast<uint64_t>(slots);
  CallableHandle add;
  FunctionHandle sq;
  for (uint32_t k = 0; k < kNodes; ++k) {
    KernelLibrary kernels;
    if (Status s = take(load_kernels({{kAddFunc, CoreType::AIV, "vector_add_add"}}), kernels); !s.ok()) return s;
    // Created and added before this function starts any thread: init forks the nodes.
    Worker node(Level::Node, node_config);
    // Registered in the same order on every node, so one handle names each on all of them.
    if (Status s = take(node.register_callable(ChipCallable(name + "_add", orchestrate_chip, std::move(kernels),
                                                            {Param::input(), Param::input(), Param::output()})),
                        add);
        !s.ok()) {
      return with_context(s, "register_callable");
    }
    if (Status s = take(node.register_function(square), sq); !s.ok()) return with_context(s, "register_function");
    if (Status s = net.add_next_level_worker(std::move(node)).status(); !s.ok()) {
      return with_context(s, "add_next_level_worker");
    }
  }
  // One node run: args a, b (inputs) and z (output), all in the network's heap.
  CallableHandle step;
  if (Status s = take(net.register_callable(NodeCallable(
                          name + "_step",
                          [add, sq](Orchestrator& o, const TaskArgs& a) -> Status {
                            Scope scope(o);  // y returns to the node's heap once the sub task read it
                            TensorView y;
                            if (Status st = take(o.alloc({kLength}, DType::F32), y); !st.ok()) return st;
                            TaskArgs chip_args;
                            chip_args.add_tensor(a[0].tensor, Tag::Input)
                                .add_tensor(a[1].tensor, Tag::Input)
                                .add_tensor(y, Tag::OutputExisting);
                            if (Status st = o.submit_next_level(add, chip_args, 0).status(); !st.ok()) return st;
                            TaskArgs sub_args;
                            sub_args.add_tensor(y, Tag::Input).add_tensor(a[2].tensor, Tag::OutputExisting);
                            return o.submit_sub(sq, sub_args).status();
                          })),
                      step);
      !s.ok()) {
    return with_context(s, "register_callable");
  }
  FunctionHandle sum;
  if (Status s = take(net.register_function(sum_nodes), sum); !s.ok()) return with_context(s, "register_function");
  if (Status s = net.init(); !s.ok()) return with_context(s, "Worker::init");

  struct Slot {
    DeviceBuffer a[kNodes], b[kNodes], z[kNodes], out;
    std::vector<float> want;
  };
  std::vector<Slot> slot_bufs(slots);
  for (Slot& s : slot_bufs) {
    for (uint32_t k = 0; k < kNodes; ++k) {
      for (DeviceBuffer* d : {&s.a[k], &s.b[k], &s.z[k]}) {
        if (Status st = take(net.malloc_shared(kBytes), *d); !st.ok()) return with_context(st, "malloc_shared");
      }
    }
    if (Status st = take(net.malloc_shared(kBytes), s.out); !st.ok()) return with_context(st, "malloc_shared out");
    s.want.resize(kLength);
  }

  auto submit = [&](int run, int slot) -> Result<RunHandle> {
    Slot& s = slot_bufs[slot];
    std::vector<float> z[kNodes];
    for (uint32_t k = 0; k < kNodes; ++k) {
      const auto seed = 1000 + 4 * static_cast<uint32_t>(run) + 2 * k;
      const std::vector<float> a = random_floats(kLength, seed, -1.f, 1.f);
      const std::vector<float> b = random_floats(kLength, seed + 1, -1.f, 1.f);
      std::copy(a.begin(), a.end(), reinterpret_cast<float*>(s.a[k].addr));
      std::copy(b.begin(), b.end(), reinterpret_cast<float*>(s.b[k].addr));
      z[k].resize(kLength);
      for (int64_t i = 0; i < kLength; ++i) {
        const float y = a[i] + b[i];
        z[k][i] = y * y;
      }
    }
    for (int64_t i = 0; i < kLength; ++i) s.want[i] = z[0][i] + z[1][i];
    // Poisoned first, so a run that writes nothing cannot pass.
    std::fill_n(reinterpret_cast<float*>(s.out.addr), kLength, kPoison);
    return net.submit([&s, step, sum](Orchestrator& o) -> Status {
      for (uint32_t k = 0; k < kNodes; ++k) {
        TaskArgs args;
        args.add_tensor(vec(s.a[k]), Tag::Input)
            .add_tensor(vec(s.b[k]), Tag::Input)
            .add_tensor(vec(s.z[k]), Tag::OutputExisting);
        if (Status st = o.submit_next_level(step, args, k).status(); !st.ok()) return st;
      }
      TaskArgs sum_args;
      sum_args.add_tensor(vec(s.z[0]), Tag::Input)
          .add_tensor(vec(s.z[1]), Tag::Input)
          .add_tensor(vec(s.out), Tag::OutputExisting);
      return o.submit_sub(sum, sum_args).status();
    });
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    const Slot& s = slot_bufs[out.slot];
    const auto* got = reinterpret_cast<const float*>(s.out.addr);
    if (std::string m = compare_floats(std::vector<float>(got, got + kLength), s.want, kLength, 0.f, 0.f); !m.empty()) {
      *mismatch = fmt::format("run {}: {}", out.run, m);
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = net.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail = fmt::format(
        "out = (a0 + b0)^2 + (a1 + b1)^2 over {} f32: 2 forked nodes (each 1 chip + 1 sub "
        "worker) + 1 network sub worker, every run exact",
        kLength);
  }
  return r;
}

}  // namespace simpler::examples
