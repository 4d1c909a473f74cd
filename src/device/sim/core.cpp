#include "device/sim/core.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/thread_name.h"
#include "base/user_code.h"

namespace simpler {

#ifdef SIMPLER_TEST_HOOKS
namespace {
std::atomic<void (*)()> g_skip_hook{nullptr};
}  // namespace
void set_core_skip_hook(void (*hook)()) { g_skip_hook.store(hook, std::memory_order_release); }
#endif

Core::Core(uint32_t id, CoreType type, uint32_t cluster, Doorbell* owner_bell, StickyFault* fault, diag::Lane* lane)
    : id_(id), type_(type), cluster_(cluster), owner_bell_(owner_bell), fault_(fault), lane_(lane) {}

Core::~Core() { stop(); }

void Core::start(const SpinPolicy& policy, CoreProgram* program, const void* device) {
  if (program != nullptr) {
    thread_ = std::thread([this, policy, program, device] {
      const UserCodeMark kernels(device);
      program_loop(policy, program);
    });
  } else {
    thread_ = std::thread([this, policy, device] {
      const UserCodeMark kernels(device);
      loop(policy);
    });
  }
}

void Core::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  regs_.bell.ring();
  thread_.join();
}

void Core::loop(SpinPolicy policy) {
  name_this_thread("{}{}", type_ == CoreType::AIC ? "aic" : "aiv", id_);
  bool last_ok = true;  // the token before ran and succeeded: a kAfterOk token may run
  for (uint32_t tok = 1;; ++tok) {
    const uint32_t slot = CoreRegisters::slot_of(tok);
    CoreRegisters::Descriptor& d = regs_.descriptor[slot];
    bool posted = false;
    spin_then_park(
        regs_.bell,
        [&] {
          uint64_t w = d.token.load(std::memory_order_acquire);
          if (static_cast<uint32_t>(w) == tok && (w & CoreRegisters::kRevoked) == 0) {
            // A failed claim means the AICPU took the token back: wait for its repost.
            posted = (w & CoreRegisters::kRevocable) == 0 ||
                     d.token.compare_exchange_strong(w, w | CoreRegisters::kClaimed, std::memory_order_acq_rel,
                                                     std::memory_order_acquire);
          }
          return posted || stop_.load(std::memory_order_acquire);
        },
        policy);
    if (!posted) return;  // stop requested with no task pending
    if ((d.token.load(std::memory_order_relaxed) & CoreRegisters::kAfterOk) != 0 && !last_ok) {
#ifdef SIMPLER_TEST_HOOKS
      if (void (*hook)() = g_skip_hook.load(std::memory_order_acquire)) hook();
#endif
      regs_.ended[slot] = CoreRegisters::Ended{0, 0, 1};
      regs_.status.store(CoreRegisters::kFin | tok, std::memory_order_release);
      owner_bell_->ring_parked();
      continue;
    }
    regs_.status.store(CoreRegisters::kAck | tok, std::memory_order_release);
    // Recorded before FIN: once the owner reaps it, the run may end and be exported.
    const bool traced = d.trace_level != 0 && lane_ != nullptr;
    const uint64_t begin = now_ns();
    const bool ok = run_kernel(d.fn, d.args, regs_.failure[slot], d.label);
    const uint64_t end = now_ns();
    regs_.ended[slot] =
        CoreRegisters::Ended{static_cast<uint32_t>(std::min<uint64_t>(end - begin, UINT32_MAX)), !ok, 0};
    last_ok = ok;
    if (traced) {
      lane_->record(
          diag::Event{d.trace_run, begin, end, d.label.name, d.label.task, d.label.func_id, diag::EventKind::kTask});
    }
    executed_.fetch_add(1, std::memory_order_relaxed);
    regs_.status.store(CoreRegisters::kFin | tok, std::memory_order_release);
    owner_bell_->ring_parked();
  }
}

void Core::program_loop(SpinPolicy policy, CoreProgram* program) {
  name_this_thread("{}{}", type_ == CoreType::AIC ? "aic" : "aiv", id_);
  IdleSpin idle(policy.spin_ns);
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return;
    if (program->core_poll(id_, *this)) {
      idle.busy();
      continue;
    }
    if (idle.keep_polling()) continue;
    // Counted as parked on the way to a park, then stop_ and the poll read again, as on
    // an AICPU thread: a ring after this point (new work, a gang peer,
    // stop()) makes the park return, and one before it is seen by that poll.
    Doorbell::Parking parking(regs_.bell);
    if (stop_.load(std::memory_order_acquire)) return;
    if (program->core_poll(id_, *this)) {
      idle.busy();
      continue;
    }
    parking.wait();
    idle.woke();
  }
}

bool Core::execute(simpler_kernel_fn fn, int64_t* args, const KernelLabel& label, KernelFailure& failure,
                   uint32_t trace_level, uint64_t trace_run) {
  const bool traced = trace_level != 0 && lane_ != nullptr;
  const uint64_t begin = traced ? now_ns() : 0;
  const bool ok = run_kernel(fn, args, failure, label);
  if (traced) {
    lane_->record(
        diag::Event{trace_run, begin, now_ns(), label.name, label.task, label.func_id, diag::EventKind::kTask});
  }
  executed_.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

bool Core::run_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure, const KernelLabel& label) {
  if (fault_ == nullptr) return call_kernel(fn, args, failure, label);
#ifdef SIMPLER_TEST_HOOKS
  device_fault_hook_fire(label.func_id, *fault_, [&] {
    return Status(StatusCode::kDeviceFault,
                  fmt::format("sticky device fault (H3 test hook) when task {} (kernel '{}', func_id {}) "
                              "started on core {}",
                              label.task, label.name != nullptr ? label.name : "?", label.func_id, id_));
  });
#endif
  if (!fault_->raised()) return call_kernel(fn, args, failure, label);
  // Not started: the task fails with the fault, which the chip reports as the run's cause.
  const std::string why = "not run: the device has a sticky fault: " + fault_->status().message();
  failure.failed = true;
  std::strncpy(failure.message, why.c_str(), kKernelErrorBytes - 1);
  failure.message[kKernelErrorBytes - 1] = '\0';
  return false;
}

}  // namespace simpler
