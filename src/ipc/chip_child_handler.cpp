#include "ipc/chip_child_handler.h"

#include <cstring>
#include <new>

#include "base/errors.h"
#include "chip/native_run.h"
#include "task/args_blob.h"

namespace simpler {

void ChipChildHandler::StorageDeleter::operator()(unsigned char* p) const {
  ::operator delete(p, std::align_val_t{native_run_storage_alignment()});
}

ChipChildHandler::ChipChildHandler(WorkerConfig config, std::vector<ChipCallable> callables)
    : config_(config), callables_(std::move(callables)) {}

ChipChildHandler::~ChipChildHandler() { drain(now_ns() + 5'000'000'000ull); }

Status ChipChildHandler::init() {
  auto w = ChipWorker::create(config_, callables_);
  if (!w.ok()) return w.status();
  worker_ = std::move(w).value();
  for (uint32_t s = 0; s < worker_->grant(); ++s) {
    auto* p = static_cast<unsigned char*>(
        ::operator new(native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}));
    std::memset(p, 0, native_run_storage_size());
    storage_.emplace_back(p);
  }
  launcher_ = std::thread([this] { launcher_main(); });
  completer_ = std::thread([this] { completer_main(); });
  return Status();
}

Result<uint32_t> ChipChildHandler::callable_for(const Digest& digest) const {
  for (uint32_t i = 0; i < callables_.size(); ++i) {
    if (callables_[i].digest() == digest) return i;
  }
  return not_found("no chip callable with digest {}", digest_hex(digest));
}

void ChipChildHandler::start(RunRequest request, RunTicket ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ticket.complete(failed_precondition("chip child is draining"));
      return;
    }
    ++in_flight_;
    to_launch_.emplace_back(std::move(request), ticket);
  }
  launch_bell_.ring();
}

void ChipChildHandler::launcher_main() {
  for (;;) {
    std::optional<std::pair<RunRequest, RunTicket>> job;
    spin_then_park(launch_bell_, [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return stopping_ || !to_launch_.empty();
    }, SpinPolicy{});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (to_launch_.empty()) return;  // stopping, nothing left
      job.emplace(std::move(to_launch_.front()));
      to_launch_.pop_front();
    }
    RunRequest& req = job->first;
    const RunTicket& ticket = job->second;
    auto fail = [&](const Status& st, MailboxDisposition d) {
      ticket.complete(st, d);
      std::lock_guard<std::mutex> lock(mu_);
      if (--in_flight_ == 0) idle_bell_.ring();
    };
    auto callable = callable_for(req.callable);
    if (!callable.ok()) {
      fail(callable.status(), kDispositionNone);
      continue;
    }
    auto args = decode_args_blob(req.args_blob.data(), req.args_blob.size());
    if (!args.ok()) {
      fail(args.status(), kDispositionNone);
      continue;
    }
    // The parent may hand a run over before a set is free (the K extra
    // entries): wait for the completer to release one.
    std::optional<Lease> lease;
    spin_then_park(launch_bell_, [&] {
      lease = worker_->try_acquire_lease();
      return lease.has_value();
    }, SpinPolicy{});
    void* storage = storage_[lease->slot].get();
    NativeRunDescriptor desc;
    desc.lease = *lease;
    desc.arena_bank = lease->slot;
    auto epoch = worker_->prepare(storage, native_run_storage_size(), desc, *callable, *args);
    if (!epoch.ok()) {
      worker_->release_lease(*lease);
      fail(epoch.status(), kDispositionValidatedOnly);
      continue;
    }
    if (Status st = worker_->launch(storage, *epoch); !st.ok()) {
      (void)worker_->finalize(storage, *epoch);  // aborts the prepared run and frees its set
      fail(st, kDispositionNativePrepared);
      launch_bell_.ring();
      continue;
    }
    ticket.accepted();  // launch() returned: the run passed the real launch marker
    {
      std::lock_guard<std::mutex> lock(mu_);
      to_finalize_.push_back(Launched{storage, *epoch, ticket});
    }
    finalize_bell_.ring();
  }
}

void ChipChildHandler::completer_main() {
  for (;;) {
    std::optional<Launched> run;
    spin_then_park(finalize_bell_, [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return !to_finalize_.empty() || (stopping_ && in_flight_ == 0);
    }, SpinPolicy{});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (to_finalize_.empty()) return;  // stopping and idle
      run.emplace(to_finalize_.front());
      to_finalize_.pop_front();
    }
    const Status st = worker_->finalize(run->storage, run->epoch);
    run->ticket.complete(st, kDispositionNativePrepared);
    launch_bell_.ring();  // a set was released
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) idle_bell_.ring();
  }
}

void ChipChildHandler::drain(uint64_t deadline_ns) {
  if (!launcher_.joinable()) return;
  const bool idle = spin_then_park(idle_bell_, [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_ == 0;
  }, SpinPolicy{}, deadline_ns);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  launch_bell_.ring();
  finalize_bell_.ring();
  if (!idle) {
    // A run still on the device: its threads may be inside a phase call that
    // does not return, so they are left behind; the child exits after the sweep.
    launcher_.detach();
    completer_.detach();
    return;
  }
  launcher_.join();
  completer_.join();
  (void)worker_->close(std::chrono::milliseconds(1000));
}

Result<DeviceBuffer> ChipChildHandler::buffer_at(uint64_t addr) const {
  auto it = buffers_.find(addr);
  if (it == buffers_.end()) return not_found("no control allocation at {:#x}", addr);
  return it->second;
}

Result<ControlReply> ChipChildHandler::control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes,
                                               uint32_t capacity) {
  ControlReply reply;
  switch (cmd.op) {
    case kCtrlMalloc: {
      auto b = worker_->malloc(cmd.args[0]);
      if (!b.ok()) return b.status();
      buffers_[b->addr] = *b;
      reply.value = b->addr;
      return reply;
    }
    case kCtrlFree: {
      auto b = buffer_at(cmd.args[0]);
      if (!b.ok()) return b.status();
      buffers_.erase(b->addr);
      SIMPLER_RETURN_IF_ERROR(worker_->free(*b));
      return reply;
    }
    case kCtrlCopyTo: {
      auto b = buffer_at(cmd.args[0]);
      if (!b.ok()) return b.status();
      if (cmd.args[2] != in_bytes) return invalid_argument("copy_to of {} B carries {} B", cmd.args[2], in_bytes);
      SIMPLER_RETURN_IF_ERROR(worker_->copy_to(*b, data, in_bytes, cmd.args[1]));
      return reply;
    }
    case kCtrlCopyFrom: {
      auto b = buffer_at(cmd.args[0]);
      if (!b.ok()) return b.status();
      if (cmd.args[2] > capacity) return invalid_argument("copy_from of {} B exceeds {} B", cmd.args[2], capacity);
      SIMPLER_RETURN_IF_ERROR(worker_->copy_from(data, *b, cmd.args[2], cmd.args[1]));
      reply.data_bytes = static_cast<uint32_t>(cmd.args[2]);
      return reply;
    }
    default:
      return invalid_argument("unknown control op {}", static_cast<uint32_t>(cmd.op));
  }
}

}  // namespace simpler
