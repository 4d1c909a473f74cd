// Shared helpers of the unit tests: a per-test watchdog, bounded waits, a
// thread counter and small host-side tensor helpers. Test-thread use only.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
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

// Every blocking wait of a test is bounded by this.
inline constexpr std::chrono::seconds kWait{30};

// Kills the test process if a test body outlives `limit`, so that a hang in a
// call that takes no deadline (Worker::close, a blocking submit) still fails
// with a message instead of running into the ctest timeout.
//
// Tests fork right after constructing one (ForkedChild::spawn wants no other
// thread running), so the constructor returns only once the watchdog thread
// is past its start-up and blocked in its wait: a thread that is still
// starting may hold an allocator lock (GCC 12's ASan allocator takes one in
// thread start-up and, unlike glibc malloc, does not guard its locks across
// fork), and a child forked then inherits it held: every thread that child
// starts blocks forever, and its runs never execute.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit = std::chrono::seconds(90))
      : thread_([this, limit] {
          std::unique_lock lock(mu_);
          started_ = true;
          cv_.notify_all();
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
            std::fprintf(stderr, "watchdog: %s.%s still running after %lld s; aborting\n",
                         info ? info->test_suite_name() : "?", info ? info->name() : "?",
                         static_cast<long long>(limit.count()));
            std::fflush(stderr);
            std::_Exit(124);
          }
        }) {
    // mu_ is free again only once the thread waits in wait_for.
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return started_; });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool done_ = false;
  std::thread thread_;
};

// Polls `cond` (yielding) until it holds or `limit` passes; true when it held.
inline bool eventually(const std::function<bool()>& cond, std::chrono::nanoseconds limit = kWait) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
}

// Threads of this process, from /proc/self/task.
inline int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
  }
  return n;
}

// The scheduler state letter ('R', 'S', ...) of every thread of this process
// but the calling one.
inline std::vector<char> other_thread_states() {
  std::vector<char> states;
  const std::string self = std::to_string(gettid());
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.' || self == e->d_name) continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
      std::string line;
      std::getline(in, line);
      const size_t p = line.rfind(')');
      if (p != std::string::npos && p + 2 < line.size()) states.push_back(line[p + 2]);
    }
    closedir(d);
  }
  return states;
}

// The state letter of one thread of this process, or '?' when it is gone.
inline char thread_state(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t p = line.rfind(')');
  return p != std::string::npos && p + 2 < line.size() ? line[p + 2] : '?';
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Asserts a refusal: the code, and that the message names `field`.
#define EXPECT_REFUSED(status_expr, expected_code, field)                                              \
  do {                                                                                                 \
    const ::simpler::Status refused_ = (status_expr);                                                  \
    EXPECT_EQ(refused_.code(), (expected_code)) << refused_.to_string();                               \
    EXPECT_NE(refused_.message().find(field), std::string::npos)                                       \
        << "message does not name '" << (field) << "': " << refused_.to_string();                      \
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
