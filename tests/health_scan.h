// The post-test health scan of the reliability plan, and the terminal ledger
// the reliability tests share (T9, T11; usable by any test):
//   - HealthScan: a baseline taken when it is built, compared by problems():
//     no child of this process that was not there before (a zombie, or an
//     orphaned descendant: the scan makes this process a child subreaper, so
//     an orphan is reparented here instead of to init, where nobody would
//     see it), the open-fd count back to its baseline, no new /dev/shm name;
//   - check_partition(): free + live + quarantined == grant for one arena;
//   - TerminalLedger: every submitted run id has exactly one terminal.
// Each reliability test prints its figure as one `RELIABILITY Tn key=value`
// line. Test-thread use, except TerminalLedger (any thread).
#pragma once

#include <dirent.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/sanitized.h"
#include "chip/run_resource_arena.h"
#include "simpler/status.h"

namespace simpler::testing {

// Sanitizer builds run the reliability tests at a smaller size: ThreadSanitizer
// slows this code 5-15x, and the suite must fit the CI budget.
inline constexpr bool kSanitized = kSanitizedBuild;

// One process as /proc/<pid>/stat shows it.
struct ProcInfo {
  pid_t pid = 0;
  pid_t ppid = 0;
  char state = '?';
  std::string comm;
};

inline std::vector<ProcInfo> list_processes() {
  std::vector<ProcInfo> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(in, line);
    // comm may hold spaces and parentheses: it ends at the last ')'.
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) continue;
    ProcInfo p;
    p.pid = pid;
    p.comm = line.substr(open + 1, close - open - 1);
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &p.state, &ppid) != 2) continue;
    p.ppid = static_cast<pid_t>(ppid);
    out.push_back(std::move(p));
  }
  closedir(d);
  return out;
}

inline std::set<std::string> dir_names(const char* path) {
  std::set<std::string> names;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.insert(e->d_name);
    }
    closedir(d);
  }
  return names;
}

// Open descriptors of this process (the one that lists them excluded).
inline size_t open_fd_count() {
  const size_t n = dir_names("/proc/self/fd").size();
  return n == 0 ? 0 : n - 1;
}

// Resident set of this process, in KiB (/proc/self/statm).
inline uint64_t rss_kb() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 1024;
}

// free + live + quarantined == grant, or what is wrong, naming `what`.
inline std::optional<std::string> check_partition(const std::string& what, const ArenaCounts& c, uint64_t grant) {
  const uint64_t sum = uint64_t{c.free} + c.live + c.quarantined;
  if (sum == grant) return std::nullopt;
  return fmt::format("{}: free {} + live {} + quarantined {} = {}, the grant is {}", what, c.free, c.live,
                     c.quarantined, sum, grant);
}

class HealthScan {
 public:
  // `shm_dir`: the directory of shared-memory names to watch; a test of the
  // scan itself watches a private one, since a name it made in /dev/shm
  // would show in the scans of the tests ctest runs beside it.
  explicit HealthScan(std::string shm_dir = "/dev/shm") : shm_dir_(std::move(shm_dir)) {
    // An orphan of a forked child would otherwise be adopted by init and
    // escape the scan; as a subreaper this process adopts it and sees it.
    subreaper_ = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
    for (const ProcInfo& p : list_processes()) {
      if (p.ppid == getpid()) children_.insert(p.pid);
    }
    fds_ = open_fd_count();
    shm_ = dir_names(shm_dir_.c_str());
  }
  HealthScan(const HealthScan&) = delete;
  HealthScan& operator=(const HealthScan&) = delete;

  // What differs from the baseline; empty when the scan is clean.
  std::vector<std::string> problems() const {
    std::vector<std::string> out;
    if (!subreaper_) out.push_back("could not become a child subreaper: orphans would escape the scan");
    for (const ProcInfo& p : list_processes()) {
      if (p.ppid != getpid() || children_.count(p.pid) != 0) continue;
      out.push_back(fmt::format("{} child pid {} ({}), state {}", p.state == 'Z' ? "zombie" : "leftover", p.pid, p.comm,
                                p.state));
    }
    if (const size_t fds = open_fd_count(); fds != fds_) {
      out.push_back(fmt::format("open fds: {} at the start, {} now", fds_, fds));
    }
    for (const std::string& name : dir_names(shm_dir_.c_str())) {
      if (shm_.count(name) == 0) out.push_back(fmt::format("new {} name: {}", shm_dir_, name));
    }
    return out;
  }

  // A gtest failure per problem; true when clean.
  bool expect_clean() const {
    const std::vector<std::string> p = problems();
    for (const std::string& s : p) ADD_FAILURE() << "health scan: " << s;
    return p.empty();
  }

 private:
  std::string shm_dir_;
  bool subreaper_ = false;
  std::set<pid_t> children_;
  size_t fds_ = 0;
  std::set<std::string> shm_;
};

// Every submitted run id gets exactly one terminal. submitted() before the
// run can end; record() from whichever thread sees the terminal. An id is
// dropped once it has exactly one of each, so a soak of 10^6 runs holds only
// the runs in flight; a terminal that comes after that reopens the id, which
// check() then reports.
class TerminalLedger {
 public:
  void submitted(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    ++submitted_;
    settle(id, open_[id], 1, 0);
  }
  void record(uint64_t id, const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++terminals_;
    if (status.ok()) {
      ++ok_;
    } else {
      ++failed_;
      ++by_code_[status.code()];
    }
    settle(id, open_[id], 0, 1);
  }

  struct Summary {
    uint64_t submitted = 0;
    uint64_t terminals = 0;
    uint64_t ok = 0;
    uint64_t failed = 0;
    std::map<StatusCode, uint64_t> by_code;  // the failed ones
    std::vector<std::string> problems;       // ids without exactly one submission and one terminal
  };
  // At most `max_problems` ids are named; the counts cover all.
  Summary check(size_t max_problems = 20) const {
    std::lock_guard<std::mutex> lock(mu_);
    Summary s{submitted_, terminals_, ok_, failed_, by_code_, {}};
    for (const auto& [id, e] : open_) {
      if (s.problems.size() == max_problems) {
        s.problems.push_back(fmt::format("... {} bad ids in all", open_.size()));
        break;
      }
      s.problems.push_back(
          fmt::format("run {}: {} submissions and {} terminals, want one of each", id, e.submissions, e.terminals));
    }
    return s;
  }

 private:
  struct Entry {
    uint32_t submissions = 0;
    uint32_t terminals = 0;
  };
  void settle(uint64_t id, Entry& e, uint32_t submissions, uint32_t terminals) {
    e.submissions += submissions;
    e.terminals += terminals;
    if (e.submissions == 1 && e.terminals == 1) open_.erase(id);
  }

  mutable std::mutex mu_;
  std::map<uint64_t, Entry> open_;
  uint64_t submitted_ = 0, terminals_ = 0, ok_ = 0, failed_ = 0;
  std::map<StatusCode, uint64_t> by_code_;
};

}  // namespace simpler::testing
