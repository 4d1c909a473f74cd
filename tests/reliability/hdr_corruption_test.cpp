// T5 of the reliability plan: the header-corruption matrix (R7-R9), as a
// corpus of case files, each corrupting the mailbox of a real forked child
// through the parent's own mapping of it (hook H4: MailboxEndpoint::view() is
// that mapping, the one the parent publishes through).
//
// Case format, tests/reliability/hdr/<name>.case: one `key = value` per line,
// `#` starts a comment. The case corrupts the request header of a run R
// published while the child is stopped (SIGSTOP), so the child reads the
// corrupted header, never the good one; every key not given keeps R's value.
//   target       = fresh (default: corrupt R's publication)
//                | replay (no R: the occupant's frame, already consumed,
//                  is marked TASK_READY again)
//   index        = M | M+1 | UINT32_MAX | occupant (the occupant's entry)
//   generation   = even (R's + 1) | stale (R's - 2) | future (R's + 2)
//                | occupant (the occupant's)
//   run          = other (the occupant's run and dispatch ids)
//   publication  = 0
//   version      = bad
//   config_bytes = over_capacity
//   args_bytes   = over_capacity | over_frame
//   magic        = bad (the control frame's magic word)
// <name>.expected, in the same format:
//   outcome = stale          the frame comes back FRAME_REFUSED; no store to
//                            any entry, no handler call, the endpoint serves
//                            on; R (if any) ends from the parent's record
//           | unattributable the endpoint stops with a reason; no entry store,
//                            no handler call; every held run ends with that cause
//           | malformed      R ends INVALID_ARGUMENT from its own entry, unrun;
//                            no other entry is stored; the endpoint serves on
//           | served         R runs and ends OK
//   text    = what the stop reason (unattributable) or R's terminal
//             (malformed) must contain
// Each case runs against a fresh child A holding an occupant O (gated, after
// its launch marker) while a second child B holds a run of its own; B must
// be unaffected in every case. Prints
// `RELIABILITY T5 cases=N matched=N wrong_entry_stores=0`.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/shared_memory.h"
#include "health_scan.h"
#include "ipc/forked_child.h"
#include "ipc_test_util.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

using KeyValues = std::map<std::string, std::string>;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Reads `key = value` lines; ADD_FAILURE on a line that is neither that, blank nor a comment.
KeyValues read_key_values(const std::string& path) {
  KeyValues kv;
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << "cannot read " << path;
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      ADD_FAILURE() << path << ": not `key = value`: " << line;
      continue;
    }
    kv[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return kv;
}

std::string value_or(const KeyValues& kv, const std::string& key, const std::string& fallback) {
  auto it = kv.find(key);
  return it == kv.end() ? fallback : it->second;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  if (DIR* d = opendir(SIMPLER_HDR_CASES)) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".case") == 0) names.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A run's terminal status; INTERNAL "no terminal" when it has none.
Status terminal_status(const std::vector<EndpointEvent>& events, uint64_t run) {
  const EndpointEvent* t = find_event(events, run, EndpointEvent::Kind::kTerminal);
  return t != nullptr ? t->status : internal_error("run {} has no terminal", run);
}

using EntrySnapshot = std::vector<std::vector<uint8_t>>;
EntrySnapshot snapshot_entries(const MailboxView& v) {
  EntrySnapshot s(v.entry_count());
  for (uint64_t i = 0; i < v.entry_count(); ++i) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v.entry(i));
    s[i].assign(p, p + kMailboxEntryStride);
  }
  return s;
}

uint32_t handler_calls(TestGates* g) { return std::atomic_ref<uint32_t>(g->handler_calls).load(); }

class HeaderCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    health_ = std::make_unique<HealthScan>();
    gates_ = make_node_gates();  // before any fork: every child shares it
    auto b = ForkedChild::spawn([g = gates_] { return std::make_unique<TestHandler>(g); }, SpawnOptions{});
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    b_ = std::move(b).value();
  }
  void TearDown() override {
    if (b_) {
      std::vector<EndpointEvent> rest;
      EXPECT_TRUE(b_->close(now_ns() + kTestWaitNs, rest).ok());
      b_.reset();
    }
  }

  // Runs one case; returns whether its observed outcome matched, and adds
  // the entries stored into against the expectation to wrong_entry_stores_.
  bool run_case(const std::string& name, int gate);

  std::unique_ptr<HealthScan> health_;
  TestGates* gates_ = nullptr;
  std::unique_ptr<ForkedChild> b_;
  std::vector<EndpointEvent> b_events_;
  uint64_t next_run_ = 1;
  uint64_t wrong_entry_stores_ = 0;
  std::map<uint64_t, int> terminals_;  // per run id, over both children
};

bool HeaderCorruption::run_case(const std::string& name, int gate) {
  SCOPED_TRACE("case " + name);
  const KeyValues c = read_key_values(std::string(SIMPLER_HDR_CASES) + "/" + name + ".case");
  const KeyValues x = read_key_values(std::string(SIMPLER_HDR_CASES) + "/" + name + ".expected");
  const std::string expected = value_or(x, "outcome", "?");
  const std::string text = value_or(x, "text", "");
  const bool replay = value_or(c, "target", "fresh") == "replay";

  auto spawned = ForkedChild::spawn([g = gates_] { return std::make_unique<TestHandler>(g); }, SpawnOptions{});
  if (!spawned.ok()) {
    ADD_FAILURE() << spawned.status().to_string();
    return false;
  }
  std::unique_ptr<ForkedChild> a = std::move(spawned).value();
  MailboxEndpoint& ep = a->endpoint();
  const MailboxView v = ep.view();
  std::vector<EndpointEvent> events;
  auto count_terminals = [&](const std::vector<EndpointEvent>& evs) {
    for (const EndpointEvent& e : evs) terminals_[e.run_id] += e.kind == EndpointEvent::Kind::kTerminal ? 1 : 0;
  };

  // Two warm-up runs, so every entry the case uses has an older generation.
  const uint64_t w1 = next_run_++, w2 = next_run_++;
  publish_run(ep, w1, "");
  publish_run(ep, w2, "");
  poll_until(
      ep, events,
      [&] {
        return find_event(events, w1, EndpointEvent::Kind::kTerminal) &&
               find_event(events, w2, EndpointEvent::Kind::kTerminal);
      },
      "the warm-up runs");
  const uint64_t o = next_run_++;
  const std::string occupant_text = "occupant of " + name;
  const Publication op = publish_run(ep, o, "gate=" + std::to_string(gate) + ";fail=6;text=" + occupant_text);
  poll_until(
      ep, events,
      [&] { return find_event(events, o, EndpointEvent::Kind::kAccepted) && ep.available_request_transport() == 2; },
      "the occupant's hand-back and acceptance");
  // B holds a run across the case.
  const uint64_t br = next_run_++;
  publish_run(b_->endpoint(), br, "gate=" + std::to_string(gate) + ";text=");
  poll_until(
      b_->endpoint(), b_events_, [&] { return find_event(b_events_, br, EndpointEvent::Kind::kAccepted) != nullptr; },
      "B's acceptance");

  const uint32_t calls = handler_calls(gates_);
  uint64_t r = 0;
  Publication rp{};
  size_t frame = op.frame;
  EntrySnapshot before;
  if (replay) {
    before = snapshot_entries(v);
    store_release(v.frame(frame).header.ready, static_cast<uint32_t>(kMailboxTaskReady));
    v.control().child_bell.ring();
  } else {
    // Stopped, the child cannot read R's header before it is corrupted.
    EXPECT_EQ(::kill(a->pid(), SIGSTOP), 0);
    EXPECT_TRUE(eventually([&] { return process_state(a->pid()) == 'T'; })) << "the child never stopped";
    r = next_run_++;
    rp = publish_run(ep, r, "text=");
    frame = rp.frame;
    RequestHeader& h = v.frame(frame).header;
    const std::string index = value_or(c, "index", "");
    const std::string generation = value_or(c, "generation", "");
    if (index == "M") h.entry_index = v.entry_count();
    if (index == "M+1") h.entry_index = v.entry_count() + 1;
    if (index == "UINT32_MAX") h.entry_index = UINT32_MAX;
    if (index == "occupant") h.entry_index = op.entry;
    if (generation == "even") h.entry_generation = rp.entry_generation + 1;
    if (generation == "stale") h.entry_generation = rp.entry_generation - 2;
    if (generation == "future") h.entry_generation = rp.entry_generation + 2;
    if (generation == "occupant") h.entry_generation = op.entry_generation;
    if (value_or(c, "run", "") == "other") {
      h.run_id = o;
      h.dispatch_id = o;
    }
    if (value_or(c, "publication", "") == "0") h.publication = 0;
    if (value_or(c, "version", "") == "bad") h.protocol_version = kMailboxProtocolVersion + 1;
    if (value_or(c, "config_bytes", "") == "over_capacity") h.config_bytes = kRequestConfigCapacity + 1;
    if (value_or(c, "args_bytes", "") == "over_capacity") h.args_bytes = kRequestArgsCapacity + 1;
    if (value_or(c, "args_bytes", "") == "over_frame") h.args_bytes = 2 * kMailboxFrameSize;
    if (value_or(c, "magic", "") == "bad") v.control().magic = ~kMailboxMagic;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    before = snapshot_entries(v);
    EXPECT_EQ(::kill(a->pid(), SIGCONT), 0);
    v.control().child_bell.ring();
  }

  // Whatever the child does with the frame shows in shared words; wait for
  // the first, without polling A (a poll would release entries).
  auto r_terminal = [&] { return r != 0 && mailbox_state_is_terminal(load_acquire(v.entry(rp.entry).state)); };
  auto stopped = [&] { return load_acquire(v.control().endpoint_state) == kEndpointStopped; };
  auto ready = [&] { return load_acquire(v.frame(frame).header.ready); };
  const bool signalled = spin_then_park(
      v.control().parent_bell,
      [&] {
        return stopped() || ready() == kMailboxFrameRefused || r_terminal() || (replay && ready() == kMailboxIdle);
      },
      SpinPolicy{}, now_ns() + 10'000'000'000ull);
  std::string observed = "timeout";
  if (stopped()) {
    observed = "unattributable";
  } else if (ready() == kMailboxFrameRefused) {
    observed = "stale";
  } else if (r_terminal()) {
    observed = load_acquire(v.entry(rp.entry).state) == kMailboxTaskDone ? "served" : "malformed";
  } else if (signalled) {
    observed = "executed again";  // a replay taken as a new request
  }
  EXPECT_EQ(observed, expected);

  // Stores into entries the outcome does not own.
  const EntrySnapshot after = snapshot_entries(v);
  const bool r_owns_its_entry = expected == "malformed" || expected == "served";
  for (uint64_t i = 0; i < v.entry_count(); ++i) {
    if (r_owns_its_entry && i == rp.entry) continue;
    if (before[i] != after[i]) {
      ++wrong_entry_stores_;
      ADD_FAILURE() << "entry " << i << " was stored into";
    }
  }
  const uint32_t served_calls = expected == "served" ? 1 : 0;

  if (expected == "unattributable") {
    const std::string reason = read_text(v.control().stop_reason, kMailboxErrorTextSize);
    EXPECT_TRUE(contains(reason, text)) << reason;
    poll_until(
        ep, events,
        [&] {
          return find_event(events, o, EndpointEvent::Kind::kTerminal) &&
                 (r == 0 || find_event(events, r, EndpointEvent::Kind::kTerminal));
        },
        "every held run's terminal");
    const EndpointEvent* ot = find_event(events, o, EndpointEvent::Kind::kTerminal);
    EXPECT_TRUE(ot && ot->endpoint_failure);
    EXPECT_TRUE(ot && contains(ot->status.message(), reason)) << (ot ? ot->status.to_string() : "");
    if (r != 0) {
      const EndpointEvent* rt = find_event(events, r, EndpointEvent::Kind::kTerminal);
      EXPECT_TRUE(rt && ot && rt->status == ot->status) << "one cause";
    }
    EXPECT_TRUE(ep.poisoned().has_value());
  } else {
    if (r != 0) {
      poll_until(
          ep, events, [&] { return find_event(events, r, EndpointEvent::Kind::kTerminal) != nullptr; }, "R's terminal");
      const EndpointEvent* rt = find_event(events, r, EndpointEvent::Kind::kTerminal);
      if (rt == nullptr) return false;
      if (expected == "stale") {
        EXPECT_EQ(rt->status.code(), StatusCode::kInternal) << rt->status.to_string();
        EXPECT_TRUE(contains(rt->status.message(), "refused")) << rt->status.to_string();
      } else if (expected == "malformed") {
        EXPECT_EQ(rt->status.code(), StatusCode::kInvalidArgument) << rt->status.to_string();
        EXPECT_TRUE(contains(rt->status.message(), text)) << rt->status.to_string();
        EXPECT_FALSE(rt->endpoint_failure);
      } else {
        EXPECT_TRUE(rt->status.ok()) << rt->status.to_string();
      }
    }
    EXPECT_FALSE(ep.poisoned().has_value()) << ep.poisoned().value_or(Status()).to_string();
    // The endpoint serves on.
    const uint64_t later = next_run_++;
    poll_until(
        ep, events, [&] { return ep.available_request_transport() > 0; }, "a free frame");
    publish_run(ep, later, "fail=6;text=later");
    poll_until(
        ep, events, [&] { return find_event(events, later, EndpointEvent::Kind::kTerminal) != nullptr; },
        "a later run");
    EXPECT_EQ(terminal_status(events, later), Status(StatusCode::kKernelFailed, "later"));
  }
  EXPECT_EQ(handler_calls(gates_), calls + served_calls + (expected == "unattributable" ? 0 : 1))
      << "a corrupted header reached the handler";

  gates_->open_gate(gate);
  if (expected != "unattributable") {
    poll_until(
        ep, events, [&] { return find_event(events, o, EndpointEvent::Kind::kTerminal) != nullptr; },
        "the occupant's terminal");
    EXPECT_EQ(terminal_status(events, o), Status(StatusCode::kKernelFailed, occupant_text))
        << "the occupant is unaffected";
  }
  poll_until(
      b_->endpoint(), b_events_, [&] { return find_event(b_events_, br, EndpointEvent::Kind::kTerminal) != nullptr; },
      "B's run");
  EXPECT_EQ(terminal_status(b_events_, br), Status()) << "B is unaffected";
  EXPECT_FALSE(b_->endpoint().poisoned().has_value());

  std::vector<EndpointEvent> rest;
  const Status closed = a->close(now_ns() + kTestWaitNs, rest);
  events.insert(events.end(), rest.begin(), rest.end());
  if (expected == "unattributable") {
    EXPECT_TRUE(contains(closed.message(), std::to_string(kChildExitEndpointStopped))) << closed.to_string();
  } else {
    EXPECT_TRUE(closed.ok()) << closed.to_string();
  }
  // close() destroyed the endpoint; what it held came back as terminals in `rest`.
  count_terminals(events);
  return observed == expected;
}

TEST_F(HeaderCorruption, T5CorpusOfCorruptedHeaders) {
  Watchdog dog;
  const std::vector<std::string> names = case_names();
  ASSERT_GE(names.size(), 15u) << "the corpus is missing from " << SIMPLER_HDR_CASES;
  int matched = 0;
  int gate = 1;
  for (const std::string& n : names) matched += run_case(n, gate++) ? 1 : 0;
  for (const EndpointEvent& e : b_events_) terminals_[e.run_id] += e.kind == EndpointEvent::Kind::kTerminal ? 1 : 0;
  for (const auto& [run, n] : terminals_) EXPECT_EQ(n, 1) << "run " << run << " got " << n << " terminals";
  std::vector<EndpointEvent> rest;
  EXPECT_TRUE(b_->close(now_ns() + kTestWaitNs, rest).ok());
  b_.reset();
  health_->expect_clean();
  EXPECT_EQ(matched, static_cast<int>(names.size()));
  EXPECT_EQ(wrong_entry_stores_, 0u);
  std::printf("RELIABILITY T5 cases=%zu matched=%d wrong_entry_stores=%llu\n", names.size(), matched,
              static_cast<unsigned long long>(wrong_entry_stores_));
}

}  // namespace
}  // namespace simpler::testing
