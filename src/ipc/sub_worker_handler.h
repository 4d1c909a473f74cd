// SubWorkerHandler: the RunHandler of a sub worker child. It runs registered
// host functions (SubFunction) over tensors in the node's shared heap, one at
// a time on a thread of its own (started in init, so after fork). The serve
// loop calls start/drain; the function table is copied in before fork and
// never changes.
#pragma once

#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "ipc/chip_child_handler.h"
#include "ipc/mailbox_child.h"

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
  void drain(uint64_t deadline_ns) override;

 private:
  void main();
  Status call(const RunRequest& request);

  std::vector<SubFunction> functions_;
  const HostRanges heap_;
  std::mutex mu_;
  std::deque<std::pair<RunRequest, RunTicket>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  Doorbell bell_;       // work, or stopping
  Doorbell idle_bell_;  // the queue drained
  std::thread thread_;
};

}  // namespace simpler
