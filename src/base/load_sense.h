// LoadSense: whether this process's spinning threads keep losing their CPU to
// other processes' threads (busy neighbours), so that every spin-then-park
// wait parks sooner instead of yielding its CPU away for a whole time slice.
// A slice lost to the job's own threads (more simulator threads runnable
// than CPUs, in this process or in the processes its workers forked) is not
// load: the yield handed the CPU to the work the spinner waits for. Any
// thread, lock-free; the rare check of who is runnable (others_runnable())
// reads /proc, under a lock. One per process (load_sense()), forked
// children start from their parent's state.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"

namespace simpler {

class LoadSense {
 public:
  // A spin batch (a few pauses and one yield) takes ~1-100 µs while the
  // spinners share the CPUs among themselves; one that took this long gave
  // its CPU to a thread that kept it for a time slice.
  static constexpr uint64_t kLostCpuNs = 200'000;
  // How long one lost batch keeps the process oversubscribed. Once it lapses
  // the next spin probes again: at most one lost slice per spinner per hold.
  static constexpr uint64_t kHoldNs = 50'000'000;
  // The idle spin of a simulated AICPU or core thread while oversubscribed:
  // pauses only, no yield, then park.
  static constexpr uint64_t kPressedSpinNs = 2'000;

  // How long the verdict "every runnable thread was the job's own" stands
  // before a long batch asks again: at least this, and at least
  // kOwnVerdictCost times what asking took, so that asking costs at most a
  // hundredth of one CPU however many threads the job has. A process whose
  // own threads outnumber the CPUs has a long batch after most yields, and
  // an ask takes tens of microseconds from a thread the device waits for;
  // a neighbour that arrives is seen this much later at most.
  static constexpr uint64_t kOwnVerdictNs = 10'000'000;
  static constexpr uint64_t kOwnVerdictCost = 100;

  // A spinner's batch that ended at `now` took `elapsed_ns`; returns true
  // (and holds the process oversubscribed until now + kHoldNs) when it lost
  // its CPU to another process. A batch as long while no other process's
  // thread was runnable (others_runnable()) lost nothing: false, and the
  // spinner goes on as on a quiet machine.
  bool note_batch(uint64_t elapsed_ns, uint64_t now);
  bool oversubscribed(uint64_t now) const;
  // The spin window a waiter with `spin_ns` quiet uses at `now`.
  uint64_t spin_window(uint64_t spin_ns, uint64_t now) const {
    return oversubscribed(now) ? (spin_ns < kPressedSpinNs ? spin_ns : kPressedSpinNs) : spin_ns;
  }
  // This process's own bounded work that holds a CPU for up to milliseconds
  // without yielding (a run's host build) begins and ends (OwnWorkScope): a
  // batch lost while it ran, or begun before it ended, reads as lost (the
  // spinner parks) but does not hold the process oversubscribed: the next
  // run's waits would park after 2 µs for 50 ms, each hand-off then a
  // futex wake, when all that took the CPU was that bounded work.
  void own_work_begin() { own_work_.fetch_add(1, std::memory_order_relaxed); }
  void own_work_end(uint64_t now) {
    own_work_end_.store(now, std::memory_order_relaxed);
    own_work_.fetch_sub(1, std::memory_order_release);
  }
  uint64_t lost_batches() const { return lost_.load(std::memory_order_relaxed); }
  // Long batches that read as taken by the job's own threads.
  uint64_t own_batches() const { return own_.load(std::memory_order_relaxed); }
  // Whether a thread outside the job is runnable now: the machine's
  // runnable threads (/proc/loadavg) exceed the job's (each thread's state
  // in /proc/<pid>/task of this process and of job_processes(), read just
  // before and just after the machine's count: a thread runnable in either
  // read is; the job's processes are listed again every kJobListNs or
  // when a fork server is noted or forgotten). Anything unreadable in this
  // process or the machine's count answers true, the answer before this
  // check existed. Six system calls per thread of the job: note_batch()
  // asks only for a long batch while the process is not held
  // oversubscribed, one thread at a time, and after a false answer not
  // again before the verdict lapses.
  bool others_runnable() const noexcept;
  // Listing the job's processes reads every process's stat on the machine
  // (three system calls each): thousands on a shared host.
  static constexpr uint64_t kJobListNs = 1'000'000'000;
  // A fork server (ForkServer) was forked by `forker`. Its threads and those
  // of every process it forks are this job's own work, not a neighbour's: a
  // worker's children spin and yield to its parent and each other as its
  // threads do. Called on both sides of the fork while each has one thread;
  // what the server forks inherits the record. The first forker is the
  // job's root. At most kMaxForkServers are tracked; later ones count as
  // others.
  static constexpr uint32_t kMaxForkServers = 16;
  void note_fork_server(int32_t server, int32_t forker);
  // The server was reaped: its pid may name an unrelated process later.
  void forget_fork_server(int32_t server);
  // How many servers are noted now: what a test of the call sites reads.
  uint32_t fork_servers_noted() const;
  // The job's processes other than this one, read from /proc now: its root
  // unless that is this process, and every process whose ancestry reaches a
  // noted fork server (the servers included). Empty while none is noted.
  std::vector<long> job_processes() const;
  // Parsers of /proc text, -1 when malformed: the running count of
  // /proc/loadavg ("0.20 0.18 0.12 3/80 11206"), the state letter of
  // /proc/<pid>/task/<tid>/stat ("1234 (name) R ...") and the parent pid of
  // /proc/<pid>/stat ("1234 (name) S 1200 ...").
  static int64_t running_of_loadavg(const char* text, size_t size);
  static int state_of_task_stat(const char* text, size_t size);
  static int64_t parent_of_stat(const char* text, size_t size);
  // Off: every batch reads as quiet, the waits spin as before issue 16 (the
  // process's LoadSense is off when SIMPLER_LOAD_SENSE=0, for A/B runs).
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> enabled_{true};
  std::atomic<uint64_t> pressed_until_{0};
  std::atomic<uint64_t> lost_{0};
  std::atomic<uint32_t> own_work_{0};
  std::atomic<uint64_t> own_work_end_{0};
  std::atomic<uint64_t> own_{0};
  std::atomic<uint64_t> own_until_{0};                           // the verdict "all ours" stands until then
  std::atomic<bool> asking_{false};                              // a thread is in others_runnable()
  std::atomic<int32_t> root_{0};                                 // the job's root; 0 while no fork server was noted
  std::array<std::atomic<int32_t>, kMaxForkServers> servers_{};  // 0 = a free entry
  std::atomic<uint32_t> servers_changed_{0};                     // counts notes and forgets
  // others_runnable()'s copy of job_processes(), read at job_read_ns_ (0 = never).
  mutable std::mutex job_mu_;
  mutable std::vector<long> job_;
  mutable uint64_t job_read_ns_ = 0;
  mutable uint32_t job_servers_changed_ = 0;

  bool ask_others_runnable() const;  // others_runnable(), which may throw std::bad_alloc
};

// The process's LoadSense, shared by every spin-then-park wait and every
// simulated AICPU and core thread.
LoadSense& load_sense();

// The CPUs this process may run on (its affinity mask, read once), at
// least 1: whether a simulated device's threads can each have one. Any thread.
uint32_t usable_cpus();

// Marks the process's own work (LoadSense::own_work_begin) for its scope.
class OwnWorkScope {
 public:
  OwnWorkScope() { load_sense().own_work_begin(); }
  ~OwnWorkScope() { load_sense().own_work_end(now_ns()); }
  OwnWorkScope(const OwnWorkScope&) = delete;
  OwnWorkScope& operator=(const OwnWorkScope&) = delete;
};

namespace hooks {
#ifdef SIMPLER_TEST_HOOKS
// Test builds: state -1 measures (the default), 0 reads as quiet, 1 as
// oversubscribed, whatever the batches measured.
void force_load_state(int state);
int forced_load_state() noexcept;
// -1 reads /proc (the default); 0: no other process's thread is runnable;
// 1: one is, whatever the machine runs.
void force_others_runnable(int state);
int forced_others_runnable() noexcept;
// Where others_runnable() reads /proc from ("/proc" by default): a test's
// tree of loadavg and self/task/<tid>/stat files. Set while no thread spins.
void set_proc_root(const std::string& root);
const char* proc_root() noexcept;
// Every spin batch noted from now reads `extra_ns` longer than it took (0 disarms).
void add_spin_batch_gap(uint64_t extra_ns);
uint64_t spin_batch_gap() noexcept;
// usable_cpus() answers `n` from now on (0: the affinity mask again).
void force_usable_cpus(uint32_t n);
uint32_t forced_usable_cpus() noexcept;
#else
inline constexpr int forced_load_state() noexcept { return -1; }
inline constexpr int forced_others_runnable() noexcept { return -1; }
inline constexpr const char* proc_root() noexcept { return "/proc"; }
inline constexpr uint64_t spin_batch_gap() noexcept { return 0; }
inline constexpr uint32_t forced_usable_cpus() noexcept { return 0; }
#endif
}  // namespace hooks

inline bool LoadSense::note_batch(uint64_t elapsed_ns, uint64_t now) {
  if (elapsed_ns + hooks::spin_batch_gap() < kLostCpuNs || !enabled_.load(std::memory_order_relaxed)) return false;
  if (own_work_.load(std::memory_order_acquire) != 0 ||
      own_work_end_.load(std::memory_order_relaxed) + elapsed_ns + hooks::spin_batch_gap() >= now) {
    lost_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (now < own_until_.load(std::memory_order_relaxed)) {
    own_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Held oversubscribed already, the batch is lost without asking; else one
  // thread at a time asks, and a batch noted meanwhile spins on.
  if (now >= pressed_until_.load(std::memory_order_relaxed)) {
    if (asking_.exchange(true, std::memory_order_acquire)) {
      own_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const uint64_t asked = now_ns();
    const bool others = others_runnable();
    if (!others) {
      const uint64_t cost = now_ns() - asked;
      own_until_.store(now + (cost * kOwnVerdictCost > kOwnVerdictNs ? cost * kOwnVerdictCost : kOwnVerdictNs),
                       std::memory_order_relaxed);
    }
    asking_.store(false, std::memory_order_release);
    if (!others) {
      own_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  lost_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t until = now + kHoldNs;
  uint64_t seen = pressed_until_.load(std::memory_order_relaxed);
  while (seen < until && !pressed_until_.compare_exchange_weak(seen, until, std::memory_order_relaxed)) {
  }
  return true;
}

inline bool LoadSense::oversubscribed(uint64_t now) const {
  if (const int forced = hooks::forced_load_state(); forced >= 0) return forced == 1;
  return now < pressed_until_.load(std::memory_order_relaxed);
}

}  // namespace simpler
