// NodeChildHandler: the RunHandler of a network's next-level worker, a forked
// node. In init() (after fork) it builds the node's own NodeWorker, which
// forks the node's children, then runs each request as one node run: the
// NodeCallable the request names, over arguments in the network's shared
// heap. The serve loop calls start/try_run_inline/control/drain; through a
// SerialRunQueue, the queue's thread submits what may wait for the node's
// admission, the loop itself a request the node admits at once and whose
// callable built quickly last time. Each run's terminal reaches its ticket
// (and the queue) from the node's scheduler thread, a role the serve loop
// takes while it spins (poll). Owns the NodeWorker.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "ipc/mailbox_child.h"
#include "ipc/serial_run_queue.h"
#include "node/node_worker.h"

namespace simpler {

class NodeChildHandler final : public RunHandler {
 public:
  // `spec.inherited` holds the network's heaps, the only memory a request's
  // tensors may name.
  NodeChildHandler(NodeSpec spec, std::vector<NodeCallable> callables);
  ~NodeChildHandler() override;

  Status init() override;
  // The node admits pipeline_depth runs at once: that many requests run
  // together, the rest wait for admission in the order they came.
  uint64_t granted_sets() const override { return node_ != nullptr ? spec_.config.pipeline_depth : 0; }
  void start(RunRequest request, RunTicket ticket) override;
  // Submits on the loop when nothing is queued or being submitted (so order
  // holds), the callable's last build took at most kInlineRunBudgetNs and the
  // node admits the run without waiting.
  bool try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) override;
  // kCtrlMemoryInfo only: the sum over the node's chips.
  Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t capacity) override;
  void drain(uint64_t deadline_ns) override;
  // The serve loop stands in for the node's scheduler thread while it spins,
  // so a run the loop submits inline is published without a hand-off.
  bool poll() override { return node_ != nullptr && node_->drive_scheduler(); }
  void stop_polling() override {
    if (node_ != nullptr) node_->release_scheduler();
  }

 private:
  // Submits one request as a node run; its ticket completes (and the queue
  // hears of it) at the run's terminal. False only when `wait` is false and the node admits no more
  // runs now: nothing was done and the ticket is untouched.
  bool submit(const RunRequest& request, const RunTicket& ticket, bool wait);
  Result<TaskArgs> decode(const RunRequest& request) const;
  // The run's diagnostics from the request's config bytes (bounded,
  // validating): its directory this node's part of the network run's.
  static Result<NodeWorker::RunDiagnostics> diagnostics_of(const RunRequest& request);
  // The index of the callable with `digest`, or callables_.size().
  size_t callable_index(const Digest& digest) const;

  const NodeSpec spec_;
  const std::vector<NodeCallable> callables_;
  InlineBudget budget_;  // per callable: its recent submissions
  std::unique_ptr<NodeWorker> node_;
  SerialRunQueue queue_;
};

}  // namespace simpler
