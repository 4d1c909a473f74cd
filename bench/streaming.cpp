// first_task and stream: what a streaming runtime (tensormap_and_ringbuffer,
// whose orchestration runs on the device while the first tasks already
// execute) wins over host_build_graph (which builds the whole graph on the
// submitting thread before it launches), measured side by side in one run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "base/doorbell.h"
#include "base/errors.h"
#include "benchmarks.h"

namespace simpler::bench {
namespace {

constexpr const char* kHbg = "host_build_graph";
constexpr const char* kTmr = "tensormap_and_ringbuffer";
constexpr int64_t kRowElems = 16;  // one 64-byte row of F32 per task

// The start of the first kernel of the current run: the kernel runs
// in-process on a simulated core thread, so it reads the same clock as the
// thread that submitted.
std::atomic<uint64_t> first_start_ns{0};

extern "C" void simpler_bench_first_start_kernel(int64_t* /*args*/) {
  if (first_start_ns.load(std::memory_order_relaxed) != 0) return;
  uint64_t none = 0;
  first_start_ns.compare_exchange_strong(none, wall_ns(), std::memory_order_relaxed);
}

Result<CallableHandle> register_and_init(Worker& worker, const std::string& name, OrchestrationFn orchestrate,
                                         std::vector<Param> signature) {
  KernelLibrary kernels;
  if (Status s = kernels.add_function(kNoopFuncId, CoreType::AIV, "simpler_bench_first_start_kernel",
                                      &simpler_bench_first_start_kernel);
      !s.ok()) {
    return s;
  }
  Result<CallableHandle> handle =
      worker.register_callable(ChipCallable(name, std::move(orchestrate), std::move(kernels), std::move(signature)));
  if (!handle.ok()) return handle;
  if (Status s = worker.init(); !s.ok()) return s;
  return handle;
}

// ---- first_task ---------------------------------------------------------------------------------

constexpr int kFirstWarmupReps = 2;
constexpr int kFirstMaxReps = 30;
constexpr uint64_t kFirstSizeBudgetNs = 3'000'000'000;
constexpr double kFirstGoalNs = 10'000.0;

// A Worker of `runtime` whose callable submits `tasks` independent no-op
// tasks, task i writing row i of its own buffer (dispatch's independent shape).
struct FirstTaskWorker {
  FirstTaskWorker(const std::string& runtime, uint32_t max_tasks)
      : worker(Level::Chip, config_for(runtime, max_tasks)) {}
  static WorkerConfig config_for(const std::string& runtime, uint32_t max_tasks) {
    WorkerConfig c;
    c.runtime = runtime;
    c.pipeline_depth = 1;
    if (max_tasks != 0) c.max_tasks_per_run = max_tasks;
    return c;
  }
  Status open(uint32_t max_rows) {
    Result<CallableHandle> c = register_and_init(
        worker, "bench_first_task", [this](ChipOrchestrator& o, const TaskArgs&) { return orchestrate(o); }, {});
    if (!c.ok()) return c.status();
    callable = *c;
    Result<DeviceBuffer> b = worker.malloc(uint64_t{max_rows} * kRowElems * sizeof(float));
    if (!b.ok()) return b.status();
    rows = b->view({max_rows, kRowElems}, DType::F32);
    return Status();
  }
  Status orchestrate(ChipOrchestrator& o) const {
    for (uint32_t i = 0; i < tasks; ++i) {
      Result<TensorView> row = rows.tile({i, 0}, {1, kRowElems});
      if (!row.ok()) return row.status();
      TaskArgs args;
      args.add_tensor(*row, Tag::OutputExisting);
      if (Result<TaskRef> t = o.submit_aiv(kNoopFuncId, args); !t.ok()) return t.status();
    }
    return Status();
  }
  Worker worker;
  CallableHandle callable;
  TensorView rows;
  uint32_t tasks = 0;
};

// The floor under first_task on this machine: a streaming run's first task
// starts after three parked threads were woken in a chain (the submitter
// rings the orchestrator, which rings a scheduler, which rings a core). Here
// those three hand-offs are all there is: thread i parks on its own Doorbell
// until its turn, rings thread i + 1, and the last reads the clock. Each rep
// starts once every thread has parked, as a device idle between runs has.
constexpr uint32_t kHandoffHops = 3;

Result<Summary> handoff_floor_us(int reps) {
  struct Hop {
    Doorbell bell;
    std::atomic<int> turn{-1};
  };
  std::vector<Hop> hops(kHandoffHops + 1);  // the last is the measuring thread's
  std::atomic<uint64_t> end_ns{0};
  std::vector<std::thread> threads;
  const auto wait_turn = [&](Hop& h, int rep) {
    return spin_then_park(
        h.bell, [&] { return h.turn.load(std::memory_order_acquire) >= rep; }, SpinPolicy{},
        wall_ns() + 10'000'000'000ull);
  };
  for (uint32_t i = 0; i < kHandoffHops; ++i) {
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < reps; ++rep) {
        if (!wait_turn(hops[i], rep)) return;
        if (i + 1 == kHandoffHops) end_ns.store(wall_ns(), std::memory_order_relaxed);
        hops[i + 1].turn.store(rep, std::memory_order_release);
        hops[i + 1].bell.ring();
      }
    });
  }
  std::vector<double> samples;
  Status failed;
  for (int rep = 0; rep < reps && failed.ok(); ++rep) {
    const uint64_t deadline = wall_ns() + 10'000'000'000ull;
    while (failed.ok()) {
      bool all_parked = true;
      for (uint32_t i = 0; i < kHandoffHops; ++i) all_parked = all_parked && hops[i].bell.parked() == 1;
      if (all_parked) break;
      if (wall_ns() > deadline) failed = Status(StatusCode::kDeadlineExceeded, "hand-off threads never parked");
      std::this_thread::yield();
    }
    if (!failed.ok()) break;
    const uint64_t t0 = wall_ns();
    hops[0].turn.store(rep, std::memory_order_release);
    hops[0].bell.ring();
    if (!wait_turn(hops[kHandoffHops], rep)) {
      failed = Status(StatusCode::kDeadlineExceeded, "the hand-off chain did not finish within 10 s");
      break;
    }
    if (rep >= kFirstWarmupReps) samples.push_back(to_us(end_ns.load(std::memory_order_relaxed) - t0));
  }
  if (!failed.ok()) {
    // Releases every thread still waiting for its turn.
    for (Hop& h : hops) {
      h.turn.store(reps, std::memory_order_release);
      h.bell.ring();
    }
  }
  for (std::thread& t : threads) t.join();
  if (!failed.ok()) return failed;
  return summarize(std::move(samples));
}

struct FirstTaskFigures {
  Summary first_task_us;
  Summary submit_return_us;
  Summary prepare_us;  // RunStats::build_us: the runtime's part of submit
  Summary run_us;
  uint32_t tasks = 0;
};

// `after_one_task_run`: each measured run follows a one-task run instead of
// the previous run of `tasks`, so the figure shows what the run's own graph
// size costs, not what a long run before it evicted from the host's caches.
Result<FirstTaskFigures> measure_first_task(FirstTaskWorker& w, uint32_t tasks, bool after_one_task_run = false) {
  std::vector<double> first, returned, prepared, whole;
  FirstTaskFigures f;
  const uint64_t start = wall_ns();
  for (int rep = 0; rep < kFirstWarmupReps + kFirstMaxReps; ++rep) {
    if (after_one_task_run) {
      w.tasks = 1;
      if (Status s = w.worker.submit(w.callable, TaskArgs{}).wait(); !s.ok()) return s;
    }
    w.tasks = tasks;
    first_start_ns.store(0, std::memory_order_relaxed);
    const uint64_t t0 = wall_ns();
    RunHandle run = w.worker.submit(w.callable, TaskArgs{});
    const uint64_t t1 = wall_ns();
    Status s = run.wait();
    const uint64_t t2 = wall_ns();
    if (!s.ok()) return s;
    const uint64_t t_first = first_start_ns.load(std::memory_order_relaxed);
    if (t_first < t0) return Status(StatusCode::kInternal, "the first kernel did not record its start");
    if (run.stats().tasks != tasks) {
      return Status(StatusCode::kInternal, fmt::format("run has {} tasks, expected {}", run.stats().tasks, tasks));
    }
    f.tasks = tasks;
    if (rep < kFirstWarmupReps) continue;
    first.push_back(to_us(t_first - t0));
    returned.push_back(to_us(t1 - t0));
    prepared.push_back(run.stats().build_us);
    whole.push_back(to_us(t2 - t0));
    if (wall_ns() - start > kFirstSizeBudgetNs) break;
  }
  f.first_task_us = summarize(std::move(first));
  f.submit_return_us = summarize(std::move(returned));
  f.prepare_us = summarize(std::move(prepared));
  f.run_us = summarize(std::move(whole));
  return f;
}

// ---- stream -------------------------------------------------------------------------------------

constexpr uint64_t kStreamTasks = 1'000'000;
constexpr uint32_t kStreamConsumers = 3;  // tasks per step reading the step's intermediate
constexpr uint32_t kStreamTasksPerStep = 1 + kStreamConsumers;
constexpr uint32_t kStreamWindow = 4096;
constexpr uint64_t kStreamRingBytes = 1ull << 20;
constexpr int64_t kIntermediateElems = 256;  // 1 KiB of F32 per step
constexpr uint64_t kIntermediateBytes = kIntermediateElems * sizeof(float);
constexpr uint32_t kOutRows = 256;
// host_build_graph holds a whole run's graph: it gets the same tasks as runs
// of its default capacity, two in flight.
constexpr uint32_t kHbgChunkTasks = 16384;
constexpr std::chrono::microseconds kMemorySamplePeriod{500};

// One step: a scope, an intermediate written by one task and read by
// kStreamConsumers, each writing a row of `out`: a row recurs every
// kOutRows / kStreamConsumers steps, so only steps that far apart are ordered
// (write after write) and the window holds many steps in flight.
Status stream_steps(ChipOrchestrator& o, const TensorView& out, uint64_t steps) {
  for (uint64_t step = 0; step < steps; ++step) {
    o.scope_begin();
    Result<TensorView> im = o.alloc({kIntermediateElems}, DType::F32);
    if (!im.ok()) return im.status();
    TaskArgs produce;
    produce.add_tensor(*im, Tag::OutputExisting);
    if (Result<TaskRef> t = o.submit_aiv(kNoopFuncId, produce); !t.ok()) return t.status();
    for (uint32_t c = 0; c < kStreamConsumers; ++c) {
      const auto row_index = static_cast<int64_t>((step * kStreamConsumers + c) % kOutRows);
      Result<TensorView> row = out.tile({row_index, 0}, {1, kRowElems});
      if (!row.ok()) return row.status();
      TaskArgs consume;
      consume.add_tensor(*im, Tag::Input).add_tensor(*row, Tag::OutputExisting);
      if (Result<TaskRef> t = o.submit_aiv(kNoopFuncId, consume); !t.ok()) return t.status();
    }
    if (Status s = o.scope_end(); !s.ok()) return s;
  }
  return Status();
}

struct StreamWorker {
  explicit StreamWorker(const WorkerConfig& config) : worker(Level::Chip, config) {}
  Status open() {
    Result<CallableHandle> c = register_and_init(worker, "bench_stream",
                                                 [this](ChipOrchestrator& o, const TaskArgs& run_args) -> Status {
                                                   return stream_steps(o, out, run_args[0].scalar);
                                                 },
                                                 {Param::scalar()});
    if (!c.ok()) return c.status();
    callable = *c;
    Result<DeviceBuffer> b = worker.malloc(uint64_t{kOutRows} * kRowElems * sizeof(float));
    if (!b.ok()) return b.status();
    out = b->view({kOutRows, kRowElems}, DType::F32);
    return Status();
  }
  Worker worker;
  CallableHandle callable;
  TensorView out;
};

struct StreamFigures {
  uint64_t tasks = 0;
  uint32_t runs = 0;
  uint64_t released_early = 0;
  double seconds = 0;
  uint64_t peak_run_bytes = 0;  // device bytes in use above the pre-submit baseline, sampled
  uint64_t samples = 0;
};

// `steps` steps as runs of at most `steps_per_run`, up to pipeline_depth in
// flight. The controlling thread samples memory_info while it waits, since a
// Worker serves one controlling thread.
Result<StreamFigures> measure_stream(StreamWorker& w, uint64_t steps, uint64_t steps_per_run) {
  Result<MemoryInfo> base = w.worker.memory_info();
  if (!base.ok()) return base.status();
  const uint64_t base_used = base->total_bytes - base->free_bytes;
  StreamFigures f;
  uint64_t peak_used = base_used;
  const auto sample = [&]() -> Status {
    Result<MemoryInfo> m = w.worker.memory_info();
    if (!m.ok()) return m.status();
    peak_used = std::max(peak_used, m->total_bytes - m->free_bytes);
    ++f.samples;
    return Status();
  };
  const uint32_t depth = w.worker.config().pipeline_depth;
  std::vector<RunHandle> in_flight;
  const auto retire_oldest = [&]() -> Status {
    while (!in_flight.front().done()) {
      if (Status s = sample(); !s.ok()) return s;
      std::this_thread::sleep_for(kMemorySamplePeriod);
    }
    if (Status s = in_flight.front().wait(); !s.ok()) return s;
    const RunStats stats = in_flight.front().stats();
    f.tasks += stats.tasks;
    f.released_early += stats.released_early;
    in_flight.erase(in_flight.begin());
    return Status();
  };
  const uint64_t t0 = wall_ns();
  for (uint64_t done = 0; done < steps; done += steps_per_run) {
    if (in_flight.size() == depth) {
      if (Status s = retire_oldest(); !s.ok()) return s;
    }
    TaskArgs run_args;
    run_args.add_scalar_u64(std::min(steps_per_run, steps - done));
    in_flight.push_back(w.worker.submit(w.callable, run_args));
    ++f.runs;
    if (Status s = sample(); !s.ok()) return s;
  }
  while (!in_flight.empty()) {
    if (Status s = retire_oldest(); !s.ok()) return s;
  }
  f.seconds = static_cast<double>(wall_ns() - t0) / 1e9;
  f.peak_run_bytes = peak_used - base_used;
  return f;
}

Json stream_json(const StreamFigures& f) {
  Json j;
  j["runs"] = f.runs;
  j["tasks"] = f.tasks;
  j["seconds"] = round3(f.seconds);
  j["tasks_per_s"] = std::round(static_cast<double>(f.tasks) / f.seconds);
  j["released_early"] = f.released_early;
  j["peak_device_bytes"] = f.peak_run_bytes;
  j["memory_samples"] = f.samples;
  return j;
}

}  // namespace

Result<Json> first_task() {
  SIMPLER_ASSIGN_OR_RETURN(const std::vector<uint32_t> sizes,
                           env_sizes("SIMPLER_BENCH_FIRST_TASK_SIZES", "1000,10000,100000"));
  const uint32_t largest = sizes.back();
  // host_build_graph must hold the largest graph whole; tensormap_and_ringbuffer
  // keeps its default window and streams what does not fit.
  FirstTaskWorker hbg(kHbg, largest);
  FirstTaskWorker tmr(kTmr, 0);
  if (Status st = hbg.open(largest); !st.ok()) return st;
  if (Status st = tmr.open(largest); !st.ok()) return st;

  Json by_size;
  double tmr_worst_us = 0;
  double tmr_best_us = 0;
  for (const uint32_t tasks : sizes) {
    Result<FirstTaskFigures> mine = measure_first_task(tmr, tasks);
    if (!mine.ok()) return mine.status();
    Result<FirstTaskFigures> peer = measure_first_task(hbg, tasks);
    if (!peer.ok()) return peer.status();
    Result<FirstTaskFigures> mine_after_short = measure_first_task(tmr, tasks, /*after_one_task_run=*/true);
    if (!mine_after_short.ok()) return mine_after_short.status();
    const double p50 = mine->first_task_us.p50;
    tmr_worst_us = std::max(tmr_worst_us, p50);
    tmr_best_us = tmr_best_us == 0 ? p50 : std::min(tmr_best_us, p50);
    Json s;
    s["tasks"] = mine->tasks;
    s["reps"] = mine->first_task_us.n;
    s["tmr_first_task_us"] = summary_json(mine->first_task_us);
    s["tmr_submit_return_us_p50"] = round3(mine->submit_return_us.p50);
    s["tmr_prepare_us_p50"] = round3(mine->prepare_us.p50);
    s["tmr_run_us_p50"] = round3(mine->run_us.p50);
    s["tmr_first_task_after_one_task_run_us"] = summary_json(mine_after_short->first_task_us);
    s["tmr_submit_return_after_one_task_run_us_p50"] = round3(mine_after_short->submit_return_us.p50);
    s["hbg_first_task_us"] = summary_json(peer->first_task_us);
    s["hbg_submit_return_us_p50"] = round3(peer->submit_return_us.p50);
    s["hbg_prepare_us_p50"] = round3(peer->prepare_us.p50);
    s["hbg_run_us_p50"] = round3(peer->run_us.p50);
    s["ratio_vs_peer"] = round3(p50 / peer->first_task_us.p50);
    s["goal_met"] = p50 * 1000.0 <= kFirstGoalNs;
    by_size[std::to_string(tasks)] = s;
  }
  if (Status st = hbg.worker.close(); !st.ok()) return st;
  if (Status st = tmr.worker.close(); !st.ok()) return st;
  SIMPLER_ASSIGN_OR_RETURN(const Summary floor, handoff_floor_us(kFirstWarmupReps + kFirstMaxReps));

  Json j;
  j["geometry"] = Geometry::small().name;
  j["unit"] = "us";
  j["what"] =
      "steady clock right before Worker::submit -> the first kernel's start (the kernel reads the same clock on "
      "its simulated core thread); independent no-op tasks, each writing its own 64-byte row; each run follows "
      "the previous run of its size (tmr_first_task_after_one_task_run_us: follows a one-task run instead, so a long "
      "run before it has not evicted the host's caches)";
  j["sizes"] = by_size;
  j["runtime"] = fmt::format("{}, default max_tasks_per_run (its window); larger graphs stream through it", kTmr);
  j["peer"] = fmt::format("{}, max_tasks_per_run = {} (it builds the whole graph before launching)", kHbg, largest);
  j["tmr_size_spread"] = round3(tmr_worst_us / tmr_best_us);
  j["handoff_floor_us"] = summary_json(floor);
  j["handoff_floor_what"] = fmt::format(
      "{} parked threads woken in a chain, one Doorbell ring each (submitter -> orchestrator -> scheduler -> core), "
      "nothing else: what the streaming route's first task costs at least on this machine",
      kHandoffHops);
  j["tmr_worst_p50_over_floor_p50"] = round3(tmr_worst_us / floor.p50);
  j["goal"] = Json{{"first_task_us_p50_max", kFirstGoalNs / 1000.0},
                   {"met", tmr_worst_us * 1000.0 <= kFirstGoalNs},
                   {"independent_of_size", "see tmr_size_spread: largest p50 / smallest p50"}};
  return j;
}

Result<Json> stream() {
  SIMPLER_ASSIGN_OR_RETURN(const std::vector<uint32_t> tasks,
                           env_sizes("SIMPLER_BENCH_STREAM_TASKS", std::to_string(kStreamTasks).c_str()));
  if (tasks.size() != 1)
    return invalid_argument("SIMPLER_BENCH_STREAM_TASKS names one task count, not {}", tasks.size());
  const uint64_t want = tasks.front();
  const uint64_t steps = (want + kStreamTasksPerStep - 1) / kStreamTasksPerStep;

  WorkerConfig tc;
  tc.runtime = kTmr;
  tc.pipeline_depth = 1;
  tc.max_tasks_per_run = kStreamWindow;
  tc.runtime_env.task_window = kStreamWindow;
  tc.runtime_env.heap_ring_bytes = kStreamRingBytes;
  StreamWorker tmr(tc);
  if (Status st = tmr.open(); !st.ok()) return st;

  WorkerConfig hc;
  hc.runtime = kHbg;
  hc.pipeline_depth = 2;
  hc.max_tasks_per_run = kHbgChunkTasks;
  StreamWorker hbg(hc);
  if (Status st = hbg.open(); !st.ok()) return st;
  const uint64_t hbg_steps_per_run = kHbgChunkTasks / kStreamTasksPerStep;

  // Warm-up: the first run of each Worker pays its first touches of memory.
  const uint64_t warmup_steps = std::min(steps, hbg_steps_per_run);
  if (Result<StreamFigures> w = measure_stream(tmr, warmup_steps, warmup_steps); !w.ok()) return w.status();
  if (Result<StreamFigures> w = measure_stream(hbg, warmup_steps, warmup_steps); !w.ok()) return w.status();

  Result<StreamFigures> mine = measure_stream(tmr, steps, steps);
  if (!mine.ok()) return mine.status();
  Result<StreamFigures> peer = measure_stream(hbg, steps, hbg_steps_per_run);
  if (!peer.ok()) return peer.status();
  if (Status st = tmr.worker.close(); !st.ok()) return st;
  if (Status st = hbg.worker.close(); !st.ok()) return st;

  const uint64_t total_intermediate_bytes = steps * kIntermediateBytes;
  const double mine_rate = static_cast<double>(mine->tasks) / mine->seconds;
  const double peer_rate = static_cast<double>(peer->tasks) / peer->seconds;
  Json j;
  j["geometry"] = Geometry::small().name;
  j["tasks"] = steps * kStreamTasksPerStep;
  j["steps"] = steps;
  j["step"] = fmt::format(
      "a scope; a {}-byte intermediate written by one no-op task and read by {} more, each writing a row of a "
      "{}-row buffer",
      kIntermediateBytes, kStreamConsumers, kOutRows);
  j["task_window"] = kStreamWindow;
  j["heap_ring_bytes"] = kStreamRingBytes;
  j["total_intermediate_bytes"] = total_intermediate_bytes;
  Json t = stream_json(*mine);
  // The rings are allocated whole when first used, one per scope depth in use (here one).
  t["peak_device_bytes_vs_total_intermediates"] =
      round3(static_cast<double>(mine->peak_run_bytes) / static_cast<double>(total_intermediate_bytes));
  j["tmr"] = t;
  Json p = stream_json(*peer);
  p["tasks_per_run_max"] = hbg_steps_per_run * kStreamTasksPerStep;
  j["peer"] = p;
  j["peer_what"] = fmt::format(
      "{}: the same steps as runs of at most {} tasks (its default max_tasks_per_run), pipeline_depth 2; "
      "peak_device_bytes: memory_info sampled every {} us while waiting, above the pre-submit baseline",
      kHbg, kHbgChunkTasks, kMemorySamplePeriod.count());
  j["ratio_vs_peer"] = Json{{"tasks_per_s", round3(mine_rate / peer_rate)}};
  return j;
}

}  // namespace simpler::bench
