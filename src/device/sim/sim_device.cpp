#include "device/sim/sim_device.h"

#include <algorithm>

#include "base/errors.h"
#include "base/thread_name.h"
#include "base/user_code.h"
#include "device/backend_registry.h"
#include "device/sim/sim_runner.h"

namespace simpler {

Result<std::unique_ptr<SimDevice>> SimDevice::create(const Geometry& geometry, uint64_t memory_bytes,
                                                     bool guard_memory) {
  SIMPLER_RETURN_IF_ERROR(geometry.validate());
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<GlobalMemory> memory, GlobalMemory::create(memory_bytes, guard_memory));
  return std::unique_ptr<SimDevice>(new SimDevice(geometry, std::move(memory)));
}

SimDevice::SimDevice(Geometry geometry, std::unique_ptr<GlobalMemory> memory)
    : geometry_(std::move(geometry)),
      recorder_(geometry_.cores(), geometry_.aicpu_threads),
      memory_(std::move(memory)),
      bells_(new PaddedBell[geometry_.aicpu_threads + AicpuProgram::kMaxOrchestratorThreads]) {
  for (uint32_t i = 0; i < geometry_.cores(); ++i) {
    const uint32_t cluster = i / 3;
    cores_.push_back(std::make_unique<Core>(i, core_type(i), cluster, &bells_[owner_of_cluster(cluster)].bell, &fault_,
                                            &recorder_.core_lane(i)));
  }
}

SimDevice::~SimDevice() { stop(); }

void SimDevice::start(AicpuProgram* program) {
  program_ = program;
  stop_.store(false);
  CoreProgram* const on_cores = program->core_program();
  // Every thread of this device runs user code for it (kernels, a
  // device-side orchestration): marked as this Device, the owner a
  // ChipWorker knows, so a call back into the chip's Worker is refused.
  const Device* const self = this;
  for (auto& c : cores_) c->start(policy_, on_cores, self);
  const uint32_t threads =
      geometry_.aicpu_threads + std::min(program->orchestrator_threads(), AicpuProgram::kMaxOrchestratorThreads);
  for (uint32_t a = 0; a < threads; ++a) {
    aicpu_.emplace_back([this, a, self] {
      const UserCodeMark orchestration(self);
      aicpu_loop(a);
    });
  }
}

void SimDevice::stop() {
  if (aicpu_.empty()) return;
  stop_.store(true, std::memory_order_seq_cst);
  for (size_t a = 0; a < aicpu_.size(); ++a) ring_aicpu(static_cast<uint32_t>(a));
  for (auto& t : aicpu_) t.join();
  aicpu_.clear();
  for (auto& c : cores_) c->stop();
}

Result<std::unique_ptr<DeviceRunner>> SimDevice::create_runner(uint64_t arena_bytes) {
  return std::unique_ptr<DeviceRunner>(new SimRunner(*memory_, arena_bytes));
}

void SimDevice::aicpu_loop(uint32_t index) {
  if (index < geometry_.aicpu_threads) {
    name_this_thread("aicpu{}", index);
  } else {
    name_this_thread("orchestrator{}", index - geometry_.aicpu_threads);
  }
  Doorbell& bell = bells_[index].bell;
  IdleSpin idle(policy_.spin_ns);
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return;
    if (program_->poll(index)) {
      idle.busy();
      continue;
    }
    if (idle.keep_polling(program_->idle_spin_ns(index, policy_.spin_ns))) continue;
    // Counted as parked only on the way to a park, then stop_ and the poll
    // read once more: a ring that lands after this point (a FIN, a launch,
    // stop()) makes the wait return at once, and one before it made its work
    // visible to that poll, so no wake-up is lost. Every ring of this bell is
    // a ring_parked(): while this thread polls, the ringers (its cores' FINs,
    // the orchestrator's submits, the other AICPU threads) only read the
    // bell's line, where an add per ring moved it between them each time.
    Doorbell::Parking parking(bell);
    if (stop_.load(std::memory_order_acquire)) return;
    if (program_->poll(index)) {
      idle.busy();
      continue;
    }
    parks_.fetch_add(1, std::memory_order_relaxed);
    // Level 3 shows a scheduler thread's parks; a spin is not worth an event.
    const bool traced = index < geometry_.aicpu_threads && recorder_.live_level() >= 3;
    const uint64_t parked = traced ? now_ns() : 0;
    parking.wait(program_->poll_again_by(index));
    if (traced) {
      recorder_.aicpu_lane(index).record(diag::Event{0, parked, now_ns(), "idle", 0, 0, diag::EventKind::kSched});
    }
    idle.woke();
  }
}

namespace {
Result<std::unique_ptr<Device>> create_sim(const DeviceOptions& options) {
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<SimDevice> d,
                           SimDevice::create(options.geometry, options.memory_bytes, options.guard_memory));
  return std::unique_ptr<Device>(std::move(d));
}
}  // namespace

SIMPLER_REGISTER_BACKEND(sim,
                         BackendInfo{"sim", "simulated chip: AICPU and AICore threads over host memory", &create_sim});

}  // namespace simpler
