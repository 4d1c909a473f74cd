#include "device/sim/core.h"

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
    const bool ok = call_kernel(regs_.fn, regs_.args, regs_.failure, regs_.label);
    executed_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t fin = CoreRegisters::kFin | (ok ? 0 : CoreRegisters::kFailedBit) | tok;
    regs_.status.store(fin, std::memory_order_release);
    owner_bell_->ring();
  }
}

}  // namespace simpler
