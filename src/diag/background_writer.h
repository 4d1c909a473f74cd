// One host thread that runs posted jobs in order: a chip Worker's diagnostic
// output (trace.json, an argument dump's manifest) is written here, off the
// device thread that retired the run, so that AICPU thread goes back to
// dispatching at once. post() from any thread; the thread starts with the
// first job (a Worker that never records has none) and parks when idle.
// stop() runs what was posted, then joins. Owns its queue and its thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace simpler::diag {

class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  ~BackgroundWriter() { stop(); }
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // False once stop() began: the caller runs `job` itself. A failure to
  // start the thread (std::system_error) propagates to the caller, with the
  // job not taken.
  bool post(std::function<void()> job);
  // Every job posted before it returns has run. Idempotent.
  void stop();

 private:
  void main();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace simpler::diag
