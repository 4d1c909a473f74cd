#include "runtime/hbg/graph_builder.h"

#include <array>
#include <cstring>

#include "base/errors.h"

namespace simpler::hbg {

Status GraphBuilder::refuse(Status st) {
  if (s_.build_error.ok()) s_.build_error = st;
  return st;
}

Result<TaskRef> GraphBuilder::submit_aiv(uint32_t func_id, const TaskArgs& args) {
  return submit(TaskKind::AIV, &func_id, 1, args);
}
Result<TaskRef> GraphBuilder::submit_aic(uint32_t func_id, const TaskArgs& args) {
  return submit(TaskKind::AIC, &func_id, 1, args);
}
Result<TaskRef> GraphBuilder::submit_mix(const MixKernels& k, const TaskArgs& args) {
  const uint32_t funcs[3] = {k.aic, k.aiv0, k.aiv1};
  return submit(TaskKind::Mix, funcs, 3, args);
}

Result<uint32_t> GraphBuilder::new_intermediate(uint64_t bytes) {
  if (s_.intermediate_count >= rt_.capacity_.tasks * 2) {
    return resource_exhausted("run allocates more than {} intermediate tensors (2 x max_tasks_per_run)",
                              rt_.capacity_.tasks * 2);
  }
  auto addr = s_.api.device_malloc(bytes);
  if (!addr.ok()) return Status(addr.status().code(), "intermediate tensor: " + addr.status().message());
  const uint32_t i = s_.intermediate_count++;
  s_.intermediates[i].addr = *addr;
  s_.intermediates[i].refs.store(1, std::memory_order_relaxed);  // the scope's (or the run's) reference
  s_.intermediate_of[*addr] = i;
  if (!s_.scopes.empty()) s_.scopes.back().push_back(i);
  return i;
}

Result<TensorView> GraphBuilder::alloc(const std::vector<int64_t>& shape, DType dtype) {
  TensorView probe = TensorView::unbound(shape, dtype);
  if (Status st = probe.validate(); !st.ok()) return refuse(Status(st.code(), "alloc: " + st.message()));
  const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(probe.numel()) * dtype_size(dtype), 1);
  auto idx = new_intermediate(bytes);
  if (!idx.ok()) return refuse(idx.status());
  return TensorView(DeviceBuffer{s_.intermediates[*idx].addr, bytes}, shape, dtype);
}

void GraphBuilder::scope_begin() { s_.scopes.emplace_back(); }

Status GraphBuilder::scope_end() {
  if (s_.scopes.empty()) return refuse(failed_precondition("scope_end without a matching scope_begin"));
  for (uint32_t i : s_.scopes.back()) {
    Intermediate& im = s_.intermediates[i];
    // Not launched yet, so no AICPU thread can race this; a zero here means no
    // task ever used the tensor and it can go back at once.
    if (im.refs.fetch_sub(1, std::memory_order_relaxed) == 1) {
      (void)s_.api.device_free(im.addr);
      s_.intermediate_of.erase(im.addr);
      im.addr = 0;
    }
  }
  s_.scopes.pop_back();
  return Status();
}

Result<GlobalMemory::Allocation> GraphBuilder::allocation_of(uint64_t addr, uint64_t bytes) {
  for (const GlobalMemory::Allocation& a : s_.known_allocations) {
    if (a.bytes != 0 && addr >= a.addr && bytes <= a.bytes && addr - a.addr <= a.bytes - bytes) return a;
  }
  auto found = rt_.device_.memory().containing_allocation(addr, bytes);
  if (!found.ok()) return found.status();
  s_.known_allocations[s_.known_next++ % s_.known_allocations.size()] = *found;
  return *found;
}

void GraphBuilder::add_edge(uint32_t from, uint32_t to) {
  if (from == to || s_.pred_mark[from] == to + 1) return;
  s_.pred_mark[from] = to + 1;
  s_.edges.emplace_back(from, to);
}

void GraphBuilder::add_dependencies(uint32_t task, const TensorView& view, Tag tag, uint64_t base) {
  const uint64_t shift = view.buffer().addr - base;
  s_.accesses->add(base, view, shift + view.first_byte(), shift + view.end_byte(), task, tag_writes(tag),
                   [&](uint32_t earlier) { add_edge(earlier, task); });
}

Result<TaskRef> GraphBuilder::submit(TaskKind kind, const uint32_t* funcs, uint32_t nfuncs, const TaskArgs& args) {
  if (!s_.build_error.ok()) {
    return Status(StatusCode::kAborted, "an earlier submit of this run was refused: " + s_.build_error.message());
  }
  const ChipCallable& c = *s_.callable;
  const uint32_t t = s_.task_count;
  if (t >= rt_.capacity_.tasks) {
    return refuse(resource_exhausted("graph capacity: the run has more than max_tasks_per_run = {} tasks",
                                     rt_.capacity_.tasks));
  }
  simpler_kernel_fn fns[3] = {};
  for (uint32_t i = 0; i < nfuncs; ++i) {
    const CoreType want = (kind == TaskKind::AIC || (kind == TaskKind::Mix && i == 0)) ? CoreType::AIC : CoreType::AIV;
    const KernelInfo* k = c.kernels().find(funcs[i]);
    if (k == nullptr) return refuse(not_found("func_id {} has no kernel in callable '{}'", funcs[i], c.name()));
    if (k->core != want) {
      return refuse(invalid_argument("func_id {} is an {} kernel but was submitted to an {} core", funcs[i],
                                     core_type_name(k->core), core_type_name(want)));
    }
    fns[i] = k->fn;
  }
  if (Status st = args.validate(); !st.ok()) return refuse(Status(st.code(), fmt::format("task {}: {}", t, st.message())));
  uint32_t ntensors = 0;
  uint64_t bases[kMaxTaskArgs] = {};
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != TaskArg::Kind::Tensor) continue;
    ++ntensors;
    const DeviceBuffer& b = args[i].tensor.buffer();
    if (b.bound()) {
      auto alloc = allocation_of(b.addr, b.bytes);
      if (!alloc.ok()) {
        return refuse(out_of_range("task {}: args[{}]: buffer is not live device memory: {}", t, i,
                                   alloc.status().message()));
      }
      bases[i] = alloc->addr;
    }
  }
  if (s_.desc_count + ntensors > rt_.capacity_.descriptors) {
    return refuse(resource_exhausted("graph capacity: the run has more than {} tensor arguments",
                                     rt_.capacity_.descriptors));
  }

  TaskRef ref;
  ref.id = t;
  // Views of the outputs allocated below; every other argument is used as given.
  std::array<TensorView, kMaxTaskArgs> bound;
  uint32_t allocated = 0;  // bit i: args[i] was an unbound output, now bound[i]
  const uint32_t first_new = s_.intermediate_count;
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor || a.tensor.buffer().bound()) continue;
    const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(a.tensor.numel()) * dtype_size(a.tensor.dtype()), 1);
    auto idx = new_intermediate(bytes);
    if (!idx.ok()) {
      // Hand back what this refused submit allocated; nothing else changed yet.
      for (uint32_t j = first_new; j < s_.intermediate_count; ++j) {
        (void)s_.api.device_free(s_.intermediates[j].addr);
        s_.intermediate_of.erase(s_.intermediates[j].addr);
        if (!s_.scopes.empty()) s_.scopes.back().pop_back();
      }
      s_.intermediate_count = first_new;
      return refuse(Status(idx.status().code(), fmt::format("task {}: args[{}]: {}", t, i, idx.status().message())));
    }
    std::vector<int64_t> shape(a.tensor.ndim());
    for (int d = 0; d < a.tensor.ndim(); ++d) shape[d] = a.tensor.shape(d);
    bound[i] = TensorView(DeviceBuffer{s_.intermediates[*idx].addr, bytes}, shape, a.tensor.dtype());
    allocated |= 1u << i;
    bases[i] = s_.intermediates[*idx].addr;
  }
  if (allocated != 0) {
    for (size_t i = 0; i < args.size(); ++i) {
      if (allocated & (1u << i)) ref.outputs.push_back(bound[i]);
    }
  }

  Task& task = s_.tasks[t];
  task.kind = kind;
  task.nargs = static_cast<uint8_t>(args.size());
  for (uint32_t i = 0; i < 3; ++i) {
    task.func_id[i] = i < nfuncs ? funcs[i] : 0;
    task.fn[i] = fns[i];
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind == TaskArg::Kind::Scalar) {
      task.args[i] = static_cast<int64_t>(a.scalar);
      continue;
    }
    const TensorView& v = (allocated & (1u << i)) ? bound[i] : a.tensor;
    DeviceTensor& d = s_.descriptors[s_.desc_count++];
    d.data = v.buffer().addr + static_cast<uint64_t>(v.offset()) * dtype_size(v.dtype());
    d.dtype = static_cast<uint32_t>(v.dtype());
    d.ndim = static_cast<uint32_t>(v.ndim());
    for (int k = 0; k < kMaxDims; ++k) {
      d.shape[k] = k < v.ndim() ? v.shape(k) : 0;
      d.stride[k] = k < v.ndim() ? v.stride(k) : 0;
    }
    task.args[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&d));
    if (a.tag != Tag::NoDep) add_dependencies(t, v, a.tag, bases[i]);
    if (s_.intermediate_count == 0) continue;
    auto im = s_.intermediate_of.find(bases[i]);
    if (im != s_.intermediate_of.end()) {
      bool seen = false;
      for (size_t j = s_.use_pairs.size(); j > 0 && s_.use_pairs[j - 1].first == t; --j) {
        seen = seen || s_.use_pairs[j - 1].second == im->second;
      }
      if (!seen) {
        s_.use_pairs.emplace_back(t, im->second);
        s_.intermediates[im->second].refs.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  s_.task_count = t + 1;
  return ref;
}

}  // namespace simpler::hbg
