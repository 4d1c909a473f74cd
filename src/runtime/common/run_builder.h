// RunBuilder: the part of a chip run's ChipOrchestrator that every runtime
// shares, so that a refusal reads word for word the same on each (the
// conformance suite compares first errors): the checks of a submit and their
// order, runtime-allocated outputs, alloc(), scopes and the intermediates
// they release. A runtime derives from it and places each checked task in its
// own graph. Lives on the building thread for one orchestration call; the
// Intermediates it fills belong to the run's set and outlive it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "device/device.h"
#include "runtime/common/task_graph.h"
#include "simpler/callable.h"
#include "simpler/orchestrator.h"

namespace simpler {

// The intermediates of one run-resource set: run-owned device allocations,
// the scopes they were made in and who still uses them. Sized at grant;
// written by the building thread, then released by AICPU threads through
// the reference counts.
class Intermediates {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  explicit Intermediates(uint32_t capacity);

  // Forgets the previous run (whose memory is already released).
  void reset();
  // A new intermediate of `bytes`, held by the current scope (or the run).
  Result<uint32_t> create(const HostApi& api, uint64_t bytes);
  void scope_begin() { scopes_.emplace_back(); }
  // Drops the innermost scope's references: an intermediate no task uses is
  // freed at once, the others when their last user finishes.
  Status scope_end(const HostApi& api);
  // The intermediate whose allocation starts at `addr`, or kNone.
  uint32_t find(uint64_t addr) const;
  // One more task references intermediate `i` (before launch).
  void add_user(uint32_t i) { table_[i].refs.fetch_add(1, std::memory_order_relaxed); }
  // Frees every intermediate created after the first `count`: a refused
  // submit hands back what it allocated.
  void roll_back(uint32_t count, const HostApi& api);
  // Frees every intermediate still held (the run ended, or never launched).
  void free_all(DeviceMemory& memory);

  uint32_t count() const { return count_; }
  uint64_t addr(uint32_t i) const { return table_[i].addr; }
  Intermediate* data() { return table_.get(); }

 private:
  const uint32_t capacity_;
  std::unique_ptr<Intermediate[]> table_;
  uint32_t count_ = 0;
  std::unordered_map<uint64_t, uint32_t> index_of_;  // addr -> index
  std::vector<std::vector<uint32_t>> scopes_;
};

// The tensor descriptors a run's graph holds per task, on average: one budget
// for every runtime, so they refuse the same graphs.
inline constexpr uint32_t kDescriptorsPerTask = 4;

// A submitted task after every shared check, ready to be placed.
struct CheckedTask {
  uint32_t id = 0;
  TaskKind kind = TaskKind::AIV;
  uint32_t func_id[3] = {};
  simpler_kernel_fn fn[3] = {};
  const TaskArgs* args = nullptr;
  // Per tensor argument: the view the kernel sees (a runtime-allocated
  // output's own view) and the start of the device allocation holding it.
  std::array<TensorView, kMaxTaskArgs> views;
  std::array<uint64_t, kMaxTaskArgs> bases{};
  // Intermediates the task references, each once.
  std::array<uint32_t, kMaxTaskArgs> uses{};
  uint32_t use_count = 0;
};

// The descriptor a kernel receives for `v`; on every task's path, so inline.
inline void write_descriptor(DeviceTensor& d, const TensorView& v) {
  d.data = v.buffer().addr + static_cast<uint64_t>(v.offset()) * dtype_size(v.dtype());
  d.dtype = static_cast<uint32_t>(v.dtype());
  d.ndim = static_cast<uint32_t>(v.ndim());
  for (int k = 0; k < kMaxDims; ++k) {
    d.shape[k] = k < v.ndim() ? v.shape(k) : 0;
    d.stride[k] = k < v.ndim() ? v.stride(k) : 0;
  }
}

// Writes a checked task's kernel arguments into `out` (its args[] array): a
// scalar as its raw 64 bits, a tensor as a pointer to its descriptor, which
// goes into descriptors[next++]. Calls on_tensor(i, view, tag) for each tensor
// argument, so the runtime can record its access.
template <typename OnTensor>
void write_kernel_args(const CheckedTask& t, int64_t* out, DeviceTensor* descriptors, uint32_t& next,
                       OnTensor&& on_tensor) {
  const TaskArgs& args = *t.args;
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind == TaskArg::Kind::Scalar) {
      out[i] = static_cast<int64_t>(a.scalar);
      continue;
    }
    DeviceTensor& d = descriptors[next++];
    write_descriptor(d, t.views[i]);
    out[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&d));
    on_tensor(i, t.views[i], a.tag);
  }
}

class RunBuilder : public ChipOrchestrator {
 public:
  RunBuilder(const ChipCallable& callable, const HostApi& api, DeviceMemory& memory, Intermediates& intermediates,
             uint32_t max_tasks);

  Result<TaskRef> submit_aiv(uint32_t func_id, const TaskArgs& args) final;
  Result<TaskRef> submit_aic(uint32_t func_id, const TaskArgs& args) final;
  Result<TaskRef> submit_mix(const MixKernels& kernels, const TaskArgs& args) final;
  Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) final;
  void scope_begin() final { intermediates_.scope_begin(); }
  Status scope_end() final;
  uint32_t task_count() const final { return task_count_; }

  // Runs the callable's orchestration over this builder. The result is the
  // orchestration's error, else the build's first refusal (which fails the
  // run even when the orchestration ignored the refused call's result); a
  // thrown exception becomes an error here and never leaves.
  Status orchestrate(const TaskArgs& run_args);

 protected:
  // The runtime's own capacity for one more task with `tensors` tensor
  // arguments; a refusal adds nothing.
  virtual Status reserve(uint32_t task, uint32_t tensors) = 0;
  // Writes a checked task into the runtime's graph; cannot fail.
  virtual void place(const CheckedTask& task) = 0;

  const HostApi& api() const { return api_; }

 private:
  Result<TaskRef> submit(TaskKind kind, const uint32_t* funcs, const TaskArgs& args);
  Status refuse(Status st);
  // The device allocation holding [addr, addr + bytes), from a small cache:
  // most tasks name a few buffers over and over.
  Result<DeviceMemory::Allocation> allocation_of(uint64_t addr, uint64_t bytes);

  const ChipCallable& callable_;
  const HostApi& api_;
  DeviceMemory& memory_;
  Intermediates& intermediates_;
  const uint32_t max_tasks_;
  uint32_t task_count_ = 0;
  Status build_error_;
  std::array<DeviceMemory::Allocation, 4> known_{};
  uint32_t known_next_ = 0;
};

}  // namespace simpler
