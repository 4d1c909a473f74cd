#include "diag/background_writer.h"

#include "base/thread_name.h"

namespace simpler::diag {

bool BackgroundWriter::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    if (!thread_.joinable()) thread_ = std::thread([this] { main(); });
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void BackgroundWriter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void BackgroundWriter::main() {
  name_this_thread("diag-writer");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and everything posted has run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace simpler::diag
