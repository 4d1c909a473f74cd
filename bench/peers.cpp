#include "peers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include <fmt/format.h>

#include "base/shared_memory.h"

namespace simpler::bench {
namespace {

Status errno_status(const char* what) {
  return Status(StatusCode::kInternal, fmt::format("{}: {}", what, std::strerror(errno)));
}

// Forks a child that runs `body` and _exits with its code; the child dies
// with this process, so a failed benchmark leaves no spinner behind.
Result<pid_t> fork_peer(const std::function<int()>& body) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return errno_status("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    _exit(body());
  }
  return pid;
}

void reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// The ping-pong word: 0 idle, odd a ping from the parent, even the pong; -1 stops the echo.
void echo_line(std::atomic<int64_t>& line) {
  for (;;) {
    const int64_t v = line.load(std::memory_order_acquire);
    if (v < 0) return;
    if (v % 2 == 1) line.store(v + 1, std::memory_order_release);
  }
}

Summary ping_line(std::atomic<int64_t>& line, int round_trips) {
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(round_trips));
  for (int64_t i = 0; i < round_trips; ++i) {
    const int64_t ping = 2 * i + 1;
    const uint64_t t0 = wall_ns();
    line.store(ping, std::memory_order_release);
    // Both ends spin on purpose (this is the floor), but never without bound:
    // an echo that stopped answering ends the measurement after a second.
    bool answered = true;
    for (uint32_t n = 1; line.load(std::memory_order_acquire) != ping + 1; ++n) {
      if (n % 4096 == 0 && wall_ns() - t0 > 1'000'000'000ull) {
        answered = false;
        break;
      }
    }
    if (!answered) break;
    samples.push_back(static_cast<double>(wall_ns() - t0) / 1000.0);
  }
  line.store(-1, std::memory_order_release);
  return summarize(std::move(samples));
}

// The far end of pipe_round_trip_us: a forked child echoing bytes between two pipes.
class ForkedPipeEcho {
 public:
  static Result<std::unique_ptr<ForkedPipeEcho>> start();
  ~ForkedPipeEcho();  // closes the pipes (the child exits on EOF) and reaps it
  ForkedPipeEcho(const ForkedPipeEcho&) = delete;
  ForkedPipeEcho& operator=(const ForkedPipeEcho&) = delete;

  Status round_trip();

 private:
  ForkedPipeEcho() = default;
  int to_child_ = -1;
  int from_child_ = -1;
  pid_t pid_ = -1;
};

Result<std::unique_ptr<ForkedPipeEcho>> ForkedPipeEcho::start() {
  int down[2], up[2];
  if (pipe(down) != 0) return errno_status("pipe");
  if (pipe(up) != 0) {
    const Status s = errno_status("pipe");
    close(down[0]);
    close(down[1]);
    return s;
  }
  Result<pid_t> pid = fork_peer([&] {
    close(down[1]);
    close(up[0]);
    char b = 0;
    while (read(down[0], &b, 1) == 1) {
      if (write(up[1], &b, 1) != 1) return 1;
    }
    return 0;
  });
  close(down[0]);
  close(up[1]);
  std::unique_ptr<ForkedPipeEcho> echo(new ForkedPipeEcho());
  echo->to_child_ = down[1];
  echo->from_child_ = up[0];
  if (!pid.ok()) return pid.status();
  echo->pid_ = *pid;
  return echo;
}

ForkedPipeEcho::~ForkedPipeEcho() {
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  if (pid_ > 0) reap(pid_);
}

Status ForkedPipeEcho::round_trip() {
  char b = 1;
  if (write(to_child_, &b, 1) != 1) return errno_status("write to the echo child");
  if (read(from_child_, &b, 1) != 1) return errno_status("read from the echo child");
  return Status();
}

}  // namespace

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
  std::atomic<int64_t> line{0};
  std::thread echo([&] { echo_line(line); });
  Summary s = ping_line(line, round_trips);
  echo.join();
  return s;
}

Result<Summary> pipe_round_trip_us(int warmup, int round_trips) {
  Result<std::unique_ptr<ForkedPipeEcho>> echo = ForkedPipeEcho::start();
  if (!echo.ok()) return echo.status();
  std::vector<double> us;
  for (int i = 0; i < warmup + round_trips; ++i) {
    const uint64_t t0 = wall_ns();
    if (Status s = (*echo)->round_trip(); !s.ok()) return s;
    if (i >= warmup) us.push_back(static_cast<double>(wall_ns() - t0) / 1000.0);
  }
  return summarize(std::move(us));
}

Result<Summary> forked_spin_round_trip_us(int round_trips) {
  Result<SharedMapping> mapping = SharedMapping::create_anonymous(sizeof(std::atomic<int64_t>));
  if (!mapping.ok()) return mapping.status();
  static_assert(std::atomic<int64_t>::is_always_lock_free, "the word is shared between processes");
  auto* line = new (mapping->data()) std::atomic<int64_t>(0);
  Result<pid_t> pid = fork_peer([line] {
    echo_line(*line);
    return 0;
  });
  if (!pid.ok()) return pid.status();
  Summary s = ping_line(*line, round_trips);
  reap(*pid);
  return s;
}

}  // namespace simpler::bench
