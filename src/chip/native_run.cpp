#include "chip/native_run.h"

#include <stdexcept>

namespace simpler {

namespace {
std::atomic<uint64_t> g_next_epoch{1};
std::atomic<bool> g_fail_next_construction{false};

TaskArgs take_args(TaskArgs args) {
  if (g_fail_next_construction.exchange(false)) throw std::runtime_error("injected NativeRunContext member failure");
  return args;
}
}  // namespace

const char* run_phase_name(RunPhase p) {
  switch (p) {
    case RunPhase::Empty:
      return "empty";
    case RunPhase::Prepared:
      return "prepared";
    case RunPhase::Launching:
      return "launching";
    case RunPhase::Launched:
      return "launched";
  }
  return "invalid";
}

uint64_t next_run_epoch() { return g_next_epoch.fetch_add(1, std::memory_order_relaxed); }

void fail_next_native_run_construction_for_test() { g_fail_next_construction.store(true); }

NativeRunContext::NativeRunContext(ChipWorker* owner, const NativeRunDescriptor& desc, uint64_t epoch,
                                   const ChipCallable* callable, uint32_t callable_id, TaskArgs args, RunConfig config,
                                   HostApi api)
    : owner_(owner),
      desc_(desc),
      epoch_(epoch),
      callable_(callable),
      callable_id_(callable_id),
      args_(take_args(std::move(args))),
      config_(std::move(config)),
      api_(api) {
  magic_.store(kMagic, std::memory_order_release);
}

NativeRunContext* NativeRunContext::from_storage(void* storage) {
  auto* ctx = static_cast<NativeRunContext*>(storage);
  return ctx->magic() == kMagic ? ctx : nullptr;
}

}  // namespace simpler
