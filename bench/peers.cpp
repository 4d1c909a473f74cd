#include "peers.h"

#include <atomic>

namespace simpler::bench {

CondvarPool::CondvarPool(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { serve(); });
}

CondvarPool::~CondvarPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void CondvarPool::post(Job& job) {
  {
    std::lock_guard lock(job.mu);
    job.done = false;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(&job);
  }
  cv_.notify_one();
}

void CondvarPool::wait(Job& job) {
  std::unique_lock lock(job.mu);
  job.cv.wait(lock, [&] { return job.done; });
}

void CondvarPool::serve() {
  for (;;) {
    Job* job = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    {
      std::lock_guard lock(job->mu);
      job->done = true;
    }
    job->cv.notify_one();
  }
}

Summary spin_round_trip_us(int round_trips) {
  // 0 = idle, odd = ping from the caller, even = pong; -1 stops the echo thread.
  std::atomic<int64_t> line{0};
  std::thread echo([&] {
    for (;;) {
      const int64_t v = line.load(std::memory_order_acquire);
      if (v < 0) return;
      if (v % 2 == 1) line.store(v + 1, std::memory_order_release);
    }
  });
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(round_trips));
  for (int64_t i = 0; i < round_trips; ++i) {
    const int64_t ping = 2 * i + 1;
    const uint64_t t0 = wall_ns();
    line.store(ping, std::memory_order_release);
    while (line.load(std::memory_order_acquire) != ping + 1) {
    }
    samples.push_back(static_cast<double>(wall_ns() - t0) / 1000.0);
  }
  line.store(-1, std::memory_order_release);
  echo.join();
  return summarize(std::move(samples));
}

}  // namespace simpler::bench
