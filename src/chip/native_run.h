// The native-run lifecycle of one chip run: prepare -> launch -> poll / wait ->
// finalize. A NativeRunContext is placement-constructed in caller-owned storage
// (native_run_storage_size/alignment) and owns everything the run needs until
// finalize: the copied descriptor and config, the bound HostApi, the decoded
// arguments and the launch state. Phase calls come from the caller's thread;
// the device's completion path writes only `done_`, `result_` and `stats_`.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chip/run_resource_arena.h"
#include "chip/run_state.h"
#include "device/host_api.h"
#include "diag/arg_capture.h"
#include "diag/args_dump_collector.h"
#include "diag/lane.h"
#include "simpler/task_args.h"
#include "simpler/worker_config.h"

namespace simpler {

class ChipWorker;
class ChipCallable;

// What the caller asks of one native run. Copied at prepare: the caller may
// destroy it at once.
struct NativeRunDescriptor {
  Lease lease;                                     // checked once, at admission
  uint32_t arena_bank = 0;                         // < grant
  std::atomic<uint32_t>* accepted_sink = nullptr;  // written once, at the launch marker
  uint32_t accepted_value = 1;
  // R53: runs on one caller stream (non-zero) reach the device in the order
  // they were launched, each only once the one before it on the stream has
  // left the device; runs on other streams (and 0: none) pass them by.
  uint64_t caller_stream = 0;
};

// A device-to-host copy performed by finalize after a successful run.
struct HostCopy {
  DeviceBuffer src;
  uint64_t src_offset = 0;
  void* dst = nullptr;
  uint64_t bytes = 0;
};

struct RunConfig {
  std::vector<HostCopy> copy_back;
  // This run's sizes for a ring-buffer runtime; unset: the worker's.
  std::optional<RuntimeEnv> runtime_env;
  // Its diagnostics (checked at prepare, naming the field).
  CallConfig call;
  // The process its trace events carry, when not the worker's own label (a
  // node's chip child names each run after the chip index its request gave).
  std::string trace_label;
  // A diagnostic run: it takes one of the chip's terminal banks before its
  // launch (waiting, queued, while all are held) and its completion path
  // writes its TerminalSnapshot there (docs/diagnostics.md). The public
  // CallConfig sets it when it asks for a swimlane or an argument dump.
  bool diagnostic = false;
};

enum class RunPhase : uint32_t { Empty = 0, Prepared = 1, Launching = 2, Launched = 3 };
const char* run_phase_name(RunPhase p);

enum class PollState { NotReady, Complete };

class NativeRunContext {
 public:
  static constexpr uint64_t kMagic = 0x534d504c52554e31ull;  // "SMPLRUN1"

  NativeRunContext(ChipWorker* owner, const NativeRunDescriptor& desc, uint64_t epoch, const ChipCallable* callable,
                   uint32_t callable_id, TaskArgs args, RunConfig config, HostApi api);

  // The context in `storage`, or null when the storage holds none.
  static NativeRunContext* from_storage(void* storage);

  uint64_t magic() const { return magic_.load(std::memory_order_acquire); }
  ChipWorker* owner() const { return owner_; }
  uint64_t epoch() const { return epoch_; }
  const NativeRunDescriptor& descriptor() const { return desc_; }
  const HostApi& api() const { return api_; }
  const TaskArgs& args() const { return args_; }
  const RunConfig& config() const { return config_; }
  const ChipCallable* callable() const { return callable_; }
  uint32_t callable_id() const { return callable_id_; }
  RunPhase phase() const { return static_cast<RunPhase>(phase_.load(std::memory_order_acquire)); }
  bool done() const { return done_.load(std::memory_order_acquire) != 0; }
  // Phase calls holding the run right now (a waiter parked in wait() is one).
  uint32_t users() const { return users_.load(std::memory_order_acquire); }

 private:
  friend class ChipWorker;

  // Set last in the constructor: storage whose construction threw still reads 0.
  std::atomic<uint64_t> magic_{0};
  ChipWorker* const owner_;
  NativeRunDescriptor desc_;
  const uint64_t epoch_;
  const ChipCallable* const callable_;
  const uint32_t callable_id_;
  TaskArgs args_;
  RunConfig config_;
  HostApi api_;
  std::atomic<uint32_t> phase_{static_cast<uint32_t>(RunPhase::Prepared)};
  // Terminal: written by the completion path, `done_` last.
  std::atomic<uint32_t> done_{0};
  Status result_;
  RunStats stats_;
  // Why a launch() was unwound before the device took the run (the run is
  // Prepared again); written before the phase store that reports it.
  Status launch_refusal_;
  // Phase calls inside this run right now; finalize destroys the context only
  // once it is the last, so no call is left holding a freed carrier (R49).
  std::atomic<uint32_t> users_{0};
  // The device allocations of its tensor arguments, pinned until it retires.
  std::vector<uint64_t> pinned_;
  // Runs submitted through Worker::submit finalize themselves on completion.
  bool auto_finalize_ = false;
  // Claimed by the one finalize() that retires the run: a second one inside
  // at once would wait for the first to leave while the first waits for it.
  std::atomic<bool> finalizing_{false};
  std::shared_ptr<detail::RunState> handle_;
  // A traced run (config_.call.swimlane_level > 0): its orchestrator lane
  // (edges, submits), its window in the device's recorder (id 0 until
  // opened) and its times on the device.
  std::unique_ptr<diag::Lane> trace_lane_;
  diag::LaneWindow trace_window_;
  // A dumping run's argument dump: the capture table the runtime fills and
  // the collector that writes DIR/args_dump when the run retires.
  std::unique_ptr<ArgsDumpCollector> dump_;
  std::unique_ptr<ArgCapture> capture_;
  uint64_t trace_launch_ns_ = 0;
  uint64_t trace_end_ns_ = 0;
};

inline constexpr size_t native_run_storage_size() { return sizeof(NativeRunContext); }
inline constexpr size_t native_run_storage_alignment() { return alignof(NativeRunContext); }

// A process-unique run identity, never 0.
uint64_t next_run_epoch();

// Test seam for R81: when set, the next NativeRunContext construction throws
// std::runtime_error from inside a member initialiser, then clears itself.
void fail_next_native_run_construction_for_test();

}  // namespace simpler
