// Shared helpers of the unit tests: a per-test watchdog, bounded waits, a
// thread counter and small host-side tensor helpers. Test-thread use only.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "simpler/simpler.h"

namespace simpler {
// gtest prints Status values as "CODE: message".
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.to_string(); }
}  // namespace simpler

namespace simpler::testing {

using namespace std::chrono_literals;

// A seeded 64-bit generator step (splitmix64): random test inputs that a
// printed seed repeats.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// An unsigned environment variable (any base strtoull reads), or `fallback`.
inline uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 0) : fallback;
}

// A mutex-and-condition-variable queue whose pop has a deadline.
template <typename T>
class Channel {
 public:
  void push(T v) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // The next item; nullopt once closed and drained, or at the deadline (then *timed_out).
  std::optional<T> pop(std::chrono::steady_clock::time_point deadline, bool* timed_out) {
    std::unique_lock<std::mutex> lock(mu_);
    *timed_out = !cv_.wait_until(lock, deadline, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  std::optional<T> try_pop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false;
};

// Every blocking wait of a test is bounded by this.
inline constexpr std::chrono::seconds kWait{30};

// Kills the test process if a test body outlives `limit`, so that a hang in a
// call that takes no deadline (Worker::close, a blocking submit) still fails
// with a message instead of running into the ctest timeout.
//
// It is an alarm, not a thread: node tests fork, and the product forks its
// children before it starts any thread of its own. A watchdog thread would make
// every such fork a fork of a multi-threaded process, which is what the product
// avoids and what ThreadSanitizer's die_after_fork checks. A pending alarm is
// not inherited by a forked child, so children never see it.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit = std::chrono::seconds(90)) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const int n = std::snprintf(message_, sizeof message_, "watchdog: %s.%s still running after %lld s; aborting\n",
                                info ? info->test_suite_name() : "?", info ? info->name() : "?",
                                static_cast<long long>(limit.count()));
    length_ = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof message_ - 1);
    struct sigaction sa {};
    sa.sa_handler = &Watchdog::expired;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &previous_);
    alarm(static_cast<unsigned>(limit.count()));
  }
  ~Watchdog() {
    alarm(0);
    sigaction(SIGALRM, &previous_, nullptr);
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  // Runs in a signal handler: async-signal-safe calls only, on a message
  // formatted before the alarm was armed.
  static void expired(int) {
    (void)!write(STDERR_FILENO, message_, length_);
    _exit(124);
  }
  static inline char message_[512];
  static inline size_t length_ = 0;
  struct sigaction previous_ {};
};

// The wait status of forked child `pid` once it exits within `limit`; past
// it the child is killed, reaped and nullopt returned, so no test hangs on it.
inline std::optional<int> reap_within(pid_t pid, std::chrono::nanoseconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int wstatus = 0;
  pid_t reaped = 0;
  while ((reaped = waitpid(pid, &wstatus, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until) usleep(1000);
  if (reaped == pid) return wstatus;
  ::kill(pid, SIGKILL);
  (void)waitpid(pid, nullptr, 0);
  return std::nullopt;
}

// Polls `cond` (yielding) until it holds or `limit` passes; true when it held.
inline bool eventually(const std::function<bool()>& cond, std::chrono::nanoseconds limit = kWait) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
}

// Threads of this process, from /proc/self/task. ThreadSanitizer starts a
// helper thread of its own at the process's first thread creation; creating
// and joining one thread before the first count makes that helper part of every
// count, so a before/after comparison sees only the threads of the code under test.
// That thread may still be listed for a moment after its join (see
// settled_thread_count): the first count waits until it is gone, or it would
// be one high, and every later count would differ from it.
inline int thread_count() {
  static const bool runtime_helpers_started = [] {
    std::atomic<pid_t> tid{0};
    std::thread([&tid] { tid.store(gettid()); }).join();
    const std::string listed = "/proc/self/task/" + std::to_string(tid.load());
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (access(listed.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    return true;
  }();
  (void)runtime_helpers_started;
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
  }
  return n;
}

// thread_count() once it reads `expected`, or at a 10 s deadline. A joined
// thread can still be listed in /proc/self/task for a moment (the kernel
// wakes the joiner before it reaps the thread), so a count taken right after
// a join may be one high on a loaded machine; a thread really left behind
// still fails the comparison, at the deadline.
inline int settled_thread_count(int expected) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int n = thread_count();
  while (n != expected && std::chrono::steady_clock::now() < end) {
    std::this_thread::yield();
    n = thread_count();
  }
  return n;
}

// The scheduler state letter ('R', 'S', 'T' when stopped, ...) in a /proc
// stat file, or '?' when it is gone.
inline char stat_state(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const size_t p = line.rfind(')');  // the command name may hold anything, ')' included
  return p != std::string::npos && p + 2 < line.size() ? line[p + 2] : '?';
}

// The state letter of every thread of this process but the calling one.
inline std::vector<char> other_thread_states() {
  std::vector<char> states;
  const std::string self = std::to_string(gettid());
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.' || self == e->d_name) continue;
      if (const char s = stat_state(std::string("/proc/self/task/") + e->d_name + "/stat"); s != '?') {
        states.push_back(s);
      }
    }
    closedir(d);
  }
  return states;
}

// The state letter of one thread of this process, or '?' when it is gone.
inline char thread_state(pid_t tid) { return stat_state("/proc/self/task/" + std::to_string(tid) + "/stat"); }

// The state letter of process `pid`, or '?' when it is gone.
inline char process_state(pid_t pid) { return stat_state("/proc/" + std::to_string(pid) + "/stat"); }

// The id of the thread of this process named `name` (its comm, at most 15
// characters), or 0 when there is none.
inline pid_t named_thread(const std::string& name) {
  pid_t tid = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string line;
      std::getline(comm, line);
      if (line != name) continue;
      tid = static_cast<pid_t>(std::stol(e->d_name));
      break;
    }
    closedir(d);
  }
  return tid;
}

// The state letter of the thread of this process named `name`, or '?' when there is none.
inline char named_thread_state(const std::string& name) {
  const pid_t tid = named_thread(name);
  return tid == 0 ? '?' : thread_state(tid);
}

// How often thread `tid` of this process gave its CPU up to block (a park
// on a futex; not a yield, which leaves it runnable), or -1 when it is gone.
inline int64_t voluntary_switches(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  const std::string key = "voluntary_ctxt_switches:";
  for (std::string line; std::getline(status, line);) {
    if (line.compare(0, key.size(), key) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Asserts a refusal: the code, and that the message names `field`.
#define EXPECT_REFUSED(status_expr, expected_code, field)                         \
  do {                                                                            \
    const ::simpler::Status refused_ = (status_expr);                             \
    EXPECT_EQ(refused_.code(), (expected_code)) << refused_.to_string();          \
    EXPECT_NE(refused_.message().find(field), std::string::npos)                  \
        << "message does not name '" << (field) << "': " << refused_.to_string(); \
  } while (0)

// Waits for a run with the standard deadline; a timeout is a test failure.
inline Status wait_run(const RunHandle& h) {
  Status s = h.wait_for(kWait);
  EXPECT_NE(s.code(), StatusCode::kDeadlineExceeded) << "run did not finish in " << kWait.count() << " s";
  return s;
}

// Device <-> host helpers that fail the test on a refused copy.
template <typename T>
DeviceBuffer upload(Worker& w, const std::vector<T>& host) {
  auto b = w.malloc(host.size() * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return {};
  Status s = w.copy_to(*b, host.data(), host.size() * sizeof(T));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return *b;
}

template <typename T>
std::vector<T> download(Worker& w, DeviceBuffer b, size_t n) {
  std::vector<T> host(n);
  Status s = w.copy_from(host.data(), b, n * sizeof(T));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return host;
}

// What a shell command printed on stdout, and how it exited (-1: it did not
// start, or a signal ended it).
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult c;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return c;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) c.output.append(buf, n);
  const int status = pclose(pipe);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

inline uint64_t free_bytes(const Worker& w) {
  auto m = w.memory_info();
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? m->free_bytes : 0;
}

// A small chip config for tests: graphs of at most `max_tasks` tasks.
inline WorkerConfig small_config(uint32_t depth = 2, uint32_t max_tasks = 1024) {
  WorkerConfig c;
  c.geometry = Geometry::small();
  c.pipeline_depth = depth;
  c.device_memory_bytes = 256ull << 20;
  c.max_tasks_per_run = max_tasks;
  return c;
}

// Element (i, j) of a 2-D f32 DeviceTensor, honouring strides.
inline float& at2(const DeviceTensor* t, int64_t i, int64_t j) {
  return tensor_data<float>(t)[i * t->stride[0] + j * t->stride[1]];
}

}  // namespace simpler::testing
