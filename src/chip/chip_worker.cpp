#include "chip/chip_worker.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include <unistd.h>

#include <fmt/ranges.h>

#include "base/errors.h"
#include "base/leak.h"
#include "base/load_sense.h"
#include "base/user_code.h"
#include "chip/pipeline_contract.h"
#include "device/backend_registry.h"
#include "diag/call_config.h"
#include "diag/chrome_trace.h"
#include "task/args_blob.h"

namespace simpler {

namespace {
// Debug and sanitizer builds check every kernel's writes against its buffers.
#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kGuardDeviceMemoryByDefault = true;
#else
constexpr bool kGuardDeviceMemoryByDefault = false;
#endif
}  // namespace

Status ChipWorker::check_dump_supported(DumpArgs dump, const std::string& runtime) {
  if (dump != DumpArgs::Partial && dump != DumpArgs::Hybrid && dump != DumpArgs::Full) return Status();
  SIMPLER_ASSIGN_OR_RETURN(const RuntimeInfo* info, runtime_named(runtime));
  if (info->captures_args) return Status();
  std::vector<std::string> capturing;
  for (const RuntimeInfo* r : registered_runtimes()) {
    if (r->captures_args) capturing.emplace_back(r->name);
  }
  return make_error(StatusCode::kUnimplemented,
                    "call.dump_args: runtime '{}' does not see task boundaries on its AICPU threads; argument dumps "
                    "run on {}",
                    runtime, fmt::join(capturing, ", "));
}

Result<std::unique_ptr<ChipWorker>> ChipWorker::create(const WorkerConfig& config,
                                                       std::vector<ChipCallable> callables) {
  SIMPLER_RETURN_IF_ERROR(is_valid_pipeline_contract(program_contract(config)));
  SIMPLER_RETURN_IF_ERROR(check_dump_supported(config.call.dump_args, config.runtime));
  if (config.run_timeout.count() < 0) {
    return invalid_argument("run_timeout = {} ms: must be >= 0 (0: no deadline)", config.run_timeout.count());
  }
  SIMPLER_RETURN_IF_ERROR(diag::validate_call_config(config.call, "call."));
  SIMPLER_ASSIGN_OR_RETURN(const BackendInfo* backend, backend_named(config.backend));
  install_kernel_crash_reporter();
  SIMPLER_ASSIGN_OR_RETURN(const RuntimeInfo* runtime, runtime_named(config.runtime));
  std::unique_ptr<ChipWorker> w(new ChipWorker(config, std::move(callables)));
  w->runtime_captures_args_ = runtime->captures_args;
  SIMPLER_ASSIGN_OR_RETURN(
      w->device_, backend->create(DeviceOptions{config.geometry, config.device_memory_bytes,
                                                config.guard_device_memory.value_or(kGuardDeviceMemoryByDefault)}));
  ChipWorker* self = w.get();
  w->gate_ = std::make_unique<CompletionGate>(self);
  CompletionGate* gate = w->gate_.get();
  SIMPLER_ASSIGN_OR_RETURN(
      w->runtime_, runtime->create(*w->device_, RuntimeOptions{config.max_tasks_per_run, config.runtime_env},
                                   [gate](uint32_t slot, RunOutcome out) { gate->deliver(slot, std::move(out)); }));
  SIMPLER_RETURN_IF_ERROR(w->check_graph_arenas(config.pipeline_depth));
  SIMPLER_ASSIGN_OR_RETURN(w->runner_, w->device_->create_runner(w->runtime_->arena_bytes()));
  SIMPLER_RETURN_IF_ERROR(check_host_api_ops(w->runner_->ops()));
  auto arena_or = RunResourceArena::create(1);
  w->arena_ = std::make_unique<RunResourceArena>(std::move(arena_or).value());
  SIMPLER_RETURN_IF_ERROR(w->set_run_resource_grant(config.pipeline_depth));
  w->device_->start(w->runtime_.get());
  if (config.run_timeout.count() > 0) w->watchdog_ = std::thread([self] { self->watchdog_main(); });
  return w;
}

ChipWorker::ChipWorker(const WorkerConfig& config, std::vector<ChipCallable> callables)
    : config_(config), callables_(std::move(callables)), launch_depth_(config.launch_depth) {}

ChipWorker::~ChipWorker() { (void)close(std::chrono::milliseconds(60'000)); }

// --- memory -------------------------------------------------------------

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

bool ChipWorker::running_its_user_code() const {
  const Device* const device = device_.get();
  return UserCodeMark::running_for(this) || UserCodeMark::running_for(device);
}

Status ChipWorker::health() const {
  // An abandoning close() gave the device up: nothing reads it any more.
  if (device_ != nullptr) {
    if (Status fault = device_->fault(); !fault.ok()) return fault;
  }
  if (wedged()) {
    std::lock_guard<std::mutex> lock(wedged_mu_);
    return wedged_why_;
  }
  return Status();
}

Status ChipWorker::refuse_unhealthy(const char* call) const {
  const Status h = health();
  if (h.ok()) return h;
  if (h.code() == StatusCode::kDeviceFault) {
    return make_error(StatusCode::kDeviceFault,
                      "{}: refused: the device has a sticky fault ({}); it takes no work until it is reset: close this "
                      "Worker and create it again",
                      call, h.message());
  }
  return failed_precondition("{}: the chip is wedged ({}); close this Worker", call, h.message());
}

Status ChipWorker::refuse_if_faulted(const char* call) const {
  if (device_ == nullptr || device_->fault().ok()) return Status();
  return refuse_unhealthy(call);
}

Result<DeviceBuffer> ChipWorker::malloc(uint64_t bytes) {
  SIMPLER_RETURN_IF_ERROR(refuse_if_faulted("malloc"));
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, device_->memory().allocate(bytes));
  return DeviceBuffer{addr, bytes};
}

Status ChipWorker::free(DeviceBuffer buffer) {
  SIMPLER_RETURN_IF_ERROR(check_buffer(buffer, 0, 0, "free"));
  return device_->memory().free(buffer.addr);
}

Status ChipWorker::copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset) {
  SIMPLER_RETURN_IF_ERROR(refuse_if_faulted("copy_to"));
  if (src == nullptr && bytes != 0) return invalid_argument("copy_to: src is null");
  SIMPLER_RETURN_IF_ERROR(check_buffer(dst, dst_offset, bytes, "copy_to dst"));
  return device_->memory().copy_to_device(dst.addr + dst_offset, src, bytes);
}

Status ChipWorker::copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset) {
  SIMPLER_RETURN_IF_ERROR(refuse_if_faulted("copy_from"));
  if (dst == nullptr && bytes != 0) return invalid_argument("copy_from: dst is null");
  SIMPLER_RETURN_IF_ERROR(check_buffer(src, src_offset, bytes, "copy_from src"));
  return device_->memory().copy_from_device(dst, src.addr + src_offset, bytes);
}

MemoryInfo ChipWorker::memory_info() const {
  return MemoryInfo{device_->memory().total_bytes(), device_->memory().free_bytes()};
}

// --- grant --------------------------------------------------------------

Status ChipWorker::check_graph_arenas(uint32_t g) const {
  const uint64_t arena = runtime_->arena_bytes();
  const uint64_t total = device_->memory().total_bytes();
  uint64_t need = 0;
  if (__builtin_mul_overflow(arena, uint64_t{g}, &need) || need > total) {
    return resource_exhausted(
        "pipeline_depth = {} x max_tasks_per_run = {} needs {} x {} bytes of graph arenas; device_memory_bytes is {}",
        g, config_.max_tasks_per_run, g, arena, total);
  }
  return Status();
}

bool ChipWorker::release_lease(const Lease& lease) {
  const bool ok = arena_->release(lease);
  admission_bell_.ring();
  return ok;
}

std::vector<std::pair<std::string, uint32_t>> ChipWorker::owner_widths() const {
  return {{"run_resource_arena", arena_->grant()},
          {"generation_filter", filter_.width()},
          {"arena_bank_owners", static_cast<uint32_t>(bank_epoch_.size())},
          {"native_run_storage", static_cast<uint32_t>(storage_.size())},
          {"launched_run_table", static_cast<uint32_t>(running_.size())},
          {"watched_run_table", static_cast<uint32_t>(running_.size())},
          {"caller_orders", static_cast<uint32_t>(caller_orders_.size())},
          {"runner_retained_temps_and_arenas", runner_->width()},
          {"runtime_graph_sets", runtime_->width()}};
}

Status ChipWorker::set_run_resource_grant(uint32_t g) {
  SIMPLER_RETURN_IF_ERROR(is_valid_pipeline_contract(PipelineContract{g, config_.launch_depth}), "regrant to {}", g);
  if (closing_.load(std::memory_order_acquire)) return failed_precondition("regrant: the worker is closed");
  // Before anything is built: every owner below is g wide, so a grant the
  // device cannot hold must not reach a host allocation of that width.
  SIMPLER_RETURN_IF_ERROR(check_graph_arenas(g), "regrant to {}", g);
  // Every owner is asked first; any "no" refuses before anything is built.
  const ArenaCounts c = arena_->counts();
  if (c.live != 0 || c.quarantined != 0) {
    return failed_precondition("regrant to {} refused: {} sets are live and {} quarantined", g, c.live, c.quarantined);
  }
  if (const size_t n = registered_runs(); n != 0) {
    return failed_precondition("regrant to {} refused: {} runs are still registered", g, n);
  }
  if (in_flight_.load(std::memory_order_acquire) != 0) {
    return failed_precondition("regrant to {} refused: runs are still in flight", g);
  }
  // Nothing holds a run now, but the last phase call or completion may still
  // be ringing its set's bell, which the commit below frees (R49). It is a
  // few instructions from done, and no run exists that could add another.
  spin_then_park(
      left_bell_, [&] { return leaving_.load(std::memory_order_acquire) == 0; }, SpinPolicy{});
  const uint32_t old = grant();
  try {
    auto arena = std::make_unique<RunResourceArena>(std::move(RunResourceArena::create(g)).value());
    GenerationFilter filter(g);
    std::vector<uint64_t> banks(g, 0);
    std::vector<std::unique_ptr<StorageBlock>> storage;
    storage.reserve(g);
    for (uint32_t i = 0; i < g; ++i) storage.push_back(std::make_unique<StorageBlock>());
    std::vector<NativeRunContext*> running(g, nullptr);
    std::unique_ptr<PaddedBell[]> bells(new PaddedBell[g]);
    std::unique_ptr<WatchedRun[]> watched(new WatchedRun[g]);
    std::vector<CallerOrder> caller_orders(g);
    // The grant hooks: a backend or runtime that cannot serve g refuses it here.
    SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<GrantOwner::Pending> runner_sets, runner_->build_grant(g),
                             "regrant to {}: the backend refused; the grant of {} is unchanged", g, old);
    SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<GrantOwner::Pending> runtime_sets, runtime_->build_grant(g),
                             "regrant to {}: the runtime refused; the grant of {} is unchanged", g, old);
    // Commit: nothing below can fail. The grant is published last.
    arena_.swap(arena);
    filter_.swap(filter);
    bank_epoch_.swap(banks);
    storage_.swap(storage);
    running_.swap(running);
    set_bells_.swap(bells);
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watched_.swap(watched);
    }
    {
      // A completion that counted itself out may still be serving the launch queue.
      std::lock_guard<std::mutex> lock(launch_mu_);
      caller_orders_.swap(caller_orders);
      launch_depth_ = config_.launch_depth == 0 ? g : config_.launch_depth;
    }
    runner_->commit_grant(*runner_sets);
    runtime_->commit_grant(*runtime_sets);
    grant_.store(g, std::memory_order_release);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("regrant to {}: host allocation failed while building; the grant of {} is unchanged", g,
                              old);
  }
  return Status();
}

// --- native lifecycle ----------------------------------------------------

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
      return invalid_argument("args[{}]: callable '{}' expects direction {}, got {}", i, c.name(), tag_name(sig[i].tag),
                              tag_name(a.tag));
    }
    if (sig[i].dtype && a.tensor.dtype() != *sig[i].dtype) {
      return invalid_argument("args[{}]: callable '{}' expects dtype {}, got {}", i, c.name(),
                              dtype_name(*sig[i].dtype), dtype_name(a.tensor.dtype()));
    }
    if (sig[i].shape) {
      const std::vector<int64_t>& want = *sig[i].shape;
      std::vector<int64_t> got(static_cast<size_t>(a.tensor.ndim()));
      for (int d = 0; d < a.tensor.ndim(); ++d) got[d] = a.tensor.shape(d);
      bool match = got.size() == want.size();
      for (size_t d = 0; match && d < want.size(); ++d) match = want[d] < 0 || want[d] == got[d];
      if (!match) {
        return invalid_argument("args[{}]: callable '{}' expects shape [{}] (-1: any), got [{}]", i, c.name(),
                                fmt::join(want, ", "), fmt::join(got, ", "));
      }
    }
    SIMPLER_RETURN_IF_ERROR(
        check_buffer(a.tensor.buffer(), 0, a.tensor.buffer().bytes, fmt::format("args[{}]", i).c_str()));
  }
  return Status();
}

Result<uint64_t> ChipWorker::prepare(void* storage, size_t storage_bytes, const NativeRunDescriptor& desc,
                                     uint32_t callable, const TaskArgs& args, RunConfig config) {
  return prepare_as(Preparer::kNativeRun, storage, storage_bytes, desc, callable, args, std::move(config));
}

Result<uint64_t> ChipWorker::prepare_as(Preparer by, void* storage, size_t storage_bytes,
                                        const NativeRunDescriptor& desc, uint32_t callable, const TaskArgs& args,
                                        RunConfig config) {
  // Host memory exhaustion anywhere in prepare is an error value like any other.
  try {
    return prepare_unchecked(by, storage, storage_bytes, desc, callable, args, std::move(config));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("prepare: host memory exhausted; nothing was prepared");
  }
}

Result<uint64_t> ChipWorker::prepare_unchecked(Preparer by, void* storage, size_t storage_bytes,
                                               const NativeRunDescriptor& desc, uint32_t callable, const TaskArgs& args,
                                               RunConfig config) {
  SIMPLER_RETURN_IF_ERROR(context_.validate("prepare"));
  if (closing_.load(std::memory_order_acquire)) return failed_precondition("prepare: the worker is closed");
  SIMPLER_RETURN_IF_ERROR(refuse_if_faulted("prepare"));
  if (storage == nullptr) return invalid_argument("prepare: storage is null");
  if (storage_bytes < native_run_storage_size()) {
    return invalid_argument("prepare: storage_bytes = {}, a native run needs {}", storage_bytes,
                            native_run_storage_size());
  }
  if (reinterpret_cast<uintptr_t>(storage) % native_run_storage_alignment() != 0) {
    return invalid_argument("prepare: storage is not aligned to {} bytes", native_run_storage_alignment());
  }
  uint64_t word;
  std::memcpy(&word, storage, sizeof word);
  if (word == NativeRunContext::kMagic) {
    return failed_precondition("prepare: storage already holds a prepared run; finalize before reuse");
  }
  if (word != 0) return invalid_argument("prepare: storage was not zero-initialised (first word {:#x})", word);
  if (callable >= callables_.size()) return not_found("prepare: callable id {} is not registered", callable);
  const uint32_t g = grant();
  const Lease& lease = desc.lease;
  if (lease.slot >= g) return invalid_argument("prepare: lease.slot = {} is outside the grant of {}", lease.slot, g);
  if (desc.arena_bank >= g) {
    return invalid_argument("prepare: arena_bank = {} is outside the grant of {}", desc.arena_bank, g);
  }
  // Admission: the lease generation is checked here, once; the epoch is the
  // run's identity from now on.
  if (!filter_.is_admissible(lease)) {
    return failed_precondition(
        "prepare: lease {{slot {}, generation {}}} is a replay: slot {} already admitted "
        "generation {}",
        lease.slot, lease.generation, lease.slot, filter_.newest(lease.slot));
  }
  if (!arena_->owns(lease)) {
    return failed_precondition("prepare: lease {{slot {}, generation {}}} is not held (stale or released)", lease.slot,
                               lease.generation);
  }
  if (bank_epoch_[desc.arena_bank] != 0) {
    return failed_precondition("prepare: arena_bank = {} is held by run {}", desc.arena_bank,
                               bank_epoch_[desc.arena_bank]);
  }
  const ChipCallable& c = callables_[callable];
  // R91: a dump on a runtime that cannot capture is refused before anything
  // is touched, the trace directory (which the check below creates) included.
  if (!runtime_captures_args_) SIMPLER_RETURN_IF_ERROR(check_dump_supported(config.call.dump_args, config_.runtime));
  // submit() checked these before it waited for a set.
  if (by == Preparer::kNativeRun) SIMPLER_RETURN_IF_ERROR(diag::validate_call_config(config.call, "call."));
  const uint32_t level = config.call.swimlane_level;
  if (level > 0 && device_->recorder() == nullptr) {
    return make_error(StatusCode::kUnimplemented, "call.swimlane_level = {}: backend '{}' records no swimlanes", level,
                      device_->backend());
  }
  if (config.call.dump_args != DumpArgs::Off && !device_->memory().host_mapped()) {
    return make_error(StatusCode::kUnimplemented, "call.dump_args: backend '{}' memory is not host-mapped",
                      device_->backend());
  }
  if (by == Preparer::kNativeRun) {
    SIMPLER_RETURN_IF_ERROR(args.validate());
    SIMPLER_RETURN_IF_ERROR(check_signature(c, args));
  }
  // The runtime sees the arguments only through their encoded form, the same
  // bytes that cross a mailbox at the node level, staged in the device memory
  // of the run's own set: the slot's retained temp buffer (R90), sized once
  // for the largest blob, so two runs in different slots never share it and
  // a slot's later runs reuse it without allocating. Device memory is
  // host-addressable on every backend built (the runtimes build their graphs
  // through it the same way), so the bytes are encoded in place, and the
  // buffer is this slot's alone while the run holds the slot.
  SIMPLER_ASSIGN_OR_RETURN(const HostApi api, runner_->bind(lease.slot, desc.arena_bank));
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t staging, api.retained_temp(kArgsBlobMaxBytes),
                           "prepare: the retained args buffer of slot {}", lease.slot);
  auto* const blob = reinterpret_cast<uint8_t*>(staging);
  SIMPLER_ASSIGN_OR_RETURN(const size_t blob_bytes, encode_args_blob(args, blob, kArgsBlobMaxBytes));
  SIMPLER_ASSIGN_OR_RETURN(TaskArgs decoded, decode_args_blob(blob, blob_bytes));

  // The run's own lane, sized for its edges and submits: allocated here, on
  // the preparing thread, never while it runs.
  std::unique_ptr<diag::Lane> trace_lane;
  if (level > 0) {
    SIMPLER_ASSIGN_OR_RETURN(trace_lane, take_trace_lane(), "prepare: call.swimlane_level = {}", level);
  }
  const uint64_t t0 = now_ns();
  const uint64_t epoch = next_run_epoch();
  NativeRunContext* ctx = nullptr;
  try {
    ctx = new (storage) NativeRunContext(this, desc, epoch, &c, callable, std::move(decoded), std::move(config), api);
  } catch (const std::exception& e) {
    return internal_error("prepare: constructing the run context failed ({}); the storage is still empty", e.what());
  }
  // From here on the context holds the set's graph and pins: a throw is
  // turned into an error here, so the undo below runs (prepare()'s catch
  // would leave the storage holding a half-prepared run).
  Status st;
  ctx->trace_lane_ = std::move(trace_lane);
  try {
    if (ctx->config_.call.dump_args != DumpArgs::Off) st = start_dump(*ctx);
    if (st.ok()) {
      // A host-side runtime runs the orchestration in build, on this thread.
      const UserCodeMark orchestration(this);
      const OwnWorkScope build_holds_a_cpu;
      st = runtime_->build(ctx->api_, c, ctx->args_,
                           ctx->config_.runtime_env ? *ctx->config_.runtime_env : config_.runtime_env,
                           diag::RunTrace{level, epoch, ctx->trace_lane_.get(), ctx->capture_.get()});
    }
    if (st.ok()) st = ctx->api_.upload_callable(callable);
    if (st.ok()) st = pin_arguments(*ctx);
    if (st.ok() && level > 0) {
      Result<diag::LaneWindow> window = device_->recorder()->begin_run(level);
      if (window.ok()) {
        ctx->trace_window_ = std::move(*window);
      } else {
        st = window.status();
      }
    }
    // Only a native run is looked up by its epoch; the worker drives a submitted one.
    if (st.ok() && by == Preparer::kNativeRun) {
      std::lock_guard<std::mutex> lock(runs_mu_);
      runs_.emplace(epoch, ctx);
    }
  } catch (const std::bad_alloc&) {
    st = resource_exhausted("prepare: host memory exhausted preparing run {}; nothing was prepared", epoch);
  }
  if (!st.ok()) {
    if (ctx->trace_window_.id != 0) device_->recorder()->end_run(ctx->trace_window_);
    unpin_arguments(*ctx);
    runtime_->discard(lease.slot);
    ctx->~NativeRunContext();
    std::memset(storage, 0, native_run_storage_size());
    return st;
  }
  ctx->stats_.build_us = static_cast<double>(now_ns() - t0) / 1e3;
  filter_.admit(lease);
  bank_epoch_[desc.arena_bank] = epoch;
  return epoch;
}

Status ChipWorker::pin_arguments(NativeRunContext& ctx) {
  DeviceMemory& memory = device_->memory();
  for (size_t i = 0; i < ctx.args_.size(); ++i) {
    const TaskArg& a = ctx.args_[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    SIMPLER_ASSIGN_OR_RETURN(const DeviceMemory::Allocation alloc,
                             memory.containing_allocation(a.tensor.buffer().addr, a.tensor.buffer().bytes),
                             "prepare: args[{}]", i);
    if (std::find(ctx.pinned_.begin(), ctx.pinned_.end(), alloc.addr) != ctx.pinned_.end()) continue;
    ctx.pinned_.push_back(alloc.addr);  // before the pin, so a throw leaves no pin unrecorded
    if (Status st = memory.pin(alloc.addr); !st.ok()) {
      ctx.pinned_.pop_back();
      return Status(st.code(), fmt::format("prepare: args[{}]: {}", i, st.message()));
    }
  }
  return Status();
}

void ChipWorker::unpin_arguments(NativeRunContext& ctx) {
  for (uint64_t addr : ctx.pinned_) device_->memory().unpin(addr);
  ctx.pinned_.clear();
}

ChipWorker::RunRef::~RunRef() {
  if (ctx_ == nullptr) return;
  // Read before letting go: once users_ drops, finalize may destroy the context.
  const uint32_t slot = ctx_->desc_.lease.slot;
  w_->leaving_.fetch_add(1, std::memory_order_acq_rel);
  ctx_->users_.fetch_sub(1, std::memory_order_acq_rel);
  w_->set_bells_[slot].bell.ring();
  w_->leaving_.fetch_sub(1, std::memory_order_acq_rel);
  w_->left_bell_.ring();
}

Result<ChipWorker::RunRef> ChipWorker::lookup(void* storage, uint64_t epoch, const char* call) {
  if (storage == nullptr) return invalid_argument("{}: storage is null", call);
  std::lock_guard<std::mutex> lock(runs_mu_);
  auto it = runs_.find(epoch);
  if (it != runs_.end() && it->second == storage) {
    it->second->users_.fetch_add(1, std::memory_order_acq_rel);
    return RunRef(this, it->second);
  }
  // Refused; say why as precisely as the storage allows. Still under the
  // lock: retire() empties a storage under it, so a run retiring under this
  // call is read whole or as an empty storage, never half destroyed.
  NativeRunContext* ctx = NativeRunContext::from_storage(storage);
  if (ctx == nullptr) return failed_precondition("{}: the storage holds no prepared run", call);
  if (ctx->owner() != this) return failed_precondition("{}: the run belongs to another ChipWorker", call);
  if (ctx->epoch() != epoch) {
    return failed_precondition("{}: epoch {} is not the run in this storage (run {})", call, epoch, ctx->epoch());
  }
  return failed_precondition("{}: run {} is not live here", call, epoch);
}

void ChipWorker::enqueue_launch(NativeRunContext* ctx) {
  ctx->phase_.store(static_cast<uint32_t>(RunPhase::Launching), std::memory_order_release);
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (ctx->desc_.caller_stream != 0) {
      caller_orders_[ctx->desc_.lease.slot] = CallerOrder{ctx->desc_.caller_stream, ++launch_seq_};
    }
    if (launched_ < launch_depth_ && launch_queue_.empty() && stream_clear(ctx) && take_bank(ctx)) {
      ++launched_;
      launched_peak_ = std::max(launched_peak_, launched_);
      now = true;
    } else {
      launch_queue_.push_back(ctx);
    }
  }
  if (now) {
    do_launch(ctx);
    return;
  }
  // The queue may hold only runs waiting for their caller streams.
  launch_queued();
}

bool ChipWorker::take_bank(NativeRunContext* ctx) {
  return !ctx->config_.diagnostic || banks_.try_acquire(ctx->epoch_).has_value();
}

bool ChipWorker::stream_clear(const NativeRunContext* ctx) const {
  const uint64_t stream = ctx->desc_.caller_stream;
  if (stream == 0) return true;
  const uint64_t seq = caller_orders_[ctx->desc_.lease.slot].seq;
  for (const CallerOrder& o : caller_orders_) {
    if (o.stream == stream && o.seq < seq) return false;
  }
  return true;
}

void ChipWorker::launch_queued() {
  for (;;) {
    NativeRunContext* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(launch_mu_);
      if (launch_queue_.empty() || launched_ >= launch_depth_) return;
      // Runs waiting for an earlier run of their caller stream are passed by
      // (R53). Of the rest the first goes or nothing does: a diagnostic run
      // that finds no bank keeps its place and is served by the next release
      // (R65).
      auto it = std::find_if(launch_queue_.begin(), launch_queue_.end(),
                             [this](const NativeRunContext* c) { return stream_clear(c); });
      if (it == launch_queue_.end() || !take_bank(*it)) return;
      next = *it;
      launch_queue_.erase(it);
      ++launched_;
      launched_peak_ = std::max(launched_peak_, launched_);
    }
    do_launch(next);
  }
}

std::vector<uint64_t> ChipWorker::queued_launches() const {
  std::vector<uint64_t> epochs;
  std::lock_guard<std::mutex> lock(launch_mu_);
  for (const NativeRunContext* ctx : launch_queue_) epochs.push_back(ctx->epoch_);
  return epochs;
}

std::vector<uint64_t> ChipWorker::waiting_for_bank() const {
  std::vector<uint64_t> epochs;
  std::lock_guard<std::mutex> lock(launch_mu_);
  for (const NativeRunContext* ctx : launch_queue_) {
    if (ctx->config_.diagnostic) epochs.push_back(ctx->epoch_);
  }
  return epochs;
}

void ChipWorker::not_started(NativeRunContext* ctx, Status why) {
  const uint32_t slot = ctx->desc_.lease.slot;
  // Nothing reached the device: that is the bank's proof (R60, R61).
  if (ctx->config_.diagnostic) (void)banks_.rollback_not_started(ctx->epoch_);
  {
    std::lock_guard<std::mutex> lock(launch_mu_);
    --launched_;
    caller_orders_[slot] = CallerOrder{};
  }
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (ctx->auto_finalize_) {
    runtime_->discard(slot);
    (void)retire(ctx, std::move(why), 0);
  } else {
    // launch() returns once it reads Prepared, and its caller may finalize
    // at once: nothing of the context is touched after this store.
    ctx->launch_refusal_ = std::move(why);
    leaving_.fetch_add(1, std::memory_order_acq_rel);
    ctx->phase_.store(static_cast<uint32_t>(RunPhase::Prepared), std::memory_order_release);
    set_bells_[slot].bell.ring();
    leaving_.fetch_sub(1, std::memory_order_acq_rel);
    left_bell_.ring();
  }
  admission_bell_.ring();
  launch_queued();
}

void ChipWorker::do_launch(NativeRunContext* ctx) {
  const uint32_t slot = ctx->desc_.lease.slot;
  // Arming comes only after acquiring (R55): take_bank acquired the bank.
  Status refused = ctx->config_.diagnostic ? banks_.arm(ctx->epoch_) : Status();
  // The preflight again at the marker: a native run queued behind
  // launch_depth may reach the device long after launch() checked (R52).
  if (refused.ok() && !ctx->auto_finalize_) refused = context_.validate("launch");
  if (!refused.ok()) {
    not_started(ctx, std::move(refused));
    return;
  }
  running_[slot] = ctx;
  // The launch marker: the acceptance sink is written here, once, and dropped.
  if (ctx->desc_.accepted_sink != nullptr) {
    ctx->desc_.accepted_sink->store(ctx->desc_.accepted_value, std::memory_order_release);
    ctx->desc_.accepted_sink = nullptr;
  }
  if (ctx->auto_finalize_) {
    // Watched from here on: the watchdog (run_timeout) and close() may give
    // it a terminal. The deadline is published last, after what it guards.
    WatchedRun& watch = watched_[slot];
    watch.handle = ctx->handle_;
    watch.lease = ctx->desc_.lease;
    watch.epoch = ctx->epoch_;
    watch.diagnostic = ctx->config_.diagnostic;
    const uint64_t timeout = timeout_ns(config_.run_timeout);
    watch.deadline.store(
        timeout == 0 ? WatchedRun::kNoDeadline : std::min(deadline_after(timeout), WatchedRun::kNoDeadline),
        std::memory_order_release);
    // Nobody waits for this launch, and the run may finalize itself as soon as
    // it is on the device: touch nothing of it after runtime_->launch.
    ctx->phase_.store(static_cast<uint32_t>(RunPhase::Launched), std::memory_order_release);
    runtime_->launch(slot);
    return;
  }
  runtime_->launch(slot);
  ctx->phase_.store(static_cast<uint32_t>(RunPhase::Launched), std::memory_order_release);
  set_bells_[slot].bell.ring();
}

Status ChipWorker::launch(void* storage, uint64_t epoch) {
  SIMPLER_ASSIGN_OR_RETURN(RunRef ref, lookup(storage, epoch, "launch"));
  SIMPLER_RETURN_IF_ERROR(context_.validate("launch"));
  NativeRunContext* c = ref.get();
  // A finalize() racing this call aborts the run only by moving it out of
  // Prepared first (R49): whichever of the two does decides whether it runs.
  auto prepared = static_cast<uint32_t>(RunPhase::Prepared);
  if (!c->phase_.compare_exchange_strong(prepared, static_cast<uint32_t>(RunPhase::Launching),
                                         std::memory_order_acq_rel)) {
    if (static_cast<RunPhase>(prepared) == RunPhase::Empty) {
      return failed_precondition("launch: run {} is being finalized before launch", epoch);
    }
    return failed_precondition("launch: run {} is {}, not prepared", epoch,
                               run_phase_name(static_cast<RunPhase>(prepared)));
  }
  enqueue_launch(c);
  spin_then_park(
      set_bells_[c->desc_.lease.slot].bell, [&] { return c->phase() != RunPhase::Launching; }, SpinPolicy{});
  if (c->phase() == RunPhase::Prepared) return c->launch_refusal_;
  return Status();
}

Result<PollState> ChipWorker::poll(void* storage, uint64_t epoch) {
  SIMPLER_ASSIGN_OR_RETURN(RunRef ref, lookup(storage, epoch, "poll"));
  SIMPLER_RETURN_IF_ERROR(context_.validate("poll"));
  NativeRunContext* c = ref.get();
  switch (c->phase()) {
    case RunPhase::Prepared:
      return failed_precondition("poll: run {} is prepared, not launched", epoch);
    case RunPhase::Launching:
      return PollState::NotReady;
    default:
      return c->done() ? PollState::Complete : PollState::NotReady;
  }
}

Status ChipWorker::wait(void* storage, uint64_t epoch, uint64_t deadline_ns) {
  SIMPLER_ASSIGN_OR_RETURN(RunRef ref, lookup(storage, epoch, "wait"));
  SIMPLER_RETURN_IF_ERROR(context_.validate("wait"));
  NativeRunContext* c = ref.get();
  if (c->phase() != RunPhase::Launched) {
    return failed_precondition("wait: run {} is {}; launch it first", epoch, run_phase_name(c->phase()));
  }
  if (!spin_then_park(
          set_bells_[c->desc_.lease.slot].bell, [&] { return c->done(); }, SpinPolicy{}, deadline_ns)) {
    return make_error(StatusCode::kDeadlineExceeded, "wait: run {} is still running at the deadline", epoch);
  }
  return c->result_;
}

Status ChipWorker::finalize(void* storage, uint64_t epoch) {
  SIMPLER_ASSIGN_OR_RETURN(RunRef ref, lookup(storage, epoch, "finalize"));
  SIMPLER_RETURN_IF_ERROR(context_.validate("finalize"));
  NativeRunContext* c = ref.get();
  if (c->finalizing_.exchange(true, std::memory_order_acq_rel)) {
    return failed_precondition("finalize: run {} is being finalized by another call", epoch);
  }
  auto phase = static_cast<uint32_t>(c->phase());
  // Aborting a prepared run takes it out of Prepared first, so a launch()
  // racing this call either refuses it or has put it on the device (R49).
  if (phase == static_cast<uint32_t>(RunPhase::Prepared) &&
      c->phase_.compare_exchange_strong(phase, static_cast<uint32_t>(RunPhase::Empty), std::memory_order_acq_rel)) {
    ref.disown();
    return abort_prepared(c, 1);
  }
  if (static_cast<RunPhase>(phase) == RunPhase::Launching) {
    c->finalizing_.store(false, std::memory_order_release);  // a later finalize may retire it
    return failed_precondition("finalize: run {} is launching; wait for launch to return", epoch);
  }
  spin_then_park(
      set_bells_[c->desc_.lease.slot].bell, [&] { return c->done(); }, SpinPolicy{});
  Status result = c->result_;
  if (result.ok()) {
    for (const HostCopy& copy : c->config_.copy_back) {
      Status st = check_buffer(copy.src, copy.src_offset, copy.bytes, "copy_back src");
      if (st.ok() && copy.dst == nullptr && copy.bytes != 0) st = invalid_argument("copy_back: dst is null");
      if (st.ok()) st = c->api_.copy_from_device(copy.dst, copy.src.addr + copy.src_offset, copy.bytes);
      if (!st.ok()) {
        result = st;
        break;
      }
    }
  }
  ref.disown();
  return retire(c, result, 1);
}

Status ChipWorker::abort_prepared(NativeRunContext* ctx, uint32_t own_holds) {
  runtime_->discard(ctx->desc_.lease.slot);
  return retire(ctx, make_error(StatusCode::kAborted, "run {} was finalized before launch; nothing ran", ctx->epoch_),
                own_holds);
}

Status ChipWorker::retire(NativeRunContext* ctx, Status result, uint32_t own_holds) {
  const Lease lease = ctx->desc_.lease;
  const uint64_t epoch = ctx->epoch_;
  {
    std::lock_guard<std::mutex> lock(runs_mu_);
    runs_.erase(epoch);
  }
  // No new call can find the run now; let the ones inside it leave first.
  spin_then_park(
      set_bells_[lease.slot].bell, [&] { return ctx->users_.load(std::memory_order_acquire) == own_holds; },
      SpinPolicy{});
  bank_epoch_[ctx->desc_.arena_bank] = 0;
  unpin_arguments(*ctx);
  const bool on_device_thread = ctx->auto_finalize_;
  DiagOutput diag = take_diag_output(*ctx);
  std::shared_ptr<detail::RunState> handle = std::move(ctx->handle_);
  const RunStats stats = ctx->stats_;
  {
    // A refused phase call on this storage reads it under this lock (lookup).
    std::lock_guard<std::mutex> lock(runs_mu_);
    ctx->~NativeRunContext();
    // The magic word goes last and atomically: a caller may read it lock-free (from_storage).
    auto* bytes = reinterpret_cast<unsigned char*>(ctx);
    std::memset(bytes + sizeof(uint64_t), 0, native_run_storage_size() - sizeof(uint64_t));
    reinterpret_cast<std::atomic<uint64_t>*>(bytes)->store(0, std::memory_order_release);
  }
  release_lease(lease);
  if (!diag.empty() && on_device_thread) {
    // Written on the writer thread, the handle completed after it (so wait()
    // still returns with the files there): the device thread retiring the
    // run goes back to dispatching the others' tasks at once.
    auto job = std::make_shared<DiagOutput>(std::move(diag));
    const bool exports = job->trace.run != 0;
    if (exports) {
      std::lock_guard<std::mutex> lock(pending_exports_mu_);
      ++pending_exports_[job->trace_dir];
    }
    auto write = [this, job, handle, result, stats, exports](bool on_writer) {
      // A trace.json that a later run's, already queued, replaces at once is
      // not written: this run completes right after that one's is, as if
      // it had been replaced (runs pipelined into one directory keep only
      // the last file either way).
      bool superseded = false;
      if (exports) {
        std::lock_guard<std::mutex> lock(pending_exports_mu_);
        auto it = pending_exports_.find(job->trace_dir);
        superseded = --it->second > 0 && on_writer;
        if (it->second == 0) pending_exports_.erase(it);
      }
      if (superseded) job->trace.run = 0;
      Status r = finish_diag_output(std::move(*job), result);
      if (superseded) {
        superseded_.push_back({handle, std::move(r), stats});
        return;
      }
      if (handle != nullptr) handle->complete(r, stats);
      if (on_writer && exports) {
        for (Superseded& d : superseded_) {
          if (d.handle != nullptr) d.handle->complete(d.result, d.stats);
        }
        superseded_.clear();
      }
    };
    if (diag_writer_.post([write] { write(true); })) return result;
    write(false);  // closing: nothing runs behind this run any more
    return result;
  }
  if (!diag.empty()) result = finish_diag_output(std::move(diag), std::move(result));
  if (handle != nullptr) handle->complete(result, stats);
  return result;
}

ChipWorker::DiagOutput ChipWorker::take_diag_output(NativeRunContext& ctx) {
  DiagOutput out;
  // The done callback came after the runtime stopped touching the set: the
  // proof that no AICPU thread still writes a lane of the run.
  out.producers_stopped = ctx.done();
  out.dump = std::move(ctx.dump_);
  out.trace_window = std::exchange(ctx.trace_window_, diag::LaneWindow{});
  out.trace_lane = std::move(ctx.trace_lane_);
  // Only a run that ended on the device has a complete trace.
  if (out.trace_window.id != 0 && out.producers_stopped && ctx.trace_end_ns_ != 0) {
    diag::ChipRunTrace& t = out.trace;
    t.pid = static_cast<int>(::getpid());
    t.label = ctx.config_.trace_label.empty() ? std::string("chip0") : ctx.config_.trace_label;
    t.run = ctx.epoch_;
    t.level = ctx.config_.call.swimlane_level;
    t.launch_ns = ctx.trace_launch_ns_;
    t.end_ns = ctx.trace_end_ns_;
    t.recorder = device_->recorder();
    t.window = out.trace_window;
    t.orchestrator = out.trace_lane.get();
    out.trace_dir = ctx.config_.call.trace_dir;
  }
  return out;
}

Status ChipWorker::finish_diag_output(DiagOutput out, Status result) {
  if (out.dump != nullptr) {
    Status dumped = out.dump->finish(out.producers_stopped);
    if (result.ok() && !dumped.ok()) result = std::move(dumped);
    out.dump.reset();
  }
  if (out.trace_window.id != 0) {
    // The window is read before it closes: its events may be reused after.
    Status exported = out.trace.run != 0 ? diag::export_chip_run(out.trace_dir, out.trace) : Status();
    device_->recorder()->end_run(out.trace_window);
    if (result.ok() && !exported.ok()) result = std::move(exported);
  }
  if (out.trace_lane != nullptr) {
    out.trace_lane->reset();
    std::lock_guard<std::mutex> lock(spare_lanes_mu_);
    spare_trace_lanes_.push_back(std::move(out.trace_lane));
  }
  return result;
}

Result<std::unique_ptr<diag::Lane>> ChipWorker::take_trace_lane() {
  {
    std::lock_guard<std::mutex> lock(spare_lanes_mu_);
    if (!spare_trace_lanes_.empty()) {
      std::unique_ptr<diag::Lane> lane = std::move(spare_trace_lanes_.back());
      spare_trace_lanes_.pop_back();
      return lane;
    }
  }
  // Sized for a run's edges and submits; allocated here, on the preparing
  // thread, never while a run records.
  try {
    auto lane = std::make_unique<diag::Lane>(
        std::max<size_t>(diag::Recorder::kDefaultLaneEvents, size_t{config_.max_tasks_per_run} * 4));
    lane->allocate();
    return lane;
  } catch (const std::bad_alloc&) {
    return resource_exhausted("the run's trace lane does not fit host memory");
  }
}

void ChipWorker::on_run_done(uint32_t slot, RunOutcome out) {
  NativeRunContext* ctx = running_[slot];
  running_[slot] = nullptr;
  ctx->stats_.tasks = out.tasks;
  ctx->stats_.executed = out.executed;
  ctx->stats_.released_early = out.released_early;
  ctx->stats_.chained = out.chained;
  ctx->stats_.taken_back = out.taken_back;
  ctx->stats_.device_us = static_cast<double>(out.end_ns - out.launch_ns) / 1e3;
  ctx->trace_launch_ns_ = out.launch_ns;
  ctx->trace_end_ns_ = out.end_ns;
  ctx->result_ = std::move(out.status);
  // CUDA's sticky-error rule: a run that ends after the fault ends with it,
  // whatever its tasks reported (a task may have finished before the fault,
  // but the device's memory is no longer trusted), so no run reads OK from
  // a faulted device.
  if (Status fault = device_->fault(); !fault.ok()) {
    ctx->result_ = make_error(StatusCode::kDeviceFault, "run {} ended by the device's sticky fault: {}", ctx->epoch_,
                              fault.message());
  }
  // Before the launch slot is handed on, so a run waiting for a bank can take this one.
  if (ctx->config_.diagnostic) close_terminal(ctx, out);
  {
    std::lock_guard<std::mutex> lock(launch_mu_);
    --launched_;
    caller_orders_[slot] = CallerOrder{};  // the next run of its stream may go
  }
  // Counted out before anyone can see the run done, so a caller returning
  // from wait() finds it no longer in flight. close() joins this thread before
  // freeing anything, so the rest of this function stays safe.
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (ctx->auto_finalize_) {
    WatchedRun& watch = watched_[slot];
    uint64_t d = watch.deadline.load(std::memory_order_acquire);
    for (;;) {
      // A claimer between its claim and kClaimed is copying a few fields; the
      // set must not be released under it.
      if (d == WatchedRun::kClaiming) {
        yield_cpu();
        d = watch.deadline.load(std::memory_order_acquire);
        continue;
      }
      if (d == WatchedRun::kClaimed) break;
      if (watch.deadline.compare_exchange_weak(d, WatchedRun::kUnwatched, std::memory_order_acq_rel)) break;
    }
    if (d == WatchedRun::kClaimed) {
      watch.deadline.store(WatchedRun::kUnwatched, std::memory_order_relaxed);
      ctx->handle_.reset();  // its terminal was delivered already (run_timeout, close)
    } else {
      watch.handle.reset();
    }
    ctx->done_.store(1, std::memory_order_release);
    (void)retire(ctx, ctx->result_, 0);
  } else {
    // The caller may finalize the instant it sees done_: nothing of the
    // context is touched after this store, and the bell is rung as a leaver.
    leaving_.fetch_add(1, std::memory_order_acq_rel);
    ctx->done_.store(1, std::memory_order_release);
    set_bells_[slot].bell.ring();
    if (done_bell_ != nullptr) done_bell_->ring();
    leaving_.fetch_sub(1, std::memory_order_acq_rel);
    left_bell_.ring();
  }
  launch_queued();
  admission_bell_.ring();
}

void ChipWorker::close_terminal(NativeRunContext* ctx, const RunOutcome& out) {
  const uint64_t epoch = ctx->epoch_;
  if (TerminalSnapshot* snap = banks_.lookup(epoch)) {
    snap->set_status(ctx->result_);
    snap->tasks = out.tasks;
    snap->tasks_executed = out.executed;
    snap->device_ns = out.end_ns - out.launch_ns;
    snap->core_count = runtime_->last_tasks(ctx->desc_.lease.slot, snap->last_task, TerminalSnapshot::kMaxCores);
    for (TerminalContributor* c : contributors_) c->write_terminal(epoch, *snap);
    // An aborted argument capture closes no terminal (R117): unpublished.
    if (!out.capture_unsettled) banks_.publish(epoch);
  }
  // The done callback comes after the runtime stopped touching the set, and
  // a simulated run's producers are this process's AICPU and core threads,
  // which reach a run only through its runtime: every producer of this run
  // has stopped (R58), unless an argument capture was aborted, which leaves no
  // proof that its producer stopped: the bank is then quarantined until
  // finalize, and the dump reports its accounting unknown (R57, R117).
  // Completion is the run's own outcome, a separate fact (R59).
  const bool producers_stopped = !out.capture_unsettled;
  (void)banks_.run_close(epoch, /*completed=*/producers_stopped && ctx->result_.ok(), producers_stopped);
}

// The flag and the count are a Dekker pair (both seq_cst): a completion that
// read the gate open is counted inside before shut() reads the count.
void ChipWorker::CompletionGate::deliver(uint32_t slot, RunOutcome outcome) {
  inside_.fetch_add(1, std::memory_order_seq_cst);
  if (shut_.load(std::memory_order_seq_cst)) {
    dropped_.fetch_add(1, std::memory_order_acq_rel);
    dropped_bell_.ring();
  } else {
    worker_->on_run_done(slot, std::move(outcome));
  }
  if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1 && shut_.load(std::memory_order_seq_cst)) {
    left_bell_.ring();
  }
}

void ChipWorker::CompletionGate::shut() {
  shut_.store(true, std::memory_order_seq_cst);
  // on_run_done never blocks for long: a submitted run has no phase call to wait out.
  spin_then_park(
      left_bell_, [&] { return inside_.load(std::memory_order_seq_cst) == 0; }, SpinPolicy{});
}

// --- asynchronous runs ---------------------------------------------------

Result<Lease> ChipWorker::acquire_set() {
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return failed_precondition("submit: the worker is closing");
    if (auto lease = arena_->try_acquire()) return *lease;
    spin_then_park(
        admission_bell_, [&] { return arena_->counts().free != 0 || closing_.load(std::memory_order_acquire); },
        SpinPolicy{});
  }
}

RunHandle ChipWorker::submit(uint32_t callable, const TaskArgs& args) { return submit(callable, args, config_.call); }

static_assert(static_cast<int>(DumpSelection::kPartial) == static_cast<int>(DumpArgs::Partial) &&
                  static_cast<int>(DumpSelection::kHybrid) == static_cast<int>(DumpArgs::Hybrid) &&
                  static_cast<int>(DumpSelection::kFull) == static_cast<int>(DumpArgs::Full),
              "a CallConfig's dump_args is its dump's selection");

Status ChipWorker::start_dump(NativeRunContext& ctx) {
  ArgsDumpCollector::Options o;
  o.publish_dir = ctx.config_.call.trace_dir + "/args_dump";
  o.dir = fmt::format("{}/.args_dump.{}.{}.tmp", ctx.config_.call.trace_dir, ::getpid(), ctx.epoch_);
  o.selection = static_cast<DumpSelection>(ctx.config_.call.dump_args);
  o.lanes = device_->geometry().aicpu_threads;
  o.run_epoch = ctx.epoch_;
  const ChipCallable* callable = ctx.callable_;
  o.kernel_name = [callable](uint32_t func_id) {
    const KernelInfo* k = callable->kernels().find(func_id);
    return k == nullptr ? std::string() : k->name;
  };
  SIMPLER_ASSIGN_OR_RETURN(ctx.dump_, ArgsDumpCollector::start(std::move(o)), "call.dump_args");
  ctx.capture_ = std::make_unique<ArgCapture>(*ctx.dump_, config_.max_tasks_per_run, ctx.epoch_);
  return Status();
}

RunHandle ChipWorker::submit(uint32_t callable, const TaskArgs& args, const CallConfig& call) {
  return submit(callable, args, call, call.swimlane_level > 0 || call.dump_args != DumpArgs::Off);
}

RunHandle ChipWorker::submit(uint32_t callable, const TaskArgs& args, bool diagnostic) {
  return submit(callable, args, config_.call, diagnostic);
}

RunHandle ChipWorker::submit(uint32_t callable, const TaskArgs& args, const CallConfig& call, bool diagnostic) {
  if (closing_.load(std::memory_order_acquire)) return detail::refused_run(0, failed_precondition("worker is closed"));
  if (Status st = refuse_unhealthy("submit"); !st.ok()) return detail::refused_run(0, st);
  if (callable >= callables_.size()) {
    return detail::refused_run(0, not_found("callable id {} is not registered", callable));
  }
  // Refusals that need no set come first, so a bad call never waits for one.
  if (Status st = args.validate(); !st.ok()) return detail::refused_run(0, st);
  if (Status st = check_signature(callables_[callable], args); !st.ok()) return detail::refused_run(0, st);
  if (Status st = diag::validate_call_config(call); !st.ok()) return detail::refused_run(0, st);
  auto lease = acquire_set();
  if (!lease.ok()) return detail::refused_run(0, lease.status());
  NativeRunDescriptor desc;
  desc.lease = *lease;
  desc.arena_bank = lease->slot;
  void* storage = storage_[lease->slot].get();
  RunConfig run_config;
  run_config.call = call;
  run_config.diagnostic = diagnostic;
  auto epoch =
      prepare_as(Preparer::kSubmit, storage, sizeof(StorageBlock), desc, callable, args, std::move(run_config));
  if (!epoch.ok()) {
    release_lease(*lease);
    return detail::refused_run(0, epoch.status());
  }
  NativeRunContext* ctx = NativeRunContext::from_storage(storage);
  std::shared_ptr<detail::RunState> state;
  try {
    state = std::make_shared<detail::RunState>(*epoch);
  } catch (const std::bad_alloc&) {
    // Prepared, never launched, and in no table a phase call reads: no other
    // thread can reach it, so it is aborted here and its set released.
    (void)abort_prepared(ctx, 0);
    return detail::refused_run(0, resource_exhausted("submit: host memory exhausted; run {} was not launched", *epoch));
  }
  ctx->auto_finalize_ = true;
  ctx->handle_ = state;
  enqueue_launch(ctx);
  return RunHandle(std::move(state));
}

// --- run_timeout ---------------------------------------------------------

ChipWorker::Claim ChipWorker::claim_terminal(uint32_t slot, uint64_t expected) {
  WatchedRun& watch = watched_[slot];
  uint64_t d = watch.deadline.load(std::memory_order_acquire);
  for (;;) {
    if (d == WatchedRun::kUnwatched || d >= WatchedRun::kClaiming) return {};
    if (expected != 0 && d != expected) return {};  // another run of this set now
    if (watch.deadline.compare_exchange_weak(d, WatchedRun::kClaiming, std::memory_order_acq_rel)) break;
  }
  Claim claim{std::move(watch.handle), watch.lease, watch.epoch, watch.diagnostic};
  watch.deadline.store(WatchedRun::kClaimed, std::memory_order_release);
  return claim;
}

void ChipWorker::watchdog_main() {
  const uint64_t timeout = timeout_ns(config_.run_timeout);
  // A launch does not ring this thread (that would put a futex wake on every
  // run's path); it looks again at least this often, so a run ends at most
  // an eighth of run_timeout after its deadline.
  const uint64_t period_ns = std::max<uint64_t>(timeout / 8, 1'000'000);
  for (;;) {
    const uint32_t armed = watchdog_bell_.arm();
    if (watchdog_stop_.load(std::memory_order_acquire)) return;
    const uint64_t now = now_ns();
    uint64_t wake = now + period_ns;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      const uint32_t g = grant();
      for (uint32_t slot = 0; slot < g; ++slot) {
        const uint64_t d = watched_[slot].deadline.load(std::memory_order_acquire);
        if (d == WatchedRun::kUnwatched || d >= WatchedRun::kNoDeadline) continue;
        if (d > now) {
          wake = std::min(wake, d);
          continue;
        }
        Claim claim = claim_terminal(slot, d);
        if (claim.handle == nullptr) continue;
        const Status why = make_error(StatusCode::kDeadlineExceeded,
                                      "run {} did not finish within run_timeout = {} ms: a kernel does not return, "
                                      "so the chip is wedged; close this Worker",
                                      claim.epoch, config_.run_timeout.count());
        // Its set may still be written by the kernel that does not return:
        // never reused (a no-op if the run ended meanwhile and gave it back).
        // All of this before the terminal, so whoever sees it sees the chip wedged.
        (void)arena_->quarantine(claim.lease);
        // Nor its terminal bank: no proof that nothing writes it (R57).
        if (claim.diagnostic) (void)banks_.run_close(claim.epoch, /*completed=*/false, /*producers_stopped=*/false);
        {
          std::lock_guard<std::mutex> wedged_lock(wedged_mu_);
          if (wedged_why_.ok()) wedged_why_ = why;
        }
        wedged_.store(true, std::memory_order_release);
        claim.handle->complete(why, RunStats{});
      }
    }
    watchdog_bell_.park(armed, wake);
  }
}

void ChipWorker::stop_watchdog() {
  if (!watchdog_.joinable()) return;
  watchdog_stop_.store(true, std::memory_order_release);
  watchdog_bell_.ring();
  watchdog_.join();
}

// --- introspection and close ---------------------------------------------

uint32_t ChipWorker::launched_now() const {
  std::lock_guard<std::mutex> lock(launch_mu_);
  return launched_;
}

uint32_t ChipWorker::launched_peak() const {
  std::lock_guard<std::mutex> lock(launch_mu_);
  return launched_peak_;
}

size_t ChipWorker::registered_runs() const {
  std::lock_guard<std::mutex> lock(runs_mu_);
  return runs_.size();
}

size_t ChipWorker::run_table_buckets() const {
  std::lock_guard<std::mutex> lock(runs_mu_);
  return runs_.bucket_count();
}

Status ChipWorker::close(std::chrono::milliseconds drain_timeout) {
  if (device_ == nullptr) return Status();
  closing_.store(true, std::memory_order_release);
  admission_bell_.ring();
  const uint64_t deadline = deadline_after(timeout_ns(drain_timeout));
  // A wedged chip has a kernel that does not return: waiting for it is futile.
  const bool drained =
      !wedged() &&
      spin_then_park(
          admission_bell_, [&] { return in_flight_.load(std::memory_order_acquire) == 0; }, SpinPolicy{}, deadline);
  stop_watchdog();
  // The retired runs' files are written and their handles completed before
  // the recorder they read can go.
  diag_writer_.stop();
  if (!drained) {
    // From here on a run that ends touches nothing of this worker, which its
    // owner may destroy while kernels still run; the gate is abandoned below.
    gate_->shut();
    // Every submitted run still without a terminal gets one now: a waiter on
    // its handle must not wait for a device that is about to be abandoned.
    const uint32_t left = in_flight_.load();
    for (uint32_t slot = 0; slot < grant(); ++slot) {
      if (Claim claim = claim_terminal(slot, 0); claim.handle != nullptr) {
        claim.handle->complete(
            make_error(StatusCode::kDeadlineExceeded,
                       "close: the run was still on the device after {} ms; the device was abandoned",
                       drain_timeout.count()),
            RunStats{});
      }
    }
    // The runs still on the device can write nothing of a bank any more (the
    // gate is shut), but none of them proved it stopped: each bank is
    // quarantined, then finalize takes them all back (R56, R62).
    for (uint32_t slot = 0; slot < grant(); ++slot) {
      const NativeRunContext* ctx = running_[slot];
      if (ctx != nullptr && ctx->config_.diagnostic) {
        (void)banks_.run_close(ctx->epoch_, /*completed=*/false, /*producers_stopped=*/false);
      }
    }
    banks_.finalize();
    std::deque<NativeRunContext*> queued;
    {
      std::lock_guard<std::mutex> lock(launch_mu_);
      queued.swap(launch_queue_);
    }
    for (NativeRunContext* ctx : queued) {
      if (ctx->auto_finalize_ && ctx->handle_ != nullptr) {
        ctx->handle_->complete(make_error(StatusCode::kAborted, "close: run {} was never launched", ctx->epoch_), {});
      }
    }
    // Device threads may still write device memory, the graphs and the run
    // storage: abandon all of it on purpose rather than free it under them.
    for (auto& block : storage_) abandon(block.release());
    abandon(runtime_.release());
    abandon(runner_.release());
    abandon(device_.release());
    abandon(gate_.release());
    return make_error(StatusCode::kDeadlineExceeded,
                      "close: {} runs still on the device after {} ms; the device and its run storage were "
                      "abandoned (leaked on purpose)",
                      left, drain_timeout.count());
  }
  device_->stop();
  banks_.finalize();
  runtime_.reset();
  runner_.reset();
  device_.reset();
  return Status();
}

}  // namespace simpler
