// HbgRuntime: the host_build_graph chip runtime. The host thread that submits
// a run builds its whole graph (tasks, fanin counts, fanout lists) into the
// device memory of one run-resource set, then launches it; the AICPU threads
// schedule every launched run on the shared cores through the handshake
// registers. Threads as in runtime/runtime.h.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/common/core_dispatcher.h"
#include "runtime/common/run_builder.h"
#include "runtime/common/task_graph.h"
#include "runtime/hbg/access_index.h"
#include "runtime/runtime.h"

namespace simpler::hbg {

struct Capacity {
  uint32_t tasks;
  uint32_t descriptors;
  uint32_t edges;
};

// One run-resource set's graph and build state.
struct Slot {
  Slot(const Capacity& c, DeviceMemory& memory);

  uint32_t index = 0;
  uint64_t arena_addr = 0;  // the bank arena the pointers below are carved from
  GraphTask* tasks = nullptr;
  DeviceTensor* descriptors = nullptr;
  uint32_t* fanout = nullptr;
  uint32_t* uses = nullptr;

  // Build state: written only by the building thread, before launch.
  HostApi api;
  const ChipCallable* callable = nullptr;  // the last run's; names kernels in errors
  std::vector<GuardCheck> guards;          // guarded device memory: per task, see GraphTask
  uint32_t task_count = 0;
  uint32_t desc_count = 0;
  std::vector<std::pair<uint32_t, uint32_t>> edges;      // (from, to)
  std::vector<std::pair<uint32_t, uint32_t>> use_pairs;  // (task, intermediate)
  std::vector<uint32_t> pred_mark;                       // edge de-duplication
  std::vector<uint32_t> counts;                          // CSR scratch
  AccessIndex accesses;
  RunAllocations allocations;
  diag::RunTrace trace;  // the run's, handed to the dispatcher at launch

  // Execution state: shared by AICPU threads after launch.
  std::atomic<uint32_t> remaining{0};
  std::atomic<uint32_t> executed{0};
  std::atomic<uint32_t> released_early{0};
  FirstError error;
  uint64_t launch_ns = 0;

  TaskGraphView graph() { return TaskGraphView{tasks, fanout, uses, &allocations}; }
};

class HbgRuntime final : public ChipRuntime {
 public:
  static Result<std::unique_ptr<ChipRuntime>> create(Device& device, const RuntimeOptions& options, RunDoneFn on_done);
  ~HbgRuntime() override;

  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override;
  void commit_grant(Pending& pending) noexcept override;
  uint32_t width() const override { return static_cast<uint32_t>(slots_.size()); }
  uint64_t arena_bytes() const override;
  Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args, const RuntimeEnv& env,
               const diag::RunTrace& trace) override;
  void discard(uint32_t slot) override;
  void launch(uint32_t slot) override;
  bool binding_held(uint32_t slot) const override { return slots_[slot]->api.bound(); }
  bool poll(uint32_t aicpu) override;

 private:
  friend class GraphBuilder;
  struct GrantState;

  HbgRuntime(Device& device, Capacity capacity, RunDoneFn on_done);
  Status bind_arena(Slot& s, const HostApi& api);
  void finalize_graph(Slot& s);
  GraphTask& task_of(ReadyItem item) const { return slots_[item.slot]->tasks[item.task]; }
  void complete_subtask(const CoreRegisters& r, const CoreDispatcher::Inflight& f, bool kernel_failed,
                        std::vector<ReadyItem>& ready);
  void finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready);
  void finish_run(Slot& s);

  Device& device_;
  DeviceMemory& memory_;
  const Capacity capacity_;
  RunDoneFn on_done_;
  std::vector<std::unique_ptr<Slot>> slots_;
  CoreDispatcher dispatcher_;
};

}  // namespace simpler::hbg
