// T4 of the reliability plan: hung children, in fork mode. A node of two chip
// children with a short run_timeout; chip 0 is made to hang in three ways:
//   (a) SIGSTOP while it holds a launched task and its staged successor, and
//       SIGSTOP while idle, then a run published to it that it never reads;
//   (b) a simulated-device task whose kernel blocks on a gate the test never
//       opens (the child runs, its task never finishes);
//   (c) SIGSTOP, then SIGCONT before the deadline, on the first child and once
//       more on its replacement after a respawn.
// (a, b): the parent's run deadline (R: a held run with no terminal
// run_timeout after publication) ends the hang: the child is SIGKILLed and
// reaped, every run it held ends once DEADLINE_EXCEEDED naming the cause
// ("child hung: ..."), never before the deadline, the child is replaced and
// the replacement serves; chip 1 serves throughout. (c): nothing is killed or
// replaced and every run ends ok exactly once. No run-resource set is left
// live or quarantined: the node's sets are the parent's own, and a reaped
// child stores nothing more, so every set's fate is proven.
// Prints `RELIABILITY T4 cases=N detected=N false_positives=0 max_detect_ms=X`,
// where a detection latency is how long after its deadline a hung run's
// terminal came, measured from the submit (so an upper bound); it is reported,
// never asserted.
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "health_scan.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

// Short enough for the test's budget, long enough that no ordinary run here
// (a 16-float kernel) comes near it, also under sanitizers.
constexpr int64_t kRunTimeoutMs = kSanitized ? 3000 : 1000;
constexpr uint64_t kRunTimeoutNs = static_cast<uint64_t>(kRunTimeoutMs) * 1'000'000ull;
// How long (c) keeps a child stopped while checking that its runs are held:
// a quarter of the deadline, so a stop never comes near it.
constexpr std::chrono::milliseconds kHeldWhileStopped{kRunTimeoutMs / 4};
constexpr int kN = 16;
constexpr size_t kSlots = 32;   // heap buffers of kN floats; slot 0 is every run's input
constexpr int kNeverGate = 9;   // never opened while a child could wait on it
constexpr uint32_t kDepth = 4;  // the node's pipeline_depth: its run-set grant

struct Figures {
  int cases = 0;
  int detected = 0;
  int false_positives = 0;
  double max_detect_ms = 0;
};

// The state letter of process `pid` ('T' when stopped), '?' when it is gone.
char proc_state(pid_t pid) {
  for (const ProcInfo& p : list_processes()) {
    if (p.pid == pid) return p.state;
  }
  return '?';
}

// True once `pid` has been reaped (a zombie still takes signal 0).
bool reaped(int pidfd) { return syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) != 0 && errno == ESRCH; }

// A pidfd of one child, closed on every path out of a case.
struct PidFd {
  explicit PidFd(pid_t pid) : fd(open_pidfd(pid)) {}
  ~PidFd() {
    if (fd >= 0) close(fd);
  }
  PidFd(const PidFd&) = delete;
  PidFd& operator=(const PidFd&) = delete;
  int fd;
};

// Entries of chip `chip`'s mailbox occupied in `state`.
int entries_in(NodeWorker& w, size_t chip, uint32_t state) {
  const MailboxView v = w.next_child(chip).endpoint().view();
  int n = 0;
  for (uint64_t i = 0; i < v.entry_count(); ++i) {
    const MailboxRunEntry& e = v.entry(i);
    n += load_acquire(e.entry_generation) % 2 == 1 && load_acquire(e.state) == state;
  }
  return n;
}

// A node of two chips with kRunTimeoutMs, kSlots heap buffers,
// and a ledger of every run's terminal and when it came.
class HungNode {
 public:
  struct Submitted {
    RunHandle handle;
    uint64_t id = 0;
    uint64_t submit_ns = 0;
  };

  HungNode() {
    WorkerConfig c = node_config(2, 0, kDepth);
    c.run_timeout = std::chrono::milliseconds(kRunTimeoutMs);
    NodeSpec spec;
    spec.config = c;
    spec.chip_callables = {axpb_callable()};
    axpb_ = CallableHandle{0, spec.chip_callables[0].digest()};
    auto w = NodeWorker::create(std::move(spec));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    if (!w.ok()) return;
    w_ = std::move(w).value();
    // One heap buffer per slot: a chip child stages each heap buffer a run
    // names as one span and copies all of it back, so two runs on one chip
    // writing disjoint slots of one buffer would overwrite each other.
    for (size_t k = 0; k < kSlots; ++k) {
      auto b = w_->malloc_shared(kN * 4);
      EXPECT_TRUE(b.ok()) << b.status().to_string();
      if (!b.ok()) return;
      slots_.push_back(*b);
    }
    auto* in = reinterpret_cast<float*>(slots_[0].addr);
    for (int i = 0; i < kN; ++i) in[i] = 1.0f + i;
  }
  // A case that failed part-way may leave a child stopped: close with a short
  // drain, so it is killed rather than waited on for the default minute.
  ~HungNode() {
    if (w_ != nullptr) (void)w_->close(std::chrono::seconds(1));
  }
  bool ok() const { return w_ != nullptr && slots_.size() == kSlots; }
  NodeWorker& w() { return *w_; }
  ForkedChild& chip(size_t i) { return w_->next_child(i); }
  TerminalLedger& ledger() { return ledger_; }

  // One task on `chip`: slot `slot` = 2 * input + slot, after gate `gate`.
  Submitted run_on(uint32_t chip, int slot, int gate) {
    return submit([this, chip, slot, gate](Orchestrator& o) {
      return o.submit_next_level(axpb_, axpb_args(view(0), view(slot), 2, slot, gate), chip).status();
    });
  }
  // A on `chip` (slot `slot` = 2 * input + slot, after gate `gate`), then C on
  // the same chip reading A's output: C is published staged while A runs.
  Submitted chain_on(uint32_t chip, int slot, int gate) {
    return submit([this, chip, slot, gate](Orchestrator& o) {
      (void)o.submit_next_level(axpb_, axpb_args(view(0), view(slot), 2, slot, gate), chip);
      return o.submit_next_level(axpb_, axpb_args(view(slot), view(slot + 1), 3, 1, -1), chip).status();
    });
  }
  // Whether slot `slot` holds what run_on(.., slot, ..) writes.
  bool slot_is_right(int slot) const {
    const auto* f = reinterpret_cast<const float*>(slots_[slot].addr);
    for (int i = 0; i < kN; ++i) {
      if (f[i] != 2.0f * (1.0f + i) + slot) return false;
    }
    return true;
  }
  std::string slot_text(int slot) const {
    const auto* f = reinterpret_cast<const float*>(slots_[slot].addr);
    std::string t;
    for (int i = 0; i < kN; ++i) t += fmt::format("{} ", f[i]);
    return t;
  }
  // When run `id`'s on_terminal was called (it comes after its handle is
  // done), waiting for it with the standard deadline; 0 when it never came.
  uint64_t terminal_ns(uint64_t id) {
    uint64_t at = 0;
    (void)eventually([&] {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = terminal_ns_.find(id);
      at = it == terminal_ns_.end() ? 0 : it->second;
      return at != 0;
    });
    return at;
  }
  // Every set back to free: none live, none quarantined (a reaped child's
  // sets are proven), and the partition holds.
  void expect_sets_free() {
    EXPECT_TRUE(eventually([&] { return w_->run_set_counts().live == 0; })) << "a run set stayed live";
    const ArenaCounts c = w_->run_set_counts();
    EXPECT_EQ(c.quarantined, 0u) << "no cause was logged for a quarantined set";
    if (auto bad = check_partition("node run sets", c, kDepth)) ADD_FAILURE() << *bad;
  }
  Status close() { return w_->close(std::chrono::seconds(30)); }

 private:
  TensorView view(int slot) const { return slots_[slot].view({kN}, DType::F32); }
  Submitted submit(std::function<Status(Orchestrator&)> orchestration) {
    Submitted s;
    s.id = next_id_++;
    ledger_.submitted(s.id);
    s.submit_ns = now_ns();
    s.handle = w_->submit(orchestration, [this, id = s.id](const Status& st) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        terminal_ns_[id] = now_ns();
      }
      ledger_.record(id, st);
    });
    return s;
  }

  std::unique_ptr<NodeWorker> w_;
  std::vector<DeviceBuffer> slots_;
  CallableHandle axpb_{};
  TerminalLedger ledger_;
  uint64_t next_id_ = 1;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> terminal_ns_;
};

// Once the node is closed: every run's on_terminal has been called by then.
void expect_ledger_clean(HungNode& node, bool all_ok) {
  const TerminalLedger::Summary s = node.ledger().check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.terminals, s.submitted);
  if (all_ok) {
    EXPECT_EQ(s.ok, s.submitted) << "a run that only paused did not end ok";
  }
}

// Stops the current child of chip `chip` and waits until it is stopped.
void stop(HungNode& node, size_t chip) {
  const pid_t pid = node.chip(chip).pid();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(eventually([&] { return proc_state(pid) == 'T'; })) << "child " << pid << " never stopped";
}

// The common end of (a) and (b): chip 1 serves while chip 0 hangs; the hung
// run ends DEADLINE_EXCEEDED naming the cause, not before its deadline; the
// hung child is killed and reaped, replaced, and the replacement serves.
void expect_detected(HungNode& node, const HungNode::Submitted& hung, const std::vector<HungNode::Submitted>& also,
                     pid_t victim, const PidFd& victim_fd, uint64_t incarnation, Figures& fig) {
  // R: every other endpoint keeps serving while one child hangs.
  for (int k = 0; k < 3; ++k) {
    HungNode::Submitted r = node.run_on(1, 20 + k, -1);
    EXPECT_TRUE(wait_run(r.handle).ok()) << r.handle.result().to_string();
    EXPECT_TRUE(node.slot_is_right(20 + k)) << "chip 1's run " << k << " computed a wrong result";
  }
  // The run's own result is DEADLINE_EXCEEDED, so wait on done(), not on wait_for's code.
  (void)hung.handle.wait_for(std::chrono::milliseconds(kRunTimeoutMs) + std::chrono::seconds(10));
  ASSERT_TRUE(hung.handle.done()) << "the hung run was never ended";
  const Status st = hung.handle.result();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "child hung")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), fmt::format("no terminal {} ms after publication; child killed", kRunTimeoutMs)))
      << st.to_string();
  for (const HungNode::Submitted& r : also) {
    (void)r.handle.wait_for(kWait);
    ASSERT_TRUE(r.handle.done()) << "a run the hung child held was never ended";
    EXPECT_EQ(r.handle.result().code(), StatusCode::kDeadlineExceeded) << r.handle.result().to_string();
    EXPECT_TRUE(contains(r.handle.result().message(), "child hung")) << r.handle.result().to_string();
  }
  // Published at or after its submit, so the deadline is no earlier than this.
  const double after_deadline_ms =
      (static_cast<double>(node.terminal_ns(hung.id)) - static_cast<double>(hung.submit_ns + kRunTimeoutNs)) / 1e6;
  EXPECT_GE(after_deadline_ms, 0.0) << "the hung run was ended before its run_timeout: a false positive";
  if (after_deadline_ms < 0) ++fig.false_positives;
  ++fig.detected;
  fig.max_detect_ms = std::max(fig.max_detect_ms, after_deadline_ms);
  std::printf("T4 detection: %.1f ms past the deadline; %s\n", after_deadline_ms, st.to_string().c_str());

  // SIGKILL -> waitpid: the hung child is gone and reaped, not left a zombie.
  EXPECT_TRUE(eventually([&] { return reaped(victim_fd.fd); }))
      << "hung child " << victim << " was not killed and reaped";
  ForkedChild& chip0 = node.chip(0);
  // The incarnation counts up before the new child's pid is set: wait on the pid.
  EXPECT_TRUE(eventually([&] { return chip0.pid() != victim && chip0.serving(); }))
      << "the hung child was not replaced";
  EXPECT_EQ(chip0.incarnation(), incarnation + 1);
  EXPECT_FALSE(chip0.failure().has_value());
  HungNode::Submitted again = node.run_on(0, 30, -1);
  EXPECT_TRUE(wait_run(again.handle).ok()) << again.handle.result().to_string();
  EXPECT_TRUE(node.slot_is_right(30)) << "the replacement computed a wrong result";
  node.expect_sets_free();
  EXPECT_TRUE(node.close().ok()) << "the replacement closes cleanly";
  expect_ledger_clean(node, false);
}

// (a) A stopped child. `staged`: stopped while it holds a launched task and
// its staged successor (whose gate opens once it is stopped, so only the stop
// holds it), plus a second run published while it is stopped; else stopped
// idle, then one run published that it never reads.
void stopped_child(bool staged, Figures& fig) {
  SCOPED_TRACE(staged ? "(a) stopped with a task in flight and one staged" : "(a) stopped idle, then published to");
  ++fig.cases;
  HungNode node;
  ASSERT_TRUE(node.ok());
  ForkedChild& chip0 = node.chip(0);
  const pid_t victim = chip0.pid();
  const uint64_t incarnation = chip0.incarnation();
  const PidFd fd(victim);
  ASSERT_GE(fd.fd, 0);
  HungNode::Submitted hung;
  std::vector<HungNode::Submitted> also;
  if (staged) {
    hung = node.chain_on(0, 1, 1);
    ASSERT_TRUE(eventually([&] {
      return entries_in(node.w(), 0, kMailboxTaskLaunched) == 1 && entries_in(node.w(), 0, kMailboxFrameStaged) == 1;
    })) << "A never launched with C staged behind it";
    stop(node, 0);
    g_node_gates->open_gate(1);
    also.push_back(node.run_on(0, 3, -1));
  } else {
    stop(node, 0);
    hung = node.run_on(0, 1, -1);
  }
  expect_detected(node, hung, also, victim, fd, incarnation, fig);
}

// (b) A task whose kernel never returns: the child runs, the device task blocks.
void stuck_task(Figures& fig) {
  SCOPED_TRACE("(b) a simulated-device task that never finishes");
  ++fig.cases;
  HungNode node;
  ASSERT_TRUE(node.ok());
  ForkedChild& chip0 = node.chip(0);
  const pid_t victim = chip0.pid();
  const uint64_t incarnation = chip0.incarnation();
  const PidFd fd(victim);
  ASSERT_GE(fd.fd, 0);
  const HungNode::Submitted hung = node.run_on(0, 1, kNeverGate);
  ASSERT_TRUE(eventually([&] { return entries_in(node.w(), 0, kMailboxTaskLaunched) == 1; }))
      << "the stuck task never launched";
  expect_detected(node, hung, {}, victim, fd, incarnation, fig);
}

// (c) SIGSTOP then SIGCONT well before the deadline, with a task in flight
// and one published while stopped: nothing is killed or replaced, and both
// runs end ok once. Then once more on the child's replacement, after a
// respawn (SIGKILL while idle), so no record of the dead child's runs can
// make the new one look hung.
void paused_child(Figures& fig) {
  SCOPED_TRACE("(c) SIGSTOP, SIGCONT before the deadline, and again after a respawn");
  ++fig.cases;
  HungNode node;
  ASSERT_TRUE(node.ok());
  ForkedChild& chip0 = node.chip(0);
  int slot = 1;
  auto pause_and_resume = [&](int gate) {
    const pid_t pid = chip0.pid();
    const uint64_t incarnation = chip0.incarnation();
    PidFd fd(pid);
    ASSERT_GE(fd.fd, 0) << "pidfd_open(" << pid << "): " << std::strerror(errno);
    const int first = slot++, second = slot++, other = slot++;
    HungNode::Submitted a = node.run_on(0, first, gate);
    ASSERT_TRUE(eventually([&] { return entries_in(node.w(), 0, kMailboxTaskLaunched) == 1; }))
        << "the task never launched";
    stop(node, 0);
    g_node_gates->open_gate(gate);
    HungNode::Submitted b = node.run_on(0, second, -1);
    HungNode::Submitted c = node.run_on(1, other, -1);
    EXPECT_TRUE(wait_run(c.handle).ok()) << "chip 1 did not serve while chip 0 was stopped";
    // Held, not ended, while the child is stopped.
    EXPECT_EQ(a.handle.wait_for(kHeldWhileStopped).code(), StatusCode::kDeadlineExceeded);
    EXPECT_FALSE(a.handle.done() || b.handle.done()) << "a run of the stopped child ended while it was stopped";
    EXPECT_EQ(::kill(pid, SIGCONT), 0) << "the paused child is gone";
    for (HungNode::Submitted* r : {&a, &b}) {
      const Status st = wait_run(r->handle);
      EXPECT_TRUE(st.ok()) << "a run that only paused ended: " << st.to_string();
      if (!st.ok()) ++fig.false_positives;
    }
    for (int s : {first, second, other})
      EXPECT_TRUE(node.slot_is_right(s)) << "slot " << s << " is wrong: " << node.slot_text(s);
    const bool killed = exits_within(fd.fd, 0);
    fd.fd = -1;  // exits_within closed it
    const bool replaced = chip0.incarnation() != incarnation || chip0.pid() != pid;
    EXPECT_FALSE(killed) << "a child that only paused was killed";
    EXPECT_FALSE(replaced) << "a child that only paused was replaced";
    fig.false_positives += killed || replaced;
  };
  pause_and_resume(2);
  const uint64_t before = chip0.incarnation();
  const pid_t dead = chip0.pid();
  ASSERT_EQ(::kill(dead, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return chip0.pid() != dead && chip0.serving(); }))
      << "the killed child was not replaced";
  ASSERT_EQ(chip0.incarnation(), before + 1);
  pause_and_resume(3);
  node.expect_sets_free();
  EXPECT_TRUE(node.close().ok());
  expect_ledger_clean(node, true);
}

// T4: hung children are detected at their run deadline and replaced; a pause
// shorter than the deadline is not a hang.
TEST(HungChild, T4StoppedAndStuckChildrenAreDetectedWithoutFalsePositives) {
  Watchdog dog;
  make_node_gates();
  const HealthScan health;  // before any node forks
  Figures fig;
  stopped_child(true, fig);
  stopped_child(false, fig);
  stuck_task(fig);
  paused_child(fig);
  EXPECT_EQ(fig.detected, 3);
  EXPECT_EQ(fig.false_positives, 0);
  health.expect_clean();
  std::printf("RELIABILITY T4 cases=%d detected=%d false_positives=%d max_detect_ms=%.1f deadline_ms=%lld\n", fig.cases,
              fig.detected, fig.false_positives, fig.max_detect_ms, static_cast<long long>(kRunTimeoutMs));
}

}  // namespace
}  // namespace simpler::testing
