// ExternalWorker: a network's next-level worker that this process does not
// fork (a node on another MPI rank, src/dist/). It is an EndpointPort, so
// the Scheduler drives it exactly as it drives a forked node's mailbox, plus
// what the NodeWorker asks a next-level worker outside the scheduler. Built
// by its factory after the node's own children are forked (a factory may
// start threads), on the thread that runs NodeWorker::create; afterwards the
// EndpointPort methods belong to the scheduler thread, memory_info and close
// to the controlling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/doorbell.h"
#include "base/host_range.h"
#include "node/worker_lane.h"
#include "simpler/callable.h"
#include "simpler/types.h"

namespace simpler {

struct ExternalContext {
  uint32_t index = 0;             // the next-level worker's index, for errors
  uint32_t pipeline_depth = 0;    // what it must grant at least (R68)
  std::vector<Digest> callables;  // the network's NodeCallables: it must serve every one
  HostRanges shared;              // where the network's tensors live
  Doorbell* bell = nullptr;       // the scheduler's: rung whenever a poll would find news
  uint64_t run_deadline_ns = 0;   // config.run_timeout; 0 = none
  // Keeps the shared-heap block holding addr from reuse, and with `write`
  // from new work, until the returned hold is dropped (null: addr is in no
  // live block): for a transfer this process no longer controls. Any thread.
  std::function<std::shared_ptr<void>(uint64_t addr, bool write)> hold_shared;
};

// The external node's clock as this process sees it: this clock minus the
// node's, estimated from a ping-pong whose round trip took rtt_ns (so the
// estimate is off by at most rtt_ns / 2).
struct ClockEstimate {
  int64_t offset_ns = 0;
  uint64_t rtt_ns = 0;
};

// What became of the files a traced or dumping task sent back: `refused`
// says why none of them was kept (empty: kept, or none was sent).
struct ShipmentNote {
  std::string refused;
};

class ExternalWorker : public EndpointPort {
 public:
  // Device memory of the node behind it (the sum over its chips).
  virtual Result<MemoryInfo> memory_info(uint64_t deadline_ns) = 0;
  // Asks the node to drain and stop; every run still held at deadline_ns
  // gets a terminal. OK for an orderly end.
  virtual Status close(uint64_t deadline_ns) = 0;
  // The latest clock estimate; any thread.
  virtual ClockEstimate clock() const = 0;
  // The note on task `task` of run `run_id`'s files, once: the scheduler
  // thread asks as it merges the run's trace, after the task's terminal.
  virtual std::optional<ShipmentNote> take_shipment_note(uint64_t run_id, uint32_t task) = 0;
};

using ExternalWorkerFactory = std::function<Result<std::unique_ptr<ExternalWorker>>(const ExternalContext&)>;

}  // namespace simpler
