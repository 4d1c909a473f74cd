// Peers measured beside simpler in the same run: a classic condition-variable
// thread pool (the hand-off most C++ code writes) and a spinning cache-line
// ping-pong (the hardware floor of any cross-thread round trip). Driven from
// the benchmark's thread; a CondvarPool owns its worker threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "harness.h"

namespace simpler::bench {

class CondvarPool {
 public:
  // A no-op job: the caller owns it and may re-post it once wait() returned.
  struct Job {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };

  explicit CondvarPool(unsigned threads);
  ~CondvarPool();
  CondvarPool(const CondvarPool&) = delete;
  CondvarPool& operator=(const CondvarPool&) = delete;

  void post(Job& job);
  static void wait(Job& job);

 private:
  void serve();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Round trips (µs) of one cache line bounced between two spinning threads.
Summary spin_round_trip_us(int round_trips);

}  // namespace simpler::bench
