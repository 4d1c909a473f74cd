// The busy neighbours of `simpler bench --neighbours N`: every child runs
// while the Neighbours live and is killed and reaped when they go, even when
// the scope unwinds on an error; a child past its deadline ends by itself.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "gate.h"
#include "neighbours.h"

namespace simpler::bench {
namespace {

// The state letter of /proc/PID/stat ('R', 'S', 'Z', ...), or '\0' when gone.
char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return '\0';
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '\0' : line[close + 2];
}

// Reaped: no longer this process's child, and no zombie left behind.
bool reaped(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) < 0 && errno == ECHILD && proc_state(pid) != 'Z';
}

TEST(BenchNeighbours, StartsEveryChildAndReapsThemOnStop) {
  Neighbours n;
  ASSERT_TRUE(n.start(2).ok());
  ASSERT_EQ(n.pids().size(), 2u);
  const std::vector<pid_t> pids = n.pids();
  for (const pid_t pid : pids) {
    const char state = proc_state(pid);
    EXPECT_TRUE(state == 'R' || state == 'S') << "neighbour " << pid << " state '" << state << "'";
  }
  EXPECT_EQ(n.stop(), 2u);
  EXPECT_TRUE(n.pids().empty());
  for (const pid_t pid : pids) EXPECT_TRUE(reaped(pid)) << pid;
}

TEST(BenchNeighbours, ReapedWhenTheScopeUnwindsOnAnError) {
  std::vector<pid_t> pids;
  try {
    Neighbours n;
    ASSERT_TRUE(n.start(2).ok());
    pids = n.pids();
    throw std::runtime_error("the benchmark failed");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(pids.size(), 2u);
  for (const pid_t pid : pids) EXPECT_TRUE(reaped(pid)) << pid;
}

TEST(BenchNeighbours, AChildPastItsDeadlineEndsByItself) {
  Neighbours n;
  ASSERT_TRUE(n.start(1, /*deadline_ns=*/1).ok());
  const pid_t pid = n.pids().at(0);
  // Exited but not yet reaped: a zombie, which only its own deadline makes it.
  ASSERT_TRUE(simpler::testing::eventually([&] { return proc_state(pid) == 'Z'; }))
      << "neighbour " << pid << " still running past its deadline";
  EXPECT_EQ(n.stop(), 0u);
  EXPECT_TRUE(reaped(pid));
}

}  // namespace
}  // namespace simpler::bench
