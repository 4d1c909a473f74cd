// T14 of the reliability plan: parent death. The test process (a child
// subreaper through HealthScan, so every orphan is reparented to it and
// reaped here) forks a "parent" process that builds a node of two chip
// children, proves it serves, puts a run in flight on each chip (their kernels
// wait on a gate that never opens) and is then killed with SIGKILL:
//   1. the parent alone, after it forked a bystander that holds every
//      descriptor it had (as a user's fork would), so the fork server's
//      socket stays open and only its pidfd watch on the parent can see the
//      parent go: the server ends the chips and exits;
//   2. the fork server first, then the parent: the chips, whose server ended
//      without ending them, die by PR_SET_PDEATHSIG alone.
// Pass: every descendant of the node exits within 2 s of the kill (a deadline
// of the test), each is reaped, none is left (no orphan); then a new parent
// starts, serves runs with right results and closes clean. simpler maps its
// shared memory MAP_SHARED|MAP_ANONYMOUS and names nothing in /dev/shm, so
// nothing can be stale after a death: the test checks that no /dev/shm name
// appears and no process maps one, at every step. Prints
// `RELIABILITY T14 orphans=0 descendants_killed=N max_exit_ms=X stale_shm_names=0`.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "health_scan.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

constexpr uint64_t kExitDeadlineNs = 2'000'000'000ull;  // T14: children exit within 2 s of the parent
constexpr int kNeverGate = 11;                          // holds the doomed parent's runs mid-run
constexpr int kN = 16;

// What a parent process reports to the test, once, through a pipe.
struct Report {
  int32_t ok = 0;
  int32_t shm_mappings = 0;  // lines of its /proc/self/maps naming /dev/shm
  pid_t bystander = 0;
  char why[240] = {};
};

// Mappings of /dev/shm names in process `pid`.
int shm_mappings(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/maps");
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("/dev/shm/") != std::string::npos;
  return n;
}

// The parent's node: two chips, each run one task y = 2 * x + slot over the
// shared heap, after gate `gate`.
class ParentNode {
 public:
  Status start() {
    NodeSpec spec;
    spec.config = node_config(2, 0, 4);
    spec.chip_callables = {axpb_callable()};
    axpb_ = CallableHandle{0, spec.chip_callables[0].digest()};
    SIMPLER_ASSIGN_OR_RETURN(w_, NodeWorker::create(std::move(spec)));
    SIMPLER_ASSIGN_OR_RETURN(heap_, w_->malloc_shared(16 * kN * 4));
    auto* in = reinterpret_cast<float*>(heap_.addr);
    for (int i = 0; i < kN; ++i) in[i] = 1.0f + i;
    return Status();
  }
  RunHandle run_on(uint32_t chip, int slot, int gate) {
    auto view = [this](int s) { return TensorView(heap_, {kN}, DType::F32, static_cast<uint64_t>(s) * kN); };
    return w_->submit([=, this](Orchestrator& o) {
      return o.submit_next_level(axpb_, axpb_args(view(0), view(slot), 2, slot, gate), chip).status();
    });
  }
  // Runs one task on each chip, `rounds` times, and checks every result.
  Status serve(int rounds) {
    for (int r = 0; r < rounds; ++r) {
      for (uint32_t chip = 0; chip < 2; ++chip) {
        const int slot = 1 + static_cast<int>(chip);
        SIMPLER_RETURN_IF_ERROR(run_on(chip, slot, -1).wait_for(kWait), "round {} on chip {}", r, chip);
        const auto* f = reinterpret_cast<const float*>(heap_.addr);
        for (int i = 0; i < kN; ++i) {
          if (f[slot * kN + i] != 2.0f * (1.0f + i) + slot) return internal_error("chip {} computed a wrong y", chip);
        }
      }
    }
    return Status();
  }
  // Whether each chip holds a launched task.
  bool both_launched() {
    for (size_t chip = 0; chip < 2; ++chip) {
      const MailboxView v = w_->next_child(chip).endpoint().view();
      bool launched = false;
      for (uint64_t i = 0; i < v.entry_count(); ++i) {
        launched |= load_acquire(v.entry(i).entry_generation) % 2 == 1 &&
                    load_acquire(v.entry(i).state) == kMailboxTaskLaunched;
      }
      if (!launched) return false;
    }
    return true;
  }
  Status close() {
    Status st = w_->close(std::chrono::seconds(30));
    w_.reset();
    return st;
  }

 private:
  std::unique_ptr<NodeWorker> w_;
  DeviceBuffer heap_{};
  CallableHandle axpb_{};
};

void send_report(int fd, Report r) { (void)!write(fd, &r, sizeof r); }

Report failed(const Status& st) {
  Report r;
  std::snprintf(r.why, sizeof r.why, "%s", st.to_string().c_str());
  return r;
}

// In the doomed parent: a node that serves, a run in flight on each chip, a
// bystander holding its descriptors (reading `hold` until the test closes
// it); reports, then waits to be killed.
[[noreturn]] void doomed_parent(int report_fd, int hold_fd) {
  auto* node = new ParentNode();  // never destroyed: this process is killed with it up
  Status st = node->start();
  if (st.ok()) st = node->serve(2);
  std::vector<RunHandle> held;
  if (st.ok()) {
    held = {node->run_on(0, 3, kNeverGate), node->run_on(1, 4, kNeverGate)};
    if (!eventually([&] { return node->both_launched(); })) st = internal_error("the held runs never launched");
  }
  if (!st.ok()) {
    send_report(report_fd, failed(st));
    _exit(1);
  }
  const pid_t bystander = fork();
  if (bystander == 0) {
    char c;
    (void)!read(hold_fd, &c, 1);
    _exit(0);
  }
  Report r;
  r.ok = bystander > 0;
  r.shm_mappings = shm_mappings("self");
  r.bystander = bystander;
  send_report(report_fd, r);
  for (;;) pause();
}

// In the new parent: a node that serves and closes clean.
[[noreturn]] void serving_parent(int report_fd) {
  ParentNode node;
  Status st = node.start();
  if (st.ok()) st = node.serve(4);
  const int mapped = shm_mappings("self");
  if (st.ok()) st = node.close();
  Report r = st.ok() ? Report{} : failed(st);
  r.ok = st.ok();
  r.shm_mappings = mapped;
  send_report(report_fd, r);
  _exit(st.ok() ? 0 : 1);
}

// A forked parent process and the pipe it reports on; killed and reaped at
// scope exit whatever the test did.
class ParentProcess {
 public:
  template <typename Body>
  explicit ParentProcess(Body body) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      body(fds[1]);
      _exit(1);
    }
    close(fds[1]);
    report_fd_ = fds[0];
    pidfd_ = open_pidfd(pid_);
  }
  ~ParentProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      (void)waitpid(pid_, nullptr, 0);
    }
    if (report_fd_ >= 0) close(report_fd_);
    if (pidfd_ >= 0) close(pidfd_);
  }
  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0 && pidfd_ >= 0; }
  // The report, or nullopt when none came by the deadline.
  std::optional<Report> report() {
    pollfd p{report_fd_, POLLIN, 0};
    Report r;
    if (poll(&p, 1, static_cast<int>(kTestWaitNs / 1'000'000)) != 1) return std::nullopt;
    if (read(report_fd_, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) return std::nullopt;
    return r;
  }
  // Reaps the parent once it has exited (by the deadline); its wait status.
  std::optional<int> reap(uint64_t deadline_ns) {
    pollfd p{pidfd_, POLLIN, 0};
    const uint64_t now = now_ns();
    if (now >= deadline_ns || poll(&p, 1, static_cast<int>((deadline_ns - now) / 1'000'000 + 1)) != 1) {
      return std::nullopt;
    }
    int ws = 0;
    if (waitpid(pid_, &ws, 0) != pid_) return std::nullopt;
    reaped_ = true;
    return ws;
  }

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
};

struct Figures {
  int orphans = 0;
  int killed = 0;
  double max_exit_ms = 0;
  std::set<std::string> stale_shm;  // /dev/shm names that were not there before, or mapped ones
};

// Names in /dev/shm that `before` lacks, added to the figures; a process
// mapping one (`mapped`) counts too.
void check_shm(const std::set<std::string>& before, int mapped, const char* when, Figures& fig) {
  for (const std::string& name : dir_names("/dev/shm")) {
    if (before.count(name) == 0 && fig.stale_shm.insert(name).second) {
      ADD_FAILURE() << "a /dev/shm name appeared " << when << ": " << name;
    }
  }
  if (mapped != 0) {
    fig.stale_shm.insert(fmt::format("mapping {}", when));
    ADD_FAILURE() << mapped << " /dev/shm mappings in a parent " << when;
  }
}

// Waits until every pidfd in `fds` is readable (its process exited) or the
// deadline passes; per process, when it exited (ns after `t0`), or nullopt.
std::vector<std::optional<uint64_t>> await_exits(const std::vector<int>& fds, uint64_t t0, uint64_t deadline_ns) {
  std::vector<std::optional<uint64_t>> exited(fds.size());
  for (;;) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (exited[k]) continue;
      p.push_back(pollfd{fds[k], POLLIN, 0});
      which.push_back(k);
    }
    const uint64_t now = now_ns();
    if (p.empty() || now >= deadline_ns) return exited;
    if (poll(p.data(), p.size(), static_cast<int>((deadline_ns - now) / 1'000'000 + 1)) <= 0) continue;
    const uint64_t at = now_ns() - t0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].revents != 0) exited[which[i]] = at;
    }
  }
}

// A doomed parent with a node up and runs in flight is killed (its fork
// server first, when `server_first`); every descendant of it must exit
// within kExitDeadlineNs and be reaped.
void kill_parent(bool server_first, const std::set<std::string>& shm_before, Figures& fig) {
  SCOPED_TRACE(server_first ? "fork server killed, then the parent" : "the parent killed");
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  ParentProcess parent([&](int report_fd) {
    close(hold[1]);
    doomed_parent(report_fd, hold[0]);
  });
  close(hold[0]);
  struct CloseHold {
    int fd;
    ~CloseHold() {
      if (fd >= 0) close(fd);
    }
  } hold_w{hold[1]};
  ASSERT_TRUE(parent.started());
  const std::optional<Report> report = parent.report();
  ASSERT_TRUE(report.has_value()) << "the doomed parent never reported";
  ASSERT_EQ(report->ok, 1) << "the doomed parent's node failed: " << report->why;
  check_shm(shm_before, report->shm_mappings, "while the doomed parent served", fig);

  std::vector<pid_t> node;  // the node's processes: fork server and chips
  for (pid_t d : descendants_of(parent.pid())) {
    if (d != report->bystander) node.push_back(d);
  }
  pid_t server = -1;
  for (pid_t d : node) {
    if (comm_of(d) == "simpler-fork") server = d;
  }
  ASSERT_EQ(node.size(), 3u) << "a fork server and two chips below the parent";
  ASSERT_GT(server, 0) << "no simpler-fork below the parent";
  std::vector<int> fds;  // opened while they run, so a reused pid cannot fool the check
  for (pid_t d : node) fds.push_back(open_pidfd(d));
  const int bystander_fd = open_pidfd(report->bystander);

  const uint64_t t0 = now_ns();
  if (server_first) {
    ASSERT_EQ(::kill(server, SIGKILL), 0);
  }
  ASSERT_EQ(::kill(parent.pid(), SIGKILL), 0);
  const std::vector<std::optional<uint64_t>> exits = await_exits(fds, t0, t0 + kExitDeadlineNs);
  EXPECT_TRUE(parent.reap(now_ns() + kTestWaitNs).has_value()) << "the killed parent was not reaped";
  for (size_t k = 0; k < node.size(); ++k) {
    if (exits[k]) {
      ++fig.killed;
      fig.max_exit_ms = std::max(fig.max_exit_ms, static_cast<double>(*exits[k]) / 1e6);
    } else {
      ++fig.orphans;
      ADD_FAILURE() << comm_of(node[k]) << " (pid " << node[k] << ") outlived its parent by 2 s";
      ::kill(node[k], SIGKILL);
    }
  }
  // Orphans were reparented here (the subreaper): reap each; one its own
  // parent reaped is gone already (ECHILD).
  for (pid_t d : node) {
    while (waitpid(d, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  for (int fd : fds) close(fd);
  const std::vector<ProcInfo> procs = list_processes();
  for (pid_t d : node) {
    const bool left = std::any_of(procs.begin(), procs.end(), [d](const ProcInfo& p) { return p.pid == d; });
    EXPECT_FALSE(left) << "pid " << d << " is still in /proc after its parent died";
  }
  // The bystander is the user's, not the node's: it lives on until released.
  EXPECT_FALSE(exits_within(open_pidfd(report->bystander), 0)) << "the bystander died with the parent";
  close(hold_w.fd);
  hold_w.fd = -1;
  EXPECT_TRUE(exits_within(bystander_fd, static_cast<int>(kTestWaitNs / 1'000'000)));
  while (waitpid(report->bystander, nullptr, 0) < 0 && errno == EINTR) {
  }
  check_shm(shm_before, 0, "after the parent died", fig);
}

// A new parent, in the same test, serves and closes clean.
void new_parent(const std::set<std::string>& shm_before, Figures& fig) {
  SCOPED_TRACE("a new parent");
  ParentProcess parent(serving_parent);
  ASSERT_TRUE(parent.started());
  const std::optional<Report> report = parent.report();
  ASSERT_TRUE(report.has_value()) << "the new parent never reported";
  EXPECT_EQ(report->ok, 1) << "the new parent did not serve and close clean: " << report->why;
  check_shm(shm_before, report->shm_mappings, "while the new parent served", fig);
  const std::optional<int> ws = parent.reap(now_ns() + kTestWaitNs);
  ASSERT_TRUE(ws.has_value()) << "the new parent never exited";
  EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0) << "wait status " << *ws;
  check_shm(shm_before, 0, "after the new parent closed", fig);
}

// T14: children die with their parent (pidfd watch, PR_SET_PDEATHSIG), none
// is left, nothing in /dev/shm, and a new parent serves.
TEST(ParentDeath, T14DescendantsDieWithTheParentAndANewParentServes) {
  Watchdog dog;
  make_node_gates();
  const std::set<std::string> shm_before = dir_names("/dev/shm");
  const HealthScan health;  // a child subreaper from here on
  Figures fig;
  kill_parent(false, shm_before, fig);
  kill_parent(true, shm_before, fig);
  new_parent(shm_before, fig);
  EXPECT_EQ(fig.killed, 6);
  EXPECT_EQ(fig.orphans, 0);
  EXPECT_TRUE(fig.stale_shm.empty());
  health.expect_clean();
  std::printf("RELIABILITY T14 orphans=%d descendants_killed=%d max_exit_ms=%.1f stale_shm_names=%zu\n", fig.orphans,
              fig.killed, fig.max_exit_ms, fig.stale_shm.size());
}

}  // namespace
}  // namespace simpler::testing
