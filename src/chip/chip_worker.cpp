#include "chip/chip_worker.h"

#include <cstring>

#include "base/errors.h"
#include "task/args_blob.h"

namespace simpler {

Result<std::unique_ptr<ChipWorker>> ChipWorker::create(const WorkerConfig& config,
                                                       std::vector<ChipCallable> callables) {
  auto arena = RunResourceArena::create(config.pipeline_depth);
  if (!arena.ok()) return arena.status();
  std::unique_ptr<ChipWorker> w(new ChipWorker(config, std::move(callables)));
  w->arena_ = std::make_unique<RunResourceArena>(std::move(arena).value());
  auto device = SimDevice::create(config.geometry, config.device_memory_bytes);
  if (!device.ok()) return device.status();
  w->device_ = std::move(device).value();
  ChipWorker* self = w.get();
  auto rt = hbg::HbgRuntime::create(*w->device_, config.pipeline_depth, config.max_tasks_per_run,
                                    [self](uint32_t slot, hbg::RunOutcome out) { self->on_run_done(slot, std::move(out)); });
  if (!rt.ok()) return rt.status();
  w->runtime_ = std::move(rt).value();
  w->slot_runs_.resize(config.pipeline_depth);
  w->device_->start(w->runtime_.get());
  return w;
}

ChipWorker::ChipWorker(const WorkerConfig& config, std::vector<ChipCallable> callables)
    : config_(config), callables_(std::move(callables)) {}

ChipWorker::~ChipWorker() { (void)close(std::chrono::milliseconds(60'000)); }

Status ChipWorker::check_buffer(const DeviceBuffer& b, uint64_t offset, uint64_t bytes, const char* what) const {
  if (!b.bound()) return invalid_argument("{}: buffer has no device address", what);
  const uint64_t size = device_->memory().allocation_size(b.addr);
  if (size == 0) return invalid_argument("{}: addr {:#x} is not a live device allocation", what, b.addr);
  if (b.bytes > size) return out_of_range("{}: buffer claims {} bytes, its allocation has {}", what, b.bytes, size);
  if (offset > b.bytes || bytes > b.bytes - offset) {
    return out_of_range("{}: range [{}, {}) is outside the buffer's {} bytes", what, offset, offset + bytes, b.bytes);
  }
  return Status();
}

Result<DeviceBuffer> ChipWorker::malloc(uint64_t bytes) {
  auto addr = device_->memory().allocate(bytes);
  if (!addr.ok()) return addr.status();
  return DeviceBuffer{*addr, bytes};
}

Status ChipWorker::free(DeviceBuffer buffer) {
  SIMPLER_RETURN_IF_ERROR(check_buffer(buffer, 0, 0, "free"));
  return device_->memory().free(buffer.addr);
}

Status ChipWorker::copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset) {
  if (src == nullptr && bytes != 0) return invalid_argument("copy_to: src is null");
  SIMPLER_RETURN_IF_ERROR(check_buffer(dst, dst_offset, bytes, "copy_to dst"));
  std::memcpy(reinterpret_cast<void*>(dst.addr + dst_offset), src, bytes);
  return Status();
}

Status ChipWorker::copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset) {
  if (dst == nullptr && bytes != 0) return invalid_argument("copy_from: dst is null");
  SIMPLER_RETURN_IF_ERROR(check_buffer(src, src_offset, bytes, "copy_from src"));
  std::memcpy(dst, reinterpret_cast<const void*>(src.addr + src_offset), bytes);
  return Status();
}

MemoryInfo ChipWorker::memory_info() const {
  return MemoryInfo{device_->memory().total_bytes(), device_->memory().free_bytes()};
}

Status ChipWorker::check_signature(const ChipCallable& c, const TaskArgs& args) const {
  const auto& sig = c.signature();
  if (args.size() != sig.size()) {
    return invalid_argument("args: callable '{}' takes {} arguments, {} given", c.name(), sig.size(), args.size());
  }
  for (size_t i = 0; i < sig.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != sig[i].kind) {
      return invalid_argument("args[{}]: callable '{}' expects a {}, got a {}", i, c.name(),
                              sig[i].kind == TaskArg::Kind::Tensor ? "tensor" : "scalar",
                              a.kind == TaskArg::Kind::Tensor ? "tensor" : "scalar");
    }
    if (a.kind != TaskArg::Kind::Tensor) continue;
    const bool out_ok = sig[i].tag == Tag::OutputExisting && (a.tag == Tag::Output || a.tag == Tag::OutputExisting);
    if (a.tag != sig[i].tag && !out_ok) {
      return invalid_argument("args[{}]: callable '{}' expects direction {}, got {}", i, c.name(),
                              tag_name(sig[i].tag), tag_name(a.tag));
    }
    SIMPLER_RETURN_IF_ERROR(check_buffer(a.tensor.buffer(), 0, a.tensor.buffer().bytes,
                                         fmt::format("args[{}]", i).c_str()));
  }
  return Status();
}

Result<Lease> ChipWorker::acquire_set() {
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return failed_precondition("worker is closing");
    if (auto lease = arena_->try_acquire()) return *lease;
    spin_then_park(
        slot_bell_,
        [&] { return arena_->counts().free != 0 || closing_.load(std::memory_order_acquire); },
        SpinPolicy{});
  }
}

void ChipWorker::release_set(const Lease& lease) {
  (void)arena_->release(lease);
  slot_bell_.ring();
}

RunHandle ChipWorker::submit(uint32_t callable, const TaskArgs& args) {
  const uint64_t run_id = next_run_id_.fetch_add(1, std::memory_order_relaxed);
  if (closing_.load(std::memory_order_acquire)) return detail::refused_run(run_id, failed_precondition("worker is closed"));
  if (callable >= callables_.size()) {
    return detail::refused_run(run_id, not_found("callable id {} is not registered", callable));
  }
  const ChipCallable& c = callables_[callable];
  if (Status st = args.validate(); !st.ok()) return detail::refused_run(run_id, st);
  if (Status st = check_signature(c, args); !st.ok()) return detail::refused_run(run_id, st);

  auto lease = acquire_set();
  if (!lease.ok()) return detail::refused_run(run_id, lease.status());
  const uint32_t slot = lease->slot;
  SlotRun& sr = slot_runs_[slot];
  sr.lease = *lease;
  // The runtime sees the arguments only through their encoded form, the same
  // bytes that will cross a mailbox at the node level.
  if (Status st = encode_args_blob(args, sr.blob); !st.ok()) {
    release_set(*lease);
    return detail::refused_run(run_id, st);
  }
  auto decoded = decode_args_blob(sr.blob.data(), sr.blob.size());
  if (!decoded.ok()) {
    release_set(*lease);
    return detail::refused_run(run_id, decoded.status());
  }
  const uint64_t t0 = now_ns();
  if (Status st = runtime_->build(slot, c, *decoded); !st.ok()) {
    release_set(*lease);
    return detail::refused_run(run_id, st);
  }
  auto state = std::make_shared<detail::RunState>(run_id);
  sr.state = state;
  sr.stats = RunStats{};
  sr.stats.build_us = static_cast<double>(now_ns() - t0) / 1e3;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  runtime_->launch(slot);
  return RunHandle(std::move(state));
}

void ChipWorker::on_run_done(uint32_t slot, hbg::RunOutcome out) {
  SlotRun& sr = slot_runs_[slot];
  // Everything the completion needs is copied out before the set is released:
  // the next submitter may reuse `sr` at once.
  const Lease lease = sr.lease;
  std::shared_ptr<detail::RunState> state = std::move(sr.state);
  RunStats stats = sr.stats;
  stats.tasks = out.tasks;
  stats.executed = out.executed;
  stats.released_early = out.released_early;
  stats.device_us = static_cast<double>(out.end_ns - out.launch_ns) / 1e3;
  release_set(lease);
  state->complete(std::move(out.status), stats);
  if (in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1) slot_bell_.ring();
}

Status ChipWorker::close(std::chrono::milliseconds drain_timeout) {
  if (device_ == nullptr) return Status();
  closing_.store(true, std::memory_order_release);
  slot_bell_.ring();
  const uint64_t deadline = now_ns() + static_cast<uint64_t>(drain_timeout.count()) * 1'000'000ull;
  const bool drained = spin_then_park(
      slot_bell_, [&] { return in_flight_.load(std::memory_order_acquire) == 0; }, SpinPolicy{}, deadline);
  if (!drained) {
    // Device threads may still write device memory and the slots: never free
    // what they can reach. Abandon the device and the runtime on purpose.
    const uint32_t left = in_flight_.load();
    (void)device_.release();
    (void)runtime_.release();
    return make_error(StatusCode::kDeadlineExceeded,
                      "close: {} runs still on the device after {} ms; the device was abandoned (leaked)", left,
                      drain_timeout.count());
  }
  device_->stop();
  runtime_.reset();
  device_.reset();
  return Status();
}

}  // namespace simpler
