#include "ipc/chip_child_handler.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "base/errors.h"
#include "chip/native_run.h"
#include "diag/call_config.h"
#include "task/args_blob.h"
#include "task/byte_runs.h"

namespace simpler {

void ChipChildHandler::StorageDeleter::operator()(unsigned char* p) const {
  ::operator delete (p, std::align_val_t{native_run_storage_alignment()});
}

namespace {
// The node parent times a chip child's runs out itself and kills a child that
// hangs; the chip's own watchdog would only race it.
WorkerConfig child_chip_config(WorkerConfig config) {
  config.run_timeout = std::chrono::milliseconds(0);
  return config;
}
}  // namespace

ChipChildHandler::ChipChildHandler(WorkerConfig config, std::vector<ChipCallable> callables, HostRanges shared,
                                   uint64_t inline_budget_ns)
    : config_(child_chip_config(std::move(config))),
      callables_(std::move(callables)),
      heap_(std::move(shared)),
      budget_(callables_.size(), inline_budget_ns),
      preparer_("chip child", SpinPolicy{}, [this](RunRequest& request, const RunTicket& ticket) {
        (void)prepare(request, ticket, /*wait=*/true);
      }) {}

ChipChildHandler::~ChipChildHandler() { drain(now_ns() + 5'000'000'000ull); }

Status ChipChildHandler::init() {
  SIMPLER_ASSIGN_OR_RETURN(worker_, ChipWorker::create(config_, callables_));
  worker_->set_done_bell(loop_bell_);
  for (uint32_t s = 0; s < worker_->grant(); ++s) {
    auto* p = static_cast<unsigned char*>(
        ::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}));
    std::memset(p, 0, native_run_storage_size());
    storage_.emplace_back(p);
  }
  launch_depth_ = worker_->launch_depth();
  preparer_.init();
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
  const bool staged = request.staged;
  if (staged) {
    // Recorded before the preparer can see the request: it routes a staged
    // run by this record.
    std::lock_guard<std::mutex> lock(mu_);
    staged_[ticket.entry_index()] = StagedRun{ticket.generation(), std::nullopt, -1};
  }
  if (preparer_.start(std::move(request), ticket) || !staged) return;
  std::lock_guard<std::mutex> lock(mu_);  // refused while draining: its ticket has its terminal
  auto it = staged_.find(ticket.entry_index());
  if (it != staged_.end() && it->second.generation == ticket.generation()) staged_.erase(it);
}

bool ChipChildHandler::try_run_inline(const RunRequest& request, const RunTicket& ticket, bool /*loop_quiet*/) {
  const Result<uint32_t> k = callable_for(request.callable);
  if (!k.ok() || !budget_.is_short(*k)) return false;
  return preparer_.try_run_inline([&] { return prepare(request, ticket, /*wait=*/false); });
}

void ChipChildHandler::fail(const RunTicket& ticket, const Status& st, MailboxDisposition d) {
  {
    // A staged run that ends here will never launch: a later activation of
    // this occupant finds nothing to do.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = staged_.find(ticket.entry_index());
    if (it != staged_.end() && it->second.generation == ticket.generation()) staged_.erase(it);
  }
  ticket.complete(st, d);
  preparer_.finished();
  exit_if_faulted();
}

void ChipChildHandler::exit_if_faulted() {
  if (worker_->health().code() != StatusCode::kDeviceFault || !preparer_.idle()) return;
  // Every terminal is stored; requests the serve loop has not started yet are
  // ended by the parent with the cause this code names. Nothing is destroyed:
  // the device is gone with the process.
  _exit(kChildExitDeviceFault);
}

void ChipChildHandler::cancel(Prepared& run, const Status& why) {
  (void)worker_->finalize(run.storage, run.epoch);  // aborts the prepared run and frees its set
  unstage(run.staged);
  fail(run.ticket, why, kDispositionNativePrepared);
  set_bell_.ring();
}

void ChipChildHandler::activate(uint32_t entry_index, uint64_t generation, bool launch) {
  std::optional<Prepared> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = staged_.find(entry_index);
    if (it == staged_.end() || it->second.generation != generation) return;  // it already ended
    if (!it->second.prepared) {
      it->second.activation = launch ? 1 : 0;  // the preparer routes it when it is prepared
      return;
    }
    Prepared p = std::move(*it->second.prepared);
    staged_.erase(it);
    if (launch) {
      to_launch_.push_back(std::move(p));
    } else {
      cancelled.emplace(std::move(p));
    }
  }
  if (cancelled) {
    cancel(*cancelled, make_error(StatusCode::kAborted, "cancelled before activation"));
  } else {
    launch_bell_.ring();
  }
}

Status ChipChildHandler::map_in(TaskArgs& args, std::vector<Staged>& staged) {
  for (size_t i = 0; i < args.size(); ++i) {
    TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    const DeviceBuffer host = a.tensor.buffer();
    if (!heap_.overlaps(host.addr, host.bytes)) continue;
    if (!heap_.contains(host.addr, host.bytes)) {
      return out_of_range("argument {}: buffer {:#x}+{} straddles the end of a shared heap", i, host.addr, host.bytes);
    }
    auto it = std::find_if(staged.begin(), staged.end(), [&](const Staged& s) { return s.host_addr == host.addr; });
    if (it == staged.end()) {
      SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer dev, worker_->malloc(host.bytes));
      staged.push_back(Staged{dev, host.addr, {}, {}});
      it = staged.end() - 1;
    }
    it->views.push_back(a.tensor);
    if (tag_writes(a.tag)) it->writes.push_back(a.tensor);
    int64_t shape[kMaxDims], stride[kMaxDims];
    for (int d = 0; d < a.tensor.ndim(); ++d) {
      shape[d] = a.tensor.shape(d);
      stride[d] = a.tensor.stride(d);
    }
    a.tensor = TensorView::from_parts(it->device, a.tensor.dtype(), a.tensor.ndim(), shape, stride, a.tensor.offset());
  }
  return Status();
}

Status ChipChildHandler::copy_in(const std::vector<Staged>& staged) {
  // Every element the run reads or writes: a partially written output keeps
  // the bytes it does not write, because exactly the written elements go back.
  (void)staged_out_.load(std::memory_order_acquire);
  for (const Staged& s : staged) {
    for (const TensorView& v : s.views) {
      SIMPLER_RETURN_IF_ERROR(for_each_byte_run(v, [&](uint64_t at, uint64_t bytes) {
        return worker_->copy_to(s.device, reinterpret_cast<const void*>(s.host_addr + at), bytes, at);
      }));
    }
  }
  return Status();
}

Status ChipChildHandler::stage_out(const std::vector<Staged>& staged) {
  // Exactly the written elements: copying the span back would put this run's
  // stale copy of bytes between its outputs over what a task beside it, writing
  // a disjoint part of the same buffer, has written meanwhile.
  Status st;
  for (const Staged& s : staged) {
    for (const TensorView& w : s.writes) {
      if (!st.ok()) break;
      st = for_each_byte_run(w, [&](uint64_t at, uint64_t bytes) {
        return worker_->copy_from(reinterpret_cast<void*>(s.host_addr + at), s.device, bytes, at);
      });
    }
  }
  // A failed stage-out wrote some bytes too.
  staged_out_.fetch_add(1, std::memory_order_release);
  return st;
}

void ChipChildHandler::unstage(std::vector<Staged>& staged) {
  for (const Staged& s : staged) (void)worker_->free(s.device);
  staged.clear();
}

Result<RunConfig> ChipChildHandler::diagnostics_of(const RunRequest& req) {
  SIMPLER_ASSIGN_OR_RETURN(const diag::ChildCallConfig c,
                           diag::decode_call_config(req.config.data(), req.config.size()), "chip task {}",
                           req.task_slot);
  RunConfig config;
  if (c.call.swimlane_level == 0 && c.call.dump_args == DumpArgs::Off) return config;
  // The node's run directory, then this chip's part of it: one directory per
  // (chip, node task), which the node merges (trace) or leaves (dumps).
  config.call = c.call;
  config.call.trace_dir = diag::child_trace_dir(c.call.trace_dir, "chip", c.child_index, req.task_slot);
  config.trace_label = fmt::format("chip{}", c.child_index);
  config.diagnostic = true;
  return config;
}

bool ChipChildHandler::prepare(const RunRequest& req, const RunTicket& ticket, bool wait) {
  const uint64_t t0 = now_ns();
  auto callable = callable_for(req.callable);
  if (!callable.ok()) {
    fail(ticket, callable.status(), kDispositionNone);
    return true;
  }
  auto args = decode_args_blob(req.args_blob.data(), req.args_blob.size());
  if (!args.ok()) {
    fail(ticket, args.status(), kDispositionNone);
    return true;
  }
  auto run_config = diagnostics_of(req);
  if (!run_config.ok()) {
    fail(ticket, run_config.status(), kDispositionNone);
    return true;
  }
  // A diagnostic run may wait for a terminal bank at launch (R65): never on
  // the serve loop, and never launched by its preparer.
  const bool diagnostic = run_config->diagnostic;
  if (!wait && diagnostic) return false;
  // The parent may hand a run over before a set is free (the K extra
  // entries): wait for the completer to release one.
  std::optional<Lease> lease = worker_->try_acquire_lease();
  if (!wait) {
    if (!lease) return false;
    // Counted before the run can reach its terminal, so a test that saw it sees the count.
    prepared_inline_.fetch_add(1, std::memory_order_relaxed);
  }
  spin_then_park(
      set_bell_,
      [&] {
        if (!lease) lease = worker_->try_acquire_lease();
        return lease.has_value();
      },
      SpinPolicy{});
  ticket.hold_set(lease->slot);
  std::vector<Staged> staged;
  Status mapped = map_in(*args, staged);
  if (mapped.ok() && !req.staged) mapped = copy_in(staged);
  if (Status st = mapped; !st.ok()) {
    unstage(staged);
    worker_->release_lease(*lease);
    fail(ticket, st, kDispositionValidatedOnly);
    return true;
  }
  void* storage = storage_[lease->slot].get();
  NativeRunDescriptor desc;
  desc.lease = *lease;
  desc.arena_bank = lease->slot;
  auto epoch = worker_->prepare(storage, native_run_storage_size(), desc, *callable, *args, std::move(*run_config));
  if (!epoch.ok()) {
    unstage(staged);
    worker_->release_lease(*lease);
    fail(ticket, epoch.status(), kDispositionValidatedOnly);
    return true;
  }
  uint64_t staged_bytes = 0;
  for (const Staged& st : staged) staged_bytes += st.device.bytes;
  Prepared p{storage,
             *epoch,
             ticket,
             std::move(staged),
             req.staged,
             /*light=*/!diagnostic && staged_bytes <= kLightStagedBytes};
  std::optional<Prepared> cancelled;
  bool launch_here = false;
  bool held = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = req.staged ? staged_.find(ticket.entry_index()) : staged_.end();
    if (!req.staged) {
      // Nothing prepared earlier is waiting or being launched: launching
      // here keeps the order and spares the launcher's wake-up.
      launch_here = !diagnostic && to_launch_.empty() && !launching_ && launched_ < launch_depth_;
      if (launch_here) {
        launching_ = true;
        ++launched_;
      } else {
        to_launch_.push_back(std::move(p));
      }
    } else if (it == staged_.end() || it->second.generation != ticket.generation() || it->second.activation == 0) {
      if (it != staged_.end() && it->second.generation == ticket.generation()) staged_.erase(it);
      cancelled.emplace(std::move(p));
    } else if (it->second.activation == 1) {
      staged_.erase(it);
      to_launch_.push_back(std::move(p));
    } else {
      it->second.prepared.emplace(std::move(p));  // held, prepared, until activate()
      held = true;
    }
  }
  if (cancelled) {
    cancel(*cancelled, make_error(StatusCode::kAborted, "cancelled before activation"));
  } else if (launch_here) {
    launched_by_preparer_.fetch_add(1, std::memory_order_relaxed);
    launch(std::move(p));
  } else if (!held) {
    launch_bell_.ring();
  }
  budget_.record(*callable, t0);
  return true;
}

void ChipChildHandler::launch(Prepared run) {
  Status st = run.copy_in_pending ? copy_in(run.staged) : Status();
  if (st.ok()) st = worker_->launch(run.storage, run.epoch);
  bool more = false;
  if (!st.ok()) {
    (void)worker_->finalize(run.storage, run.epoch);  // aborts the prepared run and frees its set
    unstage(run.staged);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --launched_;
      launching_ = false;
      more = !to_launch_.empty();
    }
    fail(run.ticket, st, kDispositionNativePrepared);
    set_bell_.ring();
  } else {
    run.ticket.accepted();  // launch() returned: the run passed the real launch marker
    bool wake_completer = false;
    void* const storage = run.storage;
    const uint64_t epoch = run.epoch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake_completer = for_completer(run);
      if (run.light) light_to_finalize_.fetch_add(1, std::memory_order_seq_cst);
      to_finalize_.push_back(std::move(run));
      launching_ = false;
      more = !to_launch_.empty();
    }
    if (wake_completer) {
      finalize_bell_.ring();
    } else if (const Result<PollState> state = worker_->poll(storage, epoch);
               !state.ok() || *state == PollState::Complete) {
      // It ended before it was listed here, so the device's ring may have
      // found nothing for a loop that then parked; one that ends later rings
      // the loop itself. (A run the worker no longer knows is the loop's to
      // report, like one that ended.)
      loop_bell_->ring();
    }
  }
  // Only then: a launcher ringing itself costs nothing, but waking a parked
  // one for nothing costs the system call this path exists to save.
  if (more) launch_bell_.ring();
}

void ChipChildHandler::launcher_main() {
  for (;;) {
    std::optional<Prepared> run;
    spin_then_park(
        launch_bell_,
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          if (launching_) return false;
          return (stopping_ && to_launch_.empty()) || (!to_launch_.empty() && launched_ < launch_depth_);
        },
        SpinPolicy{});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (to_launch_.empty()) return;  // stopping, nothing left
      run.emplace(std::move(to_launch_.front()));
      to_launch_.pop_front();
      ++launched_;
      launching_ = true;
    }
    launch(std::move(*run));
  }
}

void ChipChildHandler::completer_main() {
  for (;;) {
    spin_then_park(
        finalize_bell_,
        [&] {
          {
            std::lock_guard<std::mutex> lock(mu_);
            for (const Prepared& p : to_finalize_) {
              if (for_completer(p)) return true;
            }
            if (!stopping_) return false;
          }
          return preparer_.idle();
        },
        SpinPolicy{});
    std::optional<Prepared> run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(to_finalize_.begin(), to_finalize_.end(),
                             [this](const Prepared& p) { return for_completer(p); });
      if (it == to_finalize_.end()) return;  // stopping and idle
      if (it->light) light_to_finalize_.fetch_sub(1, std::memory_order_relaxed);
      run.emplace(std::move(*it));
      to_finalize_.erase(it);
    }
    finish(std::move(*run));
  }
}

void ChipChildHandler::finish(Prepared run) {
  Status st = worker_->finalize(run.storage, run.epoch);
  if (st.ok()) st = stage_out(run.staged);
  unstage(run.staged);
  run.ticket.complete(st, kDispositionNativePrepared);
  set_bell_.ring();  // a set was released
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --launched_;  // only now: the entry read LAUNCHED until the terminal above
    waiting = !to_launch_.empty();
  }
  preparer_.finished();
  // Only a run waiting for the slot just freed needs the launcher: waking
  // it for nothing after every run costs a system call and a switch.
  if (waiting) launch_bell_.ring();
  exit_if_faulted();
}

bool ChipChildHandler::attach_loop_bell(Doorbell& bell) {
  loop_bell_ = &bell;
  loop_serves_ = true;  // no thread of this handler runs yet
  return true;
}

bool ChipChildHandler::poll() {
  loop_polls_.store(loop_polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (light_to_finalize_.load(std::memory_order_acquire) == 0) return false;
  std::optional<Prepared> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The oldest light run: the completer takes none.
    auto it = std::find_if(to_finalize_.begin(), to_finalize_.end(), [](const Prepared& p) { return p.light; });
    if (it == to_finalize_.end()) return false;
    // A run the worker no longer knows is finalized all the same, which
    // reports why as its terminal.
    const Result<PollState> state = worker_->poll(it->storage, it->epoch);
    if (state.ok() && *state != PollState::Complete) return false;
    light_to_finalize_.fetch_sub(1, std::memory_order_relaxed);
    run.emplace(std::move(*it));
    to_finalize_.erase(it);
  }
  finalized_on_loop_.fetch_add(1, std::memory_order_relaxed);
  finish(std::move(*run));
  return true;
}

void ChipChildHandler::drain(uint64_t deadline_ns) {
  if (!launcher_.joinable()) return;
  {
    // The loop looks no more: a light run still on the device is the completer's.
    std::lock_guard<std::mutex> lock(mu_);
    loop_serves_ = false;
  }
  draining_.store(true, std::memory_order_release);
  finalize_bell_.ring();
  const bool idle = preparer_.drain(deadline_ns);
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
      SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer b, worker_->malloc(cmd.args[0]));
      buffers_[b.addr] = b;
      reply.value = b.addr;
      return reply;
    }
    case kCtrlFree: {
      SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer b, buffer_at(cmd.args[0]));
      buffers_.erase(b.addr);
      SIMPLER_RETURN_IF_ERROR(worker_->free(b));
      return reply;
    }
    case kCtrlCopyTo: {
      SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer b, buffer_at(cmd.args[0]));
      if (cmd.args[2] != in_bytes) return invalid_argument("copy_to of {} B carries {} B", cmd.args[2], in_bytes);
      SIMPLER_RETURN_IF_ERROR(worker_->copy_to(b, data, in_bytes, cmd.args[1]));
      return reply;
    }
    case kCtrlCopyFrom: {
      SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer b, buffer_at(cmd.args[0]));
      if (cmd.args[2] > capacity) return invalid_argument("copy_from of {} B exceeds {} B", cmd.args[2], capacity);
      SIMPLER_RETURN_IF_ERROR(worker_->copy_from(data, b, cmd.args[2], cmd.args[1]));
      reply.data_bytes = static_cast<uint32_t>(cmd.args[2]);
      return reply;
    }
    case kCtrlMemoryInfo: {
      const MemoryInfo m = worker_->memory_info();
      return memory_info_reply(m.total_bytes, m.free_bytes, data, capacity);
    }
    default:
      return invalid_argument("unknown control op {}", static_cast<uint32_t>(cmd.op));
  }
}

}  // namespace simpler
