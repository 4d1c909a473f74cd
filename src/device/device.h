// The backend seam: what a chip runtime and ChipWorker see of a device.
// A backend (the simulator in device/sim/, one day a real chip) implements
// Device, DeviceMemory and DeviceRunner and registers itself by name
// (backend_registry.h); nothing outside its folder names it. The thread that
// owns the chip creates, starts and stops a Device; its AICPU threads run the
// runtime's AicpuProgram; memory and runner calls are thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "base/grant_owner.h"
#include "device/core_registers.h"
#include "device/host_api.h"
#include "diag/lane.h"
#include "simpler/types.h"

namespace simpler {

// Device memory and its allocator. Addresses are device addresses; when
// host_mapped(), they are also valid host pointers in this process, which a
// runtime that builds its graph in place (host_build_graph) requires.
class DeviceMemory {
 public:
  struct Allocation {
    uint64_t addr;
    uint64_t bytes;
  };

  virtual ~DeviceMemory() = default;
  // RESOURCE_EXHAUSTED names the request and what is free.
  virtual Result<uint64_t> allocate(uint64_t bytes) = 0;
  // Refuses an address that is not the start of a live allocation, and a
  // pinned one. Never allocates host memory, so completion paths may call it.
  virtual Status free(uint64_t addr) = 0;
  // The live allocation starting at `addr` is in use by a live run: free()
  // refuses it until every pin is matched by an unpin. Pins count.
  virtual Status pin(uint64_t addr) = 0;
  // Never allocates; an address that is not pinned is ignored.
  virtual void unpin(uint64_t addr) = 0;
  // The live allocation that holds all of [addr, addr + bytes).
  virtual Result<Allocation> containing_allocation(uint64_t addr, uint64_t bytes) const = 0;
  // Size of the live allocation starting at addr, or 0.
  virtual uint64_t allocation_size(uint64_t addr) const = 0;
  virtual uint64_t total_bytes() const = 0;
  virtual uint64_t free_bytes() const = 0;
  virtual bool host_mapped() const = 0;

  // How far writes reached into the guard bytes around an allocation.
  struct GuardDamage {
    uint64_t before = 0;  // bytes written before its start
    uint64_t past = 0;    // bytes written past its end
    bool any() const { return before != 0 || past != 0; }
  };
  // Whether every allocation carries guard bytes (DeviceOptions::guard_memory).
  virtual bool guarded() const = 0;
  // The damage to the guards of the allocation [addr, addr + bytes), exactly
  // as containing_allocation() reported it; restores them. No damage when
  // not guarded. Any thread; never allocates.
  virtual GuardDamage check_guards(uint64_t addr, uint64_t bytes) = 0;
  // Copies checked against one live allocation; nothing is copied on a refusal.
  virtual Status copy_to_device(uint64_t dst, const void* src, uint64_t bytes) = 0;
  virtual Status copy_from_device(void* dst, uint64_t src, uint64_t bytes) = 0;
  virtual Status memset_device(uint64_t dst, int value, uint64_t bytes) = 0;

  Status check_range(uint64_t addr, uint64_t bytes) const { return containing_allocation(addr, bytes).status(); }
};

// A core's own execution of one kernel, handed to a CoreProgram: the kernel
// runs on the calling core thread exactly as a dispatched one does (the
// device's sticky fault, the crash label, the swimlane level-1 slice when
// `trace_level` != 0, under run `trace_run`). Returns !failure.failed.
class CoreExecutor {
 public:
  virtual bool execute(simpler_kernel_fn fn, int64_t* args, const KernelLabel& label, KernelFailure& failure,
                       uint32_t trace_level, uint64_t trace_run) = 0;

 protected:
  ~CoreExecutor() = default;
};

// What a runtime whose cores schedule themselves (the resident route) runs on
// each core thread, instead of the handshake loop: core_poll(core) does one
// bounded round (claim a ready task, run it through `exec`, complete it) and
// reports whether it made progress; the core spins and then parks on its
// registers' bell around it, which the runtime rings to wake it. Core threads
// only; the program outlives Device::stop().
class CoreProgram {
 public:
  virtual ~CoreProgram() = default;
  virtual bool core_poll(uint32_t core, CoreExecutor& exec) = 0;
};

// What a chip runtime runs on each AICPU thread. poll() does one bounded
// round of scheduling work for the clusters that thread owns and reports
// whether it made progress; the device spins and parks around it.
class AicpuProgram {
 public:
  virtual ~AicpuProgram() = default;
  virtual bool poll(uint32_t aicpu) = 0;
  // When AICPU thread `aicpu`, about to park after polls that found nothing,
  // must poll again though nothing rings it: an absolute now_ns() time, or 0
  // for never. Asked on that thread, before each park.
  virtual uint64_t poll_again_by(uint32_t /*aicpu*/) { return 0; }
  // How long AICPU thread `aicpu` polls before it parks when the device's
  // window is `spin_ns`. Asked on that thread after each empty poll, so cheap.
  virtual uint64_t idle_spin_ns(uint32_t /*aicpu*/, uint64_t spin_ns) const { return spin_ns; }
  // AICPU threads beyond the geometry's, owning no cluster, that a runtime
  // executing orchestrations on the device asks for: poll(aicpu) with aicpu
  // >= geometry().aicpu_threads runs on them. At most kMaxOrchestratorThreads.
  virtual uint32_t orchestrator_threads() const { return 0; }
  static constexpr uint32_t kMaxOrchestratorThreads = 1;
  // The program its cores run themselves, or null: the cores then only
  // answer the handshake registers. Asked once, at Device::start().
  virtual CoreProgram* core_program() { return nullptr; }
};

// The backend's per-set device resources behind every run's HostApi: one
// retained temp buffer per slot and one graph-definition arena per bank,
// each table exactly as wide as the grant. Callbacks for different slots and
// banks may run concurrently.
class DeviceRunner : public GrantOwner {
 public:
  // The backend's one complete, immutable callback table (R78).
  virtual const HostApiOps& ops() const = 0;
  // Refuses a slot or bank outside the grant, naming it.
  virtual Result<HostApi> bind(uint32_t slot, uint32_t bank) = 0;
  // 0 while the slot has none yet.
  virtual uint64_t retained_addr(uint32_t slot) const = 0;
  virtual uint64_t arena_addr(uint32_t bank) const = 0;
  virtual bool callable_uploaded(uint32_t callable_id) const = 0;
};

// One chip. Cores are numbered the same on every backend: cluster c holds
// core 3c (AIC) and cores 3c+1, 3c+2 (AIV), and AICPU thread a owns the
// clusters c with c % aicpu_threads == a.
class Device {
 public:
  virtual ~Device() = default;

  virtual const char* backend() const = 0;
  virtual const Geometry& geometry() const = 0;
  virtual DeviceMemory& memory() = 0;
  // The handshake registers of core `core` (< core_count()); stable for the device's life.
  virtual CoreRegisters& core_registers(uint32_t core) = 0;
  // Starts every core and AICPU thread; `program` must outlive stop(). A run
  // never creates or joins a thread: they live from start() to stop().
  virtual void start(AicpuProgram* program) = 0;
  // Joins every device thread; idempotent.
  virtual void stop() = 0;
  // Wakes AICPU thread `aicpu` (a scheduler, or an orchestrator thread
  // numbered after them) if it is parked.
  virtual void ring_aicpu(uint32_t aicpu) = 0;
  // The runner whose bank arenas are `arena_bytes` each.
  virtual Result<std::unique_ptr<DeviceRunner>> create_runner(uint64_t arena_bytes) = 0;
  // OK, or the sticky fault the device reported (DEVICE_FAULT, naming it):
  // from then on it starts no kernel, and only destroying it clears the
  // fault (cudaDeviceReset; a chip child's exit). Any thread.
  virtual Status fault() const = 0;
  // The swimlane lanes of its cores and AICPU threads, or null for a backend
  // that records none (a traced run is then refused). Stable for its life.
  virtual diag::Recorder* recorder() { return nullptr; }
  // Core `core`'s execution of a kernel on the calling thread, for a
  // dispatcher that runs one inline (same fault, label and lane as the core's
  // own), or null for a backend whose kernels run only on its cores.
  virtual CoreExecutor* core_executor(uint32_t /*core*/) { return nullptr; }

  uint32_t core_count() const { return geometry().cores(); }
  static CoreType core_type(uint32_t core) { return core % 3 == 0 ? CoreType::AIC : CoreType::AIV; }
  uint32_t owner_of_cluster(uint32_t cluster) const { return cluster % geometry().aicpu_threads; }
  void ring_all_aicpu() {
    for (uint32_t a = 0; a < geometry().aicpu_threads; ++a) ring_aicpu(a);
  }
};

}  // namespace simpler
