#include "diag/arg_capture.h"

namespace simpler {

ArgCapture::ArgCapture(ArgsDumpCollector& collector, uint32_t capacity, uint64_t run_epoch)
    : collector_(collector), run_epoch_(run_epoch), tasks_(capacity) {}

void ArgCapture::add_task(uint64_t task, uint32_t func_id, const TaskArgs& args, const TensorView* views) {
  Task& t = tasks_[task % tasks_.size()];
  t.id = task;
  t.func_id = func_id;
  t.args.clear();
  const DumpSelection sel = collector_.selection();
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor || a.tag == Tag::NoDep) continue;
    if (sel == DumpSelection::kPartial && !a.dump) continue;
    const DumpRole role = a.tag == Tag::Input   ? DumpRole::kInput
                          : a.tag == Tag::InOut ? DumpRole::kInOut
                                                : DumpRole::kOutput;
    t.args.push_back({views[i], static_cast<uint16_t>(i), role, sel == DumpSelection::kFull || a.dump});
  }
}

void ArgCapture::before(uint32_t aicpu, uint64_t task) {
  capture(aicpu, tasks_[task % tasks_.size()], DumpStage::kBefore);
}

void ArgCapture::after(uint32_t aicpu, uint64_t task) {
  capture(aicpu, tasks_[task % tasks_.size()], DumpStage::kAfter);
}

void ArgCapture::fill(const Task& t, const Arg& a, DumpStage stage, DumpRecord& r) const {
  r.run_epoch = run_epoch_;
  r.task_id = t.id;
  r.func_id = t.func_id;
  r.arg_index = a.index;
  r.role = static_cast<uint8_t>(a.role);
  r.stage = static_cast<uint8_t>(stage);
  r.dtype = static_cast<uint8_t>(a.view.dtype());
  r.ndim = static_cast<uint8_t>(a.view.ndim());
  r.offset = a.view.offset();
  for (int d = 0; d < a.view.ndim(); ++d) {
    r.shape[d] = a.view.shape(d);
    r.stride[d] = a.view.stride(d);
  }
  r.device_addr = a.view.buffer().addr;
  r.logical_bytes = static_cast<uint64_t>(a.view.numel()) * dtype_size(a.view.dtype());
  if (!a.bytes) r.flags |= DumpRecord::kMetadataOnly;
}

namespace {
bool wanted_at(DumpRole role, DumpStage stage) {
  return stage == DumpStage::kBefore ? role != DumpRole::kOutput : role != DumpRole::kInput;
}
}  // namespace

bool ArgCapture::stage_arg(uint64_t task, DumpStage stage, uint64_t k, DumpRecord& r, DumpSource& src,
                           bool& bytes) const {
  const Task& t = tasks_[task % tasks_.size()];
  if (t.id != task) return false;
  for (const Arg& a : t.args) {
    if (!wanted_at(a.role, stage)) continue;
    if (k-- != 0) continue;
    r = DumpRecord{};
    fill(t, a, stage, r);
    src = DumpSource{reinterpret_cast<const uint8_t*>(a.view.buffer().addr), a.view};
    bytes = a.bytes;
    return true;
  }
  return false;
}

void ArgCapture::capture(uint32_t aicpu, const Task& t, DumpStage stage) {
  DumpLane& lane = collector_.lane(aicpu);
  for (const Arg& a : t.args) {
    if (!wanted_at(a.role, stage)) continue;
    DumpRecord r;
    r.order = collector_.next_order();
    fill(t, a, stage, r);
    // Device memory is host-mapped on every backend that dumps (checked at prepare).
    const DumpSource src{reinterpret_cast<const uint8_t*>(a.view.buffer().addr), a.view};
    lane.record(r, a.bytes ? &src : nullptr);
  }
}

}  // namespace simpler
