#include "ipc/serial_run_queue.h"

#include <optional>

#include "base/errors.h"

namespace simpler {

SerialRunQueue::SerialRunQueue(std::string what, SpinPolicy spin, Runner runner)
    : what_(std::move(what)), spin_(spin), runner_(std::move(runner)) {}

SerialRunQueue::~SerialRunQueue() {
  // A std::thread still joinable at destruction would terminate the process.
  if (thread_.joinable()) (void)drain(now_ns() + 5'000'000'000ull);
}

void SerialRunQueue::init() {
  thread_ = std::thread([this] { main(); });
}

bool SerialRunQueue::start(RunRequest request, RunTicket ticket) {
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused = stopping_;
    if (!refused) {
      ++in_flight_;
      queue_.emplace_back(std::move(request), ticket);
    }
  }
  if (refused) {
    ticket.complete(failed_precondition("{} is draining", what_));
    return false;
  }
  bell_.ring();
  return true;
}

bool SerialRunQueue::begin_inline() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || busy_ || !queue_.empty()) return false;
  busy_ = true;
  ++in_flight_;
  return true;
}

void SerialRunQueue::end_inline(bool took) {
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (!took) idle = --in_flight_ == 0;
  }
  if (idle) idle_bell_.ring();
}

void SerialRunQueue::finished() {
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle = --in_flight_ == 0;
  }
  if (idle) idle_bell_.ring();
}

bool SerialRunQueue::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_ == 0;
}

bool SerialRunQueue::quiet() {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_ == 0 && !busy_;
}

void SerialRunQueue::main() {
  for (;;) {
    std::optional<Job> job;
    bool stop = false;
    spin_then_park(
        bell_,
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) {
            stop = true;  // drain took what was queued
            return true;
          }
          if (queue_.empty()) return false;
          job.emplace(std::move(queue_.front()));
          queue_.pop_front();
          busy_ = true;
          return true;
        },
        spin_);
    if (stop) return;
    runner_(job->first, job->second);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

bool SerialRunQueue::drain(uint64_t deadline_ns) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return in_flight_ == 0;  // drained before: the thread is already gone
  }
  const bool idle = spin_then_park(
      idle_bell_, [&] { return this->idle(); }, spin_, deadline_ns);
  std::deque<Job> never_started;
  bool busy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    never_started.swap(queue_);
    busy = busy_;
  }
  bell_.ring();
  for (Job& job : never_started) {
    job.second.complete(make_error(StatusCode::kAborted, "{} drained before this run started", what_));
    finished();
  }
  if (!thread_.joinable()) return idle;
  if (idle || !busy) {
    thread_.join();  // not inside a run, or leaving it: it sees stopping_ and returns
  } else {
    thread_.detach();  // a run that does not return; the child exits after the sweep
  }
  return idle;
}

}  // namespace simpler
