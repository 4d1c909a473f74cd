// The post-test health scan of the reliability plan: after a test closed
// everything it started, no child process of this one is left (zombie or
// not), the open fds are back to their count before the test, and /dev/shm
// holds no name the test created. Take the baseline before the first fork.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <set>
#include <string>

#include "node_test_util.h"

namespace simpler::testing {

struct HealthBaseline {
  size_t fds = 0;
  std::set<std::string> shm_names;

  static std::set<std::string> list(const char* dir) {
    std::set<std::string> names;
    if (DIR* d = opendir(dir)) {
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.insert(n);
      }
      closedir(d);
    }
    return names;
  }
  // Open fds; the directory stream's own fd is open while it is read.
  static size_t open_fds() { return list("/proc/self/fd").size() - 1; }

  static HealthBaseline take() { return HealthBaseline{open_fds(), list("/dev/shm")}; }

  // "" when healthy; otherwise one line per finding.
  std::string scan() const {
    std::string out;
    for (pid_t p : descendants_of(getpid())) out += "child process " + std::to_string(p) + " is left\n";
    if (const size_t now = open_fds(); now != fds) {
      out += "open fds: " + std::to_string(now) + ", baseline " + std::to_string(fds) + "\n";
    }
    for (const std::string& n : list("/dev/shm")) {
      if (shm_names.count(n) == 0) out += "new /dev/shm name " + n + "\n";
    }
    return out;
  }
};

}  // namespace simpler::testing
