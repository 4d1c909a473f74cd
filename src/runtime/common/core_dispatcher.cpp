#include "runtime/common/core_dispatcher.h"

#include <algorithm>

namespace simpler {

CoreDispatcher::Storage CoreDispatcher::make_storage(size_t capacity_per_queue, uint32_t grant) const {
  Storage s;
  for (auto& ring : s.rings) ring.resize(capacity_per_queue);
  s.traces.resize(grant);
  s.last_done.assign(size_t{grant} * regs_.size(), kNoTask);
  return s;
}

CoreDispatcher::CoreDispatcher(Device& device)
    : device_(device),
      rec_(device.recorder()),
      aic_queue_(0),
      aiv_queue_(0),
      mix_queue_(0),
      inflight_(device.core_count()),
      next_token_(device.core_count(), 0),
      aicpu_(new AicpuState[device.geometry().aicpu_threads]) {
  for (uint32_t c = 0; c < device.core_count(); ++c) regs_.push_back(&device.core_registers(c));
  for (uint32_t c = 0; c < device.geometry().clusters; ++c) aicpu_[device.owner_of_cluster(c)].clusters.push_back(c);
}

void CoreDispatcher::swap_storage(Storage& storage) noexcept {
  for (int k = 0; k < 3; ++k) queues_[k]->swap_storage(storage.rings[k]);
  traces_.swap(storage.traces);
  last_done_.swap(storage.last_done);
}

void CoreDispatcher::reset_last_done(uint32_t slot) {
  std::fill_n(last_done_.begin() + static_cast<ptrdiff_t>(size_t{slot} * regs_.size()), regs_.size(), kNoTask);
}

uint32_t CoreDispatcher::last_done(uint32_t slot, uint32_t* out, uint32_t capacity) const {
  const uint32_t n = std::min<uint32_t>(capacity, static_cast<uint32_t>(regs_.size()));
  std::copy_n(last_done_.begin() + static_cast<ptrdiff_t>(size_t{slot} * regs_.size()), n, out);
  return n;
}

void CoreDispatcher::dispatch(uint32_t aicpu, uint32_t core, ReadyItem item, GraphTask& task, uint32_t sub) {
  const diag::RunTrace& tr = traces_[item.slot];
  const uint64_t begin = tr.level >= 2 ? now_ns() : 0;
  Inflight& f = inflight_[core];
  const uint32_t k = kernel_of(task.kind, sub);
  f.slot = item.slot;
  f.task = item.task;
  f.token = ++next_token_[core];
  f.busy = true;
  f.task_id = task.id;
  f.aicpu = aicpu;
  f.name = task.name[k];
  CoreRegisters& r = *regs_[core];
  r.trace_level = tr.level;
  r.trace_run = tr.run;
  r.fn = task.fn[k];
  r.args = task.args;
  r.label = KernelLabel{task.name[k], task.id, task.func_id[k], task.kind == TaskKind::Mix ? 0 : sub, task.blocks};
  r.task.store((uint64_t{sub} << 32) | f.token, std::memory_order_release);
  r.bell.ring();
  if (tr.level >= 2) {
    // Only the cluster's owning AICPU thread dispatches to its cores.
    rec_->aicpu_lane(device_.owner_of_cluster(core / 3))
        .record(diag::Event{tr.run, begin, now_ns(), f.name, f.task_id, 0, diag::EventKind::kDispatch});
  }
}

}  // namespace simpler
