// mpi_latency and mpi_bandwidth: a network on MPI rank 0 with one remote node
// served on rank 1 (`mpirun -np 2 simpler bench mpi_latency`). The peer is
// MPI itself between the same two ranks in the same job: a ping-pong of the
// bytes a one-task remote run puts on the wire (latency; the same run through
// a forked node on rank 0, and the same remote task with a node run of no sub
// task, are measured beside it), and MPI_Send / MPI_Recv of
// the tensor bytes a 64 MiB-in, 64 MiB-OutputExisting run moves (bandwidth).
// Rank 1 serves the node first and echoes for the peer after, so its node
// forks before MPI starts (as every node server does).
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "benchmarks.h"
#include "dist/wire.h"
#include "task/args_blob.h"

namespace simpler::bench {
namespace {

constexpr int kPeerTag = 1000;
constexpr int kLatencyWarmup = 100;
constexpr int kLatencyRuns = 1000;
constexpr int kBandwidthWarmup = 2;
constexpr int kBandwidthRuns = 10;
constexpr uint64_t kBandwidthBytes = 64ull << 20;
// How long rank 1 waits for rank 0's peer plan: rank 0 measures the local
// forked node first, a few seconds at most.
constexpr auto kPlanWait = std::chrono::minutes(10);

Status noop_sub(const TaskArgsView& /*args*/) { return Status(); }

// Both benchmarks' node runs, registered by these names on both ranks.
std::vector<NodeCallable> node_callables(FunctionHandle sub) {
  return {NodeCallable("bench_mpi_one_sub",
                       [sub](Orchestrator& o, const TaskArgs&) { return o.submit_sub(sub, {}).status(); }),
          // No task: the run's cost is the wire's (its tensors in, its output back).
          NodeCallable("bench_mpi_bytes", [](Orchestrator&, const TaskArgs&) { return Status(); })};
}

WorkerConfig node_config() {
  WorkerConfig c;
  c.sub_workers = 1;
  c.pipeline_depth = 2;
  c.shared_heap_bytes = 4ull << 20;
  return c;
}

Status require_job() {
  if (mpi_size() != 2 || mpi_rank() != 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "run under `mpirun -np 2 simpler bench NAME` (as root add --allow-run-as-root --oversubscribe): "
                  "rank 0 runs the network, rank 1 serves its node");
  }
  return Status();
}

// Rank 1 waits for the peer's plan once its node is closed, so rank 0 sends
// one on every path: an empty one when the measurement failed before it.
class PeerPlan {
 public:
  ~PeerPlan() {
    if (!sent_) send(0, 0, 0);
  }
  void send(uint64_t iterations, uint64_t out, uint64_t back) {
    uint64_t plan[3] = {iterations, out, back};
    MPI_Send(plan, 3, MPI_UINT64_T, 1, kPeerTag, MPI_COMM_WORLD);
    sent_ = true;
  }

 private:
  bool sent_ = false;
};

// The peer on rank 0: `iterations` exchanges of `out` bytes to rank 1 and
// `back` bytes from it, each timed in microseconds.
Result<std::vector<double>> ping_pong(PeerPlan& plan, int iterations, uint64_t out, uint64_t back) {
  plan.send(static_cast<uint64_t>(iterations), out, back);
  std::vector<uint8_t> send(out, 1), recv(back);
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    const uint64_t t0 = wall_ns();
    if (MPI_Send(send.data(), static_cast<int>(out), MPI_BYTE, 1, kPeerTag, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Recv(recv.data(), static_cast<int>(back), MPI_BYTE, 1, kPeerTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS) {
      return Status(StatusCode::kInternal, "the MPI ping-pong with rank 1 failed");
    }
    us.push_back(to_us(wall_ns() - t0));
  }
  return us;
}

// The network with rank 1's node (or, `local`, a forked node on this rank
// with the same configuration and callables): a run of one task of each of
// `callables` in turn is timed submit -> wait, `runs` times after `warmup`;
// one vector of times per callable.
Result<std::vector<std::vector<double>>> network_runs(bool local, const std::vector<std::string>& names, int warmup,
                                                      int runs, uint64_t heap,
                                                      const std::function<TaskArgs(Worker&)>& make_args) {
  Worker net(Level::Network, WorkerConfig{.pipeline_depth = 2, .shared_heap_bytes = heap});
  Worker node(Level::Node, node_config());
  Result<FunctionHandle> sub = node.register_function(noop_sub);
  if (!sub.ok()) return sub.status();
  const std::vector<NodeCallable> callables = node_callables(*sub);
  if (local) {
    if (Status s = net.add_next_level_worker(std::move(node)).status(); !s.ok()) return s;
  } else if (Status s = net.add_remote_worker(1).status(); !s.ok()) {
    return s;
  }
  std::vector<CallableHandle> handles(names.size());
  for (const NodeCallable& c : callables) {
    Result<CallableHandle> r = net.register_callable(c);
    if (!r.ok()) return r.status();
    for (size_t k = 0; k < names.size(); ++k) {
      if (c.name() == names[k]) handles[k] = *r;
    }
  }
  if (Status s = net.init(); !s.ok()) return s;
  const TaskArgs args = make_args(net);
  std::vector<std::vector<double>> us(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    const CallableHandle h = handles[k];
    for (int i = 0; i < warmup + runs; ++i) {
      const uint64_t t0 = wall_ns();
      Status s = net.submit([&](Orchestrator& o) { return o.submit_next_level(h, args, 0).status(); }).wait();
      const uint64_t t1 = wall_ns();
      if (!s.ok()) return s;
      if (i >= warmup) us[k].push_back(to_us(t1 - t0));
    }
  }
  if (Status s = net.close(); !s.ok()) return s;
  return us;
}

Json bandwidth_json(const Summary& s, uint64_t bytes) {
  Json j = summary_json(s);
  j["gb_per_s_p50"] = round3(static_cast<double>(bytes) / (s.p50 * 1e3));
  return j;
}

}  // namespace

Result<Json> mpi_latency() {
  if (Status s = require_job(); !s.ok()) return s;
  PeerPlan plan;
  const auto no_args = [](Worker&) { return TaskArgs(); };
  // The judged run (a node run of one no-op sub task), then the same task
  // with a node run of none: the hop and the protocol without rank 1's
  // hand-off to its sub worker process.
  Result<std::vector<std::vector<double>>> remote =
      network_runs(false, {"bench_mpi_one_sub", "bench_mpi_bytes"}, kLatencyWarmup, kLatencyRuns, 4ull << 20, no_args);
  if (!remote.ok()) return remote.status();
  Result<std::vector<std::vector<double>>> local =
      network_runs(true, {"bench_mpi_one_sub"}, kLatencyWarmup, kLatencyRuns, 4ull << 20, no_args);
  if (!local.ok()) return local.status();
  // The wire bytes of that run: its request (no tensors) out; ACK, ACCEPTED and TERMINAL back.
  std::vector<uint8_t> blob;
  if (Status s = encode_args_blob(TaskArgs(), blob); !s.ok()) return s;
  const uint64_t out = dist::encode_request(1, 0, 1, 0, Digest{}, {}, blob).size();
  const uint64_t back = 3 * sizeof(dist::WireHeader);
  Result<std::vector<double>> peer = ping_pong(plan, kLatencyWarmup + kLatencyRuns, out, back);
  if (!peer.ok()) return peer.status();
  std::vector<double> measured(peer->begin() + kLatencyWarmup, peer->end());
  const Summary r = summarize(std::move((*remote)[0])), p = summarize(std::move(measured));
  const Summary bare = summarize(std::move((*remote)[1]));
  const Summary l = summarize(std::move((*local)[0]));
  Json j;
  j["unit"] = "us";
  j["simpler"] = summary_json(r);
  j["simpler"]["what"] =
      "Level::Network on rank 0, 1 remote node on rank 1 (1 sub worker): one NodeCallable task whose node run is "
      "one no-op sub task, submit -> wait";
  j["remote_no_sub_task"] = summary_json(bare);
  j["remote_no_sub_task"]["what"] =
      "the same network and node: one NodeCallable task whose node run submits nothing (no hand-off to the sub "
      "worker's process on rank 1), submit -> wait";
  j["remote_no_sub_task"]["ratio_vs_peer"] = {{"p50", round3(bare.p50 / p.p50)}};
  // The same run through a forked node on rank 0: what the run costs
  // without MPI, so the hop's own cost can be set against the ping-pong.
  j["local_node"] = summary_json(l);
  j["local_node"]["what"] = "the same run through a local forked node with the same configuration, same job";
  j["ratio_vs_local"] = {{"p50", round3(r.p50 / l.p50)}};
  j["mpi_adds_p50_us"] = round3(r.p50 - l.p50);
  j["mpi_adds_vs_peer_p50"] = round3((r.p50 - l.p50) / p.p50);
  j["peer"] = summary_json(p);
  j["peer"]["what"] = fmt::format(
      "MPI_Send of {} bytes to rank 1 and MPI_Recv of its {}-byte answer (the run's request, and its ACK + "
      "ACCEPTED + TERMINAL), same job",
      out, back);
  j["ratio_vs_peer"] = {{"p50", round3(r.p50 / p.p50)}, {"p99", round3(r.p99 / p.p99)}};
  j["goal"] = "p50 ratio <= 3";
  return j;
}

Result<Json> mpi_bandwidth() {
  if (Status s = require_job(); !s.ok()) return s;
  PeerPlan plan;
  Result<std::vector<std::vector<double>>> remote = network_runs(
      false, {"bench_mpi_bytes"}, kBandwidthWarmup, kBandwidthRuns, 2 * kBandwidthBytes + (8ull << 20),
      [](Worker& net) {
        TaskArgs a;
        auto x = net.malloc_shared(kBandwidthBytes);
        auto y = net.malloc_shared(kBandwidthBytes);
        if (!x.ok() || !y.ok()) return a;
        std::memset(reinterpret_cast<void*>(x->addr), 7, kBandwidthBytes);
        const int64_t n = static_cast<int64_t>(kBandwidthBytes / sizeof(float));
        a.add_tensor(x->view({n}, DType::F32), Tag::Input).add_tensor(y->view({n}, DType::F32), Tag::OutputExisting);
        return a;
      });
  if (!remote.ok()) return remote.status();
  // An OutputExisting goes both ways (its unwritten bytes keep the
  // caller's, as on a local node): the run sends 128 MiB and gets 64 back.
  Result<std::vector<double>> peer =
      ping_pong(plan, kBandwidthWarmup + kBandwidthRuns, 2 * kBandwidthBytes, kBandwidthBytes);
  if (!peer.ok()) return peer.status();
  std::vector<double> measured(peer->begin() + kBandwidthWarmup, peer->end());
  const Summary r = summarize(std::move((*remote)[0])), p = summarize(std::move(measured));
  const uint64_t moved = 3 * kBandwidthBytes;
  Json j;
  j["unit"] = "us";
  j["simpler"] = bandwidth_json(r, moved);
  j["simpler"]["what"] =
      "one remote run on rank 1 with a 64 MiB Input and a 64 MiB OutputExisting (sent and returned; a node run of no "
      "task), submit -> wait";
  j["peer"] = bandwidth_json(p, moved);
  j["peer"]["what"] = "MPI_Send of 128 MiB to rank 1 and MPI_Recv of 64 MiB back (the run's tensor bytes), same job";
  j["ratio_vs_peer"] = {{"bandwidth_p50", round3(p.p50 / r.p50)}};
  j["goal"] = "bandwidth ratio >= 0.8";
  return j;
}

bool serves_on_this_rank(const std::string& name) {
  return (name == "mpi_latency" || name == "mpi_bandwidth") && mpi_rank() != 0;
}

int serve_rank(const std::string& name) {
  Worker node(Level::Node, node_config());
  Result<FunctionHandle> sub = node.register_function(noop_sub);
  if (!sub.ok()) return 1;
  ServeOptions so;
  so.tensor_heap_bytes = 2 * kBandwidthBytes + (8ull << 20);
  if (Status s = serve_node(std::move(node), node_callables(*sub), so); !s.ok()) {
    fmt::print(stderr, "{}: MPI rank {}: serve_node: {}\n", name, mpi_rank(), s.to_string());
    return 1;
  }
  // The peer's other end: the plan, then that many echoes. The plan is
  // awaited asleep: OpenMPI's blocking receive polls on a CPU, and rank 0
  // measures the local forked node meanwhile, which must not share the
  // machine with a spinning rank.
  uint64_t plan[3] = {0, 0, 0};
  MPI_Request request;
  MPI_Irecv(plan, 3, MPI_UINT64_T, 0, kPeerTag, MPI_COMM_WORLD, &request);
  const auto give_up = std::chrono::steady_clock::now() + kPlanWait;
  for (;;) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      fmt::print(stderr, "{}: MPI rank {}: MPI_Test of the peer plan failed\n", name, mpi_rank());
      return 1;
    }
    if (done != 0) break;
    if (std::chrono::steady_clock::now() > give_up) {
      fmt::print(stderr, "{}: MPI rank {}: no peer plan from rank 0 within {} min\n", name, mpi_rank(),
                 std::chrono::duration_cast<std::chrono::minutes>(kPlanWait).count());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<uint8_t> in(plan[1]), out(plan[2], 2);
  for (uint64_t i = 0; i < plan[0]; ++i) {
    MPI_Recv(in.data(), static_cast<int>(plan[1]), MPI_BYTE, 0, kPeerTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(out.data(), static_cast<int>(plan[2]), MPI_BYTE, 0, kPeerTag, MPI_COMM_WORLD);
  }
  return 0;
}

}  // namespace simpler::bench
