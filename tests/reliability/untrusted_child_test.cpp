// T6 of the reliability plan: untrusted child writes (the child-to-parent
// direction). A real forked child serves through a StorePrimitive that
// misbehaves on purpose, once, in one way per case: a terminal for an
// unoccupied entry, a terminal for a wrong generation (the child rewrites the
// parent's generation word), an ACK echo with the wrong publication, an rc
// out of range, an error text with no NUL, and a terminal before its ACK.
// The parent must never deliver a terminal to a run other than the one its
// entry proves and never free anything on an unproven signal: it ignores an
// entry it does not hold, cuts a text at the entry's capacity, and stops the
// endpoint ("child protocol violation: ...") on any other such write, every
// held run then ending with that cause. Each case also holds a bystander run
// in another entry. Prints `RELIABILITY T6 cases=N misdeliveries=0`.
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "health_scan.h"
#include "ipc/fork_server.h"
#include "ipc/forked_child.h"
#include "ipc_test_util.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

enum class Misbehaviour {
  kTerminalUnoccupied,       // a terminal into an entry the parent never occupied
  kTerminalWrongGeneration,  // the generation word rewritten, then the terminal
  kAckWrongPublication,      // the ACK echoes another publication
  kRcOutOfRange,             // rc 999, no StatusCode
  kTextNoNul,                // the whole error text without a NUL
  kTerminalBeforeAck,        // TASK_DONE stored where FRAME_STAGED belongs
};

struct CaseSpec {
  const char* name;
  Misbehaviour how;
  // What the parent must do: deliver the run's own terminal (refusing the
  // bad write), or stop the endpoint with a reason containing `reason`.
  bool stops;
  const char* reason;
};

constexpr CaseSpec kCases[] = {
    {"terminal_unoccupied", Misbehaviour::kTerminalUnoccupied, false, ""},
    {"terminal_wrong_generation", Misbehaviour::kTerminalWrongGeneration, true, "generation"},
    {"ack_wrong_publication", Misbehaviour::kAckWrongPublication, true, "ACK"},
    {"rc_out_of_range", Misbehaviour::kRcOutOfRange, true, "rc 999"},
    {"text_no_nul", Misbehaviour::kTextNoNul, false, ""},
    {"terminal_before_ack", Misbehaviour::kTerminalBeforeAck, true, "before its ACK"},
};

constexpr uint64_t kTargetRun = 2;

// The child's store primitive (a copy of it lives in the forked child). It
// stores like PlainStores, except the first store the case aims at. Entries
// are found by address in the view both processes map at one address.
class UntrustedStores final : public StorePrimitive {
 public:
  UntrustedStores(MailboxView view, Misbehaviour how, TestGates* gates, int gate)
      : view_(view), how_(how), gates_(gates), gate_(gate) {}

  void store32(uint32_t& w, uint32_t v) override {
    MailboxRunEntry* e = target(&w);
    if (e != nullptr && &w == &e->state) {
      if (how_ == Misbehaviour::kTerminalUnoccupied && mailbox_state_is_terminal(v) && !fired_.exchange(true)) {
        MailboxRunEntry& idle = view_.entry(view_.entry_count() - 1);  // never occupied in these cases
        store_release(idle.rc, 0);
        store_release(idle.state, static_cast<uint32_t>(kMailboxTaskDone));
      }
      if (how_ == Misbehaviour::kTerminalWrongGeneration && mailbox_state_is_terminal(v) && !fired_.exchange(true)) {
        store_release(e->entry_generation, load_acquire(e->entry_generation) + 2);
      }
      if (how_ == Misbehaviour::kTerminalBeforeAck && v == kMailboxFrameStaged && !fired_.exchange(true)) {
        store_release(e->state, static_cast<uint32_t>(kMailboxTaskDone));
        view_.control().parent_bell.ring();
        // Held here, before the ACK, until the parent has looked.
        spin_then_park(
            gates_->bell, [&] { return gates_->is_open(gate_); }, SpinPolicy{}, now_ns() + kTestWaitNs);
      }
    }
    if (e != nullptr && how_ == Misbehaviour::kRcOutOfRange && &w == reinterpret_cast<uint32_t*>(&e->rc) &&
        !fired_.exchange(true)) {
      v = 999;
    }
    store_release(w, v);
  }
  void store64(uint64_t& w, uint64_t v) override {
    MailboxRunEntry* e = target(&w);
    if (e != nullptr && how_ == Misbehaviour::kAckWrongPublication && &w == &e->consumed_ack &&
        !fired_.exchange(true)) {
      v += 1000;
    }
    store_release(w, v);
  }
  void store_bytes(void* dst, const void* src, size_t n) override {
    MailboxRunEntry* e = target(dst);
    if (e != nullptr && how_ == Misbehaviour::kTextNoNul && dst == e->error_text && !fired_.exchange(true)) {
      std::memset(dst, 'x', n);
      return;
    }
    std::memcpy(dst, src, n);
  }

 private:
  // The entry `p` lies in when it is the case's run's (run 2); else null,
  // so the bystander is served as the protocol says.
  MailboxRunEntry* target(const void* p) const {
    const auto off = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(view_.base());
    if (off < kMailboxEntriesOffset || off >= view_.bytes()) return nullptr;
    MailboxRunEntry& e = view_.entry((off - kMailboxEntriesOffset) / kMailboxEntryStride);
    return load_acquire(e.run_id) == kTargetRun ? &e : nullptr;
  }

  MailboxView view_;
  Misbehaviour how_;
  TestGates* gates_;
  int gate_;
  std::atomic<bool> fired_{false};  // each case misbehaves once
};

// One case against a fresh child; its failures end only this case, so one
// run reports every case that is red.
void run_case(const CaseSpec& c, TestGates* gates, int case_gate, int hold_gate, uint64_t& misdeliveries) {
  SCOPED_TRACE(c.name);
  SpawnOptions o;
  auto mailbox = ForkedChild::map_mailbox(o.granted_sets);
  ASSERT_TRUE(mailbox.ok()) << mailbox.status().to_string();
  auto view = MailboxView::attach((*mailbox)->data(), (*mailbox)->size(), o.granted_sets);
  ASSERT_TRUE(view.ok());
  UntrustedStores stores(*view, c.how, gates, case_gate);
  o.child.stores = &stores;  // the child's copy is the one that stores
  std::vector<ChildRecipe> recipes;
  recipes.push_back(
      ChildRecipe{"simpler-child", [gates] { return std::make_unique<TestHandler>(gates); }, *view, o.child});
  auto server = ForkServer::start(std::move(recipes));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto started = ForkedChild::start(**server, 0, *mailbox, o);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<ForkedChild> child = std::move(started).value();
  MailboxEndpoint& ep = child->endpoint();
  std::vector<EndpointEvent> events;

  // The bystander, held in its own entry until hold_gate opens.
  const Publication by = publish_run(ep, 1, "gate=" + std::to_string(hold_gate) + ";text=");
  poll_until(
      ep, events, [&] { return ep.available_request_transport() == kMailboxRequestFrames; }, "the bystander's ACK");
  const uint64_t idle_generation = load_acquire(view->entry(view->entry_count() - 1).entry_generation);
  const Publication x = publish_run(ep, 2, "fail=6;text=the run's own failure");
  if (c.how == Misbehaviour::kTerminalBeforeAck) {
    // The child is held between its premature terminal and the ACK: this
    // poll sees a terminal no ACK has proven.
    ASSERT_TRUE(spin_then_park(
        view->control().parent_bell, [&] { return load_acquire(view->entry(x.entry).state) == kMailboxTaskDone; },
        SpinPolicy{}, now_ns() + kTestWaitNs));
    ep.poll(events);
    gates->open_gate(case_gate);
  }
  poll_until(
      ep, events,
      [&] {
        return find_event(events, 2, EndpointEvent::Kind::kTerminal) != nullptr &&
               (!c.stops || find_event(events, 1, EndpointEvent::Kind::kTerminal));
      },
      "the run's terminal");
  const EndpointEvent* xt = find_event(events, 2, EndpointEvent::Kind::kTerminal);
  ASSERT_NE(xt, nullptr);
  EXPECT_EQ(xt->entry, x.entry);
  EXPECT_EQ(load_acquire(view->entry(view->entry_count() - 1).entry_generation), idle_generation)
      << "an entry nobody occupied was released";
  if (c.stops) {
    ASSERT_TRUE(ep.poisoned().has_value()) << "the endpoint kept serving a child that broke the protocol";
    EXPECT_TRUE(contains(ep.poisoned()->message(), "child protocol violation")) << ep.poisoned()->to_string();
    EXPECT_TRUE(contains(ep.poisoned()->message(), c.reason)) << ep.poisoned()->to_string();
    // The forged outcome is not delivered: both held runs end with the stop's cause.
    if (!xt->endpoint_failure || xt->status != *ep.poisoned()) {
      ++misdeliveries;
      ADD_FAILURE() << "run 2 got " << xt->status.to_string();
    }
    const EndpointEvent* bt = find_event(events, 1, EndpointEvent::Kind::kTerminal);
    if (bt == nullptr || bt->entry != by.entry || !bt->endpoint_failure || bt->status != *ep.poisoned()) {
      ++misdeliveries;
      ADD_FAILURE() << "the bystander got " << (bt ? bt->status.to_string() : "no terminal");
    }
    EXPECT_EQ(ep.available_request_transport(), 0u) << "nothing is reused on an unproven signal";
  } else {
    EXPECT_FALSE(ep.poisoned().has_value()) << ep.poisoned().value_or(Status()).to_string();
    // The run's own failure, with the text bounded where the child left no NUL.
    if (xt->status.ok() || xt->endpoint_failure) {
      ++misdeliveries;
      ADD_FAILURE() << "run 2 got " << xt->status.to_string();
    }
    if (c.how == Misbehaviour::kTextNoNul) {
      EXPECT_EQ(xt->status.code(), StatusCode::kKernelFailed);
      EXPECT_EQ(xt->status.message(), std::string(kMailboxErrorTextSize - 1, 'x')) << "bounded by the entry";
    } else {
      EXPECT_EQ(xt->status, Status(StatusCode::kKernelFailed, "the run's own failure"));
    }
    gates->open_gate(hold_gate);
    poll_until(
        ep, events, [&] { return find_event(events, 1, EndpointEvent::Kind::kTerminal) != nullptr; },
        "the bystander's terminal");
    const EndpointEvent* bt = find_event(events, 1, EndpointEvent::Kind::kTerminal);
    if (bt == nullptr || bt->entry != by.entry || bt->status != Status()) {
      ++misdeliveries;
      ADD_FAILURE() << "the bystander got " << (bt ? bt->status.to_string() : "no terminal");
    }
  }
  for (const EndpointEvent& e : events) {
    if (e.run_id != 1 && e.run_id != 2) {
      ++misdeliveries;
      ADD_FAILURE() << "an event for run " << e.run_id << " nobody published";
    }
  }
  EXPECT_EQ(ep.held_runs(), 0u);
  gates->open_gate(case_gate);
  gates->open_gate(hold_gate);
  std::vector<EndpointEvent> rest;  // close() ends the endpoint `ep` refers to
  const Status closed = child->close(now_ns() + kTestWaitNs, rest);
  if (!c.stops) {
    EXPECT_TRUE(closed.ok()) << closed.to_string();
  }
  for (const EndpointEvent& e : rest) {
    if (e.kind == EndpointEvent::Kind::kTerminal && (e.run_id == 1 || e.run_id == 2)) {
      ++misdeliveries;
      ADD_FAILURE() << "a second terminal for run " << e.run_id;
    }
  }
}

TEST(UntrustedChild, T6ParentValidatesWhatTheChildWrites) {
  Watchdog dog;
  const HealthScan health;
  TestGates* gates = make_node_gates();
  uint64_t misdeliveries = 0;
  int gate = 1;
  for (const CaseSpec& c : kCases) {
    run_case(c, gates, gate, gate + 1, misdeliveries);
    gate += 2;
  }
  health.expect_clean();
  EXPECT_EQ(misdeliveries, 0u);
  std::printf("RELIABILITY T6 cases=%zu misdeliveries=%llu\n", std::size(kCases),
              static_cast<unsigned long long>(misdeliveries));
}

}  // namespace
}  // namespace simpler::testing
