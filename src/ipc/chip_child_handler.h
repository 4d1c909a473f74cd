// ChipChildHandler: the RunHandler of a chip child. It builds a ChipWorker in
// the child (after fork, in init()) and drives each request through the
// native lifecycle on two threads of its own: a launcher (prepare, launch,
// acceptance at the launch marker) and a completer (finalize, terminal).
// The serve loop calls start/control/drain; the threads own the device calls.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "chip/chip_worker.h"
#include "ipc/mailbox_child.h"

namespace simpler {

class ChipChildHandler final : public RunHandler {
 public:
  ChipChildHandler(WorkerConfig config, std::vector<ChipCallable> callables);
  ~ChipChildHandler() override;

  Status init() override;
  void start(RunRequest request, RunTicket ticket) override;
  Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t capacity) override;
  void drain(uint64_t deadline_ns) override;

 private:
  struct Launched {
    void* storage;
    uint64_t epoch;
    RunTicket ticket;
  };
  struct StorageDeleter {
    void operator()(unsigned char* p) const;
  };

  void launcher_main();
  void completer_main();
  Result<uint32_t> callable_for(const Digest& digest) const;
  Result<DeviceBuffer> buffer_at(uint64_t addr) const;

  const WorkerConfig config_;
  std::vector<ChipCallable> callables_;
  std::unique_ptr<ChipWorker> worker_;
  std::vector<std::unique_ptr<unsigned char, StorageDeleter>> storage_;  // by set slot
  std::map<uint64_t, DeviceBuffer> buffers_;                              // control-frame allocations

  std::mutex mu_;
  std::deque<std::pair<RunRequest, RunTicket>> to_launch_;
  std::deque<Launched> to_finalize_;
  uint32_t in_flight_ = 0;  // started, not yet completed
  bool stopping_ = false;
  Doorbell launch_bell_;    // work for the launcher, a set freed, or stopping
  Doorbell finalize_bell_;  // work for the completer, or stopping
  Doorbell idle_bell_;      // in_flight_ reached 0
  std::thread launcher_;
  std::thread completer_;
};

}  // namespace simpler
