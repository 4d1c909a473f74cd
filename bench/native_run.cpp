// native_run: the cost of the chip's native-run lifecycle itself. An empty run
// (an orchestration that submits nothing) goes through prepare -> launch ->
// finalize on ChipWorker, so what is timed is the lifecycle, not a kernel;
// a one-task run is timed the same way. Peer: the condvar pool's post + wait.
#include <cstring>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "benchmarks.h"
#include "chip/chip_worker.h"
#include "peers.h"

namespace simpler::bench {
namespace {

constexpr int kWarmup = 200;
constexpr int kRuns = 3000;
constexpr double kGoalP50Us = 10.0;

extern "C" void native_run_noop_kernel(int64_t*) {}

struct AlignedStorage {
  AlignedStorage() : p(::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()})) {
    std::memset(p, 0, native_run_storage_size());
  }
  ~AlignedStorage() { ::operator delete (p, std::align_val_t{native_run_storage_alignment()}); }
  void* p;
};

Result<Summary> lifecycle_us(ChipWorker& w, uint32_t callable) {
  AlignedStorage storage;
  std::vector<double> us;
  for (int i = 0; i < kWarmup + kRuns; ++i) {
    const uint64_t t0 = wall_ns();
    auto lease = w.try_acquire_lease();
    if (!lease) return Status(StatusCode::kInternal, "no free run-resource set");
    NativeRunDescriptor d;
    d.lease = *lease;
    d.arena_bank = lease->slot;
    auto epoch = w.prepare(storage.p, native_run_storage_size(), d, callable, TaskArgs{});
    if (!epoch.ok()) return epoch.status();
    if (Status s = w.launch(storage.p, *epoch); !s.ok()) return s;
    if (Status s = w.finalize(storage.p, *epoch); !s.ok()) return s;
    if (i >= kWarmup) us.push_back(static_cast<double>(wall_ns() - t0) / 1e3);
  }
  return summarize(std::move(us));
}

}  // namespace

Result<Json> native_run() {
  KernelLibrary kernels;
  if (Status s = kernels.add_function(kNoopFuncId, CoreType::AIV, "native_run_noop_kernel", native_run_noop_kernel);
      !s.ok()) {
    return s;
  }
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "empty", [](ChipOrchestrator&, const TaskArgs&) { return Status(); }, kernels, std::vector<Param>{});
  callables.emplace_back(
      "one_task", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(kNoopFuncId, TaskArgs{}).status(); },
      kernels, std::vector<Param>{});
  WorkerConfig config;
  config.max_tasks_per_run = 16;
  auto worker = ChipWorker::create(config, std::move(callables));
  if (!worker.ok()) return worker.status();
  Result<Summary> empty = lifecycle_us(**worker, 0);
  if (!empty.ok()) return empty.status();
  Result<Summary> one = lifecycle_us(**worker, 1);
  if (!one.ok()) return one.status();
  if (Status s = (*worker)->close(std::chrono::milliseconds(30'000)); !s.ok()) return s;

  std::vector<double> peer_us;
  {
    CondvarPool pool(std::max(1u, std::thread::hardware_concurrency()));
    CondvarPool::Job job;
    for (int i = 0; i < kWarmup + kRuns; ++i) {
      const uint64_t t0 = wall_ns();
      pool.post(job);
      CondvarPool::wait(job);
      if (i >= kWarmup) peer_us.push_back(static_cast<double>(wall_ns() - t0) / 1e3);
    }
  }
  const Summary peer = summarize(std::move(peer_us));
  Json j;
  j["geometry"] = Geometry::small().name;
  j["unit"] = "us";
  j["empty_run"] = summary_json(*empty);
  j["one_task_run"] = summary_json(*one);
  j["peer"] = summary_json(peer);
  j["peer"]["what"] = "condvar thread pool: post + wait one no-op job";
  j["ratio_vs_peer"] = {{"empty_p50", round3(empty->p50 / peer.p50)}, {"one_task_p50", round3(one->p50 / peer.p50)}};
  j["goal"] = {{"empty_p50_us_max", kGoalP50Us}, {"met", empty->p50 <= kGoalP50Us}};
  return j;
}

}  // namespace simpler::bench
