// GraphBuilder: the ChipOrchestrator of one host_build_graph run being built
// in one set. The shared checks are RunBuilder's; this places each task in
// the set's graph (descriptors, task record) and finds its dependencies.
// Lives on the building thread's stack for the orchestration call.
#pragma once

#include "runtime/common/run_builder.h"
#include "runtime/hbg/hbg_runtime.h"

namespace simpler::hbg {

class GraphBuilder final : public RunBuilder {
 public:
  GraphBuilder(HbgRuntime& rt, Slot& slot, const ChipCallable& callable);

 private:
  Status reserve(uint32_t task, uint32_t tensors) override;
  void place(const CheckedTask& task) override;
  // `base` is the device allocation holding the view's buffer: accesses are
  // grouped by allocation, so views through different sub-buffers of one
  // allocation still meet.
  void add_dependencies(uint32_t task, const TensorView& view, Tag tag, uint64_t base);
  void add_edge(uint32_t from, uint32_t to);

  HbgRuntime& rt_;
  Slot& s_;
};

}  // namespace simpler::hbg
