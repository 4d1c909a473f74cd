#include "runtime/common/run_builder.h"

#include <algorithm>
#include <exception>
#include <new>

#include "base/errors.h"

namespace simpler {

// --- Intermediates ---------------------------------------------------------

Intermediates::Intermediates(uint32_t capacity) : capacity_(capacity), table_(new Intermediate[capacity]) {}

void Intermediates::reset() {
  count_ = 0;
  index_of_.clear();
  scopes_.clear();
}

Result<uint32_t> Intermediates::create(const HostApi& api, uint64_t bytes) {
  if (count_ >= capacity_) {
    return resource_exhausted("run allocates more than {} intermediate tensors (2 x max_tasks_per_run)", capacity_);
  }
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, api.device_malloc(bytes), "intermediate tensor");
  const uint32_t i = count_++;
  table_[i].addr = addr;
  table_[i].refs.store(1, std::memory_order_relaxed);  // the scope's (or the run's) reference
  index_of_[addr] = i;
  if (!scopes_.empty()) scopes_.back().push_back(i);
  return i;
}

Status Intermediates::scope_end(const HostApi& api) {
  if (scopes_.empty()) return failed_precondition("scope_end without a matching scope_begin");
  for (uint32_t i : scopes_.back()) {
    Intermediate& im = table_[i];
    // Not launched yet, so no AICPU thread can race this; a zero here means no
    // task ever used the tensor and it can go back at once.
    if (im.refs.fetch_sub(1, std::memory_order_relaxed) == 1) {
      (void)api.device_free(im.addr);
      index_of_.erase(im.addr);
      im.addr = 0;
    }
  }
  scopes_.pop_back();
  return Status();
}

uint32_t Intermediates::find(uint64_t addr) const {
  if (count_ == 0) return kNone;
  auto it = index_of_.find(addr);
  return it == index_of_.end() ? kNone : it->second;
}

void Intermediates::roll_back(uint32_t count, const HostApi& api) {
  for (uint32_t j = count; j < count_; ++j) {
    (void)api.device_free(table_[j].addr);
    index_of_.erase(table_[j].addr);
    table_[j].addr = 0;
    if (!scopes_.empty()) scopes_.back().pop_back();
  }
  count_ = count;
}

void Intermediates::free_all(DeviceMemory& memory) {
  for (uint32_t i = 0; i < count_; ++i) {
    if (table_[i].addr != 0) {
      (void)memory.free(table_[i].addr);
      table_[i].addr = 0;
    }
  }
  count_ = 0;
}

// --- RunBuilder ------------------------------------------------------------

RunBuilder::RunBuilder(const ChipCallable& callable, const HostApi& api, DeviceMemory& memory,
                       Intermediates& intermediates, uint32_t max_tasks)
    : callable_(callable), api_(api), memory_(memory), intermediates_(intermediates), max_tasks_(max_tasks) {}

Status RunBuilder::orchestrate(const TaskArgs& run_args) {
  Status st;
  try {
    st = callable_.orchestrate()(*this, run_args);
  } catch (const std::bad_alloc&) {
    st = resource_exhausted("orchestration of '{}': host memory exhausted while building the graph", callable_.name());
  } catch (const std::exception& e) {
    st = user_code_failed("orchestration of '{}' threw: {}", callable_.name(), e.what());
  } catch (...) {
    st = user_code_failed("orchestration of '{}' threw a non-standard exception", callable_.name());
  }
  return st.ok() ? build_error_ : st;
}

Status RunBuilder::refuse(Status st) {
  if (build_error_.ok()) build_error_ = st;
  return st;
}

Result<TaskRef> RunBuilder::submit_aiv(uint32_t func_id, const TaskArgs& args) {
  return submit(TaskKind::AIV, &func_id, args);
}
Result<TaskRef> RunBuilder::submit_aic(uint32_t func_id, const TaskArgs& args) {
  return submit(TaskKind::AIC, &func_id, args);
}
Result<TaskRef> RunBuilder::submit_mix(const MixKernels& k, const TaskArgs& args) {
  const uint32_t funcs[3] = {k.aic, k.aiv0, k.aiv1};
  return submit(TaskKind::Mix, funcs, args);
}

Result<TensorView> RunBuilder::alloc(const std::vector<int64_t>& shape, DType dtype) {
  TensorView probe = TensorView::unbound(shape, dtype);
  if (Status st = probe.validate(); !st.ok()) return refuse(Status(st.code(), "alloc: " + st.message()));
  const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(probe.numel()) * dtype_size(dtype), 1);
  auto idx = intermediates_.create(api_, bytes);
  if (!idx.ok()) return refuse(idx.status());
  return TensorView(DeviceBuffer{intermediates_.addr(*idx), bytes}, shape, dtype);
}

Status RunBuilder::scope_end() {
  if (Status st = intermediates_.scope_end(api_); !st.ok()) return refuse(st);
  return Status();
}

Result<DeviceMemory::Allocation> RunBuilder::allocation_of(uint64_t addr, uint64_t bytes) {
  for (const DeviceMemory::Allocation& a : known_) {
    if (a.bytes != 0 && addr >= a.addr && bytes <= a.bytes && addr - a.addr <= a.bytes - bytes) return a;
  }
  SIMPLER_ASSIGN_OR_RETURN(const DeviceMemory::Allocation found, memory_.containing_allocation(addr, bytes));
  known_[known_next_++ % known_.size()] = found;
  return found;
}

Result<TaskRef> RunBuilder::submit(TaskKind kind, const uint32_t* funcs, const TaskArgs& args) {
  if (!build_error_.ok()) {
    return Status(StatusCode::kAborted, "an earlier submit of this run was refused: " + build_error_.message());
  }
  CheckedTask t;
  t.id = task_count_;
  t.kind = kind;
  t.args = &args;
  if (t.id >= max_tasks_) {
    return refuse(resource_exhausted("graph capacity: the run has more than max_tasks_per_run = {} tasks", max_tasks_));
  }
  for (uint32_t i = 0; i < subtask_count(kind); ++i) {
    const CoreType want = subtask_core(kind, i);
    const KernelInfo* k = callable_.kernels().find(funcs[i]);
    if (k == nullptr) return refuse(not_found("func_id {} has no kernel in callable '{}'", funcs[i], callable_.name()));
    if (k->core != want) {
      return refuse(invalid_argument("func_id {} is an {} kernel but was submitted to an {} core", funcs[i],
                                     core_type_name(k->core), core_type_name(want)));
    }
    t.func_id[i] = funcs[i];
    t.fn[i] = k->fn;
  }
  if (Status st = args.validate(); !st.ok()) {
    return refuse(Status(st.code(), fmt::format("task {}: {}", t.id, st.message())));
  }
  uint32_t tensors = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != TaskArg::Kind::Tensor) continue;
    ++tensors;
    t.views[i] = args[i].tensor;
    const DeviceBuffer& b = args[i].tensor.buffer();
    if (!b.bound()) continue;
    auto alloc = allocation_of(b.addr, b.bytes);
    if (!alloc.ok()) {
      return refuse(
          out_of_range("task {}: args[{}]: buffer is not live device memory: {}", t.id, i, alloc.status().message()));
    }
    t.bases[i] = alloc->addr;
  }
  if (Status st = reserve(t.id, tensors); !st.ok()) return refuse(st);

  TaskRef ref;
  ref.id = t.id;
  const uint32_t first_new = intermediates_.count();
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor || a.tensor.buffer().bound()) continue;
    const uint64_t bytes =
        std::max<uint64_t>(static_cast<uint64_t>(a.tensor.numel()) * dtype_size(a.tensor.dtype()), 1);
    auto idx = intermediates_.create(api_, bytes);
    if (!idx.ok()) {
      intermediates_.roll_back(first_new, api_);
      return refuse(Status(idx.status().code(), fmt::format("task {}: args[{}]: {}", t.id, i, idx.status().message())));
    }
    std::vector<int64_t> shape(a.tensor.ndim());
    for (int d = 0; d < a.tensor.ndim(); ++d) shape[d] = a.tensor.shape(d);
    t.views[i] = TensorView(DeviceBuffer{intermediates_.addr(*idx), bytes}, shape, a.tensor.dtype());
    t.bases[i] = intermediates_.addr(*idx);
    ref.outputs.push_back(t.views[i]);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != TaskArg::Kind::Tensor) continue;
    const uint32_t im = intermediates_.find(t.bases[i]);
    if (im == Intermediates::kNone) continue;
    if (std::find(t.uses.begin(), t.uses.begin() + t.use_count, im) != t.uses.begin() + t.use_count) continue;
    t.uses[t.use_count++] = im;
    intermediates_.add_user(im);
  }
  place(t);
  task_count_ = t.id + 1;
  return ref;
}

}  // namespace simpler
