// HbgRuntime: the host_build_graph chip runtime. The host thread that submits
// a run builds its whole graph (tasks, fanin counts, fanout lists) into the
// device memory of one run-resource slot, then launches it; the AICPU threads
// schedule every launched run on the shared cores. build/launch/abort are
// called by the one thread that holds the slot; poll() by AICPU threads only;
// the done callback runs on an AICPU thread (or in launch() for an empty run).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "device/host_api.h"
#include "device/sim_device.h"
#include "runtime/hbg/access_index.h"
#include "runtime/hbg/graph.h"
#include "runtime/hbg/ready_queue.h"

namespace simpler::hbg {

struct RunOutcome {
  Status status;
  uint32_t tasks = 0;
  uint32_t executed = 0;          // subtasks that ran a kernel
  uint32_t released_early = 0;    // intermediates freed during the run by a closed scope
  uint64_t launch_ns = 0;
  uint64_t end_ns = 0;
};

// Called once per launched run, after the runtime stopped touching the slot.
using RunDoneFn = std::function<void(uint32_t slot, RunOutcome outcome)>;

class GraphBuilder;

struct Slot {
  uint32_t index = 0;
  uint64_t arena_addr = 0;  // the bank arena the pointers below are carved from
  Task* tasks = nullptr;
  DeviceTensor* descriptors = nullptr;
  uint32_t* fanout = nullptr;
  uint32_t* uses = nullptr;

  // Build state: written only by the building thread, before launch.
  HostApi api;
  const ChipCallable* callable = nullptr;
  uint32_t task_count = 0;
  uint32_t desc_count = 0;
  std::vector<std::pair<uint32_t, uint32_t>> edges;      // (from, to)
  std::vector<std::pair<uint32_t, uint32_t>> use_pairs;  // (task, intermediate)
  std::vector<uint32_t> pred_mark;                       // edge de-duplication
  std::vector<uint32_t> counts;                          // CSR scratch
  std::unique_ptr<AccessIndex> accesses;
  // Allocations already looked up in this build: most tasks name a few
  // buffers over and over, and the device allocator's lock is shared with
  // AICPU threads freeing intermediates.
  std::array<GlobalMemory::Allocation, 4> known_allocations{};
  uint32_t known_next = 0;
  std::unique_ptr<Intermediate[]> intermediates;
  uint32_t intermediate_count = 0;
  std::unordered_map<uint64_t, uint32_t> intermediate_of;  // addr -> index
  std::vector<std::vector<uint32_t>> scopes;
  Status build_error;

  // Execution state: shared by AICPU threads after launch.
  std::atomic<uint32_t> remaining{0};
  std::atomic<uint32_t> executed{0};
  std::atomic<uint32_t> released_early{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status first_error;
  uint64_t launch_ns = 0;
};

class HbgRuntime final : public AicpuProgram {
 public:
  // A runtime for runs of up to `max_tasks` tasks, with no run-resource set
  // yet (see build_grant); the device memory of each graph comes from the
  // run's HostApi (its bank arena). Start the device with this program.
  static Result<std::unique_ptr<HbgRuntime>> create(SimDevice& device, uint32_t max_tasks, RunDoneFn on_done);

  // The per-set host state and ready-queue storage of a grant, built off to the side.
  struct GrantState {
    std::vector<std::unique_ptr<Slot>> slots;
    std::vector<ReadyItem> rings[3];
  };
  // May throw std::bad_alloc; touches no member.
  GrantState build_grant(uint32_t grant) const;
  // Only while no run is built or launched.
  void commit_grant(GrantState& state) noexcept;
  ~HbgRuntime() override;

  // Bytes of one bank arena: task records, tensor descriptors, fanout and use lists.
  static uint64_t arena_bytes(uint32_t max_tasks);

  // Runs the callable's orchestration to build the run's graph in set
  // `api.slot`, in the device memory of bank `api.bank`. On error nothing is
  // launched and the set holds nothing (its intermediates are freed).
  Status build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args);
  // Frees what a built but never launched run holds.
  void discard(uint32_t slot);
  // Publishes the built graph's root tasks to the AICPU threads.
  void launch(uint32_t slot);

  bool poll(uint32_t aicpu) override;

  const Capacity& capacity() const { return capacity_; }
  // Whether set `slot` holds a HostApi binding; true only inside build().
  bool binding_held(uint32_t slot) const { return slots_[slot]->api.bound(); }
  uint32_t slot_count() const { return static_cast<uint32_t>(slots_.size()); }

 private:
  friend class GraphBuilder;
  struct Inflight {
    uint32_t slot = 0;
    uint32_t task = 0;
    uint32_t token = 0;
    bool busy = false;
  };
  struct alignas(64) AicpuState {
    std::vector<uint32_t> clusters;
    std::vector<ReadyItem> scratch;  // newly ready tasks, pushed in one batch
  };

  HbgRuntime(SimDevice& device, Capacity capacity, RunDoneFn on_done);
  void reset_slot(Slot& s);
  void release_intermediates(Slot& s);
  Status bind_arena(Slot& s, const HostApi& api);
  void finalize_graph(Slot& s);
  void dispatch(uint32_t core, ReadyItem item, uint32_t sub);
  void complete_subtask(uint32_t core, bool kernel_failed, std::vector<ReadyItem>& ready);
  void finish_task(Slot& s, uint32_t task, bool failed, std::vector<ReadyItem>& ready);
  void publish_ready(std::vector<ReadyItem>& ready);
  void finish_run(Slot& s);
  void record_error(Slot& s, Status st);

  SimDevice& device_;
  const Capacity capacity_;
  RunDoneFn on_done_;
  std::vector<std::unique_ptr<Slot>> slots_;
  ReadyQueue aic_queue_;
  ReadyQueue aiv_queue_;
  ReadyQueue mix_queue_;
  std::vector<Inflight> inflight_;  // per core; only its owning AICPU thread touches it
  std::vector<uint32_t> next_token_;
  std::unique_ptr<AicpuState[]> aicpu_;
};

}  // namespace simpler::hbg
