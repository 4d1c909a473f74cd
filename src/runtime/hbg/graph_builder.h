// GraphBuilder: the ChipOrchestrator of one run being built in one slot. Lives
// on the building thread's stack for the duration of the orchestration call.
#pragma once

#include "runtime/hbg/hbg_runtime.h"
#include "simpler/orchestrator.h"

namespace simpler::hbg {

class GraphBuilder final : public ChipOrchestrator {
 public:
  GraphBuilder(HbgRuntime& rt, Slot& slot) : rt_(rt), s_(slot) {}

  Result<TaskRef> submit_aiv(uint32_t func_id, const TaskArgs& args) override;
  Result<TaskRef> submit_aic(uint32_t func_id, const TaskArgs& args) override;
  Result<TaskRef> submit_mix(const MixKernels& kernels, const TaskArgs& args) override;
  Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) override;
  void scope_begin() override;
  Status scope_end() override;
  uint32_t task_count() const override { return s_.task_count; }

 private:
  Result<TaskRef> submit(TaskKind kind, const uint32_t* funcs, uint32_t nfuncs, const TaskArgs& args);
  Status refuse(Status st);
  Result<uint32_t> new_intermediate(uint64_t bytes);
  // The device allocation holding [addr, addr + bytes), from the build's cache when it can.
  Result<GlobalMemory::Allocation> allocation_of(uint64_t addr, uint64_t bytes);
  // `base` is the device allocation holding the view's buffer: accesses are
  // grouped by allocation, so views through different sub-buffers of one
  // allocation still meet.
  void add_dependencies(uint32_t task, const TensorView& view, Tag tag, uint64_t base);
  void add_edge(uint32_t from, uint32_t to);

  HbgRuntime& rt_;
  Slot& s_;
};

}  // namespace simpler::hbg
