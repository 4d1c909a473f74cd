// SubWorkerHandler: the RunHandler of a sub worker child. It runs registered
// host functions (SubFunction) over tensors in the node's shared heap, one at
// a time through a SerialRunQueue: on the serve-loop thread when the loop is
// otherwise idle and the function's recent runs were short (InlineBudget; no
// thread hop on the latency path), else on the queue's thread (started in
// init, so after fork). The serve loop calls start/try_run_inline/drain; the
// function table is copied in before fork and never changes. A function that
// was short and then blocks holds the loop with it: a later frame's hand-back
// waits for its return like the later function itself would, and past the
// node's run_timeout the parent kills the child like a hung chip.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "base/host_range.h"
#include "ipc/mailbox_child.h"
#include "ipc/serial_run_queue.h"

namespace simpler {

// The identity of the i-th registered sub function: both sides derive it from
// the index, since a std::function has no content to hash.
Digest sub_function_digest(uint32_t index);

class SubWorkerHandler final : public RunHandler {
 public:
  SubWorkerHandler(std::vector<SubFunction> functions, HostRanges shared);
  ~SubWorkerHandler() override;

  Status init() override;
  void start(RunRequest request, RunTicket ticket) override;
  bool try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) override;
  void drain(uint64_t deadline_ns) override;

 private:
  // The function's index, or functions_.size() when none has that digest.
  size_t find(const Digest& callable) const;
  // Accepts, calls and completes one request, records whether it was short,
  // and reports the terminal to the queue.
  void run(size_t index, const RunRequest& request, const RunTicket& ticket);
  Status call(size_t index, const RunRequest& request);

  std::vector<SubFunction> functions_;
  std::vector<Digest> digests_;  // sub_function_digest(i), hashed once
  InlineBudget budget_;          // per function: its recent runs
  const HostRanges heap_;
  SerialRunQueue queue_;
};

}  // namespace simpler
