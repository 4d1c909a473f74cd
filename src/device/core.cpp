#include "device/core.h"

#include <cstring>
#include <exception>

namespace {
thread_local simpler::CoreRegisters* tls_core = nullptr;

void record_failure(simpler::CoreRegisters* r, const char* message) {
  if (r->failed) return;  // the first report wins
  r->failed = true;
  std::strncpy(r->error, message != nullptr ? message : "(no message)", simpler::kKernelErrorBytes - 1);
  r->error[simpler::kKernelErrorBytes - 1] = '\0';
}
}  // namespace

extern "C" void simpler_kernel_fail(const char* message) {
  if (tls_core != nullptr) record_failure(tls_core, message);
}

namespace simpler {

Core::Core(uint32_t id, CoreType type, uint32_t cluster, Doorbell* owner_bell)
    : id_(id), type_(type), cluster_(cluster), owner_bell_(owner_bell) {}

Core::~Core() { stop(); }

void Core::start(const SpinPolicy& policy) {
  thread_ = std::thread([this, policy] { loop(policy); });
}

void Core::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  regs_.bell.ring();
  thread_.join();
}

void Core::loop(SpinPolicy policy) {
  tls_core = &regs_;
  uint64_t last = 0;
  for (;;) {
    uint64_t token = 0;
    spin_then_park(
        regs_.bell,
        [&] {
          token = regs_.task.load(std::memory_order_acquire);
          return token != last || stop_.load(std::memory_order_acquire);
        },
        policy);
    if (token == last) return;  // stop requested with no task pending
    last = token;
    const uint64_t tok = token & CoreRegisters::kTokenMask;
    regs_.status.store(CoreRegisters::kAck | tok, std::memory_order_release);
    regs_.failed = false;
    try {
      regs_.fn(regs_.args);
    } catch (const std::exception& e) {
      record_failure(&regs_, e.what());
    } catch (...) {
      record_failure(&regs_, "kernel threw a non-standard exception");
    }
    executed_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t fin = CoreRegisters::kFin | (regs_.failed ? CoreRegisters::kFailedBit : 0) | tok;
    regs_.status.store(fin, std::memory_order_release);
    owner_bell_->ring();
  }
}

}  // namespace simpler
