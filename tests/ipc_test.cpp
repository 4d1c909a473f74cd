// The mailbox layer (issue 4, R1-R19, R69, R70): layout, the real child loop
// and the mock child over a real shared buffer in threads, and forked
// children where the requirement is about processes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "base/leak.h"
#include "base/load_sense.h"
#include "base/shared_memory.h"
#include "chip/chip_worker.h"
#include "gate.h"
#include "health_scan.h"
#include "ipc/chip_child_handler.h"
#include "ipc/fork_server.h"
#include "ipc/forked_child.h"
#include "ipc/mailbox_child.h"
#include "ipc/mailbox_endpoint.h"
#include "ipc/mailbox_layout.h"
#include "ipc/serial_run_queue.h"
#include "ipc/sub_worker_handler.h"
#include "ipc/test_hooks.h"
#include "ipc_test_util.h"
#include "simpler/kernel.h"
#include "simpler/simpler.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

// The handler thread counts with atomic_ref; the test reads the same way.
template <typename Fixture>
uint32_t handler_calls(Fixture& fx) {
  return std::atomic_ref<uint32_t>(fx.gates_->handler_calls).load();
}

size_t count_events(const std::vector<EndpointEvent>& events, uint64_t run, EndpointEvent::Kind kind) {
  return static_cast<size_t>(std::count_if(events.begin(), events.end(),
                                           [&](const EndpointEvent& e) { return e.run_id == run && e.kind == kind; }));
}
size_t odd_entries(const MailboxView& v) {
  size_t n = 0;
  for (uint64_t i = 0; i < v.entry_count(); ++i) n += load_acquire(v.entry(i).entry_generation) % 2;
  return n;
}

enum class ChildKind { kRealLoop, kMock };

// A real shared buffer served by the real child loop (MailboxChild +
// TestHandler) or by MockMailboxWorker, each on a thread of its own.
class MailboxFixture {
 public:
  explicit MailboxFixture(ChildKind kind, uint64_t grant = 2, StorePrimitive* stores = nullptr,
                          ChildOptions options = {})
      : kind_(kind) {
    auto m = SharedMapping::create_anonymous(*mailbox_size(grant));
    EXPECT_TRUE(m.ok());
    map_ = std::move(m).value();
    auto g = SharedMapping::create_anonymous(sizeof(TestGates));
    gates_map_ = std::move(g).value();
    gates_ = new (gates_map_.data()) TestGates();
    auto ep = MailboxEndpoint::create(map_.data(), map_.size(), grant);
    EXPECT_TRUE(ep.ok()) << ep.status().to_string();
    ep_ = std::move(ep).value();
    options.stores = stores;
    options_ = std::move(options);
  }
  ~MailboxFixture() { stop(); }

  void start() {
    if (kind_ == ChildKind::kRealLoop) {
      handler_ = std::make_unique<TestHandler>(gates_);
      child_ = std::make_unique<MailboxChild>(ep_->view(), *handler_, options_);
      thread_ = std::thread([this] { exit_code_ = child_->serve(); });
    } else {
      mock_ = std::make_unique<MockMailboxWorker>(ep_->view(), gates_);
      thread_ = std::thread([this] { mock_->run(); });
    }
  }
  void start_ready() {
    start();
    ASSERT_TRUE(ep_->wait_ready(now_ns() + kTestWaitNs).ok());
  }
  void stop() {
    if (!thread_.joinable()) return;
    for (int i = 0; i < 64; ++i) gates_->open_gate(i);
    ep_->request_shutdown();
    thread_.join();
    handler_.reset();
  }
  void open_gate(int n) {
    gates_->open_gate(n);
    view().control().child_bell.ring();
  }
  Publication publish(uint64_t run, const std::string& script, uint32_t task_slot = 0, bool staged = false) {
    const std::vector<uint8_t> cfg = bytes_of(script);
    PublishSpec s;
    s.run_id = run;
    s.dispatch_id = run;
    s.task_slot = task_slot;
    s.config = cfg;
    s.staged = staged;
    auto p = ep_->publish(s);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return p.ok() ? *p : Publication{};
  }
  // Waits for a free frame first, as an admitter would.
  Publication publish_when_free(uint64_t run, const std::string& script, uint32_t task_slot = 0, bool staged = false) {
    poll_until(
        *ep_, events_, [&] { return ep_->available_request_transport() > 0; }, "a free request frame");
    return publish(run, script, task_slot, staged);
  }
  bool wait_terminal(uint64_t run) {
    return poll_until(
        *ep_, events_, [&] { return find_event(events_, run, EndpointEvent::Kind::kTerminal) != nullptr; },
        "terminal of run " + std::to_string(run));
  }
  const EndpointEvent* terminal(uint64_t run) const { return find_event(events_, run, EndpointEvent::Kind::kTerminal); }
  MailboxView view() const { return ep_->view(); }

  ChildKind kind_;
  SharedMapping map_;
  SharedMapping gates_map_;
  TestGates* gates_ = nullptr;
  std::unique_ptr<MailboxEndpoint> ep_;
  ChildOptions options_;
  std::unique_ptr<TestHandler> handler_;
  std::unique_ptr<MailboxChild> child_;
  std::unique_ptr<MockMailboxWorker> mock_;
  std::thread thread_;
  int exit_code_ = -1;
  std::vector<EndpointEvent> events_;
};

// Writes a header into a frame this side considers free, as a leftover or
// corrupted frame would read, and wakes the child.
void forge_frame(const MailboxView& v, size_t f, uint64_t index, uint64_t generation) {
  RequestHeader& h = v.frame(f).header;
  store_relaxed(h.publication, uint64_t{0});
  h.protocol_version = kMailboxProtocolVersion;
  h.entry_index = index;
  h.entry_generation = generation;
  h.run_id = 999;
  h.config_bytes = 0;
  h.args_bytes = 0;
  store_relaxed(h.publication, uint64_t{1} << 60);
  store_release(h.ready, static_cast<uint32_t>(kMailboxTaskReady));
  v.control().child_bell.ring();
}

// ---------------------------------------------------------------------------
// Layout

// R1: the size formula; only the entry table grows with the grant.
// H5: each request carries an identity trailer past its args blob; the
// child counts one whose bytes are not the ones its publication wrote (here
// one byte flipped before the child reads the frame), and not a good one.
TEST(MailboxIdentity, H5AForeignPayloadIsCountedAndAnOwnOneIsNot) {
  Watchdog dog;
  MailboxFixture f(ChildKind::kRealLoop);
  const IdentityCounts before = identity_counts();
  f.publish(1, "");
  const Publication bad = f.publish(2, "");
  uint8_t* trailer = f.view().frame(bad.frame).args;  // run 2's args blob is empty
  trailer[5] ^= 0x5a;
  f.start_ready();
  ASSERT_TRUE(f.wait_terminal(1));
  ASSERT_TRUE(f.wait_terminal(2));
  const IdentityCounts after = identity_counts();
  EXPECT_EQ(after.checked - before.checked, 2u);
  EXPECT_EQ(after.mismatches - before.mismatches, 1u) << "run 2's foreign trailer was not counted";
}

TEST(MailboxLayout, R1SizeScalesOnlyByEntries) {
  for (size_t g : {1, 2, 3, 8, 1024}) {
    auto s = mailbox_size(g);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, 3 * 65536 + (g + 2) * 384) << g;
    EXPECT_EQ(*mailbox_size(g + 1) - *s, kMailboxEntryStride) << g;
  }
  EXPECT_EQ(*mailbox_size(2), 198144u);
  EXPECT_EQ(*mailbox_size(1024), 590592u);
  // Frame offsets do not depend on G.
  alignas(64) static uint8_t buf[600000];
  auto a = MailboxView::attach(buf, sizeof buf, 1);
  auto b = MailboxView::attach(buf, sizeof buf, 1024);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) EXPECT_EQ(&a->frame(f), &b->frame(f));
  EXPECT_EQ(&a->entry(0), &b->entry(0));
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&a->entry(0)) - buf, static_cast<ptrdiff_t>(kMailboxEntriesOffset));
}

// R69: typed and ranged; the cap comes from the 1 TiB entry table.
TEST(MailboxLayout, R69SizeIsTypedAndRanged) {
  EXPECT_FALSE(mailbox_size(0).ok());
  auto cap = mailbox_size(kMailboxMaxGrantedSets);
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(*cap, kMailboxEntriesOffset + (kMailboxMaxGrantedSets + kMailboxRequestFrames) * kMailboxEntryStride);
  EXPECT_LE((kMailboxMaxGrantedSets + kMailboxRequestFrames) * kMailboxEntryStride, kMailboxEntryTableCap);
  EXPECT_FALSE(mailbox_size(kMailboxMaxGrantedSets + 1).ok());
  EXPECT_FALSE(mailbox_size(SIZE_MAX).ok());
  EXPECT_LT(kMailboxMaxGrantedSets, 4294967295ull) << "some uint32 depths pass the facade and fail here";
}

// R2 (layout half): a frame has no run-life fields; the args blob is bounded.
TEST(MailboxLayout, R2FrameIsTransportOnly) {
  static_assert(sizeof(RequestFrame) == kMailboxFrameSize);
  static_assert(sizeof(RequestHeader) + 32 + kRequestConfigCapacity + kRequestArgsCapacity == kMailboxFrameSize);
  EXPECT_GE(kRequestArgsCapacity, kArgsBlobMaxBytes) << "any encodable args blob fits a frame";
  MailboxFixture fx(ChildKind::kRealLoop);
  std::vector<uint8_t> huge(kRequestArgsCapacity + 1, 0xee);
  const std::vector<uint8_t> before(fx.view().base(), fx.view().base() + fx.view().bytes());
  PublishSpec s;
  s.run_id = 1;
  s.args_blob = huge;
  auto p = fx.ep_->publish(s);
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(std::memcmp(before.data(), fx.view().base(), before.size()), 0) << "a refused publication writes nothing";
  EXPECT_EQ(fx.ep_->held_runs(), 0u);
}

// R3: each field written through the struct reads back at the exported offset;
// nothing lands outside the entry.
TEST(MailboxLayout, R3EntryFieldsByMemberMatchExportedOffsets) {
  static_assert(sizeof(MailboxRunEntry) == 384 && alignof(MailboxRunEntry) == 64);
  alignas(64) static uint8_t buf[kMailboxEntriesOffset + 5 * kMailboxEntryStride];
  std::memset(buf, 0x5a, sizeof buf);
  auto v = MailboxView::attach(buf, sizeof buf, 3);
  ASSERT_TRUE(v.ok());
  MailboxRunEntry& e = v->entry(3);
  std::memset(&e, 0, sizeof e);
  e.entry_generation = 11;
  e.run_id = 22;
  e.dispatch_id = 33;
  e.task_slot = 44;
  e.set_slot = 55;
  e.lease_generation = 66;
  e.state = kMailboxTaskLaunched;
  e.disposition = kDispositionNativePrepared;
  e.run_epoch = 77;
  e.rc = 8;
  e.accepted = 1;
  e.consumed_ack = 99;
  copy_text(e.error_text, sizeof e.error_text, "boom");
  const uint8_t* raw = reinterpret_cast<const uint8_t*>(&e);
  auto u64 = [&](size_t off) {
    uint64_t x;
    std::memcpy(&x, raw + off, 8);
    return x;
  };
  auto u32 = [&](size_t off) {
    uint32_t x;
    std::memcpy(&x, raw + off, 4);
    return x;
  };
  EXPECT_EQ(u64(kEntryOffGeneration), 11u);
  EXPECT_EQ(u64(kEntryOffRunId), 22u);
  EXPECT_EQ(u64(kEntryOffDispatchId), 33u);
  EXPECT_EQ(u32(kEntryOffTaskSlot), 44u);
  EXPECT_EQ(u32(kEntryOffSetSlot), 55u);
  EXPECT_EQ(u64(kEntryOffLeaseGeneration), 66u);
  EXPECT_EQ(u32(kEntryOffState), static_cast<uint32_t>(kMailboxTaskLaunched));
  EXPECT_EQ(u32(kEntryOffDisposition), static_cast<uint32_t>(kDispositionNativePrepared));
  EXPECT_EQ(u64(kEntryOffRunEpoch), 77u);
  EXPECT_EQ(u32(kEntryOffRc), 8u);
  EXPECT_EQ(u32(kEntryOffAccepted), 1u);
  EXPECT_EQ(u64(kEntryOffConsumedAck), 99u);
  EXPECT_STREQ(reinterpret_cast<const char*>(raw + kEntryOffErrorText), "boom");
  // The neighbours are untouched: a member write never strides whole entries.
  for (size_t i = kMailboxEntriesOffset + 2 * kMailboxEntryStride; i < kMailboxEntriesOffset + 3 * kMailboxEntryStride;
       ++i) {
    ASSERT_EQ(buf[i], 0x5a) << i;
  }
  for (size_t i = kMailboxEntriesOffset + 4 * kMailboxEntryStride; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0x5a) << i;
}

// R70: registration checks the extent before writing anything.
TEST(MailboxLayout, R70RegistrationCarriesTheExtent) {
  const size_t need = *mailbox_size(2);
  const size_t page_rounded = 212992;
  std::vector<uint8_t> storage(page_rounded + 4096 + 64);
  uint8_t* base = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  auto fill = [&] { std::memset(base, 0xc3, page_rounded + 4096); };
  auto untouched = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      if (base[i] != 0xc3) return false;
    }
    return true;
  };
  // Over-grant: refused, the canary-filled region stays byte-for-byte untouched.
  fill();
  auto over = MailboxEndpoint::create(base, need, 3);
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(untouched(0, page_rounded + 4096));
  // Above the cap with extent SIZE_MAX: refused, nothing written.
  auto cap = MailboxEndpoint::create(base, SIZE_MAX, kMailboxMaxGrantedSets + 1);
  EXPECT_FALSE(cap.ok());
  EXPECT_TRUE(untouched(0, page_rounded + 4096));
  // The exact extent: accepted; the entry table is cleared and nothing past it is written.
  auto exact = MailboxEndpoint::create(base, need, 2);
  ASSERT_TRUE(exact.ok());
  for (size_t i = kMailboxEntriesOffset; i < need; ++i) ASSERT_EQ(base[i], 0) << i;
  EXPECT_TRUE(untouched(need, page_rounded + 4096));
  EXPECT_TRUE(untouched(kMailboxFramesOffset + sizeof(RequestHeader), kMailboxFramesOffset + kMailboxFrameSize))
      << "frame payloads are not cleared";
  // A page-rounded extent is accepted.
  fill();
  auto rounded = MailboxEndpoint::create(base, page_rounded, 2);
  ASSERT_TRUE(rounded.ok());
  EXPECT_EQ(rounded.value()->view().control().mapped_bytes, page_rounded);
  EXPECT_TRUE(untouched(need, page_rounded + 4096));
}

// ---------------------------------------------------------------------------
// The protocol, against the real child loop and the mock child alike (R17).

class MailboxProtocol : public ::testing::TestWithParam<ChildKind> {};

// R17: both children follow the protocol: serve a request, hand the frame
// back, publish rc/text/terminal into the entry, and answer the control frame.
TEST_P(MailboxProtocol, R17ChildFollowsTheProtocol) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  fx.publish(1, "text=hello");
  fx.publish(2, "fail=6;text=kernel says no");
  ASSERT_TRUE(fx.wait_terminal(1));
  ASSERT_TRUE(fx.wait_terminal(2));
  EXPECT_TRUE(fx.terminal(1)->status.ok());
  EXPECT_EQ(fx.terminal(2)->status, Status(StatusCode::kKernelFailed, "kernel says no"));
  EXPECT_EQ(fx.ep_->available_request_transport(), kMailboxRequestFrames);
  EXPECT_EQ(odd_entries(fx.view()), 0u);
  EXPECT_EQ(handler_calls(fx), 2u);
}

// R2 (runtime half): a frame handed back is republished for B while A still
// executes; A's rc, text and acceptance all arrive from A's entry.
TEST_P(MailboxProtocol, R2FrameReusedWhileRunExecutes) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  const Publication a = fx.publish(1, "gate=1;fail=6;text=A's own text");
  poll_until(
      *fx.ep_, fx.events_, [&] { return fx.ep_->frames_reclaimed() >= 1; }, "A's hand-back");
  // Fill both frames so B necessarily reuses A's frame.
  const Publication b = fx.publish(2, "fail=6;text=B");
  const Publication c = fx.publish(3, "text=C");
  EXPECT_TRUE(b.frame == a.frame || c.frame == a.frame);
  ASSERT_TRUE(fx.wait_terminal(2));
  ASSERT_TRUE(fx.wait_terminal(3));
  EXPECT_EQ(fx.terminal(1), nullptr);
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(1));
  EXPECT_EQ(fx.terminal(1)->status, Status(StatusCode::kKernelFailed, "A's own text"));
  EXPECT_TRUE(fx.terminal(1)->accepted);
  EXPECT_EQ(fx.terminal(2)->status.message(), "B");
}

// R4: hand-back before completion: A's ACK is visible while A is not
// terminal, B goes into the same frame, both complete with their own results.
TEST_P(MailboxProtocol, R4HandBackBeforeCompletion) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  const Publication a = fx.publish(1, "gate=1;fail=6;text=A");
  const MailboxRunEntry& ea = fx.view().entry(a.entry);
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(ea.consumed_ack) == a.publication; }, "A's ACK");
  EXPECT_FALSE(mailbox_state_is_terminal(load_acquire(ea.state)));
  fx.publish(2, "text=filler");  // takes the other frame if A's is not first
  ASSERT_TRUE(fx.wait_terminal(2));
  const Publication b = fx.publish(3, "gate=2;fail=6;text=B");
  const Publication b2 = fx.publish_when_free(4, "text=D");
  EXPECT_TRUE(b.frame == a.frame || b2.frame == a.frame);
  fx.open_gate(1);
  fx.open_gate(2);
  ASSERT_TRUE(fx.wait_terminal(1));
  ASSERT_TRUE(fx.wait_terminal(3));
  EXPECT_EQ(fx.terminal(1)->status.message(), "A");
  EXPECT_EQ(fx.terminal(3)->status.message(), "B");
}

// R7: parity is occupancy, and a frame naming an earlier occupant's
// generation is never executed under the new one.
TEST_P(MailboxProtocol, R7GenerationParityIsOccupancy) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  EXPECT_EQ(odd_entries(fx.view()), 0u);
  const Publication first = fx.publish(1, "text=first");
  EXPECT_EQ(first.entry_generation % 2, 1u);
  EXPECT_EQ(odd_entries(fx.view()), 1u);
  ASSERT_TRUE(fx.wait_terminal(1));
  EXPECT_EQ(odd_entries(fx.view()), 0u);
  EXPECT_EQ(load_acquire(fx.view().entry(first.entry).entry_generation), first.entry_generation + 1);
  const Publication second = fx.publish(2, "gate=1;fail=6;text=second");
  ASSERT_EQ(second.entry, first.entry) << "the freed entry is reoccupied";
  EXPECT_EQ(second.entry_generation, first.entry_generation + 2);
  EXPECT_EQ(odd_entries(fx.view()), 1u);
  poll_until(
      *fx.ep_, fx.events_, [&] { return fx.ep_->available_request_transport() == kMailboxRequestFrames; },
      "second's hand-back");
  // The ACK is the child's last store of the hand-off and the handler is
  // called only after it; the acceptance comes from the handler, so the
  // count is complete only once it arrived.
  poll_until(
      *fx.ep_, fx.events_, [&] { return find_event(fx.events_, 2, EndpointEvent::Kind::kAccepted) != nullptr; },
      "second's acceptance");
  const uint32_t calls = handler_calls(fx);
  forge_frame(fx.view(), 0, first.entry, first.entry_generation);
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(fx.view().frame(0).header.ready) == kMailboxFrameRefused; },
      "the old generation's frame refused");
  EXPECT_EQ(handler_calls(fx), calls) << "not executed";
  EXPECT_EQ(load_acquire(fx.view().entry(second.entry).run_id), 2u);
  EXPECT_FALSE(fx.ep_->poisoned().has_value());
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(2));
  EXPECT_EQ(fx.terminal(2)->status.message(), "second");
  EXPECT_EQ(odd_entries(fx.view()), 0u);
}

// R8: a stale header against a live occupant: frame returned, no store to
// the occupant's entry, endpoint running, later request served.
TEST_P(MailboxProtocol, R8StaleHeaderIsResolvedByTheParent) {
  RecordingStores rec;
  MailboxFixture fx(GetParam(), 2, &rec);
  fx.start_ready();
  const Publication a = fx.publish(1, "gate=1;fail=6;text=occupant");
  poll_until(
      *fx.ep_, fx.events_, [&] { return fx.ep_->available_request_transport() == kMailboxRequestFrames; },
      "the occupant's hand-back");
  poll_until(
      *fx.ep_, fx.events_, [&] { return find_event(fx.events_, 1, EndpointEvent::Kind::kAccepted) != nullptr; },
      "the occupant's acceptance");
  const size_t before = rec.size();
  forge_frame(fx.view(), 1, a.entry, a.entry_generation + 2);
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(fx.view().frame(1).header.ready) == kMailboxFrameRefused; },
      "the stale frame returned");
  if (GetParam() == ChildKind::kRealLoop) {
    const auto log = rec.snapshot();
    for (size_t k = before; k < log.size(); ++k) {
      EXPECT_NE(region_of(fx.view(), log[k].addr), kEntryBase + static_cast<int>(a.entry)) << "store to the occupant";
    }
  }
  EXPECT_FALSE(fx.ep_->poisoned().has_value());
  fx.publish(2, "text=later");
  ASSERT_TRUE(fx.wait_terminal(2));
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(1));
  EXPECT_EQ(fx.terminal(1)->status, Status(StatusCode::kKernelFailed, "occupant"));
  EXPECT_FALSE(fx.terminal(1)->endpoint_failure);
}

// R9: an unattributable header (two kinds) stops the endpoint; the reason is
// published; no entry store; no task; every held run ends with that cause.
TEST_P(MailboxProtocol, R9UnattributableHeaderStopsTheEndpoint) {
  for (int kind = 0; kind < 2; ++kind) {
    RecordingStores rec;
    MailboxFixture fx(GetParam(), 2, &rec);
    fx.start_ready();
    fx.publish(1, "gate=1;text=held 1");
    fx.publish_when_free(2, "gate=1;text=held 2");
    poll_until(
        *fx.ep_, fx.events_, [&] { return fx.ep_->available_request_transport() == kMailboxRequestFrames; },
        "both hand-backs");
    // Both handler calls follow their ACKs: count them only once both runs were accepted.
    poll_until(
        *fx.ep_, fx.events_,
        [&] {
          return find_event(fx.events_, 1, EndpointEvent::Kind::kAccepted) != nullptr &&
                 find_event(fx.events_, 2, EndpointEvent::Kind::kAccepted) != nullptr;
        },
        "both acceptances");
    const uint32_t calls = handler_calls(fx);
    const size_t before = rec.size();
    if (kind == 0) {
      forge_frame(fx.view(), 0, fx.view().entry_count(), 1);  // index out of range
    } else {
      forge_frame(fx.view(), 0, 3, 2);  // even generation
    }
    ASSERT_TRUE(fx.wait_terminal(1));
    ASSERT_TRUE(fx.wait_terminal(2));
    fx.open_gate(1);  // the held runs finishing now must store nothing
    fx.thread_.join();
    if (GetParam() == ChildKind::kRealLoop) {
      EXPECT_EQ(fx.exit_code_, kChildExitEndpointStopped);
      fx.handler_.reset();  // drained: any late completion has been attempted
      // The accepts of the held runs may land after `before`; nothing may
      // land in an entry once the child began to stop.
      const auto log = rec.snapshot();
      const uintptr_t stop_word = reinterpret_cast<uintptr_t>(&fx.view().control().stop_reason);
      size_t stop_at = log.size();
      for (size_t k = before; k < log.size() && stop_at == log.size(); ++k) {
        if (log[k].addr == stop_word) stop_at = k;
      }
      ASSERT_LT(stop_at, log.size()) << "the reason was published";
      for (size_t k = stop_at; k < log.size(); ++k) {
        EXPECT_LT(region_of(fx.view(), log[k].addr), kEntryBase) << "entry store after the stop";
      }
    }
    EXPECT_EQ(handler_calls(fx), calls) << "no task ran";
    ASSERT_TRUE(fx.ep_->poisoned().has_value());
    const std::string reason = read_text(fx.view().control().stop_reason, kMailboxErrorTextSize);
    EXPECT_NE(reason.find("unattributable"), std::string::npos) << reason;
    EXPECT_TRUE(fx.terminal(1)->endpoint_failure);
    EXPECT_EQ(fx.terminal(1)->status, fx.terminal(2)->status) << "one cause";
    EXPECT_NE(fx.terminal(1)->status.message().find(reason), std::string::npos);
    EXPECT_EQ(fx.ep_->available_request_transport(), 0u);
    EXPECT_EQ(fx.ep_->publish(PublishSpec{}).status().code(), StatusCode::kAborted);
  }
}

// R10: ACK and terminal are levels: a parent that polls only after the runs
// finished still reclaims every frame and entry, once.
TEST_P(MailboxProtocol, R10ReclaimSignalsAreLevels) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  for (uint64_t round = 0; round < 5; ++round) {
    const Publication a = fx.publish(10 * round + 1, "text=a");
    const Publication b = fx.publish(10 * round + 2, "text=b");
    // Wait on the mapping itself, without polling, until both are terminal.
    Doorbell& bell = fx.view().control().parent_bell;
    ASSERT_TRUE(spin_then_park(
        bell,
        [&] {
          return mailbox_state_is_terminal(load_acquire(fx.view().entry(a.entry).state)) &&
                 mailbox_state_is_terminal(load_acquire(fx.view().entry(b.entry).state));
        },
        SpinPolicy{}, now_ns() + kTestWaitNs))
        << "runs never finished";
    std::vector<EndpointEvent> events;
    fx.ep_->poll(events);
    EXPECT_EQ(count_events(events, 10 * round + 1, EndpointEvent::Kind::kTerminal), 1u);
    EXPECT_EQ(count_events(events, 10 * round + 2, EndpointEvent::Kind::kTerminal), 1u);
    EXPECT_EQ(fx.ep_->available_request_transport(), kMailboxRequestFrames);
    events.clear();
    fx.ep_->poll(events);
    EXPECT_TRUE(events.empty()) << "no double reclaim";
    EXPECT_EQ(fx.ep_->held_runs(), 0u);
  }
}

// The text only the child's exit sweep writes into an entry it ends. The
// parent's own terminal for a run still held when the child exits says "the
// child exited", so a terminal carrying this text came from the sweep (R11).
std::string sweep_text(ChildKind kind) {
  return kind == ChildKind::kRealLoop ? "the child shut down before this run reached its terminal"
                                      : "mock: shut down before the terminal";
}

// R11: the exit sweep keys on parity: a run published but never staged
// (entry IDLE, generation odd) gets a terminal at shutdown, from the sweep.
TEST_P(MailboxProtocol, R11ExitSweepKeysOnParity) {
  MailboxFixture fx(GetParam());
  fx.publish(1, "text=never staged");
  EXPECT_EQ(load_acquire(fx.view().entry(0).state), static_cast<uint32_t>(kMailboxIdle));
  fx.ep_->request_shutdown();  // before the child starts: it sees shutdown before the frame
  fx.start();
  ASSERT_TRUE(fx.wait_terminal(1));
  EXPECT_TRUE(fx.terminal(1)->endpoint_failure);
  EXPECT_EQ(fx.terminal(1)->status.code(), StatusCode::kAborted);
  EXPECT_EQ(fx.terminal(1)->status.message(), sweep_text(GetParam())) << "the terminal did not come from the sweep";
  EXPECT_EQ(handler_calls(fx), 0u);
  fx.thread_.join();
  if (GetParam() == ChildKind::kRealLoop) {
    EXPECT_EQ(fx.exit_code_, kChildExitClean);
  }
}

// R12: readiness is a frame word; identity and progress live on the entry.
TEST_P(MailboxProtocol, R12ReadinessOnFramesIdentityOnEntries) {
  MailboxFixture fx(GetParam());
  const Publication p = fx.publish(7, "pre=1;text=x", 5);
  const MailboxView v = fx.view();
  EXPECT_EQ(load_acquire(v.frame(p.frame).header.ready), static_cast<uint32_t>(kMailboxTaskReady));
  EXPECT_EQ(load_acquire(v.entry(p.entry).state), static_cast<uint32_t>(kMailboxIdle));
  EXPECT_EQ(load_acquire(v.entry(p.entry).entry_generation) % 2, 1u);
  EXPECT_EQ(v.entry(p.entry).task_slot, 5u);
  fx.start_ready();
  poll_until(
      *fx.ep_, fx.events_, [&] { return fx.ep_->available_request_transport() == kMailboxRequestFrames; }, "hand-back");
  EXPECT_EQ(load_acquire(v.entry(p.entry).state), static_cast<uint32_t>(kMailboxFrameStaged));
  EXPECT_EQ(load_acquire(v.frame(p.frame).header.ready), static_cast<uint32_t>(kMailboxIdle));
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(7));
  EXPECT_EQ(fx.terminal(7)->task_slot, 5u);
}

// R12 (and R16) for the staged lane: PREPARE_READY is a frame word; the entry reads
// IDLE (odd) until the child takes it, then FRAME_STAGED; nothing runs until
// ACTIVATE, which travels on the entry (no frame); CANCEL ends it unrun.
TEST_P(MailboxProtocol, R12StagedRequestWaitsForActivation) {
  MailboxFixture fx(GetParam(), 4);
  const Publication p = fx.publish(7, "text=x", 5, true);
  const MailboxView v = fx.view();
  EXPECT_EQ(load_acquire(v.frame(p.frame).header.ready), static_cast<uint32_t>(kMailboxPrepareReady));
  EXPECT_EQ(load_acquire(v.entry(p.entry).state), static_cast<uint32_t>(kMailboxIdle));
  EXPECT_EQ(load_acquire(v.entry(p.entry).entry_generation) % 2, 1u);
  fx.start_ready();
  poll_until(
      *fx.ep_, fx.events_, [&] { return fx.ep_->available_request_transport() == kMailboxRequestFrames; }, "hand-back");
  EXPECT_EQ(load_acquire(v.entry(p.entry).state), static_cast<uint32_t>(kMailboxFrameStaged));
  EXPECT_EQ(load_acquire(v.frame(p.frame).header.ready), static_cast<uint32_t>(kMailboxIdle));
  EXPECT_EQ(handler_calls(fx), 0u) << "a staged request runs only at ACTIVATE";
  EXPECT_EQ(fx.terminal(7), nullptr);
  ASSERT_TRUE(fx.ep_->activate(p, true).ok());
  EXPECT_EQ(load_acquire(v.entry(p.entry).activation), static_cast<uint32_t>(kMailboxActivate));
  ASSERT_TRUE(fx.wait_terminal(7));
  EXPECT_TRUE(fx.terminal(7)->status.ok()) << fx.terminal(7)->status.to_string();
  // R16: the acceptance lands in the entry the staged run occupies.
  EXPECT_TRUE(fx.terminal(7)->accepted);
  EXPECT_EQ(fx.terminal(7)->entry, p.entry);
  ASSERT_NE(find_event(fx.events_, 7, EndpointEvent::Kind::kAccepted), nullptr);
  EXPECT_EQ(find_event(fx.events_, 7, EndpointEvent::Kind::kAccepted)->entry, p.entry);
  EXPECT_EQ(handler_calls(fx), 1u);
  EXPECT_FALSE(fx.ep_->activate(p, true).ok()) << "an activation names its occupant";

  const Publication q = fx.publish_when_free(8, "text=never", 6, true);
  EXPECT_FALSE(fx.ep_->activate(Publication{q.frame, q.entry, q.entry_generation + 2, q.publication}, true).ok());
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(v.entry(q.entry).state) == kMailboxFrameStaged; }, "staging");
  ASSERT_TRUE(fx.ep_->activate(q, false).ok());
  ASSERT_TRUE(fx.wait_terminal(8));
  EXPECT_EQ(fx.terminal(8)->status.code(), StatusCode::kAborted) << fx.terminal(8)->status.to_string();
  EXPECT_EQ(handler_calls(fx), 1u) << "a cancelled staged request never reaches the handler";
  EXPECT_EQ(odd_entries(v), 0u);
}

// R11 for the staged lane: a staged request never activated still gets its
// terminal when the child shuts down, and the child exits.
TEST_P(MailboxProtocol, R11ShutdownEndsAStagedRequest) {
  MailboxFixture fx(GetParam(), 2);
  const Publication p = fx.publish(3, "text=x", 0, true);
  fx.start_ready();
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(fx.view().entry(p.entry).state) == kMailboxFrameStaged; },
      "staging");
  fx.ep_->request_shutdown();
  ASSERT_TRUE(fx.wait_terminal(3));
  EXPECT_EQ(fx.terminal(3)->status.code(), StatusCode::kAborted) << fx.terminal(3)->status.to_string();
  // The child's own text for a staged run it never activated, not the parent's "the child exited".
  EXPECT_TRUE(contains(fx.terminal(3)->status.message(),
                       GetParam() == ChildKind::kRealLoop ? "the child shut down before" : "mock: shut down"))
      << fx.terminal(3)->status.to_string();
  EXPECT_EQ(handler_calls(fx), 0u);
  fx.thread_.join();
  if (GetParam() == ChildKind::kRealLoop) {
    EXPECT_EQ(fx.exit_code_, kChildExitClean);
  }
}

// R39: endpoint-level transport saturation resumes. Two publications fill K;
// the child withholds both hand-backs, so nothing more is published. Once it
// acknowledges one frame, that frame carries the third (staged) request as
// PREPARE_READY, naming the third run's own entry, while the acknowledging
// run has published no terminal.
TEST(MailboxStaging, R39SaturatedTransportResumesOnTheAcknowledgedFrame) {
  MailboxFixture fx(ChildKind::kRealLoop, 4);  // never started: nothing is handed back on its own
  const Publication a = fx.publish(1, "", 0);
  const Publication b = fx.publish(2, "", 1);
  EXPECT_NE(a.frame, b.frame);
  EXPECT_EQ(fx.ep_->available_request_transport(), 0u);
  const MailboxView v = fx.view();
  RequestHeader& h = v.frame(a.frame).header;
  store_release(h.ready, static_cast<uint32_t>(kMailboxIdle));
  store_release(v.entry(h.entry_index).consumed_ack, load_acquire(h.publication));
  EXPECT_EQ(fx.ep_->available_request_transport(), 1u);
  const Publication c = fx.publish(3, "", 2, true);
  EXPECT_EQ(c.frame, a.frame);
  EXPECT_EQ(load_acquire(h.ready), static_cast<uint32_t>(kMailboxPrepareReady));
  EXPECT_EQ(h.task_slot, 2u);
  EXPECT_EQ(h.entry_index, c.entry);
  EXPECT_EQ(v.entry(c.entry).task_slot, 2u);
  EXPECT_EQ(load_acquire(v.entry(c.entry).entry_generation), c.entry_generation);
  EXPECT_FALSE(mailbox_state_is_terminal(load_acquire(v.entry(a.entry).state)));
  EXPECT_FALSE(fx.ep_->poisoned().has_value());
  EXPECT_EQ(fx.ep_->held_runs(), 3u);
}

// R13: with K = 2 a third publication without a hand-back poisons the
// endpoint and fails as the admitter defect it is; a manual hand-back
// between the 2nd and 3rd makes the 3rd succeed.
TEST_P(MailboxProtocol, R13PublishesOnlyIntoAFreeFrame) {
  {
    MailboxFixture fx(GetParam(), 4);  // no child: nothing hands frames back
    EXPECT_EQ(fx.ep_->available_request_transport(), 2u);
    fx.publish(1, "");
    EXPECT_EQ(fx.ep_->available_request_transport(), 1u);
    fx.publish(2, "");
    EXPECT_EQ(fx.ep_->available_request_transport(), 0u);
    PublishSpec s;
    s.run_id = 3;
    const auto third = fx.ep_->publish(s);
    ASSERT_FALSE(third.ok());
    EXPECT_EQ(third.status().code(), StatusCode::kInternal) << third.status().to_string();
    EXPECT_TRUE(contains(third.status().message(), "admitter defect")) << third.status().to_string();
    ASSERT_TRUE(fx.ep_->poisoned().has_value());
    EXPECT_EQ(*fx.ep_->poisoned(), third.status()) << "the endpoint is poisoned with the defect";
    std::vector<EndpointEvent> events;
    fx.ep_->poll(events);
    EXPECT_EQ(count_events(events, 1, EndpointEvent::Kind::kTerminal), 1u);
    EXPECT_EQ(count_events(events, 2, EndpointEvent::Kind::kTerminal), 1u);
    EXPECT_TRUE(events[0].endpoint_failure);
    EXPECT_EQ(fx.ep_->available_request_transport(), 0u);
  }
  {
    MailboxFixture fx(GetParam(), 4);
    fx.publish(1, "");
    const Publication second = fx.publish(2, "");
    // The hand-back a child makes after copying the payload out: the frame's
    // own word to IDLE, then the ACK into the entry its header names.
    RequestHeader& h = fx.view().frame(second.frame).header;
    store_release(h.ready, static_cast<uint32_t>(kMailboxIdle));
    store_release(fx.view().entry(h.entry_index).consumed_ack, load_acquire(h.publication));
    EXPECT_EQ(fx.ep_->available_request_transport(), 1u);
    const Publication third = fx.publish(3, "");
    EXPECT_EQ(third.frame, second.frame);
    EXPECT_FALSE(fx.ep_->poisoned().has_value());
    EXPECT_EQ(fx.ep_->held_runs(), 3u);
    EXPECT_EQ(load_acquire(fx.view().entry(second.entry).state), static_cast<uint32_t>(kMailboxIdle)) << "un-staged";
    // Now the child starts: 1 and 3 are served; 2's payload was "taken" by
    // the manual hand-back, so only the exit sweep (parity) ends it.
    fx.start_ready();
    for (uint64_t r : {1, 3}) ASSERT_TRUE(fx.wait_terminal(r));
    fx.ep_->request_shutdown();
    ASSERT_TRUE(fx.wait_terminal(2));
    EXPECT_TRUE(fx.terminal(2)->endpoint_failure);
    EXPECT_EQ(fx.terminal(2)->status.message(), sweep_text(GetParam())) << "the terminal did not come from the sweep";
  }
}

// R15: one run per entry, all live, each failing with its own full-length
// text and code; a second wave through the same entries shows no old text.
TEST_P(MailboxProtocol, R15ErrorTextIsPerEntryAndFullLength) {
  const uint64_t grant = 4;
  MailboxFixture fx(GetParam(), grant);
  fx.start_ready();
  const uint64_t m = grant + kMailboxRequestFrames;
  std::vector<std::string> texts;
  for (uint64_t r = 0; r < m; ++r) {
    texts.push_back(std::string(kMailboxErrorTextSize - 1, static_cast<char>('a' + r)));
    const int code = 1 + static_cast<int>(r % 8);
    fx.publish_when_free(r, fmt::format("gate=1;fail={};text={}", code, texts.back()), static_cast<uint32_t>(r));
  }
  EXPECT_EQ(fx.ep_->held_runs(), m);
  EXPECT_EQ(odd_entries(fx.view()), m);
  fx.open_gate(1);
  for (uint64_t r = 0; r < m; ++r) {
    ASSERT_TRUE(fx.wait_terminal(r));
    EXPECT_EQ(fx.terminal(r)->status.message(), texts[r]) << r;
    EXPECT_EQ(static_cast<int>(fx.terminal(r)->status.code()), 1 + static_cast<int>(r % 8));
    EXPECT_EQ(fx.terminal(r)->task_slot, r);
  }
  // Second wave: shorter texts and successes through the recycled entries.
  for (uint64_t r = 100; r < 100 + m; ++r) {
    fx.publish_when_free(r, r % 2 == 0 ? "gate=2;fail=6;text=short" : "gate=2", static_cast<uint32_t>(r));
  }
  fx.open_gate(2);
  for (uint64_t r = 100; r < 100 + m; ++r) {
    ASSERT_TRUE(fx.wait_terminal(r));
    EXPECT_EQ(fx.terminal(r)->status.message(), r % 2 == 0 ? "short" : "") << r;
  }
}

// R15: a text longer than an entry holds arrives cut to its
// kMailboxErrorTextSize - 1 characters and NUL-terminated; the neighbouring
// entry's own text is untouched.
TEST_P(MailboxProtocol, R15OverlongTextIsCutToTheEntry) {
  MailboxFixture fx(GetParam(), 2);
  fx.start_ready();
  const std::string overlong(kMailboxErrorTextSize + 44, 'z');
  fx.publish_when_free(1, fmt::format("gate=1;fail=6;text={}", overlong), 0);
  fx.publish_when_free(2, "gate=1;fail=6;text=neighbour", 1);
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(1));
  ASSERT_TRUE(fx.wait_terminal(2));
  EXPECT_EQ(fx.terminal(1)->status.message(), overlong.substr(0, kMailboxErrorTextSize - 1));
  EXPECT_EQ(fx.terminal(2)->status.message(), "neighbour");
}

// R14: M runs live, one fails; every other completion is SUCCESS with an
// empty message, keyed by its own task slot.
TEST_P(MailboxProtocol, R14FailuresAreIsolatedPerEntry) {
  const uint64_t grant = 6;
  MailboxFixture fx(GetParam(), grant);
  fx.start_ready();
  const uint64_t m = grant + kMailboxRequestFrames;
  for (uint64_t r = 0; r < m; ++r) {
    fx.publish_when_free(r, r == 3 ? "gate=1;fail=6;text=only me" : "gate=1", static_cast<uint32_t>(100 + r));
  }
  fx.open_gate(1);
  for (uint64_t r = 0; r < m; ++r) {
    ASSERT_TRUE(fx.wait_terminal(r));
    EXPECT_EQ(fx.terminal(r)->task_slot, 100 + r);
    if (r == 3) {
      EXPECT_EQ(fx.terminal(r)->status, Status(StatusCode::kKernelFailed, "only me"));
    } else {
      EXPECT_EQ(fx.terminal(r)->status, Status()) << r;
    }
  }
}

// R16: acceptance is reported at most once and before the terminal even when
// the child reaches the terminal between polls; a run failing before launch
// never gets the word, and its terminal still arrives.
TEST_P(MailboxProtocol, R16LaunchAcceptanceIsStickyOnTheEntry) {
  MailboxFixture fx(GetParam());
  fx.start_ready();
  const Publication a = fx.publish(1, "text=short");
  Doorbell& bell = fx.view().control().parent_bell;
  ASSERT_TRUE(spin_then_park(
      bell, [&] { return mailbox_state_is_terminal(load_acquire(fx.view().entry(a.entry).state)); }, SpinPolicy{},
      now_ns() + kTestWaitNs));
  std::vector<EndpointEvent> events;
  fx.ep_->poll(events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, EndpointEvent::Kind::kAccepted);
  EXPECT_EQ(events[1].kind, EndpointEvent::Kind::kTerminal);
  EXPECT_TRUE(events[1].accepted);

  const Publication b = fx.publish(2, "noaccept;fail=1;text=refused before launch");
  ASSERT_TRUE(fx.wait_terminal(2));
  EXPECT_EQ(count_events(fx.events_, 2, EndpointEvent::Kind::kAccepted), 0u);
  EXPECT_FALSE(fx.terminal(2)->accepted);
  EXPECT_EQ(fx.terminal(2)->status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fx.view().entry(b.entry).accepted, 0u);

  const Publication c = fx.publish(3, "gate=1");
  poll_until(
      *fx.ep_, fx.events_, [&] { return find_event(fx.events_, 3, EndpointEvent::Kind::kAccepted) != nullptr; },
      "acceptance of 3");
  for (int i = 0; i < 3; ++i) fx.ep_->poll(fx.events_);
  EXPECT_EQ(load_acquire(fx.view().entry(c.entry).accepted), 1u);
  fx.open_gate(1);
  ASSERT_TRUE(fx.wait_terminal(3));
  EXPECT_EQ(count_events(fx.events_, 3, EndpointEvent::Kind::kAccepted), 1u);
}

// R16: the free-entry stack hands back the lowest free entry, so a run
// published into an empty table always lands in entry 0 and an accept()
// hard-wired to index 0 would pass the test above. Entries 0..3 are held by
// runs parked before their launch marker; a staged run then occupies entry
// 4: its acceptance must land in entry 4 alone and be reported for it.
TEST_P(MailboxProtocol, R16AcceptanceLandsInTheEntryTheStagedRunOccupies) {
  MailboxFixture fx(GetParam(), 4);
  fx.start_ready();
  const MailboxView v = fx.view();
  constexpr uint32_t kHeld = 4;
  for (uint32_t r = 0; r < kHeld; ++r) {
    const Publication p = fx.publish_when_free(r + 1, "pre=1;text=held");
    ASSERT_EQ(p.entry, r);
  }
  const Publication staged = fx.publish_when_free(9, "text=staged", 0, true);
  ASSERT_EQ(staged.entry, kHeld) << "entries 0..3 are held";
  poll_until(
      *fx.ep_, fx.events_, [&] { return load_acquire(v.entry(staged.entry).state) == kMailboxFrameStaged; }, "staging");
  ASSERT_TRUE(fx.ep_->activate(staged, true).ok());
  ASSERT_TRUE(fx.wait_terminal(9));
  EXPECT_TRUE(fx.terminal(9)->status.ok()) << fx.terminal(9)->status.to_string();
  EXPECT_TRUE(fx.terminal(9)->accepted);
  const EndpointEvent* accepted = find_event(fx.events_, 9, EndpointEvent::Kind::kAccepted);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->entry, staged.entry);
  for (uint32_t i = 0; i < kHeld; ++i) {
    EXPECT_EQ(load_acquire(v.entry(i).accepted), 0u) << "entry " << i << " got another run's acceptance";
    EXPECT_EQ(find_event(fx.events_, i + 1, EndpointEvent::Kind::kAccepted), nullptr) << "run " << i + 1;
  }
  fx.open_gate(1);
  for (uint32_t r = 1; r <= kHeld; ++r) {
    ASSERT_TRUE(fx.wait_terminal(r));
    EXPECT_TRUE(fx.terminal(r)->accepted) << r;
    EXPECT_EQ(count_events(fx.events_, r, EndpointEvent::Kind::kAccepted), 1u) << r;
  }
}

// R19: control commands work while every entry is held and the request
// side is saturated, and after the request side is poisoned.
TEST_P(MailboxProtocol, R19ControlFrameIsIndependentOfTheGrant) {
  const uint64_t grant = 3;
  MailboxFixture fx(GetParam(), grant);
  fx.start_ready();
  for (uint64_t r = 0; r < grant + kMailboxRequestFrames; ++r) fx.publish_when_free(r, "gate=1");
  EXPECT_EQ(odd_entries(fx.view()), grant + kMailboxRequestFrames);
  const uint64_t deadline = now_ns() + kTestWaitNs;
  auto addr = fx.ep_->control_malloc(100000, deadline);
  ASSERT_TRUE(addr.ok()) << addr.status().to_string();
  std::vector<uint8_t> in(100000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(fx.ep_->control_copy_to(*addr, 0, in, deadline).ok());
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE(fx.ep_->control_copy_from(*addr, 0, out, deadline).ok());
  EXPECT_EQ(in, out);
  EXPECT_EQ(fx.ep_->control_free(*addr + 1, deadline).code(), StatusCode::kNotFound);
  fx.ep_->poison(Status(StatusCode::kAborted, "request side gone"));
  EXPECT_TRUE(fx.ep_->control_free(*addr, deadline).ok());
  fx.open_gate(1);
}

INSTANTIATE_TEST_SUITE_P(RealAndMock, MailboxProtocol, ::testing::Values(ChildKind::kRealLoop, ChildKind::kMock),
                         [](const auto& info) { return info.param == ChildKind::kRealLoop ? "RealLoop" : "Mock"; });

// ---------------------------------------------------------------------------
// Store order over the real child loop (R5, R6).

// R5: the ACK is the last store of each frame hand-off; the parent
// republishes the instant it sees it, 10,000 times, and every task is served
// exactly once.
TEST(MailboxStoreOrder, R5AckIsTheLastStoreToAFrame) {
  RecordingStores rec;
  MailboxFixture fx(ChildKind::kRealLoop, 2, &rec);
  fx.start_ready();
  const int kRuns = 10000;
  std::map<uint64_t, Publication> pubs;
  int published = 0;
  size_t terminals = 0;
  std::vector<EndpointEvent> events;
  const uint64_t deadline = now_ns() + kTestWaitNs * 4;
  while (terminals < static_cast<size_t>(kRuns)) {
    while (published < kRuns && fx.ep_->available_request_transport() > 0 &&
           fx.ep_->held_runs() < fx.view().entry_count()) {
      pubs[published] = fx.publish(published, "");
      ++published;
    }
    fx.ep_->poll(events);
    for (const auto& e : events) terminals += e.kind == EndpointEvent::Kind::kTerminal;
    for (const auto& e : events) {
      if (e.kind == EndpointEvent::Kind::kTerminal) {
        EXPECT_TRUE(e.status.ok());
      }
    }
    events.clear();
    ASSERT_LT(now_ns(), deadline) << "stalled at " << terminals;
    fx.ep_->wait(deadline);
  }
  EXPECT_EQ(handler_calls(fx), static_cast<uint32_t>(kRuns)) << "every task served exactly once";
  fx.stop();
  // Per frame: the child's stores to it, plus the ACKs of its publications,
  // must alternate IDLE, ACK and end on an ACK.
  std::map<uint64_t, size_t> frame_of_pub;
  for (const auto& [run, p] : pubs) frame_of_pub[p.publication] = p.frame;
  const auto log = rec.snapshot();
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    std::vector<char> seq;
    for (const auto& s : log) {
      const int r = region_of(fx.view(), s.addr);
      if (r == static_cast<int>(f)) seq.push_back('I');
      const bool ack = r >= kEntryBase &&
                       s.addr - reinterpret_cast<uintptr_t>(&fx.view().entry(r - kEntryBase)) == kEntryOffConsumedAck;
      if (ack && frame_of_pub.count(s.value) && frame_of_pub[s.value] == f) seq.push_back('A');
    }
    ASSERT_FALSE(seq.empty());
    for (size_t k = 0; k < seq.size(); ++k)
      ASSERT_EQ(seq[k], k % 2 == 0 ? 'I' : 'A') << "frame " << f << " store " << k;
    EXPECT_EQ(seq.back(), 'A');
  }
}

// R6: the terminal is the last store to each entry; the parent canary-fills
// an entry the instant it sees the terminal, and the canary survives until
// the entry is reoccupied.
TEST(MailboxStoreOrder, R6TerminalIsTheLastStoreToAnEntry) {
  RecordingStores rec;
  MailboxFixture fx(ChildKind::kRealLoop, 2, &rec);
  fx.start_ready();
  const int kRuns = 2000;
  int published = 0;
  size_t terminals = 0;
  std::set<uint32_t> canaried;
  std::vector<EndpointEvent> events;
  const uint64_t deadline = now_ns() + kTestWaitNs * 2;
  auto canary_intact = [&](uint32_t i) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&fx.view().entry(i)) + 8;
    for (size_t k = 0; k < kMailboxEntryStride - 8; ++k) {
      if (p[k] != 0xa5) return false;
    }
    return true;
  };
  while (terminals < static_cast<size_t>(kRuns)) {
    while (published < kRuns && fx.ep_->available_request_transport() > 0 && fx.ep_->held_runs() < 4) {
      for (uint32_t i : canaried) ASSERT_TRUE(canary_intact(i)) << "entry " << i << " written after its terminal";
      canaried.clear();
      fx.publish(published, published % 3 == 0 ? "fail=6;text=odd one" : "");
      ++published;
    }
    fx.ep_->poll(events);
    for (const auto& e : events) {
      if (e.kind != EndpointEvent::Kind::kTerminal) continue;
      ++terminals;
      std::memset(reinterpret_cast<uint8_t*>(&fx.view().entry(e.entry)) + 8, 0xa5, kMailboxEntryStride - 8);
      canaried.insert(e.entry);
    }
    events.clear();
    ASSERT_LT(now_ns(), deadline) << "stalled at " << terminals;
    fx.ep_->wait(deadline);
  }
  fx.stop();
  // Per entry: after a terminal store, the next store to that entry opens a
  // new occupant (its run_epoch at staging), never a late rc/text/ACK.
  EXPECT_EQ(expect_terminal_last_per_entry(rec.snapshot(), fx.view()), static_cast<size_t>(kRuns));
}

// The control frame holds one command. A copy_from times out while the
// child is still inside it; the next command must not be written over it
// (its input would meet that one's reply bytes): within a short deadline it
// is refused with nothing sent, and once the first is answered it goes out
// and arrives with its own bytes.
TEST(MailboxControl, ACommandAfterOneThatTimedOutWaitsForItsReplyOrSendsNothing) {
  Watchdog dog;
  struct HeldCopyFrom final : RunHandler {
    std::atomic<bool> entered{false};
    std::atomic<bool> release{false};
    std::vector<uint8_t> written;
    void start(RunRequest, RunTicket t) override { t.complete(Status()); }
    Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t) override {
      ControlReply r;
      if (cmd.op == kCtrlCopyFrom) {
        entered = true;
        if (!eventually([&] { return release.load(); })) return internal_error("never released");
        std::memset(data, 'A', cmd.args[2]);
        r.data_bytes = static_cast<uint32_t>(cmd.args[2]);
      } else if (cmd.op == kCtrlCopyTo) {
        written.assign(data, data + in_bytes);
      }
      return r;
    }
  } h;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto ep = MailboxEndpoint::create(m->data(), m->size(), 2);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  MailboxChild child((*ep)->view(), h);
  std::thread loop([&] { (void)child.serve(); });
  ASSERT_TRUE((*ep)->wait_ready(now_ns() + kTestWaitNs).ok());
  std::vector<uint8_t> out(4);
  Status st = (*ep)->control_copy_from(1, 0, out, now_ns() + 50'000'000ull);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  ASSERT_TRUE(eventually([&] { return h.entered.load(); }));
  const std::vector<uint8_t> in = {'B', 'B', 'B', 'B'};
  st = (*ep)->control_copy_to(1, 0, in, now_ns() + 50'000'000ull);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "was not sent")) << st.to_string();
  EXPECT_EQ(load_acquire((*ep)->view().control().cmd_seq), 1u) << "a command was written over one still served";
  h.release = true;
  st = (*ep)->control_copy_to(1, 0, in, now_ns() + kTestWaitNs);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(h.written, in) << "copy_to carried the timed-out copy_from's reply bytes";
  (*ep)->request_shutdown();
  loop.join();
}

// A handler with work of its own is polled by the serve loop while it spins
// (a node child's Scheduler, which then parks instead of spinning beside it),
// is told before the loop parks, and is not polled while it is parked; a
// request wakes the loop, which polls again.
TEST(MailboxChildPolling, TheLoopPollsWhileItSpinsAndHandsBackBeforeItParks) {
  struct PollingHandler final : RunHandler {
    void start(RunRequest request, RunTicket ticket) override {
      stopped.store(false);
      ticket.accepted();
      ticket.complete(Status());
    }
    bool poll() override {
      if (stopped.load()) polled_while_stopped.fetch_add(1);
      polls.fetch_add(1);
      return false;
    }
    void stop_polling() override {
      stops.fetch_add(1);
      stopped.store(true);
    }
    std::atomic<uint64_t> polls{0};
    std::atomic<uint64_t> stops{0};
    std::atomic<uint64_t> polled_while_stopped{0};
    std::atomic<bool> stopped{false};
  } h;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto ep = MailboxEndpoint::create(m->data(), m->size(), 2);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  ChildOptions options;
  options.spin = SpinPolicy{1, 200'000};
  MailboxChild child((*ep)->view(), h, options);
  std::thread loop([&] { (void)child.serve(); });
  ASSERT_TRUE((*ep)->wait_ready(now_ns() + kTestWaitNs).ok());
  Doorbell& bell = (*ep)->view().control().child_bell;
  ASSERT_TRUE(eventually([&] { return bell.parked() == 1; })) << "the idle loop never parked";
  EXPECT_GT(h.polls.load(), 0u) << "the loop spun without polling its handler";
  EXPECT_EQ(h.stops.load(), 1u) << "the loop parked without handing the handler's work back";
  EXPECT_EQ(h.polled_while_stopped.load(), 0u) << "the loop polled after it handed the work back";

  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(TaskArgs{}, blob).ok());
  PublishSpec s;
  s.run_id = 1;
  s.dispatch_id = 1;
  s.args_blob = blob;
  // Read while the loop is parked: after the run it polls again at once,
  // and may have parked again (a loaded machine spins briefly) before this
  // thread looks.
  const uint64_t polls = h.polls.load();
  ASSERT_TRUE((*ep)->publish(s).ok());
  std::vector<EndpointEvent> events;
  ASSERT_TRUE(poll_until(
      **ep, events, [&] { return find_event(events, 1, EndpointEvent::Kind::kTerminal) != nullptr; },
      "terminal of run 1"));
  ASSERT_TRUE(eventually([&] { return h.polls.load() > polls; })) << "the woken loop did not poll again";
  EXPECT_EQ(h.polled_while_stopped.load(), 0u);
  (*ep)->request_shutdown();
  loop.join();
  EXPECT_EQ(h.stops.load(), 2u) << "the loop ended without handing the work back";
}

// A sub worker runs a function already seen to be short on the serve-loop
// thread, and any other on its own thread, beside which the loop keeps
// handing frames back (R4); a run queued behind it is never taken inline
// ahead of it; the terminal stays the last store to each entry either way (R6).
TEST(MailboxStoreOrder, SubWorkerRunsShortFunctionsOnTheLoop) {
  RecordingStores rec;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto ep = MailboxEndpoint::create(m->data(), m->size(), 2);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::mutex mu;
  std::vector<std::thread::id> short_on, long_on;
  std::atomic<bool> release{false};
  Doorbell release_bell;
  SubWorkerHandler handler(
      {[&](const TaskArgsView&) {
         std::lock_guard<std::mutex> lock(mu);
         short_on.push_back(std::this_thread::get_id());
         return Status();
       },
       [&](const TaskArgsView&) {
         // Longer than the inline budget on any machine: the duration is what is under test.
         std::this_thread::sleep_for(std::chrono::milliseconds(1));
         if (!spin_then_park(
                 release_bell, [&] { return release.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs)) {
           return Status(StatusCode::kDeadlineExceeded, "the long function was never released");
         }
         std::lock_guard<std::mutex> lock(mu);
         long_on.push_back(std::this_thread::get_id());
         return Status();
       }},
      HostRanges{});
  ChildOptions options;
  options.stores = &rec;
  MailboxChild child((*ep)->view(), handler, options);
  std::thread loop([&] { (void)child.serve(); });
  ASSERT_TRUE((*ep)->wait_ready(now_ns() + kTestWaitNs).ok());
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(TaskArgs{}, blob).ok());
  std::vector<EndpointEvent> events;
  auto publish = [&](uint64_t run, uint32_t fn) {
    PublishSpec s;
    s.run_id = run;
    s.dispatch_id = run;
    s.callable = sub_function_digest(fn);
    s.args_blob = blob;
    ASSERT_TRUE((*ep)->publish(s).ok());
  };
  auto terminal = [&](uint64_t run) {
    return poll_until(
        **ep, events, [&] { return find_event(events, run, EndpointEvent::Kind::kTerminal) != nullptr; },
        "terminal of run " + std::to_string(run));
  };

  const uint64_t kShortRuns = 200;
  for (uint64_t run = 1; run <= kShortRuns; ++run) {
    publish(run, 0);
    ASSERT_TRUE(terminal(run));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(short_on.size(), kShortRuns);
    EXPECT_NE(short_on.front(), loop.get_id()) << "a function not yet seen to be short runs on the handler's thread";
    EXPECT_NE(std::count(short_on.begin(), short_on.end(), loop.get_id()), 0) << "no short run was taken inline";
  }

  // The long run holds the handler's thread; the short one published behind
  // it is handed back at once and queued, not run inline ahead of it.
  publish(kShortRuns + 1, 1);
  publish(kShortRuns + 2, 0);
  ASSERT_TRUE(poll_until(
      **ep, events, [&] { return (*ep)->available_request_transport() == kMailboxRequestFrames; },
      "both frames handed back while the long run executes"));
  EXPECT_EQ(find_event(events, kShortRuns + 1, EndpointEvent::Kind::kTerminal), nullptr);
  EXPECT_EQ(find_event(events, kShortRuns + 2, EndpointEvent::Kind::kTerminal), nullptr);
  release.store(true);
  release_bell.ring();
  ASSERT_TRUE(terminal(kShortRuns + 1));
  ASSERT_TRUE(terminal(kShortRuns + 2));
  publish(kShortRuns + 3, 1);  // seen to be long: on the handler's thread again
  ASSERT_TRUE(terminal(kShortRuns + 3));
  for (const EndpointEvent& e : events) {
    if (e.kind == EndpointEvent::Kind::kTerminal) {
      EXPECT_TRUE(e.status.ok()) << e.status.to_string();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(short_on.back(), loop.get_id()) << "the run queued behind the long one ran inline";
    ASSERT_EQ(long_on.size(), 2u);
    for (const std::thread::id& id : long_on) EXPECT_NE(id, loop.get_id());
  }
  (*ep)->request_shutdown();
  loop.join();
  EXPECT_EQ(expect_terminal_last_per_entry(rec.snapshot(), (*ep)->view()), kShortRuns + 3);
}

// ---------------------------------------------------------------------------
// SerialRunQueue: the run queue of the sub worker, node and chip handlers,
// driven from the test thread (standing in for the serve loop) with real
// tickets, so whatever the queue does with a ticket reaches the endpoint.

using QueueJob = std::pair<RunRequest, RunTicket>;

// A RunHandler that runs nothing: it hands each request and ticket to the test.
class TicketHarvester final : public RunHandler {
 public:
  void start(RunRequest request, RunTicket ticket) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.emplace_back(std::move(request), ticket);
    }
    if (hold_.exchange(false)) {
      // The serve loop stays inside this take until the test lets it go.
      EXPECT_TRUE(spin_then_park(
          gate_, [&] { return opened_.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs))
          << "the held start was never let go";
    }
  }
  // The next start() keeps the serve loop until let_go().
  void hold_next() { hold_.store(true); }
  void let_go() {
    opened_.store(true);
    gate_.ring();
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.size();
  }
  std::vector<QueueJob> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(jobs_);
  }

 private:
  std::mutex mu_;
  std::vector<QueueJob> jobs_;
  std::atomic<bool> hold_{false}, opened_{false};
  Doorbell gate_;
};

class HarvestFixture {
 public:
  HarvestFixture() {
    auto m = SharedMapping::create_anonymous(*mailbox_size(kGrant));
    EXPECT_TRUE(m.ok());
    map_ = std::move(m).value();
    auto ep = MailboxEndpoint::create(map_.data(), map_.size(), kGrant);
    EXPECT_TRUE(ep.ok()) << ep.status().to_string();
    ep_ = std::move(ep).value();
    child_ = std::make_unique<MailboxChild>(ep_->view(), harvester_);
    loop_ = std::thread([this] { (void)child_->serve(); });
    EXPECT_TRUE(ep_->wait_ready(now_ns() + kTestWaitNs).ok());
  }
  ~HarvestFixture() {
    ep_->request_shutdown();
    loop_.join();
  }
  // Publishes runs 1..n and returns their requests and tickets in that order.
  std::vector<QueueJob> harvest(uint64_t n) {
    for (uint64_t run = 1; run <= n; ++run) (void)publish(run);
    return take(n);
  }
  // The request frame run `run` went into.
  uint32_t publish(uint64_t run) {
    poll_until(
        *ep_, events_, [&] { return ep_->available_request_transport() > 0; }, "a free request frame");
    PublishSpec s;
    s.run_id = run;
    s.dispatch_id = run;
    auto p = ep_->publish(s);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return p.ok() ? p->frame : kMailboxRequestFrames;
  }
  std::vector<QueueJob> take(uint64_t n) {
    EXPECT_TRUE(eventually([&] { return harvester_.size() == n; })) << "the serve loop did not start every run";
    return harvester_.take();
  }
  TicketHarvester& harvester() { return harvester_; }
  const EndpointEvent* wait_event(uint64_t run, EndpointEvent::Kind kind) {
    poll_until(
        *ep_, events_, [&] { return find_event(events_, run, kind) != nullptr; },
        "an event of run " + std::to_string(run));
    return find_event(events_, run, kind);
  }
  bool has_terminal(uint64_t run) {
    ep_->poll(events_);
    return find_event(events_, run, EndpointEvent::Kind::kTerminal) != nullptr;
  }

 private:
  static constexpr uint64_t kGrant = 8;  // 10 entries: every run of a test is held at once
  SharedMapping map_;
  std::unique_ptr<MailboxEndpoint> ep_;
  TicketHarvester harvester_;
  std::unique_ptr<MailboxChild> child_;
  std::thread loop_;
  std::vector<EndpointEvent> events_;
};

// The parent fills whichever request frame is free, so a later run can sit
// in a lower frame than an earlier one; the child still hands runs to its
// handler in publication order (a serial handler runs them in that order).
// Run 1 is held inside the handler, so runs 2 (frame 0, freed by run 1's ACK)
// and 3 (frame 1) are both ready when the serve loop goes on.
TEST(MailboxChildOrder, RunsReachTheHandlerInPublicationOrderWhicheverFrameTheyFill) {
  Watchdog dog;
  HarvestFixture fx;
  fx.harvester().hold_next();
  ASSERT_EQ(fx.publish(1), 0u);
  ASSERT_TRUE(eventually([&] { return fx.harvester().size() == 1; })) << "run 1 never reached the handler";
  ASSERT_EQ(fx.publish(2), 0u) << "run 1's ACK frees frame 0 before the handler returns";
  ASSERT_EQ(fx.publish(3), 1u);
  fx.harvester().let_go();
  std::vector<QueueJob> jobs = fx.take(3);
  std::vector<uint64_t> order;
  for (const QueueJob& job : jobs) order.push_back(job.first.run_id);
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));
  for (QueueJob& job : jobs) job.second.complete(Status());
}

// Runs go in arrival order on the queue's thread; the caller may run one
// itself only while no run is queued or inside its call; a run still
// awaiting its terminal (a node run in flight) does not stop it.
TEST(SerialRunQueue, RunsInArrivalOrderAndInlineOnlyWhenNothingIsQueuedOrRunning) {
  Watchdog dog;
  HarvestFixture fx;
  std::vector<QueueJob> jobs = fx.harvest(5);
  std::mutex mu;
  std::vector<uint64_t> order;
  std::atomic<bool> first_entered{false}, release{false};
  Doorbell release_bell;
  SerialRunQueue q("test queue", SpinPolicy{}, [&](RunRequest& request, const RunTicket& ticket) {
    if (request.run_id == 1) {
      first_entered.store(true);
      (void)spin_then_park(
          release_bell, [&] { return release.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(request.run_id);
    }
    ticket.complete(Status());
    q.finished();
  });
  bool called = false;
  auto inline_call = [&] {
    called = true;
    return true;
  };

  // Before init nothing takes a run off the queue: queued, none in a call.
  ASSERT_TRUE(q.start(std::move(jobs[0].first), jobs[0].second));
  EXPECT_FALSE(q.try_run_inline(inline_call)) << "run 1 is queued";
  q.init();
  ASSERT_TRUE(eventually([&] { return first_entered.load(); }));
  EXPECT_FALSE(q.try_run_inline(inline_call)) << "run 1 is inside its call";
  EXPECT_FALSE(called);
  for (size_t k = 1; k < jobs.size(); ++k) ASSERT_TRUE(q.start(std::move(jobs[k].first), jobs[k].second));
  release.store(true);
  release_bell.ring();
  for (uint64_t run = 1; run <= jobs.size(); ++run) {
    const EndpointEvent* t = fx.wait_event(run, EndpointEvent::Kind::kTerminal);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  }
  ASSERT_TRUE(eventually([&] { return q.idle(); }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  }

  // Taken inline, its terminal left for later, as a node run's is.
  EXPECT_TRUE(q.try_run_inline(inline_call));
  EXPECT_TRUE(called);
  EXPECT_FALSE(q.idle()) << "the inline run has not reported its terminal";
  called = false;
  EXPECT_TRUE(q.try_run_inline(inline_call)) << "a run awaiting its terminal is neither queued nor running";
  EXPECT_TRUE(called);
  q.finished();
  // A call that leaves its request untouched is not counted as started.
  EXPECT_FALSE(q.try_run_inline([] { return false; }));
  EXPECT_FALSE(q.idle()) << "the second inline run has not reported its terminal";
  q.finished();
  EXPECT_TRUE(q.idle());
  EXPECT_TRUE(q.drain(now_ns() + kTestWaitNs));
}

// A run whose terminal never comes: drain returns not-idle at its deadline
// instead of waiting for it, and from then on every start() ends its ticket
// with an error at once.
TEST(SerialRunQueue, DrainPastItsDeadlineIsNotIdleAndLaterStartsFail) {
  Watchdog dog;
  HarvestFixture fx;
  std::vector<QueueJob> jobs = fx.harvest(2);
  SerialRunQueue q("test queue", SpinPolicy{}, [](RunRequest&, const RunTicket& ticket) {
    ticket.accepted();  // and never a terminal, nor finished()
  });
  q.init();
  ASSERT_TRUE(q.start(std::move(jobs[0].first), jobs[0].second));
  ASSERT_NE(fx.wait_event(1, EndpointEvent::Kind::kAccepted), nullptr);
  EXPECT_FALSE(q.drain(now_ns() + 20'000'000)) << "run 1 never reported its terminal";
  EXPECT_FALSE(q.drain(now_ns() + kTestWaitNs)) << "a second drain answers at once, and the same";
  EXPECT_FALSE(q.try_run_inline([] { return true; })) << "nothing runs inline once draining";

  EXPECT_FALSE(q.start(std::move(jobs[1].first), jobs[1].second));
  const EndpointEvent* t = fx.wait_event(2, EndpointEvent::Kind::kTerminal);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->status.code(), StatusCode::kFailedPrecondition) << t->status.to_string();
  EXPECT_TRUE(contains(t->status.message(), "test queue is draining")) << t->status.to_string();
  EXPECT_FALSE(fx.has_terminal(1));
}

// A run stuck inside its call at the deadline: drain returns not-idle, ends
// the run queued behind it with an error, and leaves the thread behind.
TEST(SerialRunQueue, DrainLeavesARunStuckInItsCallBehind) {
  Watchdog dog;
  HarvestFixture fx;
  std::vector<QueueJob> jobs = fx.harvest(2);
  // The left-behind thread returns into the queue after this test: both are
  // abandoned, never freed under it.
  struct Stuck {
    std::atomic<bool> entered{false}, release{false}, left{false};
    Doorbell bell;
    std::unique_ptr<SerialRunQueue> queue;
  };
  Stuck* s = abandon(new Stuck());
  s->queue = std::make_unique<SerialRunQueue>("test queue", SpinPolicy{}, [s](RunRequest&, const RunTicket&) {
    s->entered.store(true);
    (void)spin_then_park(
        s->bell, [s] { return s->release.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs);
    s->left.store(true);  // the ticket is left alone: its mailbox may be gone by now
  });
  s->queue->init();
  ASSERT_TRUE(s->queue->start(std::move(jobs[0].first), jobs[0].second));
  ASSERT_TRUE(s->queue->start(std::move(jobs[1].first), jobs[1].second));
  ASSERT_TRUE(eventually([&] { return s->entered.load(); }));
  EXPECT_FALSE(s->queue->drain(now_ns() + 20'000'000));
  const EndpointEvent* t = fx.wait_event(2, EndpointEvent::Kind::kTerminal);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->status.code(), StatusCode::kAborted) << t->status.to_string();
  EXPECT_TRUE(contains(t->status.message(), "drained before this run started")) << t->status.to_string();
  EXPECT_FALSE(fx.has_terminal(1));
  EXPECT_FALSE(s->left.load()) << "drain returned while run 1 was still inside its call";
  s->release.store(true);
  s->bell.ring();
  EXPECT_TRUE(eventually([&] { return s->left.load(); }));
}

// ---------------------------------------------------------------------------
// Wire constants (R18).

// R18: a child with a perturbed constant fails init with every disagreement
// named; a parent-side perturbation is caught by the child.
TEST(MailboxWire, R18WireLayoutIsCheckedOnBothSides) {
  {
    ChildOptions o;
    o.perturb_wire = [](std::vector<WireConstant>& w) {
      for (auto& c : w) {
        if (std::string(c.name) == "ENTRY_OFF_RC" || std::string(c.name) == "STATE_TASK_DONE") c.value += 1;
      }
    };
    MailboxFixture fx(ChildKind::kRealLoop, 2, nullptr, o);
    fx.start();
    Status st = fx.ep_->wait_ready(now_ns() + kTestWaitNs);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("ENTRY_OFF_RC"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("STATE_TASK_DONE"), std::string::npos) << st.message();
  }
  {
    MailboxFixture fx(ChildKind::kRealLoop);
    WireConstant& c = fx.view().control().parent_wire[3];
    const std::string name = c.name;
    c.value += 7;
    fx.start();
    Status st = fx.ep_->wait_ready(now_ns() + kTestWaitNs);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
    fx.thread_.join();
    EXPECT_EQ(fx.exit_code_, kChildExitInitFailed);
  }
}

// A handler whose init fails with `code`, as a device that cannot be created does.
class FailingInitHandler final : public RunHandler {
 public:
  explicit FailingInitHandler(StatusCode code) : code_(code) {}
  Status init() override { return Status(code_, "device_memory_bytes = 1: too small"); }
  void start(RunRequest, RunTicket ticket) override { ticket.complete(Status()); }

 private:
  StatusCode code_;
};

// Issue 9 item 8: a refused init reaches the parent with its own code (here
// RESOURCE_EXHAUSTED), not wrapped in FAILED_PRECONDITION, and with its text.
TEST(MailboxWire, Issue9InitFailureCarriesItsCode) {
  Watchdog dog;
  auto m = SharedMapping::create_anonymous(*mailbox_size(2));
  ASSERT_TRUE(m.ok());
  auto ep = MailboxEndpoint::create(m->data(), m->size(), 2);
  ASSERT_TRUE(ep.ok());
  FailingInitHandler handler(StatusCode::kResourceExhausted);
  MailboxChild child((*ep)->view(), handler);
  int exit_code = -1;
  std::thread t([&] { exit_code = child.serve(); });
  const Status st = (*ep)->wait_ready(now_ns() + kTestWaitNs);
  t.join();
  EXPECT_EQ(exit_code, kChildExitInitFailed);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_EQ(st.message(), "child init failed: device_memory_bytes = 1: too small");
}

// Issue 9 item 8: the code word crossed the mailbox, so it is validated: a
// value that is no failure code (0, or past the last StatusCode) is reported
// as INTERNAL naming the value, with the text.
TEST(MailboxWire, Issue9InitFailureCodeIsValidated) {
  for (const uint32_t code : {0u, static_cast<uint32_t>(StatusCode::kDeviceFault) + 1, 0xffffffffu}) {
    auto m = SharedMapping::create_anonymous(*mailbox_size(2));
    ASSERT_TRUE(m.ok());
    auto ep = MailboxEndpoint::create(m->data(), m->size(), 2);
    ASSERT_TRUE(ep.ok());
    ControlFrame& c = (*ep)->view().control();
    copy_text(c.init_error, sizeof c.init_error, "forged");
    store_release(c.init_code, code);
    store_release(c.init_state, static_cast<uint32_t>(kInitFailed));
    const Status st = (*ep)->wait_ready(now_ns() + kTestWaitNs);
    EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
    EXPECT_TRUE(contains(st.message(), fmt::format("unknown code {}: forged", code))) << st.to_string();
  }
}

// ---------------------------------------------------------------------------
// Real processes (docs/design.md §6; R9 and R11 over fork).

std::unique_ptr<ForkedChild> spawn_test_child(TestGates* gates, SpawnOptions o = {}) {
  auto c = ForkedChild::spawn([gates] { return std::make_unique<TestHandler>(gates); }, o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

Publication publish_to(MailboxEndpoint& ep, uint64_t run, const std::string& script) {
  const std::vector<uint8_t> cfg = bytes_of(script);
  PublishSpec s;
  s.run_id = run;
  s.config = cfg;
  auto p = ep.publish(s);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : Publication{};
}

struct Gates {
  Gates()
      : map(std::move(SharedMapping::create_anonymous(sizeof(TestGates))).value()), g(new (map.data()) TestGates()) {}
  SharedMapping map;
  TestGates* g;
};

// One mailbox, its parent's side (written first: each child forked serves
// it, parked, instead of failing its init and exiting) and a fork server
// whose one recipe, `name`, serves it with a TestHandler.
struct OneRecipeServer {
  void start(const char* name, TestGates* g) {
    Result<std::shared_ptr<SharedMapping>> m = ForkedChild::map_mailbox(1);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    mailbox = *m;
    auto view = MailboxView::attach(mailbox->data(), mailbox->size(), 1);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    auto e = MailboxEndpoint::create(mailbox->data(), mailbox->size(), 1);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    endpoint = std::move(*e);
    std::vector<ChildRecipe> recipes;
    recipes.push_back(ChildRecipe{name, [g] { return std::make_unique<TestHandler>(g); }, *view, {}});
    auto s = ForkServer::start(std::move(recipes));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server = std::move(*s);
  }
  std::shared_ptr<SharedMapping> mailbox;
  std::unique_ptr<MailboxEndpoint> endpoint;
  std::unique_ptr<ForkServer> server;
};

// A spawn that timed out still forks its child, later. No one claimed that
// child, and it would serve its recipe's mailbox beside the child spawned in
// its place: the server's next answer has it killed, so only the claimed
// child lives (before: both served).
TEST(MailboxProcess, AChildForkedForASpawnThatTimedOutIsKilled) {
  Watchdog dog;
  Gates gates;
  OneRecipeServer one;
  ASSERT_NO_FATAL_FAILURE(one.start("simpler-late", gates.g));
  // A deadline already past: the request is sent, its answer not awaited.
  const Result<pid_t> late = one.server->spawn(0, now_ns());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().to_string();
  const Result<pid_t> claimed = one.server->spawn(0, now_ns() + kTestWaitNs);
  ASSERT_TRUE(claimed.ok()) << claimed.status().to_string();
  ASSERT_TRUE(one.endpoint->wait_ready(now_ns() + kTestWaitNs).ok());
  const pid_t server_pid = one.server->pid();
  auto live_children = [server_pid] {
    std::set<pid_t> live;
    for (const ProcInfo& p : list_processes()) {
      if (p.ppid == server_pid && p.state != 'Z') live.insert(p.pid);
    }
    return live;
  };
  EXPECT_TRUE(eventually([&] { return live_children() == std::set<pid_t>{*claimed}; }))
      << "the server's live children are not just the claimed one: " << live_children().size() << " live";
}

// Issue 16: the fork server and the children it forks are this job's own
// processes (LoadSense): a slice this process loses to them is not load. A
// server reaped is forgotten.
TEST(MailboxProcess, AForkServerAndItsChildrenAreTheJobsOwnProcesses) {
  Watchdog dog;
  Gates gates;
  const uint32_t noted_before = load_sense().fork_servers_noted();
  OneRecipeServer one;
  ASSERT_NO_FATAL_FAILURE(one.start("simpler-job", gates.g));
  const Result<pid_t> child = one.server->spawn(0, now_ns() + kTestWaitNs);
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  ASSERT_TRUE(one.endpoint->wait_ready(now_ns() + kTestWaitNs).ok());
  const long server_pid = one.server->pid();
  const auto in_job = [](long pid) {
    const std::vector<long> job = load_sense().job_processes();
    return std::find(job.begin(), job.end(), pid) != job.end();
  };
  EXPECT_TRUE(in_job(server_pid));
  EXPECT_TRUE(in_job(*child));
  EXPECT_FALSE(in_job(static_cast<long>(getpid()))) << "this process is counted apart";
  EXPECT_EQ(load_sense().fork_servers_noted(), noted_before + 1);
  one.server.reset();  // ends and reaps the server, which ends its child
  EXPECT_EQ(load_sense().fork_servers_noted(), noted_before) << "a reaped server's pid may be reused";
}

// A child killed with SIGKILL: every run it held gets a terminal error while
// another child keeps serving.
TEST(MailboxProcess, ChildDeathGivesEveryHeldRunATerminal) {
  Gates gates;  // created before fork, shared with both children
  auto a = spawn_test_child(gates.g);
  auto b = spawn_test_child(gates.g);
  ASSERT_TRUE(a && b);
  std::vector<EndpointEvent> ea, eb;
  publish_to(a->endpoint(), 1, "gate=1");
  publish_to(a->endpoint(), 2, "gate=1");
  poll_until(
      a->endpoint(), ea, [&] { return a->endpoint().available_request_transport() == 2; }, "hand-backs");
  ASSERT_EQ(::kill(a->pid(), SIGKILL), 0);
  poll_until(
      a->endpoint(), ea,
      [&] {
        return find_event(ea, 1, EndpointEvent::Kind::kTerminal) && find_event(ea, 2, EndpointEvent::Kind::kTerminal);
      },
      "terminals of the dead child's runs");
  const EndpointEvent* t1 = find_event(ea, 1, EndpointEvent::Kind::kTerminal);
  ASSERT_NE(t1, nullptr);
  EXPECT_TRUE(t1->endpoint_failure);
  EXPECT_NE(t1->status.message().find("signal 9"), std::string::npos) << t1->status.to_string();
  EXPECT_EQ(t1->status, find_event(ea, 2, EndpointEvent::Kind::kTerminal)->status);
  publish_to(b->endpoint(), 3, "fail=6;text=still serving");
  poll_until(
      b->endpoint(), eb, [&] { return find_event(eb, 3, EndpointEvent::Kind::kTerminal) != nullptr; }, "B's run");
  EXPECT_EQ(find_event(eb, 3, EndpointEvent::Kind::kTerminal)->status.message(), "still serving");
  gates.g->open_gate(1);
  std::vector<EndpointEvent> rest;
  EXPECT_FALSE(a->close(now_ns() + kTestWaitNs, rest).ok());
  EXPECT_TRUE(b->close(now_ns() + kTestWaitNs, rest).ok());
}

// A child that hangs past the run deadline is killed; its run ends with
// DEADLINE_EXCEEDED while another child keeps serving.
TEST(MailboxProcess, HungChildIsKilledPastItsDeadline) {
  Gates gates;
  SpawnOptions o;
  o.endpoint.run_deadline_ns = 300'000'000;
  auto a = spawn_test_child(gates.g, o);
  auto b = spawn_test_child(gates.g);
  ASSERT_TRUE(a && b);
  std::vector<EndpointEvent> ea, eb;
  publish_to(a->endpoint(), 1, "gate=9");  // never opened
  poll_until(
      a->endpoint(), ea, [&] { return find_event(ea, 1, EndpointEvent::Kind::kTerminal) != nullptr; },
      "the hung run's terminal");
  EXPECT_EQ(find_event(ea, 1, EndpointEvent::Kind::kTerminal)->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(a->check().ok()) << "killed and reaped";
  publish_to(b->endpoint(), 2, "text=fine");
  poll_until(
      b->endpoint(), eb, [&] { return find_event(eb, 2, EndpointEvent::Kind::kTerminal) != nullptr; }, "B's run");
  std::vector<EndpointEvent> rest;
  (void)a->close(now_ns() + kTestWaitNs, rest);
  EXPECT_TRUE(b->close(now_ns() + kTestWaitNs, rest).ok());
}

// Polls `c`'s endpoint and lets it maintain itself (replace a dead child)
// until done() holds; fails the test at the deadline.
bool maintain_until(ForkedChild& c, std::vector<EndpointEvent>& events, const std::function<bool()>& done,
                    const std::string& what) {
  const uint64_t deadline = now_ns() + kTestWaitNs;
  for (;;) {
    c.endpoint().poll(events);
    (void)c.maintain();
    if (done()) return true;
    if (now_ns() >= deadline) {
      ADD_FAILURE() << "timed out waiting for " << what;
      return false;
    }
    c.endpoint().wait(deadline);
  }
}

// Issue 9 item 5 at the mailbox level: maintain() replaces a child that died
// (the run it held ends with the death; a new process serves the freshly
// registered mailbox, refusing commands meant for the dead child), and
// SpawnOptions::max_replacements bounds the
// replacements over the child's life: the next death fails it for good.
TEST(MailboxProcess, Issue9ADeadChildIsReplacedWithinItsBudget) {
  Watchdog dog;
  Gates gates;
  SpawnOptions o;
  o.max_replacements = 1;
  auto a = spawn_test_child(gates.g, o);
  ASSERT_TRUE(a);
  std::vector<EndpointEvent> events;
  publish_to(a->endpoint(), 1, "gate=1");
  poll_until(
      a->endpoint(), events, [&] { return a->endpoint().available_request_transport() == 2; }, "hand-back");
  const pid_t first = a->pid();
  EXPECT_EQ(a->incarnation(), 1u);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  maintain_until(
      *a, events, [&] { return a->serving() && a->incarnation() == 2; }, "the replacement's INIT_READY");
  const EndpointEvent* t1 = find_event(events, 1, EndpointEvent::Kind::kTerminal);
  ASSERT_NE(t1, nullptr);
  EXPECT_TRUE(contains(t1->status.message(), "signal 9")) << t1->status.to_string();
  EXPECT_NE(a->pid(), first);
  EXPECT_FALSE(a->failure().has_value());
  publish_to(a->endpoint(), 2, "fail=6;text=the replacement serves");
  maintain_until(
      *a, events, [&] { return find_event(events, 2, EndpointEvent::Kind::kTerminal) != nullptr; }, "run 2");
  EXPECT_EQ(find_event(events, 2, EndpointEvent::Kind::kTerminal)->status.message(), "the replacement serves");
  // A control command names the registration its address belongs to: one
  // for the dead child's is refused unsent; the replacement's is served.
  uint64_t served = 0;
  auto addr = a->endpoint().control_malloc(64, now_ns() + kTestWaitNs, &served);
  ASSERT_TRUE(addr.ok()) << addr.status().to_string();
  EXPECT_EQ(served, 2u);
  const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_REFUSED(a->endpoint().control_copy_to(*addr, 0, bytes, now_ns() + kTestWaitNs, 1), StatusCode::kAborted,
                 "the child this address belongs to is gone");
  EXPECT_TRUE(a->endpoint().control_copy_to(*addr, 0, bytes, now_ns() + kTestWaitNs, 2).ok());
  ASSERT_EQ(::kill(a->pid(), SIGKILL), 0);
  maintain_until(
      *a, events, [&] { return a->failure().has_value(); }, "the spent budget");
  const Status failed = a->failure().value_or(Status());
  EXPECT_TRUE(contains(failed.message(), "died again after 1 replacements, all it may have")) << failed.to_string();
  EXPECT_TRUE(contains(failed.message(), "signal 9")) << failed.to_string();
  EXPECT_EQ(a->incarnation(), 2u) << "no third child";
  std::vector<EndpointEvent> rest;
  EXPECT_FALSE(a->close(now_ns() + kTestWaitNs, rest).ok());
}

// R11 over fork: close with a run still held (and one published after it)
// returns within its deadline, and both runs get their terminal: the held
// one, taken by the child and waiting on a gate that never opens, an error.
TEST(MailboxProcess, R11CloseSweepsHeldRunsAndReaps) {
  Watchdog dog;
  Gates gates;
  SpawnOptions o;
  o.child.drain_timeout_ns = 200'000'000;
  auto a = spawn_test_child(gates.g, o);
  ASSERT_TRUE(a);
  std::vector<EndpointEvent> events;
  publish_to(a->endpoint(), 1, "gate=9");
  ASSERT_TRUE(eventually([&] { return load_acquire(gates.g->handler_calls) >= 1u; }))
      << "the child never took run 1, so close would sweep no held run";
  publish_to(a->endpoint(), 2, "gate=9");
  const pid_t pid = a->pid();
  EXPECT_TRUE(a->close(now_ns() + kTestWaitNs, events).ok());
  EXPECT_EQ(count_events(events, 1, EndpointEvent::Kind::kTerminal), 1u);
  EXPECT_EQ(count_events(events, 2, EndpointEvent::Kind::kTerminal), 1u);
  for (const EndpointEvent& e : events) {
    if (e.run_id == 1 && e.kind == EndpointEvent::Kind::kTerminal) {
      EXPECT_FALSE(e.status.ok()) << "the held run, whose gate never opened, ended OK";
    }
  }
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1) << "not reaped: the pid still names a process (a zombie)";
  EXPECT_EQ(errno, ESRCH);
}

// R9 over fork: an unattributable header stops the child with its exit code
// and every held run ends with the published reason.
TEST(MailboxProcess, R9UnattributableHeaderStopsAForkedChild) {
  Gates gates;
  auto a = spawn_test_child(gates.g);
  ASSERT_TRUE(a);
  std::vector<EndpointEvent> events;
  publish_to(a->endpoint(), 1, "gate=1");
  poll_until(
      a->endpoint(), events, [&] { return a->endpoint().available_request_transport() == 2; }, "hand-back");
  forge_frame(a->endpoint().view(), 0, 1u << 20, 1);
  poll_until(
      a->endpoint(), events, [&] { return find_event(events, 1, EndpointEvent::Kind::kTerminal) != nullptr; },
      "the held run's terminal");
  EXPECT_NE(find_event(events, 1, EndpointEvent::Kind::kTerminal)->status.message().find("unattributable"),
            std::string::npos);
  std::vector<EndpointEvent> rest;
  Status st = a->close(now_ns() + kTestWaitNs, rest);
  EXPECT_NE(st.message().find(std::to_string(kChildExitEndpointStopped)), std::string::npos) << st.to_string();
}

// R19 over fork plus the chip child: a forked child drives a real ChipWorker;
// control malloc/copy reach its device and a run through the mailbox adds one.
extern "C" void ipc_add_one_kernel(int64_t* args) {
  const DeviceTensor* t = tensor_arg(args, 0);
  for (int64_t i = 0; i < t->shape[0]; ++i) tensor_data<float>(t)[i] += 1.0f;
}

TEST(MailboxProcess, ChipChildRunsThroughTheMailbox) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "ipc_add_one_kernel", ipc_add_one_kernel).ok());
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{Param::inout()});
  const Digest digest = callables[0].digest();
  WorkerConfig cfg;
  cfg.pipeline_depth = 2;
  cfg.max_tasks_per_run = 16;
  cfg.device_memory_bytes = 64ull << 20;
  auto child = ForkedChild::spawn([&] { return std::make_unique<ChipChildHandler>(cfg, callables); }, SpawnOptions{});
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  MailboxEndpoint& ep = (*child)->endpoint();
  const uint64_t deadline = now_ns() + kTestWaitNs;
  auto addr = ep.control_malloc(64 * 4, deadline);
  ASSERT_TRUE(addr.ok()) << addr.status().to_string();
  std::vector<float> host(64, 1.5f);
  ASSERT_TRUE(ep.control_copy_to(*addr, 0, {reinterpret_cast<const uint8_t*>(host.data()), 256}, deadline).ok());
  TaskArgs args;
  args.add_tensor(DeviceBuffer{*addr, 256}.view({64}, DType::F32), Tag::InOut);
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(args, blob).ok());
  std::vector<EndpointEvent> events;
  for (uint64_t run = 1; run <= 3; ++run) {
    poll_until(
        ep, events, [&] { return ep.available_request_transport() > 0; }, "a free frame");
    PublishSpec s;
    s.run_id = run;
    s.callable = digest;
    s.args_blob = blob;
    ASSERT_TRUE(ep.publish(s).ok());
    poll_until(
        ep, events, [&] { return find_event(events, run, EndpointEvent::Kind::kTerminal) != nullptr; }, "chip run");
    const EndpointEvent* t = find_event(events, run, EndpointEvent::Kind::kTerminal);
    EXPECT_TRUE(t->status.ok()) << t->status.to_string();
    EXPECT_TRUE(t->accepted);
    EXPECT_EQ(t->disposition, kDispositionNativePrepared);
    ASSERT_NE(find_event(events, run, EndpointEvent::Kind::kAccepted), nullptr);
  }
  // An unknown callable fails its own run only.
  PublishSpec bad;
  bad.run_id = 9;
  bad.args_blob = blob;
  ASSERT_TRUE(ep.publish(bad).ok());
  poll_until(
      ep, events, [&] { return find_event(events, 9, EndpointEvent::Kind::kTerminal) != nullptr; }, "bad run");
  EXPECT_EQ(find_event(events, 9, EndpointEvent::Kind::kTerminal)->status.code(), StatusCode::kNotFound);
  std::vector<float> out(64);
  ASSERT_TRUE(ep.control_copy_from(*addr, 0, {reinterpret_cast<uint8_t*>(out.data()), 256}, deadline).ok());
  for (float v : out) ASSERT_EQ(v, 4.5f);
  EXPECT_TRUE(ep.control_free(*addr, deadline).ok());
  std::vector<EndpointEvent> rest;
  EXPECT_TRUE((*child)->close(now_ns() + kTestWaitNs, rest).ok());
}

// The chip child's short path. Each run's kernel records its marker (the
// run id, a scalar); the gated kernel then holds its core until the test
// opens the gate.
std::mutex chip_order_mu;
std::vector<int64_t> chip_order;
std::atomic<bool> chip_gate_reached{false};
std::atomic<bool> chip_gate_open{false};
Doorbell chip_gate_bell;

extern "C" void ipc_record_marker_kernel(int64_t* args) {
  std::lock_guard<std::mutex> lock(chip_order_mu);
  chip_order.push_back(args[0]);
}

extern "C" void ipc_gated_marker_kernel(int64_t* args) {
  ipc_record_marker_kernel(args);
  chip_gate_reached.store(true);
  (void)spin_then_park(
      chip_gate_bell, [] { return chip_gate_open.load(); }, SpinPolicy{}, now_ns() + kTestWaitNs);
}

// A kind runs inline once a run of it was short; one run over the budget (a
// run that lost its CPU for a time slice, on a loaded machine) keeps it
// short, two in a row make it long. A kind first seen long, or never seen,
// is long; a kind out of range is never short.
TEST(InlineBudget, AKindStaysShortThroughOneLongRunAndTurnsLongAfterTwoInARow) {
  constexpr uint64_t kBudget = 1'000'000'000;
  InlineBudget b(2, kBudget);
  const auto short_run = [&](size_t kind) { b.record(kind, now_ns()); };
  const auto long_run = [&](size_t kind) { b.record(kind, now_ns() - 2 * kBudget); };
  EXPECT_FALSE(b.is_short(0)) << "a kind never seen";
  short_run(0);
  EXPECT_TRUE(b.is_short(0));
  long_run(0);
  EXPECT_TRUE(b.is_short(0)) << "one run over the budget";
  long_run(0);
  EXPECT_FALSE(b.is_short(0)) << "two runs in a row over the budget";
  short_run(0);
  EXPECT_TRUE(b.is_short(0));
  long_run(1);
  EXPECT_FALSE(b.is_short(1)) << "a kind whose first run was long";
  short_run(1);
  EXPECT_TRUE(b.is_short(1));
  short_run(2);
  EXPECT_FALSE(b.is_short(2)) << "a kind out of range";
}

// A chip child served by a thread of this process over an anonymous
// mailbox: the loop's thread, the handler's counters and the parent's
// endpoint are all in reach. A callable's runs are prepared on the loop once
// one was seen, whatever a sanitizer build costs (the budget is 10 s).
struct LoopChipChild {
  LoopChipChild(const WorkerConfig& cfg, const std::vector<ChipCallable>& callables, ChildOptions options,
                HostRanges heap = {})
      : mapping(SharedMapping::create_anonymous(*mailbox_size(kEntries))),
        endpoint(MailboxEndpoint::create(mapping->data(), mapping->size(), kEntries)),
        handler(cfg, callables, std::move(heap), /*inline_budget_ns=*/10'000'000'000ull),
        child((*endpoint)->view(), handler, std::move(options)),
        loop([this] { (void)child.serve(); }) {}
  ~LoopChipChild() { shut_down(); }
  void shut_down() {
    if (!loop.joinable()) return;
    ep().request_shutdown();
    loop.join();
  }
  MailboxEndpoint& ep() { return **endpoint; }
  void publish(uint64_t run, const Digest& callable, const TaskArgs& args) {
    std::vector<uint8_t> blob;
    ASSERT_TRUE(encode_args_blob(args, blob).ok());
    PublishSpec s;
    s.run_id = run;
    s.dispatch_id = run;
    s.callable = callable;
    s.args_blob = blob;
    ASSERT_TRUE(ep().publish(s).ok());
  }
  // A run whose one argument is its id, as a scalar (a marker kernel's).
  void publish_marker(uint64_t run, const Digest& callable) {
    TaskArgs args;
    args.add_scalar(static_cast<int64_t>(run));
    publish(run, callable, args);
  }
  // The run's terminal, or null (and a failure) at the deadline.
  const EndpointEvent* terminal(uint64_t run) {
    (void)poll_until(
        ep(), events, [&] { return find_event(events, run, EndpointEvent::Kind::kTerminal) != nullptr; },
        "terminal of run " + std::to_string(run));
    return find_event(events, run, EndpointEvent::Kind::kTerminal);
  }

  static constexpr uint64_t kEntries = 3;
  Result<SharedMapping> mapping;
  Result<std::unique_ptr<MailboxEndpoint>> endpoint;
  ChipChildHandler handler;
  MailboxChild child;
  std::vector<EndpointEvent> events;
  std::thread loop;  // last: it starts serving once everything above is built
};

// A small chip for a chip child under test: `depth` runs in the pipeline.
WorkerConfig chip_child_config(uint32_t depth) {
  WorkerConfig cfg;
  cfg.pipeline_depth = depth;
  cfg.max_tasks_per_run = 16;
  cfg.device_memory_bytes = 64ull << 20;
  return cfg;
}

// Closes the chip gate for one test and opens it when the test ends:
// declared after the chip child, so a kernel still at the gate lets the
// child shut down.
struct ChipGateScope {
  ChipGateScope() {
    chip_gate_reached.store(false);
    chip_gate_open.store(false);
  }
  ~ChipGateScope() {
    chip_gate_open.store(true);
    chip_gate_bell.ring();
  }
};

// A run whose callable prepared quickly last time is prepared on the serve
// loop, and a preparer that finds the launcher idle and a launch slot free
// launches its run itself. With the device full (launch_depth 1, a gated run
// on it), runs prepared behind it wait for their turn without holding the
// loop: both frames come back and neither run is accepted early (R4); they
// launch in order once the gate opens; the terminal stays the last store to
// each entry (R6).
TEST(ChipChildInline, R4ShortRunsArePreparedOnTheLoopAndWaitTheirTurnWithoutHoldingIt) {
  Watchdog dog;
  chip_order.clear();
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "ipc_record_marker_kernel", ipc_record_marker_kernel).ok());
  ASSERT_TRUE(k.add_function(1, CoreType::AIV, "ipc_gated_marker_kernel", ipc_gated_marker_kernel).ok());
  std::mutex mu;
  std::vector<std::thread::id> prepared_on;  // where each short run's orchestration ran
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "short",
      [&](ChipOrchestrator& o, const TaskArgs& a) {
        {
          std::lock_guard<std::mutex> lock(mu);
          prepared_on.push_back(std::this_thread::get_id());
        }
        return o.submit_aiv(0, a).status();
      },
      k, std::vector<Param>{Param::scalar()});
  callables.emplace_back(
      "gated", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(1, a).status(); }, k,
      std::vector<Param>{Param::scalar()});
  WorkerConfig cfg = chip_child_config(3);
  cfg.launch_depth = 1;
  RecordingStores rec;
  ChildOptions options;
  options.stores = &rec;
  LoopChipChild c(cfg, callables, options);
  ChipGateScope gate;
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  auto publish = [&](uint64_t run, size_t callable) {
    TaskArgs args;
    args.add_scalar(static_cast<int64_t>(run));
    c.publish(run, callables[callable].digest(), args);
  };
  auto terminal = [&](uint64_t run) { return c.terminal(run) != nullptr; };
  auto order = [] {
    std::lock_guard<std::mutex> lock(chip_order_mu);
    return chip_order;
  };

  constexpr int64_t kShortRuns = 50;
  std::vector<int64_t> expected;
  for (int64_t run = 1; run <= kShortRuns; ++run) {
    // Quiet first: a run published while the preparer's thread is still
    // leaving the last one's call goes to that thread's queue.
    ASSERT_TRUE(eventually([&] { return c.handler.quiet(); })) << "the handler never went quiet before run " << run;
    publish(run, 0);
    ASSERT_TRUE(terminal(run));
    expected.push_back(run);
  }
  EXPECT_EQ(order(), expected);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(prepared_on.size(), static_cast<size_t>(kShortRuns));
    EXPECT_NE(prepared_on.front(), c.loop.get_id()) << "a callable not yet seen to be short is prepared on the loop";
    const auto on_loop = std::count(prepared_on.begin(), prepared_on.end(), c.loop.get_id());
    EXPECT_EQ(on_loop, kShortRuns - 1) << "short runs prepared on the loop";
    EXPECT_EQ(c.handler.prepared_inline(), static_cast<uint64_t>(on_loop));
  }
  EXPECT_GT(c.handler.launched_by_preparer(), 0u) << "no run was launched by its preparer";

  // The gated run holds the only launch slot; the two short runs behind it
  // are prepared, hand their frames back and wait, unaccepted.
  publish(101, 1);
  ASSERT_TRUE(eventually([] { return chip_gate_reached.load(); })) << "the gated kernel never started";
  auto prepared = [&](size_t n) {
    return eventually([&] {
      std::lock_guard<std::mutex> lock(mu);
      return prepared_on.size() == n;
    });
  };
  // One at a time, so each finds the loop alone (the path a loop that held
  // on to a run waiting for the device would block).
  // Each waits unaccepted, so only its ACK rings the parent (R10: a parked
  // parent learns the frame is back without a later ring).
  Doorbell& parent_bell = c.ep().view().control().parent_bell;
  for (int64_t run : {102, 103}) {
    const uint32_t rung = parent_bell.arm();
    publish(run, 0);
    ASSERT_TRUE(prepared(static_cast<size_t>(kShortRuns + run - 101))) << "run " << run << " was never prepared";
    EXPECT_TRUE(eventually([&] { return parent_bell.arm() != rung; }))
        << "run " << run << " was prepared and is waiting for the device, and its ACK never rang the parent";
  }
  ASSERT_TRUE(poll_until(
      c.ep(), c.events, [&] { return c.ep().available_request_transport() == kMailboxRequestFrames; },
      "both frames handed back while the device is full"));
  for (uint64_t run : {102u, 103u}) {
    EXPECT_EQ(find_event(c.events, run, EndpointEvent::Kind::kAccepted), nullptr) << "run " << run << " launched early";
    EXPECT_EQ(find_event(c.events, run, EndpointEvent::Kind::kTerminal), nullptr) << "run " << run;
  }
  chip_gate_open.store(true);
  chip_gate_bell.ring();
  for (uint64_t run : {101u, 102u, 103u}) ASSERT_TRUE(terminal(run));
  for (const EndpointEvent& e : c.events) {
    if (e.kind == EndpointEvent::Kind::kTerminal) {
      EXPECT_TRUE(e.status.ok()) << e.status.to_string();
    }
  }
  for (int64_t run : {101, 102, 103}) expected.push_back(run);
  EXPECT_EQ(order(), expected) << "the runs prepared behind the full device launched out of order";
  c.shut_down();
  EXPECT_EQ(expect_terminal_last_per_entry(rec.snapshot(), c.ep().view()), static_cast<size_t>(kShortRuns + 3));
}

// R4, R10: a run the loop prepares and launches itself rings the parent for
// its acceptance a few microseconds after its ACK, and one wake shows a
// parked parent both (each a level that stays readable): the ACK does not
// ring on its own. Every other run rings for its ACK, its acceptance and its
// terminal. One run at a time, each published once the handler is quiet,
// so every run after the first finds the preparer, the launcher and a slot
// free and is prepared and launched on the loop. (Without that wait, a run
// that ends before its preparer's call returns sends the next run to the
// preparer's queue, and so on: a loaded sanitizer build saw none on the loop.)
TEST(ChipChildInline, R4ARunLaunchedOnTheLoopRingsTheParentOnceForItsAckAndAcceptance) {
  Watchdog dog;
  chip_order.clear();
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "ipc_record_marker_kernel", ipc_record_marker_kernel).ok());
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "short", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{Param::scalar()});
  LoopChipChild c(chip_child_config(3), callables, ChildOptions{});
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  Doorbell& bell = c.ep().view().control().parent_bell;
  const uint32_t before = bell.arm();
  constexpr uint64_t kRuns = 20;
  for (uint64_t run = 1; run <= kRuns; ++run) {
    ASSERT_TRUE(eventually([&] { return c.handler.quiet(); })) << "the handler never went quiet before run " << run;
    c.publish_marker(run, callables[0].digest());
    const EndpointEvent* t = c.terminal(run);
    ASSERT_NE(t, nullptr);
    ASSERT_TRUE(t->status.ok()) << t->status.to_string();
  }
  const uint64_t on_loop = c.handler.prepared_inline();
  // The first run's callable was not yet seen to be short.
  ASSERT_EQ(on_loop, kRuns - 1) << "runs prepared on the loop";
  // The last terminal's ring may follow the store the parent saw.
  const uint64_t expected = 3 * kRuns - on_loop;
  const auto rings = [&] { return static_cast<uint64_t>((bell.arm() - before) / 2); };
  EXPECT_TRUE(eventually([&] { return rings() == expected; }))
      << rings() << " rings of the parent's bell for " << kRuns << " runs, " << on_loop
      << " of them launched on the loop; expected " << expected;
}

// The machine read as quiet while it lives, so a spinning loop spins its
// whole window whatever else the test machine runs.
struct QuietMachine {
  QuietMachine() { hooks::force_load_state(0); }
  ~QuietMachine() { hooks::force_load_state(-1); }
};

// One callable `name`: a single AIV task of `kernel`, over one argument.
std::vector<ChipCallable> one_task_callable(KernelLibrary& k, const char* name, simpler_kernel_fn kernel, Param param) {
  EXPECT_TRUE(k.add_function(0, CoreType::AIV, name, kernel).ok());
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      name, [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{param});
  return callables;
}
std::vector<ChipCallable> add_one_callable(KernelLibrary& k) {
  return one_task_callable(k, "ipc_add_one_kernel", ipc_add_one_kernel, Param::inout());
}
std::vector<ChipCallable> gated_callable(KernelLibrary& k) {
  return one_task_callable(k, "ipc_gated_marker_kernel", ipc_gated_marker_kernel, Param::scalar());
}

// A light run's end is taken by the serve loop, which stores the terminal
// without waking the completer; a run whose staged tensors would hold the
// loop up copying them back is the completer's. Each run
// adds one to its shared-heap tensor, which must come back whole (R6: the
// terminal follows the copy back).
TEST(ChipChildCompleter, ALightRunEndsOnTheSpinningLoopAHeavyOneOnTheCompleter) {
  Watchdog dog;
  QuietMachine quiet;
  KernelLibrary k;
  const std::vector<ChipCallable> callables = add_one_callable(k);
  constexpr size_t kLight = 64;
  constexpr size_t kHeavy = 2 * ChipChildHandler::kLightStagedBytes / sizeof(float);
  std::vector<float> heap(kLight + kHeavy, 1.0f);
  const auto base = reinterpret_cast<uint64_t>(heap.data());
  HostRanges ranges{{HostRange{base, base + heap.size() * sizeof(float)}}};
  const WorkerConfig cfg = chip_child_config(2);
  ChildOptions options;
  options.spin = SpinPolicy{64, 4 * kTestWaitNs};  // the loop never parks in this test
  LoopChipChild c(cfg, callables, options, ranges);
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  auto run = [&](uint64_t id, uint64_t addr, size_t floats) {
    TaskArgs args;
    args.add_tensor(DeviceBuffer{addr, floats * sizeof(float)}.view({static_cast<int64_t>(floats)}, DType::F32),
                    Tag::InOut);
    c.publish(id, callables[0].digest(), args);
    const EndpointEvent* t = c.terminal(id);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  };
  run(1, base, kLight);
  EXPECT_EQ(c.handler.finalized_on_loop(), 1u) << "the spinning loop left a light run to the completer";
  run(2, base + kLight * sizeof(float), kHeavy);
  EXPECT_EQ(c.handler.finalized_on_loop(), 1u) << "the loop copied a heavy run back itself";
  run(3, base, kLight);
  EXPECT_EQ(c.handler.finalized_on_loop(), 2u) << "after a heavy run the loop left a light one to the completer";
  c.shut_down();
  for (size_t i = 0; i < kLight; ++i) ASSERT_EQ(heap[i], 3.0f) << "light element " << i;
  for (size_t i = kLight; i < heap.size(); ++i) ASSERT_EQ(heap[i], 2.0f) << "heavy element " << i - kLight;
}

// A light run still on the device when the loop stops serving (shutdown):
// the drain hands it to the completer, which stores its terminal.
TEST(ChipChildCompleter, ALightRunOnTheDeviceAtShutdownIsEndedByTheCompleter) {
  Watchdog dog;
  QuietMachine quiet;
  KernelLibrary k;
  const std::vector<ChipCallable> callables = gated_callable(k);
  ChildOptions options;
  options.drain_timeout_ns = 1'000'000'000ull;  // a drain that waits for nothing fails fast
  LoopChipChild c(chip_child_config(2), callables, options);
  ChipGateScope gate;
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  c.publish_marker(1, callables[0].digest());
  ASSERT_TRUE(eventually([] { return chip_gate_reached.load(); })) << "the gated kernel never started";
  c.ep().request_shutdown();
  ASSERT_TRUE(eventually([&] { return c.handler.draining(); })) << "the loop never began to drain";
  chip_gate_open.store(true);
  chip_gate_bell.ring();
  const EndpointEvent* t = c.terminal(1);
  ASSERT_NE(t, nullptr) << "the run on the device at shutdown never ended";
  EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  EXPECT_EQ(c.handler.finalized_on_loop(), 0u);
  c.shut_down();
}

// Holds the first store of an entry's `accepted` word (the launch marker,
// stored by the thread that launched the run, before the run is listed for
// its end) at `gate`; every store goes through as PlainStores would.
class HoldAcceptStores final : public StorePrimitive {
 public:
  void store32(uint32_t& w, uint32_t v) override {
    if (accepted_word(&w) && !held_.exchange(true)) gate.pass();
    store_release(w, v);
  }
  void store64(uint64_t& w, uint64_t v) override { store_release(w, v); }
  void store_bytes(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void watch(MailboxView view, size_t entries) {
    entries_ = entries;
    view_ = std::move(view);
    watching_.store(true);
  }
  Gate gate;

 private:
  bool accepted_word(const uint32_t* w) {
    if (!watching_.load()) return false;
    for (size_t k = 0; k < entries_; ++k) {
      if (w == &view_.entry(k).accepted) return true;
    }
    return false;
  }
  std::atomic<bool> watching_{false};
  std::atomic<bool> held_{false};
  MailboxView view_;
  size_t entries_ = 0;
};

// A light run launched off the loop that ends before it is listed for its
// end: the device's ring finds nothing for the loop, which parks again, so
// the launching thread must ring the loop once it lists the run.
TEST(ChipChildCompleter, ARunThatEndsBeforeItIsListedStillReachesTheParkedLoop) {
  Watchdog dog;
  QuietMachine quiet;
  KernelLibrary k;
  const std::vector<ChipCallable> callables = gated_callable(k);
  auto* stores = abandon(new HoldAcceptStores);  // a thread may still be leaving its gate
  ChildOptions options;
  options.spin = SpinPolicy{1, 200'000};
  options.stores = stores;
  LoopChipChild c(chip_child_config(2), callables, options);
  ChipGateScope gate;
  struct Release {
    Gate& gate;
    ~Release() { gate.release(); }
  } release_before_shutdown{stores->gate};
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  stores->watch(c.ep().view(), LoopChipChild::kEntries);
  c.publish_marker(1, callables[0].digest());  // the callable's first run: its preparer launches it
  ASSERT_TRUE(stores->gate.wait_entered()) << "the run never reached its launch marker";
  Doorbell& bell = c.ep().view().control().child_bell;
  ASSERT_TRUE(eventually([&] { return bell.parked() == 1; })) << "the idle loop never parked";
  // Read while the loop is parked: it looks again only once something wakes it.
  const uint64_t polls = c.handler.loop_polls();
  const uint32_t rings = bell.arm();
  chip_gate_open.store(true);
  chip_gate_bell.ring();
  ASSERT_TRUE(eventually([&] { return bell.arm() != rings; })) << "the run's end never rang the loop";
  // The loop woke, found nothing listed, and parked again.
  ASSERT_TRUE(eventually([&] { return c.handler.loop_polls() > polls; })) << "the rung loop never looked";
  ASSERT_TRUE(eventually([&] { return bell.parked() == 1; })) << "the loop never parked again";
  stores->gate.release();
  const EndpointEvent* t = c.terminal(1);
  ASSERT_NE(t, nullptr) << "the run listed after its end never reached the parent";
  EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  EXPECT_EQ(c.handler.finalized_on_loop(), 1u);
}

// Adds one to its tensor after recording its marker (a scalar); marker 1
// holds its core at the gate first.
extern "C" void ipc_gated_add_one_kernel(int64_t* args) {
  if (args[1] == 1) {
    ipc_gated_marker_kernel(args + 1);
  } else {
    ipc_record_marker_kernel(args + 1);
  }
  ipc_add_one_kernel(args);
}

// A heavy run that ended while the completer is busy with another waits for
// the completer, however long the spinning loop looks at it: run 2 ends on
// the device while run 1 holds the completer, gated, and its terminal still
// comes second.
TEST(ChipChildCompleter, AHeavyRunThatEndsWhileTheCompleterIsBusyWaitsForIt) {
  Watchdog dog;
  QuietMachine quiet;
  chip_order.clear();
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "ipc_gated_add_one_kernel", ipc_gated_add_one_kernel).ok());
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "gated_add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{Param::inout(), Param::scalar()});
  constexpr size_t kHeavy = 2 * ChipChildHandler::kLightStagedBytes / sizeof(float);
  std::vector<float> heap(2 * kHeavy, 1.0f);
  const auto base = reinterpret_cast<uint64_t>(heap.data());
  HostRanges ranges{{HostRange{base, base + heap.size() * sizeof(float)}}};
  WorkerConfig cfg = chip_child_config(2);
  cfg.launch_depth = 2;
  ChildOptions options;
  options.spin = SpinPolicy{64, 4 * kTestWaitNs};  // the loop never parks in this test
  LoopChipChild c(cfg, callables, options, ranges);
  ChipGateScope gate;
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  for (int64_t run : {1, 2}) {
    TaskArgs args;
    args.add_tensor(
        DeviceBuffer{base + static_cast<uint64_t>(run - 1) * kHeavy * sizeof(float), kHeavy * sizeof(float)}.view(
            {static_cast<int64_t>(kHeavy)}, DType::F32),
        Tag::InOut);
    args.add_scalar(run);
    c.publish(static_cast<uint64_t>(run), callables[0].digest(), args);
    if (run == 1) {
      ASSERT_TRUE(eventually([] { return chip_gate_reached.load(); })) << "run 1 never started";
    }
  }
  ASSERT_TRUE(eventually([] {
    std::lock_guard<std::mutex> lock(chip_order_mu);
    return chip_order.size() == 2;
  })) << "run 2 never ran";
  chip_gate_open.store(true);
  chip_gate_bell.ring();
  for (uint64_t run : {1u, 2u}) {
    const EndpointEvent* t = c.terminal(run);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  }
  std::vector<uint64_t> terminals;
  for (const EndpointEvent& e : c.events) {
    if (e.kind == EndpointEvent::Kind::kTerminal) terminals.push_back(e.run_id);
  }
  EXPECT_EQ(terminals, (std::vector<uint64_t>{1, 2})) << "the loop ended heavy run 2 while the completer held run 1";
  EXPECT_EQ(c.handler.finalized_on_loop(), 0u);
  c.shut_down();
  for (size_t i = 0; i < heap.size(); ++i) ASSERT_EQ(heap[i], 2.0f) << "element " << i;
}

// A light run still on the device when the loop parks: its end rings the
// loop's bell, and the loop, not the completer, stores its terminal.
TEST(ChipChildCompleter, ALightRunThatEndsWhileTheLoopIsParkedWakesTheLoop) {
  Watchdog dog;
  QuietMachine quiet;
  KernelLibrary k;
  const std::vector<ChipCallable> callables = gated_callable(k);
  const WorkerConfig cfg = chip_child_config(2);
  ChildOptions options;
  options.spin = SpinPolicy{1, 200'000};
  LoopChipChild c(cfg, callables, options);
  ChipGateScope gate;
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  c.publish_marker(1, callables[0].digest());
  ASSERT_TRUE(eventually([] { return chip_gate_reached.load(); })) << "the gated kernel never started";
  Doorbell& bell = c.ep().view().control().child_bell;
  ASSERT_TRUE(eventually([&] { return bell.parked() == 1; })) << "the idle loop never parked";
  chip_gate_open.store(true);
  chip_gate_bell.ring();
  const EndpointEvent* t = c.terminal(1);
  ASSERT_NE(t, nullptr) << "the run that ended while the loop was parked never reached the parent";
  EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  EXPECT_EQ(c.handler.finalized_on_loop(), 1u) << "the completer, not the woken loop, ended the run";
}

// A short run is prepared on the loop even while another frame waits: the
// preparation never waits for the run, so the waiting frame is served sooner
// than a wake of the preparer's thread would serve it (R4: each frame is
// still handed back, and the runs reach the device in publication order).
TEST(ChipChildInline, R4AShortRunIsPreparedOnTheLoopWhileAnotherFrameWaits) {
  Watchdog dog;
  chip_order.clear();
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "ipc_record_marker_kernel", ipc_record_marker_kernel).ok());
  std::mutex mu;
  std::map<int64_t, std::thread::id> prepared_on;  // run -> where its orchestration ran
  std::atomic<int64_t> held{-1};                   // the run whose orchestration waits at `hold`
  Gate* const hold = abandon(new Gate);            // a loop left inside the orchestration may still pass it
  std::vector<ChipCallable> callables;
  callables.emplace_back(
      "short",
      [&](ChipOrchestrator& o, const TaskArgs& a) {
        const auto run = static_cast<int64_t>(a[0].scalar);
        {
          std::lock_guard<std::mutex> lock(mu);
          prepared_on[run] = std::this_thread::get_id();
        }
        if (run == held.load()) hold->pass();
        return o.submit_aiv(0, a).status();
      },
      k, std::vector<Param>{Param::scalar()});
  WorkerConfig cfg = chip_child_config(3);
  cfg.launch_depth = 3;
  LoopChipChild c(cfg, callables, ChildOptions{});
  struct Release {
    Gate* gate;
    ~Release() { gate->release(); }
  } release_before_shutdown{hold};
  ASSERT_TRUE(c.ep().wait_ready(now_ns() + kTestWaitNs).ok());
  auto publish = [&](int64_t run) {
    TaskArgs args;
    args.add_scalar(run);
    c.publish(static_cast<uint64_t>(run), callables[0].digest(), args);
  };
  auto on_loop = [&](int64_t run) {
    std::lock_guard<std::mutex> lock(mu);
    return prepared_on[run] == c.loop.get_id();
  };
  // The first run is the preparer's: the callable was not yet seen to be
  // short. Once the handler is quiet, the next is the loop's.
  const int64_t run = 1;
  publish(run);
  ASSERT_NE(c.terminal(static_cast<uint64_t>(run)), nullptr);
  EXPECT_FALSE(on_loop(run)) << "a callable not yet seen to be short was prepared on the loop";
  ASSERT_TRUE(eventually([&] { return c.handler.quiet(); })) << "the handler never went quiet after run " << run;
  const int64_t h = run + 1;
  held.store(h);
  publish(h);
  ASSERT_TRUE(hold->wait_entered()) << "run " << h << " was never prepared";
  // The held run's frame was handed back before its preparation began: both
  // frames take a request while the loop is inside it.
  publish(h + 1);
  publish(h + 2);
  hold->release();
  for (int64_t r = h; r <= h + 2; ++r) {
    const EndpointEvent* t = c.terminal(static_cast<uint64_t>(r));
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->status.ok()) << t->status.to_string();
  }
  EXPECT_TRUE(on_loop(h)) << "the held run was not prepared on the loop";
  EXPECT_TRUE(on_loop(h + 1)) << "the run taken while the next frame waited went to the preparer";
  std::lock_guard<std::mutex> lock(chip_order_mu);
  std::vector<int64_t> ran = chip_order;
  std::sort(ran.begin(), ran.end());  // three launch slots: the cores finish in any order
  std::vector<int64_t> all(static_cast<size_t>(h + 2));
  std::iota(all.begin(), all.end(), 1);
  EXPECT_EQ(ran, all);
}

}  // namespace
}  // namespace simpler::testing
