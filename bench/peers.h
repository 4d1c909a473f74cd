// Peers measured beside simpler in the same run: a classic condition-variable
// thread pool (the hand-off most C++ code writes), a pipe ping-pong with a
// forked process (the classic hand-off to another process) and spinning
// cache-line ping-pongs between threads or processes (the hardware floor of
// any round trip). Driven from the benchmark's thread; a CondvarPool owns its
// worker threads; the forked peers reap their children before returning. They
// fork, so call them while the benchmark runs no thread of its own.
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

// Round trips (µs) of a pipe ping-pong with a forked child that answers each
// byte written to one pipe with a byte on another (post one job to another
// process, block until its answer), after `warmup` untimed ones.
Result<Summary> pipe_round_trip_us(int warmup, int round_trips);

// Round trips (µs) of one cache line of shared memory bounced between this
// process and a forked child, both spinning: the floor of any hand-off
// between two processes.
Result<Summary> forked_spin_round_trip_us(int round_trips);

}  // namespace simpler::bench
