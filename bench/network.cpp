// l4_latency: a one-task run through the network level (L4): the network's
// Scheduler publishes one NodeCallable task to a forked node, whose own
// orchestration submits one no-op sub task to the node's sub worker. The
// peer is the same sub task submitted straight to a Level::Node Worker, in
// the same run, so the ratio is what the extra level costs. Workers are
// created while this process runs no other thread (init forks).
#include <functional>
#include <vector>

#include "benchmarks.h"

namespace simpler::bench {
namespace {

constexpr int kWarmupRuns = 200;
constexpr int kLatencyRuns = 2000;

Status noop_sub(const TaskArgsView& /*args*/) { return Status(); }

WorkerConfig sub_only(uint32_t depth) {
  WorkerConfig c;
  c.sub_workers = 1;
  c.pipeline_depth = depth;
  c.shared_heap_bytes = 4ull << 20;
  return c;
}

// submit -> wait of `one_run` on `worker`, after warm-up, in microseconds.
Result<Summary> latency(Worker& worker, const std::function<Status(Orchestrator&)>& one_run) {
  std::vector<double> us;
  us.reserve(kLatencyRuns);
  for (int i = 0; i < kWarmupRuns + kLatencyRuns; ++i) {
    const uint64_t t0 = wall_ns();
    Status s = worker.submit(one_run).wait();
    const uint64_t t1 = wall_ns();
    if (!s.ok()) return s;
    if (i >= kWarmupRuns) us.push_back(to_us(t1 - t0));
  }
  return summarize(std::move(us));
}

}  // namespace

Result<Json> l4_latency() {
  Summary network;
  {
    Worker net(Level::Network, WorkerConfig{.pipeline_depth = 2, .shared_heap_bytes = 4ull << 20});
    Worker node(Level::Node, sub_only(2));
    Result<FunctionHandle> fn = node.register_function(noop_sub);
    if (!fn.ok()) return fn.status();
    if (Status s = net.add_next_level_worker(std::move(node)).status(); !s.ok()) return s;
    const FunctionHandle sub = *fn;
    Result<CallableHandle> step = net.register_callable(NodeCallable(
        "bench_l4_one_sub", [sub](Orchestrator& o, const TaskArgs&) { return o.submit_sub(sub, {}).status(); }));
    if (!step.ok()) return step.status();
    if (Status s = net.init(); !s.ok()) return s;
    const CallableHandle h = *step;
    Result<Summary> r = latency(net, [h](Orchestrator& o) { return o.submit_next_level(h, {}, 0).status(); });
    if (!r.ok()) return r.status();
    network = *r;
    if (Status s = net.close(); !s.ok()) return s;
  }
  Summary node_level;
  {
    Worker node(Level::Node, sub_only(2));
    Result<FunctionHandle> fn = node.register_function(noop_sub);
    if (!fn.ok()) return fn.status();
    if (Status s = node.init(); !s.ok()) return s;
    const FunctionHandle sub = *fn;
    Result<Summary> r = latency(node, [sub](Orchestrator& o) { return o.submit_sub(sub, {}).status(); });
    if (!r.ok()) return r.status();
    node_level = *r;
    if (Status s = node.close(); !s.ok()) return s;
  }
  Json j;
  j["unit"] = "us";
  j["simpler"] = summary_json(network);
  j["simpler"]["what"] =
      "Level::Network, 1 forked node (1 sub worker): one NodeCallable task whose node run is one "
      "no-op sub task, submit -> wait";
  j["peer"] = summary_json(node_level);
  j["peer"]["what"] = "the same no-op sub task submitted to a Level::Node Worker directly (l3_sub_latency's path)";
  j["ratio_vs_peer"] = {{"p50", round3(network.p50 / node_level.p50)}, {"p99", round3(network.p99 / node_level.p99)}};
  j["level_cost_p50_us"] = round3(network.p50 - node_level.p50);
  return j;
}

}  // namespace simpler::bench
