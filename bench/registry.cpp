#include <unistd.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <thread>

#include "base/doorbell.h"
#include "base/load_sense.h"
#include "bench.h"
#include "benchmarks.h"
#include "neighbours.h"

namespace simpler::bench {
namespace {

struct Entry {
  BenchInfo info;
  Result<Json> (*fn)();
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"l2_latency", "1-task run latency, submit -> wait, p50/p99 (small geometry) vs a condvar thread pool"},
       &l2_latency},
      {{"runs_in_flight",
        "runs/s with pipeline_depth = launch_depth = 1, 2, 4, 8, 16 one-task runs in flight vs a condvar pool"},
       &runs_in_flight},
      // These fork, so `bench` (all of them, in this order) runs them while no
      // other thread of this process lives: earlier benchmarks closed their
      // Workers, and dispatch, whose oneTBB workers outlive it, comes after.
      {{"l3_sub_latency",
        "1-task run through a sub worker (Level::Node), submit -> wait, p50/p99 vs a forked pipe "
        "ping-pong"},
       &l3_sub_latency},
      {{"l3_pipelined",
        "runs/s of 1-task runs through one chip child at depth 1..64 vs the L2 Worker at the same depth"},
       &l3_pipelined},
      {{"l4_latency",
        "1-task run through a forked node (Level::Network -> NodeCallable -> one sub task), submit -> "
        "wait, p50/p99 vs the same sub task on a Level::Node Worker"},
       &l4_latency},
      {{"mailbox_round_trip",
        "parent <-> forked child over the mailbox (control command, request ACK, terminal), "
        "p50/p99 vs a forked cache-line ping-pong"},
       &mailbox_round_trip},
      {{"mailbox_bytes", "mailbox_size at grant 1, 2, 3, 64, 1024 (exact bytes) vs the old fixed 3 x 64 KiB layout"},
       &mailbox_bytes},
      {{"dispatch",
        "ns per no-op task for 10k tasks: independent, chain, layered DAG; host_build_graph, "
        "tensormap_and_ringbuffer and resident vs a oneTBB flow graph"},
       &dispatch},
      {{"scaling",
        "ns per no-op task at 10k, 100k, 1M tasks (independent, chain, layered; host_build_graph and "
        "tensormap_and_ringbuffer; small, a2a3, a5) vs the same cell at 10k; runs/s of a node with 1, 2, 4 chips"},
       &scaling},
      {{"first_task",
        "submit -> first kernel start for 1k/10k/100k independent-task graphs, tensormap_and_ringbuffer vs "
        "host_build_graph"},
       &first_task},
      {{"stream",
        "tasks/s and peak device memory of 1M tasks through a 4096-slot window and 1 MiB heap ring "
        "(tensormap_and_ringbuffer) vs host_build_graph in 16k-task runs"},
       &stream},
      {{"idle_cpu", "% of one CPU burned by an idle a2a3-geometry chip over 1 s vs an idle process"}, &idle_cpu},
#ifdef SIMPLER_BENCH_HAVE_EXAMPLES
      {{"swimlane",
        "wall time of the matmul_chain example with swimlane level 1 and 4 and a FULL argument dump, each as a "
        "ratio to diagnostics off (and off against itself); the resident route's FULL capture (Mechanism R) vs "
        "its dumps-off run and vs host_build_graph's FULL"},
       &swimlane},
#endif
      {{"native_run", "prepare + launch + finalize of an empty and a one-task native run, p50/p99 vs a condvar pool"},
       &native_run},
      {{"mpi_latency",
        "1-task run through a remote node on MPI rank 1, submit -> wait, p50/p99 vs an MPI ping-pong of the same "
        "bytes (mpirun -np 2)",
        /*needs_mpi=*/true},
       &mpi_latency},
      {{"mpi_bandwidth",
        "a 64 MiB input and 64 MiB output through a remote node on MPI rank 1 vs MPI_Send/MPI_Recv of the same "
        "bytes (mpirun -np 2)",
        /*needs_mpi=*/true},
       &mpi_bandwidth},
  };
  return kEntries;
}

// On a shared 2-vCPU machine, what tells a regression from a neighbour's
// compile: the load average when the benchmark started, and NeighbourMeter.
double load_average_1m() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

// Busy CPU time of the whole machine (all CPUs, steal included), from /proc/stat.
uint64_t machine_busy_ns() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const uint64_t ticks = user + nice + system + irq + softirq + steal;
  return ticks * 1'000'000'000ull / static_cast<uint64_t>(sysconf(_SC_CLK_TCK));
}

// CPU used by everything but this process and the children it forked (reaped
// by the time pct() is read) while the benchmark ran, in % of one CPU: the
// load average lags by a minute, this does not.
class NeighbourMeter {
 public:
  NeighbourMeter() : wall_(wall_ns()), busy_(machine_busy_ns()), own_(own_cpu_ns()) {}
  double pct() const {
    const double others = static_cast<double>(machine_busy_ns() - busy_) - static_cast<double>(own_cpu_ns() - own_);
    return round3(std::max(0.0, 100.0 * others / static_cast<double>(wall_ns() - wall_)));
  }

 private:
  static uint64_t own_cpu_ns() { return process_cpu_ns() + reaped_children_cpu_ns(); }
  uint64_t wall_, busy_, own_;
};

Json context() {
  return Json{{"version", version_string()},
              {"build", build_options()},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"load_1m", load_average_1m()}};
}

}  // namespace

std::vector<BenchInfo> list() {
  std::vector<BenchInfo> out;
  for (const Entry& e : entries()) out.push_back(e.info);
  return out;
}

namespace {

// One run of `entry`, beside `neighbours` busy processes: the benchmark's
// JSON object, its context included. The neighbours are reaped before the
// object is returned, whatever the benchmark did.
Result<Json> measure(const Entry& entry, uint32_t neighbours) {
  Json head{{"bench", entry.info.name}};
  head["context"] = context();
  Result<Json> figures = Status(StatusCode::kInternal, "benchmark did not run");
  Neighbours busy;
  if (Status s = busy.start(neighbours); !s.ok()) return s;
  const NeighbourMeter meter;
  const uint64_t lost_before = load_sense().lost_batches();
  const uint64_t own_before = load_sense().own_batches();
  const uint64_t wakes_before = doorbell_wakes();
  set_busy_neighbours(neighbours);
  try {
    figures = entry.fn();
  } catch (const std::exception& e) {
    figures = Status(StatusCode::kInternal, std::string("exception: ") + e.what());
  }
  set_busy_neighbours(0);
  head["context"]["neighbour_cpu_pct"] = meter.pct();
  // Spin batches of this process that lost their CPU for a time slice, each
  // of which made its waits park sooner for a while (base/load_sense.h),
  // and those that lost it to this process's own threads, which did not.
  head["context"]["load_sense_lost_batches"] = load_sense().lost_batches() - lost_before;
  head["context"]["load_sense_own_batches"] = load_sense().own_batches() - own_before;
  // Hand-offs in this process that found their thread asleep in the kernel:
  // each one cost a system call and a wake-up (a forked child's are its own).
  head["context"]["futex_wakes"] = doorbell_wakes() - wakes_before;
  if (neighbours > 0) {
    Json pids = Json::array();
    for (const pid_t pid : busy.pids()) pids.push_back(pid);
    const uint32_t running = busy.stop();
    head["context"]["busy_neighbours"] = {{"count", neighbours}, {"pids", pids}, {"running_at_end", running}};
  }
  if (figures.ok()) {
    head.update(*figures);
  } else {
    head["error"] = figures.status().to_string();
  }
  return head;
}

// loaded ÷ quiet for every number both objects hold at the same path
// (context and booleans left out); a quiet 0 gives no ratio.
Json ratios(const Json& quiet, const Json& loaded) {
  Json out = Json::object();
  for (const auto& [key, q] : quiet.items()) {
    if (key == "context" || !loaded.contains(key)) continue;
    const Json& l = loaded[key];
    if (q.is_object() && l.is_object()) {
      Json inner = ratios(q, l);
      if (!inner.empty()) out[key] = std::move(inner);
    } else if (q.is_number() && l.is_number() && q.get<double>() != 0.0) {
      out[key] = round3(l.get<double>() / q.get<double>());
    }
  }
  return out;
}

}  // namespace

int run(const std::string& name, const RunOptions& options, std::ostream& out) {
  const Entry* entry = nullptr;
  for (const Entry& e : entries()) {
    if (e.info.name == name) entry = &e;
  }
  if (entry == nullptr) {
    out << "unknown benchmark '" << name << "'; `simpler bench --list` names them\n";
    return 2;
  }
  Json result;
  bool ok = true;
  if (options.compare_load) {
    const uint32_t n = options.neighbours > 0 ? options.neighbours : kDefaultCompareNeighbours;
    Result<Json> quiet = measure(*entry, 0);
    Result<Json> loaded = quiet.ok() && !quiet->contains("error") ? measure(*entry, n) : quiet;
    if (!quiet.ok() || !loaded.ok()) {
      const Status why = !quiet.ok() ? quiet.status() : loaded.status();
      result = Json{{"bench", name}, {"error", why.to_string()}};
      ok = false;
    } else {
      ok = !quiet->contains("error") && !loaded->contains("error");
      result = Json{{"bench", name}, {"busy_neighbours", n}};
      if (ok) result["loaded_over_quiet"] = ratios(*quiet, *loaded);
      result["quiet"] = *quiet;
      result["loaded"] = *loaded;
    }
  } else {
    Result<Json> one = measure(*entry, options.neighbours);
    if (one.ok()) {
      result = *one;
      ok = !result.contains("error");
    } else {
      result = Json{{"bench", name}, {"error", one.status().to_string()}};
      ok = false;
    }
  }
  if (options.json) {
    out << result.dump() << "\n";
  } else {
    out << render_table(result);
  }
  return ok ? 0 : 1;
}

}  // namespace simpler::bench
