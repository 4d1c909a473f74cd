// SerialRunQueue: the one-at-a-time run queue of a child handler (the sub
// worker, the forked node, the chip child's preparer). It runs started
// requests in arrival order on one thread of its own, or one on the caller's
// thread when nothing is queued or running, and counts each started run
// until the handler reports its terminal (finished()), which is what drain()
// waits for. start, try_run_inline and drain come from the serve-loop thread;
// finished() and idle() from any thread. Owns its thread and the queued requests.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "base/doorbell.h"
#include "ipc/mailbox_child.h"

namespace simpler {

class SerialRunQueue {
 public:
  // Runs one queued request on the queue's thread. The handler calls
  // finished() once the run's ticket holds its terminal, then or later, from
  // any thread.
  using Runner = std::function<void(RunRequest& request, const RunTicket& ticket)>;

  // `what` names the handler in the error of a run refused while draining.
  SerialRunQueue(std::string what, SpinPolicy spin, Runner runner);
  ~SerialRunQueue();
  SerialRunQueue(const SerialRunQueue&) = delete;
  SerialRunQueue& operator=(const SerialRunQueue&) = delete;

  // Starts the thread: in the handler's init(), after fork.
  void init();
  // Queues a run behind every earlier one. Once drain() began, the ticket
  // completes with an error instead and this returns false.
  bool start(RunRequest request, RunTicket ticket);
  // Calls `run` (returning bool) here, on the caller's thread, only when no
  // run is queued or inside a call and the queue is not draining, so order
  // holds. The call counts as started: `run` returns true when it took the
  // request (finished() follows, then or later), false when it left it
  // untouched. True when it was called and took it.
  template <typename Run>
  bool try_run_inline(Run&& run) {
    if (!begin_inline()) return false;
    const bool took = run();
    end_inline(took);
    return took;
  }
  // One started run reached its terminal.
  void finished();
  // Every started run has reported its terminal.
  bool idle();
  // Idle, and no call of a run is still returning: a run offered now is
  // taken inline (what a test of that path waits for). Any thread.
  bool quiet();
  // Waits until idle or `deadline_ns`, then refuses every later start, ends
  // each queued run that never started with an error, and stops the thread:
  // joined, unless it is inside a run at the deadline (a call that may never
  // return), which is left behind. True when idle.
  bool drain(uint64_t deadline_ns);

 private:
  using Job = std::pair<RunRequest, RunTicket>;

  void main();
  bool begin_inline();
  void end_inline(bool took);

  const std::string what_;
  const SpinPolicy spin_;
  const Runner runner_;
  std::mutex mu_;
  std::deque<Job> queue_;
  uint32_t in_flight_ = 0;  // started (queued, inside a call, or awaiting its terminal)
  bool busy_ = false;       // a call of a run is in progress, on the thread or inline
  bool stopping_ = false;
  Doorbell bell_;       // work, or stopping
  Doorbell idle_bell_;  // in_flight_ reached 0
  std::thread thread_;
};

}  // namespace simpler
