// network_mpi: the network level across MPI ranks. Under `mpirun -np N`,
// rank 0 runs a Level::Network Worker with one forked local node and one
// remote node per other rank; every other rank serves its node
// (serve_node). Each run hands every node one NodeCallable run, c_k = a_k +
// b_k on the node's chip: a remote node's inputs travel with its request
// and c_k comes back with its terminal; the local node reads the shared heap
// in place. Every output is checked bit-exactly against the host's sum.
#include <algorithm>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kAddFunc = 0;
constexpr int64_t kLength = 1 << 14;
constexpr uint64_t kBytes = kLength * sizeof(float);
constexpr float kPoison = -12345.f;
const char* const kName = "network_mpi";

Status orchestrate_chip(ChipOrchestrator& o, const TaskArgs& run_args) {
  return o.submit_aiv(kAddFunc, run_args).status();
}

TensorView vec(const DeviceBuffer& b) { return b.view({kLength}, DType::F32); }

// A node as every rank builds it: one chip with the add callable, registered
// first, so its handle is the same on every node.
Result<std::pair<std::unique_ptr<Worker>, CallableHandle>> make_node(const ExampleOptions& options) {
  WorkerConfig c;
  c.geometry = options.geometry;
  c.runtime = options.runtime;
  c.backend = options.backend;
  c.chips = 1;
  c.pipeline_depth = options.pipeline_depth;
  c.device_memory_bytes = 64ull << 20;
  c.max_tasks_per_run = 16;
  c.shared_heap_bytes = 4ull << 20;
  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kAddFunc, CoreType::AIV, "vector_add_add"}}), kernels); !s.ok()) return s;
  auto node = std::make_unique<Worker>(Level::Node, c);
  CallableHandle add;
  if (Status s =
          take(node->register_callable(ChipCallable(std::string(kName) + "_add", orchestrate_chip, std::move(kernels),
                                                    {Param::input(), Param::input(), Param::output()})),
               add);
      !s.ok()) {
    return with_context(s, "register_callable");
  }
  return std::make_pair(std::move(node), add);
}

// The one NodeCallable, registered by the same name on the network and on every server.
NodeCallable step_callable(CallableHandle add) {
  return NodeCallable(std::string(kName) + "_step",
                      [add](Orchestrator& o, const TaskArgs& a) { return o.submit_next_level(add, a, 0).status(); });
}

}  // namespace

bool serves_on_this_rank(const std::string& example) { return example == kName && mpi_rank() != 0; }

Status serve_example(const std::string& example, const ExampleOptions& options) {
  if (example != kName) return Status(StatusCode::kNotFound, fmt::format("{} has no node server", example));
  std::pair<std::unique_ptr<Worker>, CallableHandle> node;
  if (Status s = take(make_node(options), node); !s.ok()) return s;
  ServeOptions so;
  so.tensor_heap_bytes = 64ull << 20;
  return serve_node(std::move(*node.first), {step_callable(node.second)}, so);
}

Result<ExampleReport> run_network_mpi(const ExampleOptions& options) {
  const int ranks = mpi_size();
  if (ranks < 2) {
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("{} runs under mpirun: `mpirun -np 3 simpler run {}` (as root add "
                              "--allow-run-as-root --oversubscribe); this process is not an MPI job of 2 or more",
                              kName, kName));
  }
  const uint32_t nodes = static_cast<uint32_t>(ranks);  // the local node and one per other rank
  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);
  WorkerConfig net_config;
  net_config.pipeline_depth = options.pipeline_depth;
  // --trace / --dump-args: one trace.json with the network's, every node's and
  // their chips' lanes; a remote node's files come back over MPI.
  net_config.call = options.call;
  net_config.shared_heap_bytes = (4ull << 20) + 4ull * kBytes * nodes * static_cast<uint64_t>(slots);
  Worker net(Level::Network, net_config);
  std::pair<std::unique_ptr<Worker>, CallableHandle> local;
  if (Status s = take(make_node(options), local); !s.ok()) return s;
  if (Status s = net.add_next_level_worker(std::move(*local.first)).status(); !s.ok()) {
    return with_context(s, "add_next_level_worker");
  }
  for (int r = 1; r < ranks; ++r) {
    if (Status s = net.add_remote_worker(r).status(); !s.ok()) return with_context(s, "add_remote_worker");
  }
  CallableHandle step;
  if (Status s = take(net.register_callable(step_callable(local.second)), step); !s.ok()) {
    return with_context(s, "register_callable");
  }
  if (Status s = net.init(); !s.ok()) return with_context(s, "Worker::init");

  struct Slot {
    std::vector<DeviceBuffer> a, b, c;
    std::vector<std::vector<float>> want;
  };
  std::vector<Slot> slot_bufs(slots);
  for (Slot& s : slot_bufs) {
    for (uint32_t k = 0; k < nodes; ++k) {
      for (auto* v : {&s.a, &s.b, &s.c}) {
        DeviceBuffer d;
        if (Status st = take(net.malloc_shared(kBytes), d); !st.ok()) return with_context(st, "malloc_shared");
        v->push_back(d);
      }
    }
    s.want.assign(nodes, std::vector<float>(kLength));
  }
  auto submit = [&](int run, int slot) -> Result<RunHandle> {
    Slot& s = slot_bufs[slot];
    for (uint32_t k = 0; k < nodes; ++k) {
      const auto seed = 5000 + 2 * (static_cast<uint32_t>(run) * nodes + k);
      const std::vector<float> a = random_floats(kLength, seed, -1.f, 1.f);
      const std::vector<float> b = random_floats(kLength, seed + 1, -1.f, 1.f);
      std::copy(a.begin(), a.end(), reinterpret_cast<float*>(s.a[k].addr));
      std::copy(b.begin(), b.end(), reinterpret_cast<float*>(s.b[k].addr));
      for (int64_t i = 0; i < kLength; ++i) s.want[k][i] = a[i] + b[i];
      // Poisoned first, so a run that returns nothing cannot pass.
      std::fill_n(reinterpret_cast<float*>(s.c[k].addr), kLength, kPoison);
    }
    return net.submit([&s, step, nodes](Orchestrator& o) -> Status {
      for (uint32_t k = 0; k < nodes; ++k) {
        TaskArgs args;
        args.add_tensor(vec(s.a[k]), Tag::Input)
            .add_tensor(vec(s.b[k]), Tag::Input)
            .add_tensor(vec(s.c[k]), Tag::OutputExisting);
        if (Status st = o.submit_next_level(step, args, k).status(); !st.ok()) return st;
      }
      return Status();
    });
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    const Slot& s = slot_bufs[out.slot];
    for (uint32_t k = 0; k < nodes && mismatch->empty(); ++k) {
      const auto* got = reinterpret_cast<const float*>(s.c[k].addr);
      if (std::string m = compare_floats(std::vector<float>(got, got + kLength), s.want[k], kLength, 0.f, 0.f);
          !m.empty()) {
        *mismatch = fmt::format("run {}, node {}: {}", out.run, k, m);
      }
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(kName, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = net.close(); !s.ok()) return with_context(s, "Worker::close");
  ExampleReport r{kName, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail =
        fmt::format("c = a + b over {} f32 on 1 local node + {} remote node(s) on MPI ranks 1..{}, every run exact",
                    kLength, ranks - 1, ranks - 1);
  }
  return r;
}

}  // namespace simpler::examples
