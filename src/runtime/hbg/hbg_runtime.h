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
#include "runtime/common/host_graph.h"
#include "runtime/common/task_graph.h"
#include "runtime/runtime.h"

namespace simpler::hbg {

// One run-resource set: its graph, as the host built it.
using Slot = HostGraph;

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
  uint32_t last_tasks(uint32_t slot, uint32_t* out, uint32_t capacity) const override {
    return dispatcher_.last_done(slot, out, capacity);
  }
  bool poll(uint32_t aicpu) override;
  uint64_t poll_again_by(uint32_t aicpu) override { return dispatcher_.poll_again_by(aicpu); }

 private:
  struct GrantState;

  HbgRuntime(Device& device, GraphCapacity capacity, RunDoneFn on_done);
  GraphTask& task_of(ReadyItem item) const { return slots_[item.slot]->tasks[item.task]; }
  void complete_subtask(const CoreDispatcher::Inflight& f, const char* failure, std::vector<ReadyItem>& ready);
  void finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready);
  // CoreDispatcher's chain_after: a successor of `after` that waits on it
  // alone, of `kind`, not SPMD, marked chained. A whole graph is built before
  // launch, so no successor appears later; a task with guards has none (its
  // guard check may poison them after its kernel succeeded).
  bool chain_after(ReadyItem after, TaskKind kind, ReadyItem& next) const;
  void finish_run(Slot& s);

  Device& device_;
  DeviceMemory& memory_;
  const GraphCapacity capacity_;
  RunDoneFn on_done_;
  std::vector<std::unique_ptr<Slot>> slots_;
  CoreDispatcher dispatcher_;
};

}  // namespace simpler::hbg
