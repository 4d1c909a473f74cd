#include "base/load_sense.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/fault_hooks.h"

namespace simpler {
namespace {

// Reads up to `size` bytes of file `path`; -1 on error.
ssize_t read_file(const char* path, char* buf, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = ::read(fd, buf, size);
  ::close(fd);
  return n;
}

// An open directory, closed on every way out (an allocation may throw).
using Dir = std::unique_ptr<DIR, int (*)(DIR*)>;
Dir open_dir(const char* path) { return Dir(::opendir(path), &::closedir); }

// Adds to `runnable` the ids of the threads of process `pid` ("self" or a
// number) that are runnable now (state R); false when /proc cannot tell.
bool add_runnable_threads(const char* proc, const char* pid, std::vector<long>& runnable) {
  char path[512];
  std::snprintf(path, sizeof path, "%s/%s/task", proc, pid);
  const Dir dir = open_dir(path);
  if (dir == nullptr) return false;
  bool ok = true;
  char buf[256];
  while (const dirent* e = ::readdir(dir.get())) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "%s/%s/task/%s/stat", proc, pid, e->d_name);
    const ssize_t n = read_file(path, buf, sizeof buf);
    // A thread that ended since the listing is not runnable.
    if (n <= 0) continue;
    const int state = LoadSense::state_of_task_stat(buf, static_cast<size_t>(n));
    if (state < 0) {
      ok = false;
      break;
    }
    const long tid = std::strtol(e->d_name, nullptr, 10);
    if (state == 'R' && std::find(runnable.begin(), runnable.end(), tid) == runnable.end()) runnable.push_back(tid);
  }
  return ok;
}

}  // namespace

LoadSense& load_sense() {
  // Never destroyed: a detached or late thread may still spin at exit.
  static LoadSense* const sense = [] {
    auto* s = new LoadSense();
    const char* env = std::getenv("SIMPLER_LOAD_SENSE");
    s->set_enabled(env == nullptr || std::strcmp(env, "0") != 0);
    return s;
  }();
  return *sense;
}

uint32_t usable_cpus() {
  if (const uint32_t forced = hooks::forced_usable_cpus(); forced != 0) return forced;
  static const uint32_t cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return std::max(1, CPU_COUNT(&set));
  }();
  return cpus;
}

int64_t LoadSense::running_of_loadavg(const char* text, size_t size) {
  size_t i = 0;
  for (int field = 0; field < 3; ++field) {
    while (i < size && text[i] != ' ') ++i;
    while (i < size && text[i] == ' ') ++i;
  }
  int64_t n = 0;
  size_t digits = 0;
  for (; i < size && text[i] >= '0' && text[i] <= '9' && digits < 9; ++i, ++digits) n = n * 10 + (text[i] - '0');
  if (digits == 0 || i >= size || text[i] != '/') return -1;
  return n;
}

int LoadSense::state_of_task_stat(const char* text, size_t size) {
  // The name may hold spaces and parentheses: the state follows the last ')'.
  size_t close = size;
  for (size_t i = size; i > 0; --i) {
    if (text[i - 1] == ')') {
      close = i - 1;
      break;
    }
  }
  if (close == size || close + 2 >= size || text[close + 1] != ' ') return -1;
  const char state = text[close + 2];
  return state >= 'A' && state <= 'Z' ? state : -1;
}

int64_t LoadSense::parent_of_stat(const char* text, size_t size) {
  if (state_of_task_stat(text, size) < 0) return -1;
  size_t i = size;
  while (text[i - 1] != ')') --i;  // found: the state parsed
  i += 3;                          // past ") S "
  if (i > size || text[i - 1] != ' ') return -1;
  int64_t n = 0;
  size_t digits = 0;
  for (; i < size && text[i] >= '0' && text[i] <= '9' && digits < 9; ++i, ++digits) n = n * 10 + (text[i] - '0');
  if (digits == 0 || i >= size || text[i] != ' ') return -1;
  return n;
}

void LoadSense::note_fork_server(int32_t server, int32_t forker) {
  int32_t none = 0;
  root_.compare_exchange_strong(none, forker, std::memory_order_relaxed);
  for (auto& s : servers_) {
    if (s.load(std::memory_order_relaxed) == server) return;
    int32_t free = 0;
    if (s.compare_exchange_strong(free, server)) {
      servers_changed_.fetch_add(1, std::memory_order_release);
      return;
    }
  }
}

void LoadSense::forget_fork_server(int32_t server) {
  for (auto& s : servers_) {
    int32_t was = server;
    if (s.compare_exchange_strong(was, 0)) {
      servers_changed_.fetch_add(1, std::memory_order_release);
      return;
    }
  }
}

std::vector<long> LoadSense::job_processes() const {
  std::vector<long> servers;
  for (const auto& s : servers_) {
    if (const int32_t pid = s.load(std::memory_order_relaxed); pid != 0) servers.push_back(pid);
  }
  if (servers.empty()) return {};
  const char* proc = hooks::proc_root();
  const long root = root_.load(std::memory_order_relaxed);
  std::vector<std::pair<long, long>> parent_of;  // (pid, ppid), sorted by pid
  if (const Dir dir = open_dir(proc)) {
    char path[512];
    char buf[256];
    while (const dirent* e = ::readdir(dir.get())) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::snprintf(path, sizeof path, "%s/%s/stat", proc, e->d_name);
      const ssize_t n = read_file(path, buf, sizeof buf);
      const int64_t ppid = n > 0 ? LoadSense::parent_of_stat(buf, static_cast<size_t>(n)) : -1;
      if (ppid >= 0) parent_of.emplace_back(std::strtol(e->d_name, nullptr, 10), static_cast<long>(ppid));
    }
  }
  std::sort(parent_of.begin(), parent_of.end());
  const long self = static_cast<long>(::getpid());
  std::vector<long> job;
  if (root != self) job.push_back(root);
  // A fork tree is a few levels deep; the bound only guards a cycle of
  // reused pids read at different instants.
  constexpr int kMaxDepth = 32;
  for (const auto& entry : parent_of) {
    const long pid = entry.first;
    if (pid == self || pid == root) continue;
    long p = pid;
    for (int depth = 0; depth < kMaxDepth && p > 1; ++depth) {
      if (std::find(servers.begin(), servers.end(), p) != servers.end()) {
        job.push_back(pid);
        break;
      }
      const auto it = std::lower_bound(parent_of.begin(), parent_of.end(), std::make_pair(p, 0L));
      if (it == parent_of.end() || it->first != p) break;
      p = it->second;
    }
  }
  return job;
}

uint32_t LoadSense::fork_servers_noted() const {
  uint32_t n = 0;
  for (const auto& s : servers_) n += s.load(std::memory_order_relaxed) != 0 ? 1 : 0;
  return n;
}

bool LoadSense::others_runnable() const noexcept {
  if (const int forced = hooks::forced_others_runnable(); forced >= 0) return forced == 1;
  // Asked from inside any wait, whose caller's allocations a reliability
  // test may be failing one by one: these are not the caller's.
  const hooks::AllocFaultPause not_the_callers;
  try {
    return ask_others_runnable();
  } catch (const std::bad_alloc&) {
    return true;  // as for anything unreadable
  }
}

bool LoadSense::ask_others_runnable() const {
  const char* proc = hooks::proc_root();
  std::vector<long> job;
  {
    std::lock_guard<std::mutex> lock(job_mu_);
    const uint64_t now = now_ns();
    const uint32_t changed = servers_changed_.load(std::memory_order_acquire);
    if (job_read_ns_ == 0 || now - job_read_ns_ >= kJobListNs || changed != job_servers_changed_) {
      job_ = job_processes();
      job_read_ns_ = now;
      job_servers_changed_ = changed;
    }
    job = job_;
  }
  std::vector<long> ours;
  ours.reserve(64);
  // A process of the job that ended since the listing has no runnable thread.
  const auto add_ours = [&] {
    if (!add_runnable_threads(proc, "self", ours)) return false;
    char pid[24];
    for (const long p : job) {
      std::snprintf(pid, sizeof pid, "%ld", p);
      (void)add_runnable_threads(proc, pid, ours);
    }
    return true;
  };
  // The job's threads change state every few microseconds: one counts as
  // runnable if it was so just before or just after the machine's count.
  if (!add_ours()) return true;
  char path[512];
  std::snprintf(path, sizeof path, "%s/loadavg", proc);
  char buf[128];
  const ssize_t n = read_file(path, buf, sizeof buf);
  const int64_t running = n > 0 ? running_of_loadavg(buf, static_cast<size_t>(n)) : -1;
  if (running < 0 || !add_ours()) return true;
  return running > static_cast<int64_t>(ours.size());
}

#ifdef SIMPLER_TEST_HOOKS
namespace hooks {
namespace {
std::atomic<int> g_forced_state{-1};
std::atomic<uint64_t> g_batch_gap{0};
std::atomic<int> g_forced_others{-1};
std::atomic<uint32_t> g_forced_cpus{0};
std::string g_proc_root = "/proc";
}  // namespace

void force_load_state(int state) { g_forced_state.store(state, std::memory_order_relaxed); }
int forced_load_state() noexcept { return g_forced_state.load(std::memory_order_relaxed); }
void force_others_runnable(int state) { g_forced_others.store(state, std::memory_order_relaxed); }
int forced_others_runnable() noexcept { return g_forced_others.load(std::memory_order_relaxed); }
void set_proc_root(const std::string& root) { g_proc_root = root; }
const char* proc_root() noexcept { return g_proc_root.c_str(); }
void add_spin_batch_gap(uint64_t extra_ns) { g_batch_gap.store(extra_ns, std::memory_order_relaxed); }
uint64_t spin_batch_gap() noexcept { return g_batch_gap.load(std::memory_order_relaxed); }
void force_usable_cpus(uint32_t n) { g_forced_cpus.store(n, std::memory_order_relaxed); }
uint32_t forced_usable_cpus() noexcept { return g_forced_cpus.load(std::memory_order_relaxed); }
}  // namespace hooks
#endif

}  // namespace simpler
