#include "runtime/common/run_builder.h"

#include <algorithm>
#include <exception>
#include <new>

#include "base/clock.h"
#include "base/errors.h"
#include "diag/arg_capture.h"

namespace simpler {

// --- RunBuilder ------------------------------------------------------------

RunBuilder::RunBuilder(const ChipCallable& callable, const HostApi& api, DeviceMemory& memory,
                       Intermediates& allocations, uint32_t max_tasks)
    : callable_(callable), api_(api), memory_(memory), allocations_(allocations), max_tasks_(max_tasks) {}

void collect_guard_checks(const CheckedTask& t, std::vector<GuardCheck>& out) {
  const size_t first = out.size();
  for (size_t i = 0; i < t.args->size(); ++i) {
    if ((*t.args)[i].kind != TaskArg::Kind::Tensor) continue;
    bool seen = false;
    for (size_t k = first; k < out.size() && !seen; ++k) seen = out[k].addr == t.bases[i];
    if (!seen) out.push_back(GuardCheck{t.bases[i], t.base_bytes[i], static_cast<uint32_t>(i)});
  }
}

Status guard_failure(const DeviceMemory::GuardDamage& d, const GuardCheck& check, uint32_t task, TaskKind kind,
                     const uint32_t* func_ids, const ChipCallable& callable) {
  const auto name = [&](uint32_t sub) {
    const KernelInfo* info = callable.kernels().find(func_ids[sub]);
    return info != nullptr ? info->name : std::string("?");
  };
  const std::string who =
      kind == TaskKind::Mix
          ? fmt::format("mix kernels '{}', '{}', '{}'", name(0), name(1), name(2))
          : fmt::format("{} kernel '{}', func_id {}", core_type_name(subtask_core(kind, 0)), name(0), func_ids[0]);
  return make_error(StatusCode::kKernelFailed, "task {} ({}) wrote {} bytes {} tensor argument {}", task, who,
                    d.past != 0 ? d.past : d.before, d.past != 0 ? "past" : "before", check.arg);
}

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
Result<TaskRef> RunBuilder::submit_aiv_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) {
  return submit(TaskKind::AIV, &func_id, args, block_num);
}
Result<TaskRef> RunBuilder::submit_aic_spmd(uint32_t func_id, const TaskArgs& args, uint32_t block_num) {
  return submit(TaskKind::AIC, &func_id, args, block_num);
}
Result<TaskRef> RunBuilder::submit_mix(const MixKernels& k, const TaskArgs& args) {
  const uint32_t funcs[3] = {k.aic, k.aiv0, k.aiv1};
  return submit(TaskKind::Mix, funcs, args);
}

Result<TensorView> RunBuilder::alloc(const std::vector<int64_t>& shape, DType dtype) {
  TensorView probe = TensorView::unbound(shape, dtype);
  if (Status st = probe.validate(); !st.ok()) return refuse(Status(st.code(), "alloc: " + st.message()));
  const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(probe.numel()) * dtype_size(dtype), 1);
  auto idx = allocations_.create(api_, bytes);
  if (!idx.ok()) return refuse(idx.status());
  note_made(*idx);
  return TensorView(DeviceBuffer{allocations_.addr(*idx), bytes}, shape, dtype);
}

void RunBuilder::scope_begin() {
  allocations_.scope_begin();
  ++depth_;
}

Status RunBuilder::scope_end() {
  if (Status st = allocations_.scope_end(); !st.ok()) return refuse(st);
  if (--depth_ < manual_depth_) {
    manual_serial_ = 0;
    manual_depth_ = 0;
    deps_.clear();
  }
  return Status();
}

Status RunBuilder::manual_scope_begin() {
  scope_begin();  // opened even when refused, so the caller's scope_end() stays balanced
  if (manual_serial_ != 0) {
    return refuse(failed_precondition("manual_scope_begin: manual scopes do not nest (one is open since task {})",
                                      manual_first_task_));
  }
  manual_serial_ = ++manual_scopes_;
  manual_depth_ = depth_;
  manual_first_task_ = task_count_;
  return Status();
}

Status RunBuilder::set_dependencies(const std::vector<uint32_t>& predecessors) {
  if (manual_serial_ == 0) return refuse(failed_precondition("set_dependencies outside a manual scope"));
  for (uint32_t p : predecessors) {
    if (p < manual_first_task_ || p >= task_count_) {
      return refuse(invalid_argument(
          "set_dependencies: task {} was not submitted in this manual scope (its tasks so far: [{}, {}))", p,
          manual_first_task_, task_count_));
    }
  }
  deps_ = predecessors;
  std::sort(deps_.begin(), deps_.end());
  deps_.erase(std::unique(deps_.begin(), deps_.end()), deps_.end());
  return Status();
}

void RunBuilder::note_made(uint32_t intermediate) {
  if (manual_serial_ != 0) {
    made_in_manual_[intermediate] = manual_serial_;
  } else if (!made_in_manual_.empty()) {
    made_in_manual_.erase(intermediate);  // a streaming runtime reuses the index
  }
}

Result<Intermediates::Held> RunBuilder::allocation_of(uint64_t addr, uint64_t bytes) {
  for (const DeviceMemory::Allocation& a : known_) {
    if (a.bytes != 0 && addr >= a.addr && bytes <= a.bytes && addr - a.addr <= a.bytes - bytes) {
      return Intermediates::Held{a, Intermediates::kNone};
    }
  }
  // A caller allocation is borrowed on its first use and then cached; an
  // intermediate is asked for each time, because a streaming runtime may
  // have released it and reused its memory since.
  SIMPLER_ASSIGN_OR_RETURN(const Intermediates::Held held, allocations_.hold(addr, bytes));
  if (held.intermediate == Intermediates::kNone) known_[known_next_++ % known_.size()] = held.allocation;
  return held;
}

Result<TaskRef> RunBuilder::submit(TaskKind kind, const uint32_t* funcs, const TaskArgs& args, uint32_t blocks) {
  const uint64_t submit_begin = trace_.level >= 4 ? now_ns() : 0;
  if (!build_error_.ok()) {
    return Status(StatusCode::kAborted, "an earlier submit of this run was refused: " + build_error_.message());
  }
  // Reused across submits: a fresh CheckedTask zeroed kilobytes of per-argument
  // arrays on every submit (60 % of submit()'s own time in the dispatch
  // profile). Only the fields of this task's arguments are reset below.
  CheckedTask& t = task_;
  t.id = task_count_;
  t.kind = kind;
  t.blocks = 1;
  t.args = &args;
  t.use_count = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    t.func_id[i] = 0;
    t.fn[i] = nullptr;
    t.name[i] = nullptr;
  }
  if (blocks == 0 || blocks > kMaxBlocks) {
    return refuse(invalid_argument("task {}: block_num = {} is outside [1, {}]", t.id, blocks, kMaxBlocks));
  }
  t.blocks = blocks;
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
    t.name[i] = k->name.c_str();
  }
  if (Status st = args.validate(); !st.ok()) {
    return refuse(Status(st.code(), fmt::format("task {}: {}", t.id, st.message())));
  }
  for (size_t i = 0; i < args.size(); ++i) {  // validate() bounded the count
    t.bases[i] = 0;
    t.base_bytes[i] = 0;
    t.intermediate[i] = Intermediates::kNone;
    t.local[i] = false;
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
      // Host memory running out while pinning is exhaustion, not a bad buffer.
      if (alloc.status().code() == StatusCode::kResourceExhausted) {
        return refuse(Status(StatusCode::kResourceExhausted,
                             fmt::format("task {}: args[{}]: {}", t.id, i, alloc.status().message())));
      }
      return refuse(
          out_of_range("task {}: args[{}]: buffer is not live device memory: {}", t.id, i, alloc.status().message()));
    }
    t.bases[i] = alloc->allocation.addr;
    t.base_bytes[i] = alloc->allocation.bytes;
    t.intermediate[i] = alloc->intermediate;
    if (auto made = made_in_manual_.find(alloc->intermediate); made != made_in_manual_.end()) {
      if (made->second != manual_serial_) {
        return refuse(failed_precondition(
            "task {}: args[{}]: the intermediate was made in a manual scope that has ended", t.id, i));
      }
      t.local[i] = true;
    }
  }
  if (Status st = reserve(t.id, tensors); !st.ok()) return refuse(st);

  TaskRef ref;
  ref.id = t.id;
  // Not zeroed: only the first created_count entries are read, and a
  // zeroing rep stos was a third of submit()'s own time in the dispatch profile.
  std::array<uint32_t, kMaxTaskArgs> created;
  uint32_t created_count = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor || a.tensor.buffer().bound()) continue;
    const uint64_t bytes =
        std::max<uint64_t>(static_cast<uint64_t>(a.tensor.numel()) * dtype_size(a.tensor.dtype()), 1);
    auto idx = allocations_.create(api_, bytes);
    if (!idx.ok()) {
      while (created_count != 0) allocations_.discard(created[--created_count]);
      return refuse(Status(idx.status().code(), fmt::format("task {}: args[{}]: {}", t.id, i, idx.status().message())));
    }
    created[created_count++] = *idx;
    t.intermediate[i] = *idx;
    t.local[i] = manual_serial_ != 0;
    std::vector<int64_t> shape(a.tensor.ndim());
    for (int d = 0; d < a.tensor.ndim(); ++d) shape[d] = a.tensor.shape(d);
    t.views[i] = TensorView(DeviceBuffer{allocations_.addr(*idx), bytes}, shape, a.tensor.dtype());
    t.bases[i] = allocations_.addr(*idx);
    t.base_bytes[i] = bytes;
    ref.outputs.push_back(t.views[i]);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != TaskArg::Kind::Tensor) continue;
    const uint32_t im = t.intermediate[i];
    if (im == Intermediates::kNone) continue;
    if (std::find(t.uses.begin(), t.uses.begin() + t.use_count, im) != t.uses.begin() + t.use_count) continue;
    t.uses[t.use_count++] = im;
    allocations_.add_user(im);
  }
  for (uint32_t k = 0; k < created_count; ++k) note_made(created[k]);
  t.deps = deps_.data();
  t.dep_count = static_cast<uint32_t>(deps_.size());
  // Before place(), which may hand the task to the AICPU threads.
  if (trace_.capture != nullptr) trace_.capture->add_task(t.id, t.func_id[0], args, t.views.data());
  place(t);
  deps_.clear();
  task_count_ = t.id + 1;
  if (trace_.level >= 4) {
    trace_.orchestrator->record(
        diag::Event{trace_.run, submit_begin, now_ns(), t.name[0], t.id, t.func_id[0], diag::EventKind::kSubmit});
  }
  return ref;
}

}  // namespace simpler
