// One run's argument dump while it runs: a DumpLane per AICPU thread and a
// host thread that drains them into DIR (manifest.json + args.bin), so a
// producer waits only on what the host has not yet consumed. Created by the
// thread that prepares a dumping run; lane(i) is used by AICPU thread i
// only; finish() by the thread that retires the run, once the device
// stopped producing. Owns its lanes, its writer and its thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "diag/args_dump_file.h"
#include "diag/args_dump_lane.h"

namespace simpler {

class ArgsDumpCollector {
 public:
  struct Options {
    std::string dir;  // the dump's directory: manifest.json and args.bin land here
    // Non-empty: `dir` is this run's own staging directory, moved to
    // publish_dir once the manifest is written (replacing the dump there), so
    // runs dumping at once into one trace_dir never share args.bin; the last
    // one to finish stays, as for trace.json.
    std::string publish_dir;
    DumpSelection selection = DumpSelection::kFull;
    uint32_t lanes = 1;  // AICPU threads
    DumpLaneConfig lane;
    uint64_t run_epoch = 0;
    std::function<std::string(uint32_t func_id)> kernel_name;
    // Tests: while it returns true for a lane, the host thread does not
    // drain it (it stops acknowledging payloads); wake() after a change.
    std::function<bool(uint32_t lane)> hold;
  };
  // Creates the directory, the lanes and the host thread.
  static Result<std::unique_ptr<ArgsDumpCollector>> start(Options options);
  ~ArgsDumpCollector();  // finish(false) if finish() was not called
  ArgsDumpCollector(const ArgsDumpCollector&) = delete;
  ArgsDumpCollector& operator=(const ArgsDumpCollector&) = delete;

  DumpSelection selection() const { return options_.selection; }
  DumpLane& lane(uint32_t aicpu) { return *lanes_[aicpu]; }
  // The run's capture sequence: the order of the manifest and of `dump diff`.
  uint64_t next_order() { return order_.fetch_add(1, std::memory_order_relaxed); }
  // Makes the host thread look at every lane again (after `hold` changed).
  void wake() { bell_.ring(); }

  // Stops the host thread and writes the manifest. `producers_stopped`: the
  // device can no longer write a lane (the run's outcome was delivered, so
  // its AICPU threads left it); without that proof nothing more is drained
  // and the dump says it is incomplete. Idempotent; the first call's status.
  Status finish(bool producers_stopped);

 private:
  explicit ArgsDumpCollector(Options options);
  void drain_loop();
  // Moves the finished `staging` directory to `dir`.
  static Status publish(const std::string& staging, const std::string& dir);

  Options options_;
  std::vector<std::unique_ptr<DumpLane>> lanes_;
  std::unique_ptr<ArgsDumpWriter> writer_;
  std::vector<DumpLane::Sink> sinks_;
  std::atomic<uint64_t> order_{0};
  Doorbell bell_;  // every lane's host bell
  std::atomic<bool> stop_{false};
  std::thread thread_;
  bool finished_ = false;
  Status finish_status_;
};

}  // namespace simpler
