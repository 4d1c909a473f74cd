// Mechanism R (seed 002, R93-R131) on its own: the capture gate, the BEFORE
// and AFTER barriers, the request/ack lines, the AICPU service step and the
// abort, driven with real threads as cores and either an AICPU thread or the
// test thread itself as the supervisor (so a script can place every service
// step). Interleavings are forced with the protocol's hooks and latches; an
// event log with one global sequence gives the order. Every wait has a deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "diag/arg_capture.h"
#include "diag/args_dump_collector.h"
#include "diag/args_dump_file.h"
#include "runtime/resident/args_capture.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

using resident::AckStatus;
using resident::ArgsCaptureAck;
using resident::ArgsCaptureControl;
using resident::ArgsCaptureRequest;
using resident::ArgsCaptureSlot;
using resident::CaptureConfig;
using resident::CaptureCoreState;
using resident::CaptureEnv;
using resident::CaptureHooks;
using resident::CapturePhase;
using resident::CapturePoint;
using resident::CaptureRun;
using resident::claim_occupancy;
using resident::claim_state;
using resident::claim_word;
using resident::Participant;
using resident::SlotOp;
using resident::SlotState;
using resident::SlotWordId;

constexpr uint64_t kEpoch = 41;
constexpr int kExecute = 100;  // a test event: a participant "executes" its task

// R93: the layouts the seed prices.
static_assert(sizeof(ArgsCaptureSlot) == 64 && sizeof(ArgsCaptureRequest) == 64 && sizeof(ArgsCaptureAck) == 64);
static_assert(sizeof(ArgsCaptureControl) == 72 * 64 + 108 * 64 + 108 * 64 && sizeof(ArgsCaptureControl) == 18432);

struct FakeEnv : CaptureEnv {
  explicit FakeEnv(uint32_t cores) : bells(cores) {}
  Doorbell& core_bell(uint32_t c) override { return bells[c]; }
  void ring_aicpu(uint32_t) override {
    aicpu_rings.fetch_add(1);
    aicpu.ring();
  }
  std::vector<Doorbell> bells;
  Doorbell aicpu;
  std::atomic<uint64_t> aicpu_rings{0};
};

struct Event {
  int kind;  // a CapturePoint, or kExecute
  uint32_t core;
  uint32_t slot;
  uint64_t word;
};

// A host tensor standing in for device memory.
struct Buf {
  explicit Buf(size_t n, float fill = 0) : data(n, fill) {}
  TensorView view() const {
    DeviceBuffer b{reinterpret_cast<uint64_t>(data.data()), data.size() * sizeof(float)};
    return b.view({static_cast<int64_t>(data.size())}, DType::F32);
  }
  std::vector<float> data;
};

// One dumping "run": a collector with one lane, its ArgCapture, a zeroed
// control block, fake doorbells and the protocol, with hooks that log events.
struct Rig {
  explicit Rig(uint32_t cores, CaptureConfig cfg = {}, DumpLaneConfig lane = {}, uint32_t lanes_n = 1,
               uint64_t epoch = kEpoch)
      : env(cores), lanes(lanes_n) {
    dir = scratch_dir("capture", "dump");
    ArgsDumpCollector::Options o;
    o.dir = dir;
    o.selection = DumpSelection::kFull;
    o.run_epoch = epoch;
    o.lane = lane;
    o.lanes = lanes;
    o.hold = [this](uint32_t l) { return held[l].load(); };
    auto c = ArgsDumpCollector::start(o);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    collector = std::move(*c);
    capture = std::make_unique<ArgCapture>(*collector, 64, epoch);
    control.reset(new ArgsCaptureControl{});
    hooks.point = [this](CapturePoint p, uint32_t core, uint32_t slot, uint64_t w) {
      log(static_cast<int>(p), core, slot, w);
      if (on_point) on_point(p, core, slot, w);
    };
    hooks.serve = [this](uint32_t) { return serving.load(); };
    run = std::make_unique<CaptureRun>(control.get(), cores, lanes, *capture, epoch, env, cfg, &hooks);
  }
  ~Rig() { stop_aicpu(); }

  void log(int kind, uint32_t core, uint32_t slot, uint64_t w) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({kind, core, slot, w});
  }
  std::vector<Event> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
  // Task `id`: `in` read before, `out` written after.
  void add_task(uint64_t id, std::vector<const Buf*> in, std::vector<const Buf*> out) {
    TaskArgs args;
    for (const Buf* b : in) args.add_tensor(b->view(), Tag::Input);
    for (const Buf* b : out) args.add_tensor(b->view(), Tag::OutputExisting);
    std::array<TensorView, kMaxTaskArgs> views;
    for (size_t i = 0; i < args.size(); ++i) views[i] = args[i].tensor;
    capture->add_task(id, 7, args, views.data());
  }
  void start_aicpu() {
    aicpu = std::thread([this] {
      while (!stop.load()) {
        bool progress = false;
        for (uint32_t l = 0; l < lanes; ++l) progress |= run->service(l);
        if (!progress) {
          spin_then_park(
              env.aicpu, [&] { return stop.load(); }, SpinPolicy{}, now_ns() + 1'000'000);
        }
      }
    });
  }
  void stop_aicpu() {
    stop.store(true);
    env.aicpu.ring();
    if (aicpu.joinable()) aicpu.join();
  }
  // A participant's whole task: enter, BEFORE, execute, AFTER.
  Status participate(uint32_t core, uint64_t task, bool gang, const std::function<void()>& execute = {}) {
    Participant p;
    p.core = core;
    p.bit = uint64_t{1} << (core % 3);
    p.mask = gang ? 7 : p.bit;
    p.task_id = task;
    CaptureCoreState& cs = ids[core];
    Status st = gang ? run->enter_gang(p) : run->enter_single(p, core / 3);
    if (!st.ok()) return st;
    st = run->phase(p, CapturePhase::kBefore, cs);
    if (!st.ok()) return st;
    log(kExecute, core, p.slot, task);
    if (execute) execute();
    return run->phase(p, CapturePhase::kAfter, cs);
  }
  // The test's own view of a gate word (a script standing in for a core or a fault).
  std::atomic_ref<uint64_t> slot_ref(uint32_t slot, SlotWordId w) {
    return std::atomic_ref<uint64_t>(reinterpret_cast<uint64_t*>(&control->slots[slot])[static_cast<int>(w)]);
  }
  uint64_t slot_word(uint32_t slot, SlotWordId w) { return slot_ref(slot, w).load(); }
  Result<ArgsDump> finish(bool stopped = true) {
    stop_aicpu();
    (void)collector->finish(stopped);
    return load_args_dump(dir);
  }

  // The host stops acknowledging lane l's payloads while held[l] (R112).
  void hold(uint32_t l, bool on) {
    held[l].store(on);
    collector->wake();
  }

  FakeEnv env;
  const uint32_t lanes;
  std::array<std::atomic<bool>, 4> held{};
  std::string dir;
  std::unique_ptr<ArgsDumpCollector> collector;
  std::unique_ptr<ArgCapture> capture;
  std::unique_ptr<ArgsCaptureControl> control;
  CaptureHooks hooks;
  std::function<void(CapturePoint, uint32_t, uint32_t, uint64_t)> on_point;
  std::atomic<bool> serving{true};
  std::unique_ptr<CaptureRun> run;
  std::array<CaptureCoreState, 12> ids{};
  std::mutex mu;
  std::vector<Event> events;
  std::atomic<bool> stop{false};
  std::thread aicpu;
};

size_t count(const std::vector<Event>& ev, int kind, uint64_t word = UINT64_MAX) {
  return static_cast<size_t>(std::count_if(
      ev.begin(), ev.end(), [&](const Event& e) { return e.kind == kind && (word == UINT64_MAX || e.word == word); }));
}
int idx(CapturePoint p) { return static_cast<int>(p); }

// Runs the three cores of cluster 0 as one gang on `task`, all released at once.
std::array<Status, 3> run_gang(Rig& rig, uint64_t task, const std::function<void(uint32_t)>& execute = {}) {
  std::array<Status, 3> st;
  std::atomic<int> go{0};
  std::vector<std::thread> ts;
  for (uint32_t c = 0; c < 3; ++c) {
    ts.emplace_back([&, c] {
      eventually([&] { return go.load() != 0; });
      st[c] = rig.participate(c, task, true, [&] {
        if (execute) execute(c);
      });
    });
  }
  go.store(1);
  for (auto& t : ts) t.join();
  return st;
}

// ---- R93-R99: the gate and one publisher -----------------------------------------------------

// R95: the gate word carries a reuse counter, advanced once per claim: after
// N tasks on one gate its occupancy is N, and each left the gate SETTLED.
TEST(CaptureGate, R95OccupancyCountsTheClaimsOfOneGate) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 1), b(4);
  for (uint64_t t = 0; t < 5; ++t) rig.add_task(t, {&a}, {&b});
  rig.start_aicpu();
  for (uint64_t t = 0; t < 5; ++t) ASSERT_TRUE(rig.participate(1, t, false).ok());
  const uint64_t w = rig.slot_word(0, SlotWordId::kClaim);
  EXPECT_EQ(claim_state(w), SlotState::kSettled);
  EXPECT_EQ(claim_occupancy(w), 5u);
  EXPECT_EQ(claim_word(SlotState::kSettled, 5), (uint64_t{3} << 62) | 5);
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_EQ(dump->args.size(), 10u);  // each task: a before, b after
}

// R96, R97, R99, R122 (A3): three participants race for the claim, over many
// rounds with randomized arrival orders: exactly one claimer per occupancy,
// no arrival bit lost, one publisher per (occupancy, phase), every slot
// access a single atomic, and while the slot reads CLAIMING the peers only
// load `claim` (the claimer is stalled there on every 8th round).
TEST(CaptureGate, R96R97R99AClaimRaceHasOneClaimerOnePublisherPerPhaseAndPeersOnlyLoadClaim) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 2), b(4);
  std::atomic<uint32_t> claimer{UINT32_MAX};
  std::atomic<bool> in_claiming{false};
  std::mutex amu;
  std::vector<std::tuple<uint32_t, SlotWordId, SlotOp>> during_claiming;
  std::atomic<uint64_t> round{0};
  rig.hooks.slot_access = [&](uint32_t core, uint32_t, SlotWordId w, SlotOp op) {
    if (in_claiming.load() && core != claimer.load() && core != UINT32_MAX) {
      std::lock_guard<std::mutex> lock(amu);
      during_claiming.emplace_back(core, w, op);
    }
  };
  std::atomic<uint32_t> claim_loads_seen{0};
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t, uint64_t) {
    if (p != CapturePoint::kClaimWon) return;
    claimer.store(core);
    if (round.load() % 8 == 0) {
      in_claiming.store(true);
      // Stall in CLAIMING until both peers were seen polling (R97's delay hook).
      eventually([&] {
        std::lock_guard<std::mutex> lock(amu);
        return during_claiming.size() >= 4;
      });
      in_claiming.store(false);
    }
  };
  rig.start_aicpu();
  constexpr uint64_t kRounds = 200;
  uint64_t seed = 12345;
  for (uint64_t r = 0; r < kRounds; ++r) {
    round.store(r);
    rig.add_task(r, {&a}, {&b});
    std::array<uint32_t, 3> spin{};
    for (auto& s : spin) s = static_cast<uint32_t>(splitmix(seed) % 2000);
    std::array<Status, 3> st;
    std::atomic<int> go{0};
    std::vector<std::thread> ts;
    for (uint32_t c = 0; c < 3; ++c) {
      ts.emplace_back([&, c] {
        eventually([&] { return go.load() != 0; });
        for (uint32_t i = 0; i < spin[c]; ++i) cpu_relax();
        st[c] = rig.participate(c, r, true);
      });
    }
    go.store(1);
    for (auto& t : ts) t.join();
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(rig.slot_word(0, SlotWordId::kArrivedBefore), 7u) << "an arrival bit was lost in round " << r;
    EXPECT_EQ(rig.slot_word(0, SlotWordId::kReleasedAfter), 7u);
  }
  const std::vector<Event> ev = rig.snapshot();
  EXPECT_EQ(count(ev, idx(CapturePoint::kClaimWon)), kRounds) << "one claimer per occupancy";
  EXPECT_EQ(count(ev, idx(CapturePoint::kPublished)), 2 * kRounds) << "one publisher per (occupancy, phase)";
  EXPECT_EQ(count(ev, idx(CapturePoint::kSettled)), kRounds);
  EXPECT_EQ(claim_occupancy(rig.slot_word(0, SlotWordId::kClaim)), kRounds);
  std::lock_guard<std::mutex> lock(amu);
  ASSERT_FALSE(during_claiming.empty()) << "the stall never saw a peer";
  for (const auto& [core, w, op] : during_claiming) {
    EXPECT_EQ(w, SlotWordId::kClaim) << "core " << core << " touched another word during CLAIMING";
    EXPECT_EQ(op, SlotOp::kLoad) << "core " << core << " did more than load claim during CLAIMING";
  }
}

// R122 (A3, last clause), R116: a claimer descheduled in CLAIMING past the
// budget ends the run as INIT_LOST: its peers write nothing and leave, nothing
// is published or sealed, and the slot is never SETTLED.
TEST(CaptureGate, R122AClaimerStalledInClaimingEndsTheRunAsInitLost) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.first_budget_ns = 50'000'000;
  cfg.second_budget_ns = 200'000'000;
  Rig rig(3, cfg);
  Buf a(4, 2), b(4);
  rig.add_task(0, {&a}, {&b});
  std::atomic<int> peers_done{0};
  std::mutex amu;
  std::vector<std::pair<uint32_t, SlotOp>> peer_writes;
  std::atomic<uint32_t> claimer{UINT32_MAX};
  // A failed claim CAS (a peer that read FREE just before the winner's CAS)
  // writes nothing; every other non-load by a non-claimer is a write.
  rig.hooks.slot_access = [&](uint32_t core, uint32_t, SlotWordId w, SlotOp op) {
    const uint32_t k = claimer.load();
    if (k != UINT32_MAX && core != k && op != SlotOp::kLoad && !(w == SlotWordId::kClaim && op == SlotOp::kCas)) {
      std::lock_guard<std::mutex> lock(amu);
      peer_writes.emplace_back(core, op);
    }
  };
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t, uint64_t) {
    if (p != CapturePoint::kClaimWon) return;
    claimer.store(core);
    EXPECT_TRUE(eventually([&] { return peers_done.load() == 2; })) << "the peers never gave up";
  };
  rig.start_aicpu();
  std::array<Status, 3> st;
  std::vector<std::thread> ts;
  for (uint32_t c = 0; c < 3; ++c) {
    ts.emplace_back([&, c] {
      st[c] = rig.participate(c, 0, true);
      if (c != claimer.load()) peers_done.fetch_add(1);
    });
  }
  for (auto& t : ts) t.join();
  // The first peer whose budget expires reports INIT_LOST; a peer that sees
  // the run already fatal leaves too; the claimer, once resumed, finds no
  // publisher and leaves. Nobody succeeds.
  int init_lost = 0;
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_FALSE(st[c].ok()) << "core " << c;
    if (contains(st[c].message(), "ARGS_CAPTURE_INIT_LOST")) ++init_lost;
  }
  EXPECT_GE(init_lost, 1) << st[0].to_string() << " | " << st[1].to_string() << " | " << st[2].to_string();
  EXPECT_FALSE(contains(st[claimer.load()].message(), "INIT_LOST")) << "the claimer itself is not lost";
  EXPECT_TRUE(rig.run->fatal());
  const std::vector<Event> ev = rig.snapshot();
  EXPECT_EQ(count(ev, idx(CapturePoint::kPublished)), 0u);
  EXPECT_EQ(count(ev, kExecute), 0u);
  EXPECT_NE(claim_state(rig.slot_word(0, SlotWordId::kClaim)), SlotState::kSettled);
  std::lock_guard<std::mutex> lock(amu);
  EXPECT_TRUE(peer_writes.empty()) << "a peer wrote the slot";
}

// R98, R116 (third item): a participant that joined occupancy n and then
// reads another occupancy leaves into the fatal path, reading no seal.
TEST(CaptureGate, R116AJoinerThatReadsAForeignOccupancyLeavesFatally) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 2), b(4);
  rig.add_task(0, {&a}, {&b});
  std::atomic<int> joiners_out{0};
  std::atomic<uint32_t> claimer{UINT32_MAX};
  std::atomic<int> loads[3] = {};  // claim loads by each core since the claim
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t slot, uint64_t n) {
    if (p != CapturePoint::kClaimWon) return;
    claimer.store(core);
    // Three loads after the CAS: the joiner decided its occupancy on
    // CLAIMING | n and polls for READY | n. Then a foreign occupancy appears.
    EXPECT_TRUE(eventually([&] {
      for (uint32_t c = 0; c < 3; ++c) {
        if (c != core && loads[c].load() < 3) return false;
      }
      return true;
    }));
    rig.slot_ref(slot, SlotWordId::kClaim).store(claim_word(SlotState::kReady, n + 7));
    EXPECT_TRUE(eventually([&] { return joiners_out.load() == 2; })) << "the joiners did not leave";
  };
  rig.hooks.slot_access = [&](uint32_t core, uint32_t, SlotWordId w, SlotOp op) {
    if (w == SlotWordId::kClaim && op == SlotOp::kLoad && claimer.load() != UINT32_MAX && core < 3) {
      loads[core].fetch_add(1);
    }
  };
  std::array<Status, 3> st;
  std::vector<std::thread> ts;
  for (uint32_t c = 0; c < 3; ++c) {
    ts.emplace_back([&, c] {
      Participant p;
      p.core = c;
      p.bit = uint64_t{1} << c;
      p.mask = 7;
      p.task_id = 0;
      st[c] = rig.run->enter_gang(p);
      if (c != claimer.load()) joiners_out.fetch_add(1);
    });
  }
  for (auto& t : ts) t.join();
  for (uint32_t c = 0; c < 3; ++c) {
    if (c == claimer.load()) continue;
    // A peer that read the planted word before the claim CAS retried as a
    // claimer of n+8 is impossible (READY is no source state): it joined.
    EXPECT_FALSE(st[c].ok()) << "core " << c;
    EXPECT_TRUE(contains(st[c].message(), "another occupancy")) << st[c].to_string();
  }
  EXPECT_TRUE(rig.run->fatal());
}

// ---- R100-R105: following, stale acks, departure ----------------------------------------------

// R100, R123 (A4): BEFORE's last arriver is core 1 and AFTER's is core 2
// (forced). Each phase's publisher word names its own publisher, and every
// peer's acceptance of a phase comes after that phase's seal was written.
TEST(CaptureGate, R100R123SplitPublishersEachPhaseFollowsItsOwnPublisherWord) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 3), b(4);
  rig.add_task(0, {&a}, {&b});
  std::atomic<int> arrived[2] = {};
  // Core 1 arrives last at BEFORE, core 2 last at AFTER.
  rig.on_point = [&](CapturePoint p, uint32_t, uint32_t, uint64_t ph) {
    if (p == CapturePoint::kArrived) arrived[ph - 1].fetch_add(1);
  };
  rig.hooks.slot_access = [&](uint32_t core, uint32_t, SlotWordId w, SlotOp op) {
    if (op != SlotOp::kFetchOr) return;
    if (w == SlotWordId::kArrivedBefore && core == 1) eventually([&] { return arrived[0].load() == 2; });
    if (w == SlotWordId::kArrivedAfter && core == 2) eventually([&] { return arrived[1].load() == 2; });
  };
  rig.start_aicpu();
  const auto st = run_gang(rig, 0);
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  const uint64_t pb = rig.slot_word(0, SlotWordId::kPublisherBefore);
  const uint64_t pa = rig.slot_word(0, SlotWordId::kPublisherAfter);
  EXPECT_EQ(pb >> 32, 2u) << "BEFORE's publisher is core 1";
  EXPECT_EQ(pa >> 32, 3u) << "AFTER's publisher is core 2";
  EXPECT_EQ(pb & 0xffffffffu, 1u);  // each core's first phase_seq
  EXPECT_EQ(pa & 0xffffffffu, 1u);
  // Every acceptance follows the seal of its phase, on the named line.
  const std::vector<Event> ev = rig.snapshot();
  int sealed_seen[3] = {};  // by publisher core
  int accepted[3] = {};     // by accepting core: its first is BEFORE, its second AFTER
  for (const Event& e : ev) {
    if (e.kind == idx(CapturePoint::kServed) && e.word == static_cast<uint64_t>(AckStatus::kSealed)) {
      ++sealed_seen[e.core];
    }
    if (e.kind == idx(CapturePoint::kSealAccepted)) {
      const uint32_t pub = accepted[e.core]++ == 0 ? 1 : 2;
      EXPECT_GE(sealed_seen[pub], 1) << "core " << e.core << " accepted before core " << pub << "'s seal";
    }
  }
  EXPECT_EQ(sealed_seen[1], 1);
  EXPECT_EQ(sealed_seen[2], 1);
}

// R102: stale acks are planted on every ack line before the run: a previous
// run's Sealed for the phase_seq this phase will use, and the right run's
// InProgress. With the AICPU stopped until every participant waits, no
// participant accepts anything; each accepts only after the real seal.
TEST(CaptureGate, R102PlantedStaleAcksAreIgnored) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 3), b(4);
  rig.add_task(9, {&a}, {&b});
  for (uint32_t c = 0; c < 3; ++c) {
    ArgsCaptureAck& k = rig.control->acks[c];
    k = ArgsCaptureAck{static_cast<uint64_t>(AckStatus::kSealed), 0, 0, 1, kEpoch - 1, 9, 0, 1};
  }
  rig.control->acks[2].status = static_cast<uint64_t>(AckStatus::kInProgress);
  rig.control->acks[2].run_epoch = kEpoch;
  rig.serving.store(false);
  rig.start_aicpu();
  std::array<Status, 3> st;
  std::thread t([&] { st = run_gang(rig, 9); });
  // Every participant arrived and the publisher published; nobody accepted.
  ASSERT_TRUE(eventually([&] { return count(rig.snapshot(), idx(CapturePoint::kPublished)) == 1; }));
  EXPECT_EQ(count(rig.snapshot(), idx(CapturePoint::kSealAccepted)), 0u);
  rig.serving.store(true);
  rig.env.ring_aicpu(0);
  t.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<Event> ev = rig.snapshot();
  const auto first_seal = std::find_if(ev.begin(), ev.end(), [](const Event& e) {
    return e.kind == idx(CapturePoint::kServed) && e.word == static_cast<uint64_t>(AckStatus::kSealed);
  });
  const auto first_accept =
      std::find_if(ev.begin(), ev.end(), [](const Event& e) { return e.kind == idx(CapturePoint::kSealAccepted); });
  ASSERT_NE(first_seal, ev.end());
  EXPECT_LT(first_seal - ev.begin(), first_accept - ev.begin()) << "a stale ack was accepted";
}

// R102: the readers' acceptance rules over planted acks: a previous run's
// seal, a previous phase's seal, another task's, InProgress and WouldBlock
// for the right identity, and a stale tick for the publisher. A peer accepts
// only the full identity with a terminal status; the publisher only its latest tick.
TEST(CaptureGate, R102EachReaderAcceptsOnlyWhatItsRuleAllows) {
  const auto ack = [](AckStatus s, uint64_t epoch, uint64_t task, uint64_t seq, uint64_t tick) {
    return ArgsCaptureAck{static_cast<uint64_t>(s), 0, 0, tick, epoch, task, 0, seq};
  };
  struct Case {
    ArgsCaptureAck a;
    bool peer, publisher;
    const char* what;
  };
  const Case cases[] = {
      {ack(AckStatus::kSealed, kEpoch, 9, 4, 7), true, true, "this phase's seal"},
      {ack(AckStatus::kAborted, kEpoch, 9, 4, 7), true, true, "this phase's abort"},
      {ack(AckStatus::kSealed, kEpoch - 1, 9, 4, 7), false, false, "a previous run's seal"},
      {ack(AckStatus::kSealed, kEpoch, 9, 3, 7), false, false, "a previous phase's seal"},
      {ack(AckStatus::kSealed, kEpoch, 8, 4, 7), false, false, "another task's seal"},
      {ack(AckStatus::kInProgress, kEpoch, 9, 4, 7), false, true, "progress for this phase"},
      {ack(AckStatus::kWouldBlock, kEpoch, 9, 4, 7), false, true, "WouldBlock for this phase"},
      {ack(AckStatus::kInProgress, kEpoch, 9, 4, 6), false, false, "progress for an older request"},
      {ack(AckStatus::kNone, kEpoch, 9, 4, 7), false, false, "no status"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(resident::peer_accepts(c.a, kEpoch, 9, 4), c.peer) << "peer: " << c.what;
    EXPECT_EQ(resident::publisher_accepts(c.a, kEpoch, 9, 4, 7), c.publisher) << "publisher: " << c.what;
  }
}

// Until `core` has arrived for `ph` (its kArrived is logged before any hook holds it).
bool arrived(Rig& rig, uint32_t core, CapturePhase ph) {
  const std::vector<Event> ev = rig.snapshot();
  return std::any_of(ev.begin(), ev.end(), [&](const Event& e) {
    return e.kind == idx(CapturePoint::kArrived) && e.core == core && e.word == static_cast<uint64_t>(ph);
  });
}

// The position of the first event matching, or the log's size.
size_t first_at(const std::vector<Event>& ev, int kind, uint32_t core, uint32_t slot) {
  return static_cast<size_t>(
      std::find_if(ev.begin(), ev.end(),
                   [&](const Event& e) { return e.kind == kind && e.core == core && e.slot == slot; }) -
      ev.begin());
}

// R103, R124 (A5): one participant's seal acceptance is delayed far behind
// its peers'. SETTLED appears only after all three released bits, and the
// next occupancy's claim (a single task on the same cluster) never precedes
// the last departure: it takes gate 1, not gate 0. Core 2 arrives last for
// AFTER (cores 0 and 1 arrive first), so it is that phase's publisher and
// reads its own ack line; the single on core 0 reuses no line a peer still reads.
TEST(CaptureGate, R103R124TheNextClaimNeverPrecedesTheLastDeparture) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 3), b(4);
  rig.add_task(0, {&a}, {&b});
  rig.add_task(1, {&a}, {&b});
  std::atomic<int> late_release{0};
  std::atomic<int> core2_accepts{0};
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t, uint64_t) {
    // Core 2 holds at its AFTER acceptance (its second) until the test lets it go.
    if (p == CapturePoint::kSealAccepted && core == 2 && core2_accepts.fetch_add(1) == 1) {
      EXPECT_TRUE(eventually([&] { return late_release.load() != 0; }));
    }
  };
  rig.start_aicpu();
  std::array<Status, 3> st;
  std::thread gang([&] {
    st = run_gang(rig, 0, [&](uint32_t core) {
      if (core == 2) {
        EXPECT_TRUE(
            eventually([&] { return arrived(rig, 0, CapturePhase::kAfter) && arrived(rig, 1, CapturePhase::kAfter); }));
      }
    });
  });
  // Cores 0 and 1 left AFTER; core 2 is held.
  ASSERT_TRUE(eventually([&] { return count(rig.snapshot(), idx(CapturePoint::kReleased), 2) == 2; }));
  EXPECT_NE(claim_state(rig.slot_word(0, SlotWordId::kClaim)), SlotState::kSettled);
  // The next occupant (core 0, a single) must take gate 1, not gate 0.
  Status next;
  std::thread single([&] { next = rig.participate(0, 1, false); });
  single.join();
  ASSERT_TRUE(next.ok()) << next.to_string();
  EXPECT_EQ(claim_occupancy(rig.slot_word(0, SlotWordId::kClaim)), 1u) << "gate 0 was re-claimed under core 2";
  EXPECT_EQ(claim_state(rig.slot_word(1, SlotWordId::kClaim)), SlotState::kSettled);
  late_release.store(1);
  gang.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kClaim), claim_word(SlotState::kSettled, 1));
  // SETTLED came after the third release.
  const std::vector<Event> ev = rig.snapshot();
  int released_after = 0;
  for (const Event& e : ev) {
    if (e.kind == idx(CapturePoint::kReleased) && e.word == 2 && e.slot == 0) ++released_after;
    if (e.kind == idx(CapturePoint::kSettled) && e.slot == 0) {
      EXPECT_EQ(released_after, 3);
    }
  }
}

// R104: a seal outlives its readers. Core 0 publishes task 0's AFTER phase
// (cores 2 and 1 arrive first) while core 2 is held after its arrival,
// before it reads the seal on core 0's ack line. Core 0 moves on to its next
// task (a single, on gate 1) and must not publish there, which would rewrite
// that line, until core 2 has left: its publish waits (kReuseWait) and comes
// after core 2's acceptance and release; core 2 reads the right seal.
TEST(CaptureGate, R104ADelayedPeerReadsItsSealAfterThePublisherMovedOn) {
  Watchdog dog;
  Rig rig(3);
  Buf a(4, 3), b(4);
  rig.add_task(0, {&a}, {&b});
  rig.add_task(1, {&a}, {&b});
  std::atomic<int> late_release{0};
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t, uint64_t w) {
    if (p == CapturePoint::kArrived && core == 2 && w == static_cast<uint64_t>(CapturePhase::kAfter)) {
      EXPECT_TRUE(eventually([&] { return late_release.load() != 0; }));
    }
  };
  rig.start_aicpu();
  std::array<Status, 3> st;
  std::thread gang([&] {
    st = run_gang(rig, 0, [&](uint32_t core) {
      // AFTER arrivals in the order 2, 1, 0: core 0 is the publisher.
      if (core == 1) {
        EXPECT_TRUE(eventually([&] { return arrived(rig, 2, CapturePhase::kAfter); }));
      }
      if (core == 0) {
        EXPECT_TRUE(eventually([&] { return arrived(rig, 1, CapturePhase::kAfter); }));
      }
    });
  });
  ASSERT_TRUE(eventually([&] { return count(rig.snapshot(), idx(CapturePoint::kReleased), 2) == 2; }));
  Status next;
  std::thread single([&] { next = rig.participate(0, 1, false); });
  // Core 0 arrived on gate 1 and waits; nothing was published there.
  EXPECT_TRUE(eventually([&] {
    const std::vector<Event> ev = rig.snapshot();
    return first_at(ev, idx(CapturePoint::kReuseWait), 0, 1) < ev.size();
  })) << "core 0 did not wait on gate 1 for core 2 to read its seal";
  {
    const std::vector<Event> ev = rig.snapshot();
    EXPECT_EQ(first_at(ev, idx(CapturePoint::kPublished), 0, 1), ev.size())
        << "core 0 published on gate 1 while core 2 had not read its seal";
  }
  late_release.store(1);
  gang.join();
  single.join();
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(next.ok()) << next.to_string();
  const std::vector<Event> ev = rig.snapshot();
  const size_t accepted = first_at(ev, idx(CapturePoint::kSealAccepted), 2, 0);
  const size_t published = first_at(ev, idx(CapturePoint::kPublished), 0, 1);
  ASSERT_LT(accepted, ev.size());
  ASSERT_LT(published, ev.size());
  // Core 2's AFTER acceptance is its second on gate 0; both precede core 0's next publish.
  size_t core2_after = ev.size();
  int seen = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].kind == idx(CapturePoint::kSealAccepted) && ev[i].core == 2 && ev[i].slot == 0 && ++seen == 2) {
      core2_after = i;
    }
  }
  EXPECT_EQ(ev[core2_after].word, static_cast<uint64_t>(AckStatus::kSealed));
  EXPECT_LT(core2_after, published) << "core 0 rewrote its ack line before core 2 read the seal";
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kClaim), claim_word(SlotState::kSettled, 1));
  EXPECT_EQ(rig.slot_word(1, SlotWordId::kClaim), claim_word(SlotState::kSettled, 1));
}

// R104 across runs: the phase a core published last belongs to its run's ack
// lines, so it holds back nothing in the next run (whose lines are its own),
// even where that run's gate 0 is at the same occupancy. The AFTER publisher
// of a gang in one run runs a single task in the next: it claims gate 0
// (occupancy 1 again) and publishes at once.
TEST(CaptureGate, R104APublicationOfAnEarlierRunHoldsNothingBack) {
  Watchdog dog;
  Buf a(4, 3), b(4);
  std::array<CaptureCoreState, 12> ids{};
  uint32_t publisher = 0;
  {
    Rig first(3);
    first.add_task(0, {&a}, {&b});
    first.start_aicpu();
    for (const Status& s : run_gang(first, 0)) ASSERT_TRUE(s.ok()) << s.to_string();
    publisher = static_cast<uint32_t>(first.slot_word(0, SlotWordId::kPublisherAfter) >> 32) - 1;
    ASSERT_LT(publisher, 3u);
    ids = first.ids;
  }
  Rig second(3, {}, {}, 1, kEpoch + 1);
  second.ids = ids;
  second.add_task(5, {&a}, {&b});
  second.start_aicpu();
  const Status st = second.participate(publisher, 5, false);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(count(second.snapshot(), idx(CapturePoint::kReuseWait)), 0u)
      << "a previous run's phase held core " << publisher << " back";
  EXPECT_EQ(second.slot_word(0, SlotWordId::kClaim), claim_word(SlotState::kSettled, 1));
}

// R105, R120 (A1): a 1C2V task yields one record set, and no subtask
// executes before the BEFORE seal nor completes before the AFTER seal.
TEST(CaptureGate, R105R120AMixTaskIsOneRecordSetAndNoSubtaskRunsBeforeItsSeal) {
  Watchdog dog;
  Rig rig(3);
  Buf a(64, 5), b(64, -1);
  rig.add_task(0, {&a}, {&b});
  rig.start_aicpu();
  const auto st = run_gang(rig, 0, [&](uint32_t c) {
    if (c == 0) std::fill(b.data.begin(), b.data.end(), 6.f);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<Event> ev = rig.snapshot();
  bool before_sealed = false;
  for (const Event& e : ev) {
    if (e.kind == idx(CapturePoint::kServed) && e.word == static_cast<uint64_t>(AckStatus::kSealed)) {
      before_sealed = true;
    }
    if (e.kind == kExecute) {
      EXPECT_TRUE(before_sealed) << "core " << e.core << " executed before the BEFORE seal";
    }
  }
  EXPECT_EQ(count(ev, kExecute), 3u);
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  ASSERT_EQ(dump->args.size(), 2u) << "one record set for the three subtasks";
  for (const DumpedArg& x : dump->args) {
    const float want = x.stage == DumpStage::kBefore ? 5.f : 6.f;
    for (uint64_t i = 0; i < 64; ++i) ASSERT_EQ(dumped_element(*dump, x, i), want);
  }
}

// R121 (A2): every cluster requests at once (4 clusters x 3 singles, plus a
// gang on a fifth): all complete, and no gate is left READY or CLAIMING.
TEST(CaptureGate, R121EveryClusterRequestingAtOnceCompletesAndLeavesNoGateReady) {
  Watchdog dog;
  Rig rig(12);
  std::vector<std::unique_ptr<Buf>> bufs;
  for (uint64_t t = 0; t < 12; ++t) {
    bufs.push_back(std::make_unique<Buf>(256, static_cast<float>(t)));
    bufs.push_back(std::make_unique<Buf>(256, -1.f));
    rig.add_task(t, {bufs[2 * t].get()}, {bufs[2 * t + 1].get()});
  }
  rig.start_aicpu();
  std::array<Status, 12> st;
  std::atomic<int> go{0};
  std::vector<std::thread> ts;
  for (uint32_t c = 0; c < 12; ++c) {
    ts.emplace_back([&, c] {
      eventually([&] { return go.load() != 0; });
      st[c] = rig.participate(
          c, c, false, [&, c] { std::fill(bufs[2 * c + 1]->data.begin(), bufs[2 * c + 1]->data.end(), c + 0.5f); });
    });
  }
  go.store(1);
  for (auto& t : ts) t.join();
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
  for (uint32_t g = 0; g < 8; ++g) {
    const SlotState s = claim_state(rig.slot_word(g, SlotWordId::kClaim));
    EXPECT_TRUE(s == SlotState::kSettled || s == SlotState::kFree) << "gate " << g;
  }
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  ASSERT_EQ(dump->args.size(), 24u);
  for (const DumpedArg& x : dump->args) {
    const float want = x.stage == DumpStage::kBefore ? static_cast<float>(x.task) : x.task + 0.5f;
    EXPECT_EQ(dumped_element(*dump, x, 255), want) << "task " << x.task;
  }
}

// ---- R107-R112: the service step ---------------------------------------------------------------

// R110, R111, R128 (A9): the test thread is the supervisor. Three singles on
// one lane publish; the first observed holds an argument of many chunks.
// Each step copies at most max_bytes (the lane's payload grows by at most
// that per step), the other requests are answered WouldBlock between its
// chunks, and reservations open in observation order.
TEST(CaptureService, R110R111ServiceStepsAreBoundedAndFollowFirstObservation) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.max_bytes = 4096;
  DumpLaneConfig lane;
  lane.arena_bytes = 1 << 20;
  Rig rig(9, cfg, lane);
  Buf big(64 * 1024, 1.f), strided(4096, 2.f), small(16, 3.f), out(16);
  rig.add_task(0, {&big}, {});
  // A strided view: every other element (non-unit innermost stride).
  {
    TaskArgs args;
    DeviceBuffer d{reinterpret_cast<uint64_t>(strided.data.data()), strided.data.size() * sizeof(float)};
    TensorView v = d.view({2048}, DType::F32);
    const int64_t shape[1] = {2048}, stride[1] = {2};
    v = TensorView::from_parts(d, DType::F32, 1, shape, stride, 0);
    args.add_tensor(v, Tag::Input);
    std::array<TensorView, kMaxTaskArgs> views;
    views[0] = v;
    rig.capture->add_task(1, 7, args, views.data());
  }
  rig.add_task(2, {&small}, {&out});
  std::vector<std::pair<uint32_t, uint64_t>> observed;
  rig.hooks.observed = [&](uint32_t, uint32_t core, uint64_t tick) { observed.emplace_back(core, tick); };
  std::array<Status, 3> st;
  std::vector<std::thread> ts;
  const uint32_t cores[3] = {0, 3, 6};  // clusters 0, 1, 2: one lane
  // Publish one at a time so the observation order is fixed: 0, then 3, then 6.
  for (uint32_t i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] { st[i] = rig.participate(cores[i], i, false); });
    ASSERT_TRUE(eventually(
        [&] { return std::atomic_ref<uint64_t>(rig.control->requests[cores[i]].request_tick).load() != 0; }));
    rig.run->service(0);
  }
  uint64_t steps = 0;
  uint64_t last_bytes = rig.collector->lane(0).reservation_open() ? rig.collector->lane(0).open_copied() : 0;
  EXPECT_LE(last_bytes, 3 * cfg.max_bytes) << "three steps so far";
  std::vector<uint32_t> sealed_order;
  while (sealed_order.size() < 6 && steps < 100000) {
    const uint64_t collected = rig.collector->lane(0).counts().collected;
    const bool was_open = rig.collector->lane(0).reservation_open();
    rig.run->service(0);
    ++steps;
    const uint64_t bytes = rig.collector->lane(0).open_copied();
    // Within one reservation (no commit in the step) the cursor moves by at most max_bytes.
    if (was_open && rig.collector->lane(0).counts().collected == collected && bytes > last_bytes) {
      EXPECT_LE(bytes - last_bytes, cfg.max_bytes) << "a step copied more than max_bytes";
    }
    last_bytes = rig.collector->lane(0).reservation_open() ? bytes : 0;
    sealed_order.clear();
    for (const Event& e : rig.snapshot()) {
      if (e.kind == idx(CapturePoint::kServed) && e.word == static_cast<uint64_t>(AckStatus::kSealed)) {
        sealed_order.push_back(e.core);
      }
    }
    if (sealed_order.size() < 6) yield_cpu();
  }
  for (auto& t : ts) t.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_GE(observed.size(), 6u);  // each core's BEFORE and AFTER, and each further argument
  EXPECT_EQ(observed[0].first, 0u);
  EXPECT_EQ(observed[1].first, 3u);
  EXPECT_EQ(observed[2].first, 6u);
  // BEFORE seals in observation order: 0's 64 KiB took 64 steps, yet 3 and 6 waited.
  ASSERT_GE(sealed_order.size(), 3u);
  EXPECT_EQ(sealed_order[0], 0u);
  const std::vector<Event> ev = rig.snapshot();
  EXPECT_GT(count(ev, idx(CapturePoint::kServed), static_cast<uint64_t>(AckStatus::kWouldBlock)), 0u)
      << "the later requests were never answered WouldBlock between the first's chunks";
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->counts.dropped, 0u);
  EXPECT_EQ(dump->counts.total, dump->counts.collected);
  for (const DumpedArg& x : dump->args) {
    if (x.task == 1) {
      ASSERT_EQ(dumped_elements(x), 2048u);
      for (uint64_t i = 0; i < 2048; ++i) ASSERT_EQ(dumped_element(*dump, x, i), 2.f);
    }
  }
}

// ---- R113-R117, R129, R131: abort -------------------------------------------------------------

// R131: the seed's worked walk, scripted with the test thread as the AICPU.
// Publisher A (core 2, forced last arriver at AFTER), peers B and C (cores 0,
// 1); E (core 4, another cluster on the same lane) publishes meanwhile.
// Argument 0 (128 KiB) goes in two chunks (InProgress at 64 KiB, then
// commit); E, observed before A's next request, takes the lane, so argument 1
// meets WouldBlock; once E is done argument 1 (the arena clamp) is reserved
// and copied one chunk; A's watchdog fires (the script does its CAS); the
// AICPU abandons and answers Aborted with A's phase_seq; B and C leave on
// that word. Host view: argument 0 committed, argument 1 one dropped
// record, nothing sealed, the gate READY, the lane unsettled (unknown).
TEST(CaptureAbort, R131TheWorkedWalk) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.max_bytes = 64 * 1024;
  DumpLaneConfig lane;
  lane.arena_bytes = 8 << 20;
  Rig rig(6, cfg, lane);
  Buf arg0(32 * 1024, 1.f), arg1(1 << 20, 2.f), in(4, 0.f), ebig(256 * 1024, 4.f);
  rig.add_task(9, {&in}, {&arg0, &arg1});  // AFTER: args[1] and args[2]
  rig.add_task(78, {&ebig}, {});
  std::atomic<int> arrived_after{0};
  rig.on_point = [&](CapturePoint p, uint32_t, uint32_t, uint64_t ph) {
    if (p == CapturePoint::kArrived && ph == 2) arrived_after.fetch_add(1);
  };
  rig.hooks.slot_access = [&](uint32_t core, uint32_t slot, SlotWordId w, SlotOp op) {
    if (slot == 0 && core == 2 && w == SlotWordId::kArrivedAfter && op == SlotOp::kFetchOr) {
      eventually([&] { return arrived_after.load() == 2; });
    }
  };
  const auto tick_of = [&](uint32_t c) {
    return std::atomic_ref<uint64_t>(rig.control->requests[c].request_tick).load();
  };
  const auto ack_of = [&](uint32_t c, uint64_t ArgsCaptureAck::*f) {
    return std::atomic_ref<uint64_t>(rig.control->acks[c].*f).load();
  };
  const auto status = [](AckStatus s) { return static_cast<uint64_t>(s); };
  // BEFORE of task 9 runs with a live AICPU thread; the script takes AFTER.
  std::array<Status, 3> st;
  std::atomic<int> executing{0};
  std::atomic<int> finish{0};
  rig.start_aicpu();
  std::thread gang([&] {
    st = run_gang(rig, 9, [&](uint32_t) {
      executing.fetch_add(1);
      eventually([&] { return finish.load() != 0; });
    });
  });
  ASSERT_TRUE(eventually([&] { return executing.load() == 3; }));
  rig.stop_aicpu();
  finish.store(1);
  // Step 1: A publishes phase_seq, arg 0, cursor 0; peers follow publisher_after.
  ASSERT_TRUE(eventually([&] { return count(rig.snapshot(), idx(CapturePoint::kPublished)) == 2; }));
  const uint64_t pub = rig.slot_word(0, SlotWordId::kPublisherAfter);
  ASSERT_EQ(pub >> 32, 3u) << "A (core 2) publishes AFTER";
  const uint64_t seq = pub & 0xffffffffu;
  const uint64_t a0 = tick_of(2);
  // Step 2: a chunk; InProgress at 64 KiB.
  rig.run->service(0);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::status), status(AckStatus::kInProgress));
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::arg_cursor), 64u * 1024);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::phase_seq), seq);
  // E publishes while A's argument 0 is open.
  Status e_status;
  std::thread e([&] {
    Participant p;
    p.core = 4;
    p.bit = 2;
    p.mask = 2;
    p.task_id = 78;
    e_status = rig.run->enter_single(p, 1);
    if (e_status.ok()) e_status = rig.run->phase(p, CapturePhase::kBefore, rig.ids[4]);
  });
  ASSERT_TRUE(eventually([&] { return tick_of(4) != 0 && tick_of(2) == a0 + 1; }));
  // Step 3: the rest of argument 0 (the step's whole budget), committed; E is observed, behind A.
  const DumpCounts c0 = rig.collector->lane(0).counts();
  rig.run->service(0);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::arg_cursor), resident::kCursorDone);
  EXPECT_EQ(rig.collector->lane(0).counts().collected, c0.collected + 1) << "argument 0 committed";
  EXPECT_FALSE(rig.collector->lane(0).reservation_open());
  // Step 4: A republishes arg 1: another core's reservation is open: WouldBlock, nothing accounted.
  ASSERT_TRUE(eventually([&] { return tick_of(2) == a0 + 2; }));
  const DumpCounts c1 = rig.collector->lane(0).counts();
  rig.run->service(0);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::status), status(AckStatus::kWouldBlock));
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::request_tick), a0 + 2);
  EXPECT_TRUE(rig.collector->lane(0).reservation_open()) << "E, observed first, holds the lane";
  EXPECT_EQ(rig.collector->lane(0).counts().total, c1.total + 1) << "only E's argument was counted";
  // Step 5: E finishes; A's argument 1 is reserved and copied one chunk.
  // Bounded by time, not by a count of steps: on a loaded machine E may
  // not run between thousands of them, and its seal comes only from here.
  const uint64_t step_deadline = now_ns() + static_cast<uint64_t>(std::chrono::nanoseconds(kWait).count());
  while (!(ack_of(2, &ArgsCaptureAck::status) == status(AckStatus::kInProgress) &&
           ack_of(2, &ArgsCaptureAck::arg_index) == 1) &&
         now_ns() < step_deadline) {
    rig.run->service(0);
    yield_cpu();
  }
  e.join();
  ASSERT_TRUE(e_status.ok()) << e_status.to_string();
  ASSERT_TRUE(rig.collector->lane(0).reservation_open()) << "argument 1 is reserved";
  const DumpCounts c2 = rig.collector->lane(0).counts();
  EXPECT_EQ(c2.collected, c1.collected + 1) << "E's record";
  EXPECT_EQ(c2.dropped, 0u) << "WouldBlock answers were charged";
  EXPECT_EQ(c2.total, c2.collected + 1) << "argument 1 counted once, however often it was retried";
  // Step 6: A's watchdog fires mid-argument 1: the abort CAS, as its budget would do it.
  uint64_t expected = 0;
  ASSERT_TRUE(rig.slot_ref(0, SlotWordId::kAborted).compare_exchange_strong(expected, 1 | 2 << 8));
  const uint64_t t = ack_of(2, &ArgsCaptureAck::request_tick);
  ASSERT_TRUE(eventually([&] { return tick_of(2) != t; }));
  rig.run->service(0);
  EXPECT_FALSE(rig.collector->lane(0).reservation_open());
  const DumpCounts c3 = rig.collector->lane(0).counts();
  EXPECT_EQ(c3.collected, c2.collected) << "nothing committed from the abandoned reservation";
  EXPECT_EQ(c3.dropped, 1u) << "argument 1 is exactly one dropped record";
  EXPECT_EQ(c3.total, c3.collected + c3.dropped);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::status), status(AckStatus::kAborted));
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::phase_seq), seq);
  EXPECT_EQ(ack_of(2, &ArgsCaptureAck::run_epoch), kEpoch);
  // Step 7: A, B and C leave on that word; nothing sealed; the gate stays READY | n.
  gang.join();
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_FALSE(st[c].ok()) << "core " << c;
    EXPECT_TRUE(contains(st[c].message(), "aborted")) << st[c].to_string();
  }
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kClaim), claim_word(SlotState::kReady, 1));
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kReleasedAfter), 0u);
  const std::vector<Event> ev = rig.snapshot();
  EXPECT_EQ(count(ev, idx(CapturePoint::kSettled)), 0u) << "a gate settled (E ran only its BEFORE phase)";
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_FALSE(dump->complete) << "the aborted lane's accounting must read unknown";
  EXPECT_EQ(dump->counts.total, dump->counts.collected + dump->counts.dropped);
  bool arg0_committed = false;
  for (const DumpedArg& x : dump->args) {
    EXPECT_FALSE(x.task == 9 && x.arg == 2) << "argument 1 (args[2]) was committed";
    if (x.task == 9 && x.arg == 1 && x.stage == DumpStage::kAfter) {
      arg0_committed = true;
      EXPECT_EQ(dumped_element(*dump, x, 32 * 1024 - 1), 1.f);
    }
  }
  EXPECT_TRUE(arg0_committed) << "the committed argument 0 was retracted";
}

// R113, R114 (the walk without a reservation), R116 (second item): the
// AICPU never answers: the publisher's first budget expires (abort CAS,
// TIMEOUT, it keeps polling), its second budget ends the wait; nothing was
// reserved, so nothing is dropped and nothing counted; the gate stays READY.
TEST(CaptureAbort, R113R116AnAicpuThatNeverAnswersEndsInTheFatalPathWithNothingCharged) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.first_budget_ns = 30'000'000;
  cfg.second_budget_ns = 120'000'000;
  Rig rig(3, cfg);
  Buf a(4, 1), b(4);
  rig.add_task(0, {&a}, {&b});
  rig.serving.store(false);
  rig.start_aicpu();
  const Status st = rig.participate(1, 0, false);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "ARGS_CAPTURE_TIMEOUT")) << st.to_string();
  const std::vector<Event> ev = rig.snapshot();
  EXPECT_EQ(count(ev, idx(CapturePoint::kAbortCas)), 1u);
  EXPECT_EQ(count(ev, kExecute), 0u);
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kAborted), 1u | 1u << 8);
  EXPECT_EQ(claim_state(rig.slot_word(0, SlotWordId::kClaim)), SlotState::kReady);
  const DumpCounts c = rig.collector->lane(0).counts();
  EXPECT_EQ(c.total, 0u);
  EXPECT_EQ(c.dropped, 0u);
}

// R113, R114, R129 (A10): the AICPU answers only after the abort. The waiter
// is still parked after its CAS (no execute, no release) until the Aborted
// ack; an open reservation is abandoned: exactly one dropped record, the
// arena rolled back, nothing committed, the lane unsettled.
TEST(CaptureAbort, R114R129AnAbortAbandonsTheOpenReservationAndReleasesOnlyOnTheAck) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.first_budget_ns = 40'000'000;
  cfg.max_bytes = 1024;
  Rig rig(3, cfg);
  Buf a(64 * 1024, 1), b(4);
  rig.add_task(0, {&a}, {&b});
  rig.serving.store(false);
  Status st;
  std::thread core([&] { st = rig.participate(1, 0, false); });
  ASSERT_TRUE(eventually([&] { return std::atomic_ref<uint64_t>(rig.control->requests[1].request_tick).load() != 0; }));
  rig.run->service(0);  // hooks say no
  rig.serving.store(true);
  rig.run->service(0);  // reserved, chunk 1
  ASSERT_TRUE(rig.collector->lane(0).reservation_open());
  rig.serving.store(false);
  ASSERT_TRUE(eventually([&] { return count(rig.snapshot(), idx(CapturePoint::kAbortCas)) == 1; }));
  // After its CAS the waiter keeps polling: it has not left.
  EXPECT_TRUE(core.joinable());
  EXPECT_EQ(count(rig.snapshot(), idx(CapturePoint::kSealAccepted)), 0u);
  const DumpCounts mid = rig.collector->lane(0).counts();
  rig.serving.store(true);
  ASSERT_TRUE(eventually([&] {
    rig.run->service(0);
    return count(rig.snapshot(), idx(CapturePoint::kSealAccepted)) == 1;
  }));
  core.join();
  EXPECT_TRUE(contains(st.message(), "ARGS_CAPTURE_TIMEOUT")) << st.to_string();
  EXPECT_EQ(count(rig.snapshot(), kExecute), 0u);
  const DumpCounts c = rig.collector->lane(0).counts();
  EXPECT_EQ(c.collected, mid.collected);
  EXPECT_EQ(c.dropped, mid.dropped + 1);
  EXPECT_EQ(c.total, c.collected + c.dropped);
  EXPECT_TRUE(rig.run->aborted());
  EXPECT_EQ(rig.slot_word(0, SlotWordId::kReleasedBefore), 0u);
  EXPECT_EQ(claim_state(rig.slot_word(0, SlotWordId::kClaim)), SlotState::kReady);
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_FALSE(dump->complete);
}

// ---- R94, R101, R106: access discipline, line order, payload visibility ----------------------

// R94: a slot word has no plain access at all: no copy, no assignment from
// a value, no conversion to one, and a slot line cannot be copied whole.
static_assert(!std::is_copy_constructible_v<resident::SlotWord> && !std::is_copy_assignable_v<resident::SlotWord>);
static_assert(!std::is_assignable_v<resident::SlotWord&, uint64_t> &&
              !std::is_convertible_v<resident::SlotWord, uint64_t>);
static_assert(!std::is_copy_assignable_v<ArgsCaptureSlot> && !std::is_copy_constructible_v<ArgsCaptureSlot>);

constexpr int kLineKind = 200;  // a line event in the rig's log: kLineKind + LineEvent

// R94's checker: it wraps the slot primitives (every access reports its
// word and op) and the line ops. It flags an op a word may not see, any line
// event on the slot array, and, at each quiescent point, any gate word whose
// value changed without a primitive write to it since the last one (a
// non-atomic store).
struct SlotChecker {
  explicit SlotChecker(Rig& rig) : rig(rig) {
    rig.hooks.slot_access = [this](uint32_t core, uint32_t slot, SlotWordId w, SlotOp op) {
      on_access(core, slot, w, op);
    };
    rig.hooks.line = [this](resident::LineEvent ev, uint32_t, const void* addr, uint64_t bytes) {
      const auto* lo = reinterpret_cast<const uint8_t*>(&this->rig.control->slots[0]);
      const auto* hi = lo + sizeof(this->rig.control->slots);
      const auto* a = static_cast<const uint8_t*>(addr);
      if (a != nullptr && a < hi && a + bytes > lo)
        flag("a line event (" + std::to_string(static_cast<int>(ev)) + ") on the slot array");
    };
    snapshot();
  }
  void on_access(uint32_t core, uint32_t slot, SlotWordId w, SlotOp op) {
    ++accesses;
    bool allowed = op == SlotOp::kLoad;
    switch (w) {
      case SlotWordId::kClaim:
        allowed = allowed || op == SlotOp::kCas || op == SlotOp::kStore;
        break;
      case SlotWordId::kArrivedBefore:
      case SlotWordId::kArrivedAfter:
      case SlotWordId::kReleasedBefore:
      case SlotWordId::kReleasedAfter:
        allowed = allowed || op == SlotOp::kFetchOr || op == SlotOp::kStore;  // the claimer's init_clear
        break;
      case SlotWordId::kPublisherBefore:
      case SlotWordId::kPublisherAfter:
        allowed = allowed || op == SlotOp::kStore;
        break;
      case SlotWordId::kAborted:
        allowed = allowed || op == SlotOp::kCas || op == SlotOp::kStore;
        break;
    }
    if (!allowed)
      flag("core " + std::to_string(core) + " did op " + std::to_string(static_cast<int>(op)) + " on word " +
           std::to_string(static_cast<int>(w)));
    if (op != SlotOp::kLoad) {
      std::lock_guard<std::mutex> lock(mu);
      written.insert({slot, static_cast<int>(w)});
    }
  }
  void flag(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    flags.push_back(what);
  }
  // Everything quiet: every changed word must have seen a primitive write.
  void quiescent(const std::string& where) {
    std::lock_guard<std::mutex> lock(mu);
    for (uint32_t g = 0; g < 72; ++g) {
      for (int w = 0; w < 8; ++w) {
        const uint64_t v = rig.slot_word(g, static_cast<SlotWordId>(w));
        if (v != last[g][w] && !written.count({g, w})) {
          flags.push_back(where + ": gate " + std::to_string(g) + " word " + std::to_string(w) +
                          " changed without an atomic");
        }
        last[g][w] = v;
      }
    }
    written.clear();
  }
  void snapshot() {
    for (uint32_t g = 0; g < 72; ++g) {
      for (int w = 0; w < 8; ++w) last[g][w] = rig.slot_word(g, static_cast<SlotWordId>(w));
    }
  }
  Rig& rig;
  std::mutex mu;
  std::set<std::pair<uint32_t, int>> written;
  std::array<std::array<uint64_t, 8>, 72> last{};
  std::vector<std::string> flags;
  std::atomic<uint64_t> accesses{0};
};

// R94: gangs, singles on two clusters, and an aborted phase, under the
// checker: every slot access is one of the four single-word atomics, no line
// op touches a slot, and no gate word changes outside them.
TEST(CaptureGate, R94EverySlotAccessIsOneAtomicAndNoLineOpTouchesASlot) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.first_budget_ns = 30'000'000;
  Rig rig(6, cfg);
  SlotChecker check(rig);
  Buf a(64, 1), b(64);
  for (uint64_t t = 0; t < 8; ++t) rig.add_task(t, {&a}, {&b});
  // The aborted phase at the end: the AICPU answers only after the waiter's abort CAS.
  rig.on_point = [&](CapturePoint p, uint32_t, uint32_t, uint64_t) {
    if (p == CapturePoint::kAbortCas) rig.serving.store(true);
  };
  rig.start_aicpu();
  for (uint64_t t = 0; t < 3; ++t) {
    for (const Status& st : run_gang(rig, t)) ASSERT_TRUE(st.ok()) << st.to_string();
    check.quiescent("gang " + std::to_string(t));
  }
  std::array<Status, 4> st;
  std::vector<std::thread> ts;
  const uint32_t cores[4] = {0, 1, 3, 4};
  for (uint32_t i = 0; i < 4; ++i) ts.emplace_back([&, i] { st[i] = rig.participate(cores[i], 3 + i, false); });
  for (auto& t : ts) t.join();
  for (const Status& x : st) ASSERT_TRUE(x.ok()) << x.to_string();
  check.quiescent("singles");
  rig.serving.store(false);
  const Status aborted = rig.participate(5, 7, false);
  EXPECT_FALSE(aborted.ok());
  rig.stop_aicpu();
  check.quiescent("abort");
  EXPECT_GT(check.accesses.load(), 100u);
  std::lock_guard<std::mutex> lock(check.mu);
  for (const std::string& f : check.flags) ADD_FAILURE() << f;
}

struct LineLog {
  resident::LineEvent ev;
  uint32_t actor;
  const void* addr;
  uint64_t bytes;
  ArgsCaptureRequest req;  // at a request line's flush: its contents
  ArgsCaptureAck ack;      // at an ack line's flush: its contents
};

// R101: the recorder order on the lines. Every ack is status, index, cursor,
// tick, then the identity (epoch, task) with phase_seq the very last, then
// the flush; every request has request_tick last, then the flush. One
// argument goes in chunks and a second follows: the publisher republishes
// per chunk and per argument, advancing index, cursor and tick, never its
// phase_seq, and each ack echoes the tick it answers.
TEST(CaptureLines, R101ProgressAndSealFollowTheRecorderOrder) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.max_bytes = 1024;
  Rig rig(3, cfg);
  Buf big(2048, 1.f), small(16, 2.f), out(16);
  rig.add_task(0, {&big, &small}, {&out});
  std::mutex mu;
  std::vector<LineLog> log;
  rig.hooks.line = [&](resident::LineEvent ev, uint32_t actor, const void* addr, uint64_t bytes) {
    LineLog e{ev, actor, addr, bytes, {}, {}};
    const auto* a = static_cast<const uint8_t*>(addr);
    const auto* req0 = reinterpret_cast<const uint8_t*>(&rig.control->requests[0]);
    const auto* ack0 = reinterpret_cast<const uint8_t*>(&rig.control->acks[0]);
    if (ev == resident::LineEvent::kFlush && a >= req0 && a < req0 + sizeof(rig.control->requests)) {
      for (int i = 0; i < 8; ++i) {
        reinterpret_cast<uint64_t*>(&e.req)[i] =
            std::atomic_ref<uint64_t>(const_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(a))[i]).load();
      }
    }
    if (ev == resident::LineEvent::kFlush && a >= ack0 && a < ack0 + sizeof(rig.control->acks)) {
      for (int i = 0; i < 8; ++i) {
        reinterpret_cast<uint64_t*>(&e.ack)[i] =
            std::atomic_ref<uint64_t>(const_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(a))[i]).load();
      }
    }
    if (ev == resident::LineEvent::kInvalidate) return;
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(e);
  };
  rig.start_aicpu();
  ASSERT_TRUE(rig.participate(1, 0, false).ok());
  rig.stop_aicpu();
  std::lock_guard<std::mutex> lock(mu);
  const auto* req_base = reinterpret_cast<const uint8_t*>(&rig.control->requests[1]);
  const auto* ack_base = reinterpret_cast<const uint8_t*>(&rig.control->acks[1]);
  const std::vector<size_t> ack_order = {offsetof(ArgsCaptureAck, status),     offsetof(ArgsCaptureAck, arg_index),
                                         offsetof(ArgsCaptureAck, arg_cursor), offsetof(ArgsCaptureAck, request_tick),
                                         offsetof(ArgsCaptureAck, run_epoch),  offsetof(ArgsCaptureAck, task_id),
                                         offsetof(ArgsCaptureAck, phase_seq)};
  std::vector<size_t> req_order;
  for (size_t o = 0; o < 64; o += 8) req_order.push_back(o);  // request_tick (56) last
  std::vector<size_t> ack_stores, req_stores;
  std::vector<ArgsCaptureRequest> requests;
  std::vector<ArgsCaptureAck> acks;
  for (const LineLog& e : log) {
    const auto* a = static_cast<const uint8_t*>(e.addr);
    const bool on_ack = a >= ack_base && a < ack_base + 64;
    const bool on_req = a >= req_base && a < req_base + 64;
    if (e.ev == resident::LineEvent::kStore && on_ack) ack_stores.push_back(static_cast<size_t>(a - ack_base));
    if (e.ev == resident::LineEvent::kStore && on_req) req_stores.push_back(static_cast<size_t>(a - req_base));
    if (e.ev == resident::LineEvent::kFlush && on_ack) {
      EXPECT_EQ(e.actor, UINT32_MAX) << "only the AICPU writes an ack line";
      EXPECT_EQ(ack_stores, ack_order) << "ack " << acks.size() << ": the identity, phase_seq last, then the flush";
      ack_stores.clear();
      acks.push_back(e.ack);
    }
    if (e.ev == resident::LineEvent::kFlush && on_req) {
      EXPECT_EQ(e.actor, 1u) << "only its core writes a request line";
      EXPECT_EQ(req_stores, req_order) << "request " << requests.size() << ": request_tick last, then the flush";
      req_stores.clear();
      requests.push_back(e.req);
    }
  }
  EXPECT_TRUE(ack_stores.empty() && req_stores.empty()) << "a line was written and never flushed";
  // BEFORE: 2 KiB + 64 B of input in 1 KiB steps; AFTER: one output.
  ASSERT_GE(requests.size(), 4u);
  uint64_t chunk_moves = 0, arg_moves = 0;
  for (size_t i = 1; i < requests.size(); ++i) {
    const ArgsCaptureRequest& p = requests[i - 1];
    const ArgsCaptureRequest& r = requests[i];
    EXPECT_GT(r.request_tick, p.request_tick);
    if (r.phase != p.phase) continue;
    EXPECT_EQ(r.phase_seq, p.phase_seq) << "a republish advanced phase_seq";
    EXPECT_TRUE(r.arg_index > p.arg_index || (r.arg_index == p.arg_index && r.arg_cursor >= p.arg_cursor));
    if (r.arg_index == p.arg_index && r.arg_cursor > p.arg_cursor) ++chunk_moves;
    if (r.arg_index > p.arg_index) ++arg_moves;
  }
  EXPECT_GE(chunk_moves, 1u) << "no republish per chunk";
  EXPECT_GE(arg_moves, 1u) << "no republish per argument";
  // Each ack answers the request whose tick it echoes, with that request's identity.
  for (const ArgsCaptureAck& k : acks) {
    const auto it = std::find_if(requests.begin(), requests.end(),
                                 [&](const ArgsCaptureRequest& r) { return r.request_tick == k.request_tick; });
    ASSERT_NE(it, requests.end()) << "an ack echoes a tick never requested";
    EXPECT_EQ(k.phase_seq, it->phase_seq);
    EXPECT_EQ(k.task_id, it->task_id);
    EXPECT_EQ(k.run_epoch, kEpoch);
  }
}

// R106: the three cores of a gang each write a third of the output. Each
// flushes its outputs before it arrives at AFTER; the AICPU invalidates each
// argument's tensor extent before its seal, and the dumped bytes are every
// core's writes (the publisher's barrier alone would carry only its own).
TEST(CaptureLines, R106OutputsAreFlushedBeforeArrivalAndInvalidatedBeforeTheCopy) {
  Watchdog dog;
  Rig rig(3);
  Buf in(96, 4.f), out(96, -1.f);
  rig.add_task(0, {&in}, {&out});
  rig.hooks.line = [&](resident::LineEvent ev, uint32_t actor, const void* addr, uint64_t bytes) {
    if (ev == resident::LineEvent::kFlushOutputs) rig.log(kLineKind + static_cast<int>(ev), actor, 0, bytes);
    if (ev == resident::LineEvent::kInvalidate && actor == UINT32_MAX) {
      if (addr == in.data.data() && bytes == 96 * sizeof(float)) rig.log(kLineKind + static_cast<int>(ev), actor, 0, 1);
      if (addr == out.data.data() && bytes == 96 * sizeof(float))
        rig.log(kLineKind + static_cast<int>(ev), actor, 0, 2);
    }
  };
  rig.start_aicpu();
  const auto st = run_gang(rig, 0, [&](uint32_t c) {
    for (uint32_t i = 0; i < 32; ++i) out.data[c * 32 + i] = static_cast<float>(c + 1);
  });
  for (const Status& x : st) ASSERT_TRUE(x.ok()) << x.to_string();
  const std::vector<Event> ev = rig.snapshot();
  const int flush_outputs = kLineKind + static_cast<int>(resident::LineEvent::kFlushOutputs);
  const int invalidate = kLineKind + static_cast<int>(resident::LineEvent::kInvalidate);
  bool flushed[3] = {};
  int seals = 0;
  bool inv_in = false, inv_out = false;
  for (const Event& e : ev) {
    if (e.kind == flush_outputs) flushed[e.core] = true;
    if (e.kind == idx(CapturePoint::kArrived) && e.word == 2) {
      EXPECT_TRUE(flushed[e.core]) << "core " << e.core << " arrived at AFTER before flushing its outputs";
    }
    if (e.kind == invalidate) (e.word == 1 ? inv_in : inv_out) = true;
    if (e.kind == idx(CapturePoint::kServed) && e.word == static_cast<uint64_t>(AckStatus::kSealed)) {
      ++seals;
      EXPECT_TRUE(seals == 1 ? inv_in : inv_out) << "seal " << seals << " before its tensor extent was invalidated";
    }
  }
  EXPECT_EQ(seals, 2);
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  ASSERT_EQ(dump->args.size(), 2u);
  for (const DumpedArg& x : dump->args) {
    for (uint64_t i = 0; i < 96; ++i) {
      const double want = x.stage == DumpStage::kBefore ? 4.0 : static_cast<double>(i / 32 + 1);
      ASSERT_EQ(dumped_element(*dump, x, i), want)
          << "element " << i << " of the " << dump_stage_name(x.stage) << " record";
    }
  }
}

// ---- R108, R109, R112, R125, R127: reservations, accounting, back-pressure --------------------

// A task's BEFORE phase run on its own thread, the test thread being the supervisor.
struct Single {
  Single(Rig& rig, uint32_t core, uint64_t task) : rig(rig), core(core) {
    t = std::thread([this, task] {
      st = this->rig.participate(this->core, task, false);
      done.store(true);
    });
  }
  ~Single() {
    if (t.joinable()) t.join();
  }
  uint64_t tick() const { return std::atomic_ref<uint64_t>(rig.control->requests[core].request_tick).load(); }
  uint64_t ack(uint64_t ArgsCaptureAck::*f) const {
    return std::atomic_ref<uint64_t>(rig.control->acks[core].*f).load();
  }
  // Waits for a request newer than `after`, then runs one service step.
  void step_after(uint64_t after, uint32_t lane = 0) {
    EXPECT_TRUE(eventually([&] { return tick() != after; })) << "core " << core << " never republished";
    rig.run->service(lane);
  }
  Rig& rig;
  uint32_t core;
  Status st;
  std::atomic<bool> done{false};
  std::thread t;
};

// R109: the accounting classes. (1) A would-block on the arena predicate
// (the host stopped acknowledging) is answered WouldBlock, retried, not
// charged: the argument is counted once in total, and once the host
// acknowledges it commits with nothing dropped. (2) The abort walk with no
// reservation: a waiter whose argument only ever met WouldBlock times out;
// the AICPU abandons nothing and charges nothing. The walk with a
// reservation (exactly one charge) is R114R129's test.
TEST(CaptureService, R109AWouldBlockIsRetriedUnchargedAndAnAbortWithoutAReservationChargesNothing) {
  Watchdog dog;
  DumpLaneConfig lane;
  lane.arena_bytes = 64 * 1024;                     // a payload is clamped to 32 KiB
  Buf a0(8192, 1.f), a1(8192, 2.f), a2(8192, 3.f);  // 32 KiB each
  {
    Rig rig(3, {}, lane);
    rig.add_task(0, {&a0, &a1, &a2}, {});
    rig.hold(0, true);
    Single s(rig, 1, 0);
    uint64_t t = 0;
    // a0 and a1 fill the arena; a2 meets the arena predicate.
    while (!(s.ack(&ArgsCaptureAck::status) == static_cast<uint64_t>(AckStatus::kWouldBlock))) {
      s.step_after(t);
      t = s.ack(&ArgsCaptureAck::request_tick);
      ASSERT_FALSE(s.done.load());
    }
    const DumpCounts blocked = rig.collector->lane(0).counts();
    EXPECT_EQ(blocked.collected, 2u);
    EXPECT_EQ(blocked.total, 3u);
    for (int retry = 0; retry < 5; ++retry) {
      s.step_after(t);
      t = s.ack(&ArgsCaptureAck::request_tick);
      EXPECT_EQ(s.ack(&ArgsCaptureAck::status), static_cast<uint64_t>(AckStatus::kWouldBlock));
    }
    EXPECT_EQ(rig.collector->lane(0).counts().total, 3u) << "a retried would-block was counted again";
    EXPECT_EQ(rig.collector->lane(0).counts().dropped, 0u) << "a would-block was charged";
    rig.hold(0, false);
    ASSERT_TRUE(eventually([&] {
      if (s.tick() != t) {
        t = s.tick();
        rig.run->service(0);
      }
      return s.ack(&ArgsCaptureAck::status) == static_cast<uint64_t>(AckStatus::kSealed);
    }));
    // AFTER has no arguments: its own seal.
    ASSERT_TRUE(eventually([&] {
      rig.run->service(0);
      return s.done.load();
    }));
    s.t.join();
    ASSERT_TRUE(s.st.ok()) << s.st.to_string();
    auto dump = rig.finish();
    ASSERT_TRUE(dump.ok()) << dump.status().to_string();
    EXPECT_TRUE(dump->complete);
    EXPECT_EQ(dump->counts.total, 3u);
    EXPECT_EQ(dump->counts.collected, 3u);
    EXPECT_EQ(dump->counts.dropped, 0u);
  }
  {
    CaptureConfig cfg;
    cfg.first_budget_ns = 50'000'000;
    Rig rig(3, cfg, lane);
    rig.add_task(0, {&a0, &a1, &a2}, {});
    rig.hold(0, true);  // never acknowledged
    Single s(rig, 1, 0);
    ASSERT_TRUE(eventually([&] {
      rig.run->service(0);
      return s.done.load();
    }));
    s.t.join();
    EXPECT_TRUE(contains(s.st.message(), "ARGS_CAPTURE_TIMEOUT")) << s.st.to_string();
    EXPECT_EQ(count(rig.snapshot(), idx(CapturePoint::kAbortCas)), 1u);
    EXPECT_FALSE(rig.collector->lane(0).reservation_open());
    const DumpCounts c = rig.collector->lane(0).counts();
    EXPECT_EQ(c.collected, 2u);
    EXPECT_EQ(c.dropped, 0u) << "the watchdog charged a would-block that never reserved";
    EXPECT_EQ(c.total, 2u) << "the withdrawn would-block is not an argument of the dump";
    EXPECT_TRUE(rig.run->aborted());
    rig.hold(0, false);
    auto dump = rig.finish();
    ASSERT_TRUE(dump.ok()) << dump.status().to_string();
    EXPECT_FALSE(dump->complete) << "an aborted lane's accounting must read unknown";
    EXPECT_EQ(dump->counts.total, dump->counts.collected + dump->counts.dropped);
  }
}

// R125 (A6), R108: the A/B schedule. A holds the lane's reservation mid-copy;
// B's request is answered WouldBlock with nothing counted, and no metadata
// buffer is published while A's reservation is open. A's watchdog fires and
// the AICPU abandons: the arena offset and the record count are exactly
// their pre-reservation values (B's record starts where A's would have),
// and B then takes the lane.
TEST(CaptureService, R125TheLaneReservationABSchedule) {
  Watchdog dog;
  CaptureConfig cfg;
  cfg.max_bytes = 1024;
  DumpLaneConfig lane;
  lane.records_per_buffer = 1;  // every commit publishes: any publication shows
  Rig rig(6, cfg, lane);
  Buf big(4096, 1.f), small(64, 2.f);
  rig.add_task(0, {&big}, {});
  rig.add_task(1, {&small}, {});
  rig.hold(0, true);  // the test drains the lane itself
  std::atomic<bool> abandoned{false};
  DumpCounts at_abandon;
  rig.on_point = [&](CapturePoint p, uint32_t core, uint32_t, uint64_t w) {
    // On the service thread, right after the abandon and before the Aborted ack.
    if (p == CapturePoint::kServed && core == 0 && w == static_cast<uint64_t>(AckStatus::kAborted)) {
      at_abandon = rig.collector->lane(0).counts();
      abandoned.store(true);
    }
  };
  Doorbell& host = rig.collector->lane(0).host_bell();
  std::vector<DumpRecord> seen;
  const auto drain = [&] {
    return rig.collector->lane(0).drain(
        [&](const DumpRecord& r, const uint8_t*, size_t, const uint8_t*, size_t) { seen.push_back(r); });
  };
  Single a(rig, 0, 0);
  a.step_after(0);
  ASSERT_TRUE(rig.collector->lane(0).reservation_open());
  const uint32_t published = host.arm();
  const DumpCounts open = rig.collector->lane(0).counts();
  EXPECT_EQ(open.total, 1u);
  Single b(rig, 3, 1);
  ASSERT_TRUE(eventually([&] { return b.tick() != 0 && a.tick() != a.ack(&ArgsCaptureAck::request_tick); }));
  rig.run->service(0);  // A's next chunk; B observed behind it
  for (int i = 0; i < 3; ++i) {
    const uint64_t t = b.ack(&ArgsCaptureAck::request_tick);
    if (b.tick() == t)
      b.step_after(t);
    else
      rig.run->service(0);
  }
  EXPECT_EQ(b.ack(&ArgsCaptureAck::status), static_cast<uint64_t>(AckStatus::kWouldBlock));
  EXPECT_TRUE(rig.collector->lane(0).reservation_open()) << "A's reservation yielded";
  EXPECT_EQ(rig.collector->lane(0).counts().total, open.total) << "B's would-block was counted";
  EXPECT_EQ(rig.collector->lane(0).counts().dropped, 0u);
  EXPECT_EQ(host.arm(), published) << "a metadata buffer was published while A's reservation was open";
  EXPECT_EQ(drain(), 0u);
  // A's watchdog, as its budget would fire it; the AICPU abandons on A's next request.
  uint64_t expected = 0;
  ASSERT_TRUE(rig.slot_ref(0, SlotWordId::kAborted).compare_exchange_strong(expected, 1 | 1 << 8));
  a.step_after(a.ack(&ArgsCaptureAck::request_tick));
  ASSERT_TRUE(eventually([&] { return a.done.load(); })) << "A did not leave on its Aborted ack";
  ASSERT_TRUE(abandoned.load());
  EXPECT_EQ(at_abandon.collected, open.collected) << "the record count moved";
  EXPECT_EQ(at_abandon.total, open.total);
  EXPECT_EQ(at_abandon.dropped, 1u) << "the abandon is one refused record";
  // B takes the lane: its record starts at A's pre-reservation offset.
  ASSERT_TRUE(eventually([&] {
    rig.run->service(0);
    return b.done.load();
  }));
  b.t.join();
  ASSERT_TRUE(b.st.ok()) << b.st.to_string();
  drain();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].task_id, 1u);
  EXPECT_EQ(seen[0].arena_pos, 0u) << "the arena was not rolled back to its pre-reservation offset";
  const DumpCounts end = rig.collector->lane(0).counts();
  EXPECT_EQ(end.total, end.collected + end.dropped);
}

// R107: the four-call producer surface, each return value: try_begin
// answers kDone (reserved) or kWouldBlock (the arena predicate, nothing
// reserved), copy_chunk kInProgress until the last byte then kDone, commit
// counts one collected, abandon one dropped. A strided gather (innermost
// stride 2, rows of 8) resumed in 12-byte chunks, each ending mid-row, gives
// the bytes of a one-shot gather.
TEST(CaptureService, R107TheResumableProducerSurfaceAndAStridedGatherResumedAcrossChunks) {
  DumpLaneConfig c;
  c.arena_bytes = 8192;
  Buf base(1024);
  for (size_t i = 0; i < base.data.size(); ++i) base.data[i] = static_cast<float>(i);
  DeviceBuffer d{reinterpret_cast<uint64_t>(base.data.data()), base.data.size() * sizeof(float)};
  const int64_t shape[2] = {64, 8}, stride[2] = {16, 2};
  const DumpSource strided{reinterpret_cast<const uint8_t*>(base.data.data()),
                           TensorView::from_parts(d, DType::F32, 2, shape, stride, 1)};
  std::vector<std::vector<uint8_t>> payloads;
  const DumpLane::Sink sink = [&](const DumpRecord&, const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    std::vector<uint8_t> bytes(a, a + na);
    bytes.insert(bytes.end(), b, b + nb);
    payloads.push_back(std::move(bytes));
  };
  auto chunked = DumpLane::create(c).value();
  ASSERT_EQ(chunked->try_begin(DumpRecord{}, &strided), DumpStep::kDone);
  int steps = 0;
  while (chunked->copy_chunk(12) == DumpStep::kInProgress) ++steps;
  EXPECT_EQ(steps, 2048 / 12) << "a 2 KiB payload in 12-byte chunks";
  const DumpCounts open = chunked->counts();
  EXPECT_EQ(open.total, 1u);
  EXPECT_EQ(open.collected, 0u) << "counted before commit";
  chunked->commit();
  EXPECT_EQ(chunked->counts().collected, 1u);
  // The arena (8 KiB) holds the 2 KiB record and one more clamp-sized 4 KiB payload, not two.
  Buf big(2048, 5.f);
  const DumpSource sbig{reinterpret_cast<const uint8_t*>(big.data.data()), big.view()};
  ASSERT_EQ(chunked->try_begin(DumpRecord{}, &sbig), DumpStep::kDone);
  EXPECT_EQ(chunked->copy_chunk(4096), DumpStep::kDone);
  chunked->commit();
  EXPECT_EQ(chunked->try_begin(DumpRecord{}, &sbig), DumpStep::kWouldBlock);
  EXPECT_FALSE(chunked->reservation_open());
  EXPECT_EQ(chunked->counts().dropped, 0u) << "a would-block was charged";
  chunked->drain(sink);  // the host acknowledges: room again
  ASSERT_EQ(chunked->try_begin(DumpRecord{}, &sbig), DumpStep::kDone);
  EXPECT_EQ(chunked->counts().total, 3u) << "the retry was counted again";
  EXPECT_EQ(chunked->copy_chunk(1024), DumpStep::kInProgress);
  chunked->abandon();
  EXPECT_EQ(chunked->counts().dropped, 1u);
  EXPECT_EQ(chunked->counts().total, chunked->counts().collected + chunked->counts().dropped);
  ASSERT_TRUE(chunked->drain_final(sink).ok());
  ASSERT_EQ(payloads.size(), 2u);

  auto whole = DumpLane::create(c).value();
  ASSERT_EQ(whole->try_begin(DumpRecord{}, &strided), DumpStep::kDone);
  ASSERT_EQ(whole->copy_chunk(1 << 20), DumpStep::kDone);
  whole->commit();
  std::vector<std::vector<uint8_t>> chunked_payloads = std::move(payloads);
  payloads.clear();
  ASSERT_TRUE(whole->drain_final(sink).ok());
  ASSERT_EQ(payloads.size(), 1u);
  EXPECT_EQ(chunked_payloads[0], payloads[0]) << "the resumed gather differs from the one-shot gather";
  const auto* f = reinterpret_cast<const float*>(payloads[0].data());
  EXPECT_EQ(f[0], 1.f);
  EXPECT_EQ(f[9], 1.f + 16 + 2) << "row 1, column 1 of the view";
}

// R125 (A6), the abandon-under-a-full-buffer walk: A holds record 255 of a
// 256-record buffer and abandons it. The count stays 255, one record is
// charged, the arena rolls back; the buffer then switches (the host sees
// its 255 records) and B opens record 0 of the next buffer.
TEST(CaptureService, R125AbandoningTheLastRecordOfABufferSwitchesItAndWedgesNothing) {
  DumpLaneConfig c;
  c.buffers = 2;
  c.records_per_buffer = 256;
  c.arena_bytes = 1 << 20;
  auto lane = DumpLane::create(c);
  ASSERT_TRUE(lane.ok()) << lane.status().to_string();
  DumpLane& L = **lane;
  Buf x(16, 7.f), big(4096, 8.f);
  const auto src = [](const Buf& b) { return DumpSource{reinterpret_cast<const uint8_t*>(b.data.data()), b.view()}; };
  const DumpSource sx = src(x), sbig = src(big);
  for (uint64_t i = 0; i < 255; ++i) {
    DumpRecord r;
    r.task_id = i;
    ASSERT_EQ(L.try_begin(r, &sx), DumpStep::kDone);
    ASSERT_EQ(L.copy_chunk(1 << 20), DumpStep::kDone);
    L.commit();
  }
  std::vector<DumpRecord> seen;
  const DumpLane::Sink sink = [&](const DumpRecord& r, const uint8_t*, size_t, const uint8_t*, size_t) {
    seen.push_back(r);
  };
  EXPECT_EQ(L.drain(sink), 0u) << "a 255-record buffer was published early";
  DumpRecord a;
  a.task_id = 1000;
  ASSERT_EQ(L.try_begin(a, &sbig), DumpStep::kDone);
  ASSERT_EQ(L.copy_chunk(1024), DumpStep::kInProgress);
  L.abandon();
  EXPECT_EQ(L.counts().collected, 255u);
  EXPECT_EQ(L.counts().dropped, 1u);
  EXPECT_EQ(L.counts().total, 256u);
  EXPECT_EQ(L.drain(sink), 255u) << "the switch did not proceed after the abandon";
  DumpRecord b;
  b.task_id = 2000;
  ASSERT_EQ(L.try_begin(b, &sx), DumpStep::kDone);
  ASSERT_EQ(L.copy_chunk(1 << 20), DumpStep::kDone);
  L.commit();
  ASSERT_TRUE(L.drain_final(sink).ok());
  ASSERT_EQ(seen.size(), 256u);
  EXPECT_EQ(seen[255].task_id, 2000u) << "B is record 0 of the next buffer, after A's 255";
  EXPECT_EQ(seen[255].arena_pos, 255u * 64) << "B's bytes start where A's rolled back";
  for (uint64_t i = 0; i < 255; ++i) EXPECT_EQ(seen[i].arena_pos, i * 64);
}

// R108: at most one open reservation per lane, as a property over random
// interleavings of try_begin, copy_chunk, commit, abandon, the watchdog's
// withdrawal and the host's drains, for three cores sharing one lane
// (seeded; the seed is printed). After every step: reserved == count +
// open; the open reservation's bytes are the last taken (committed records
// are contiguous in the arena: an abandon left no hole); no metadata buffer
// is published while a reservation is open; host-facing counters move only
// at commit or abandon; total == collected + dropped whenever nothing is pending.
TEST(CaptureService, R108OneOpenReservationPerLaneUnderRandomInterleavings) {
  Watchdog dog;
  const uint64_t base = 0x5108;
  for (uint64_t round = 0; round < 40; ++round) {
    uint64_t seed = base + round;
    SCOPED_TRACE("seed " + std::to_string(seed));
    DumpLaneConfig c;
    c.buffers = 2;
    c.records_per_buffer = 3;
    c.arena_bytes = 8192;  // payloads up to 4 KiB: the arena predicate bites
    auto made = DumpLane::create(c);
    ASSERT_TRUE(made.ok());
    DumpLane& L = **made;
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<DumpSource> srcs;
    for (uint64_t k = 0; k < 6; ++k) {
      bufs.push_back(std::make_unique<Buf>(64 << k, static_cast<float>(k)));  // 256 B .. 8 KiB (clamped)
      srcs.push_back({reinterpret_cast<const uint8_t*>(bufs.back()->data.data()), bufs.back()->view()});
    }
    // The supervisor's view, as CaptureRun keeps it: one owner, one pending argument.
    int owner = -1, pending = -1;
    uint64_t pending_src = 0;
    uint64_t committed = 0, abandoned = 0, opened = 0;
    uint64_t next_pos = 0;  // where the next committed record's bytes must start
    std::vector<uint64_t> order;
    const DumpLane::Sink sink = [&](const DumpRecord& r, const uint8_t*, size_t na, const uint8_t*, size_t nb) {
      EXPECT_EQ(r.arena_pos, next_pos) << "a committed record does not follow the last one's bytes";
      EXPECT_EQ(na + nb, r.payload_bytes);
      next_pos = r.arena_pos + r.payload_bytes;
    };
    for (int step = 0; step < 400; ++step) {
      const uint32_t core = static_cast<uint32_t>(splitmix(seed) % 3);
      const uint64_t action = splitmix(seed) % 6;
      const DumpCounts before = L.counts();
      const uint32_t bell = L.host_bell().arm();
      const bool was_open = L.reservation_open();
      if (action <= 1) {  // the core's request reaches the supervisor
        const bool busy =
            (owner >= 0 && owner != static_cast<int>(core)) || (pending >= 0 && pending != static_cast<int>(core));
        if (owner < 0 && !busy) {
          if (pending < 0) pending_src = splitmix(seed) % srcs.size();
          DumpRecord r;
          r.task_id = core;
          const DumpStep st = L.try_begin(r, &srcs[pending_src]);
          if (st == DumpStep::kDone) {
            owner = static_cast<int>(core);
            pending = -1;
            ++opened;
            EXPECT_EQ(L.counts().collected, before.collected);
            EXPECT_EQ(L.counts().dropped, before.dropped);
          } else {
            EXPECT_EQ(L.counts().total, before.total + (pending < 0 ? 1 : 0)) << "a retried would-block was recounted";
            pending = static_cast<int>(core);
          }
        }
        // Lane busy: WouldBlock without touching the lane (nothing counted).
        if (busy) {
          EXPECT_EQ(L.counts().total, before.total);
        }
      } else if (action == 2 && owner >= 0) {
        (void)L.copy_chunk(1 + splitmix(seed) % 2048);
        const DumpCounts now = L.counts();
        EXPECT_TRUE(now.total == before.total && now.collected == before.collected && now.dropped == before.dropped)
            << "a chunk moved a host-facing counter";
      } else if (action == 3 && owner >= 0) {
        while (L.copy_chunk(4096) == DumpStep::kInProgress) {
        }
        EXPECT_EQ(L.host_bell().arm(), bell) << "a buffer was published while a reservation was open";
        L.commit();
        owner = -1;
        ++committed;
      } else if (action == 4 && (owner >= 0 || pending >= 0)) {  // the watchdog
        if (owner >= 0) {
          L.abandon();
          owner = -1;
          ++abandoned;
        } else {
          L.withdraw_pending();
          pending = -1;
        }
      } else if (action == 5) {
        L.drain(sink);
      }
      if (was_open && L.reservation_open()) {
        EXPECT_EQ(L.host_bell().arm(), bell) << "a buffer was published while a reservation was open";
      }
      ASSERT_EQ(L.reservation_open(), owner >= 0) << "step " << step;
      const DumpCounts now = L.counts();
      EXPECT_EQ(opened - abandoned, now.collected + (owner >= 0 ? 1 : 0))
          << "reserved != count + open at step " << step;
      EXPECT_EQ(now.collected, committed);
      EXPECT_EQ(now.dropped, abandoned);
      if (owner < 0 && pending < 0) {
        ASSERT_EQ(now.total, now.collected + now.dropped) << "step " << step;
      }
    }
    if (owner >= 0) L.abandon();
    if (pending >= 0) L.withdraw_pending();
    ASSERT_TRUE(L.drain_final(sink).ok());
    const DumpCounts end = L.counts();
    EXPECT_EQ(end.total, end.collected + end.dropped);
    EXPECT_GT(end.collected, 0u);
  }
}

// R112: the host stops acknowledging lane 0's payloads. Its publisher is
// answered WouldBlock step after step, while the same supervisor loop keeps
// serving lane 1's core through five whole tasks and polling its error
// latch between steps; once the host acknowledges again lane 0 completes.
TEST(CaptureService, R112BackPressureNeverBlocksTheSupervisor) {
  Watchdog dog;
  DumpLaneConfig lane;
  lane.arena_bytes = 64 * 1024;
  Rig rig(6, {}, lane, 2);  // cluster 0 -> lane 0, cluster 1 -> lane 1
  Buf a0(8192, 1.f), a1(8192, 2.f), a2(8192, 3.f), x(64, 4.f), y(64);
  rig.add_task(0, {&a0, &a1, &a2}, {});
  for (uint64_t t = 1; t <= 5; ++t) rig.add_task(t, {&x}, {&y});
  rig.hold(0, true);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> latch_polls{0};
  std::atomic<uint32_t> error_latch{0};
  std::thread supervisor([&] {
    while (!stop.load()) {
      rig.run->service(0);
      rig.run->service(1);
      (void)error_latch.load();  // the run's error latch, polled between steps
      latch_polls.fetch_add(1);
      // A core's request rings the bell; the park's deadline keeps the latch polled.
      spin_then_park(
          rig.env.aicpu, [&] { return stop.load(); }, SpinPolicy{}, now_ns() + 1'000'000);
    }
  });
  Single blocked(rig, 0, 0);
  ASSERT_TRUE(eventually(
      [&] { return blocked.ack(&ArgsCaptureAck::status) == static_cast<uint64_t>(AckStatus::kWouldBlock); }));
  // Lane 1's core runs five whole tasks meanwhile.
  for (uint64_t t = 1; t <= 5; ++t) {
    const Status st = rig.participate(3, t, false);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_FALSE(blocked.done.load()) << "lane 0 finished with its host silent";
  const uint64_t polls = latch_polls.load();
  ASSERT_TRUE(eventually([&] { return latch_polls.load() > polls + 10; })) << "the supervisor stopped polling";
  EXPECT_GT(count(rig.snapshot(), idx(CapturePoint::kServed), static_cast<uint64_t>(AckStatus::kWouldBlock)), 1u);
  EXPECT_EQ(rig.collector->lane(0).counts().dropped, 0u);
  rig.hold(0, false);
  ASSERT_TRUE(eventually([&] { return blocked.done.load(); }));
  stop.store(true);
  supervisor.join();
  blocked.t.join();
  ASSERT_TRUE(blocked.st.ok()) << blocked.st.to_string();
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->counts.collected, 3u + 10u);
  EXPECT_EQ(dump->counts.dropped, 0u);
}

// R127 (A8), scaled down: FULL capture of a 48-task chain (each task reads
// the previous one's 64 KiB output and writes its own) against a 256 KiB
// arena. The host starts silent, so the capture back-pressures; it then
// drains as it goes. No deadlock, every record complete (never short), the
// would-blocks added no dropped record, and total == collected + dropped.
TEST(CaptureService, R127ArenaPressureOnAChainBackPressuresWithoutDeadlockOrShortRecords) {
  Watchdog dog;
  DumpLaneConfig lane;
  lane.arena_bytes = 256 * 1024;
  Rig rig(9, {}, lane);
  constexpr uint64_t kTasks = 48;
  constexpr size_t kFloats = 16 * 1024;  // 64 KiB
  std::vector<std::unique_ptr<Buf>> bufs;
  for (uint64_t t = 0; t <= kTasks; ++t) bufs.push_back(std::make_unique<Buf>(kFloats, t == 0 ? 1.f : 0.f));
  for (uint64_t t = 0; t < kTasks; ++t) rig.add_task(t, {bufs[t].get()}, {bufs[t + 1].get()});
  rig.hold(0, true);
  std::atomic<uint64_t> would_blocks{0};
  rig.on_point = [&](CapturePoint p, uint32_t, uint32_t, uint64_t w) {
    // The first would-block ends the host's silence.
    if (p == CapturePoint::kServed && w == static_cast<uint64_t>(AckStatus::kWouldBlock) &&
        would_blocks.fetch_add(1) == 0) {
      rig.hold(0, false);
    }
  };
  rig.start_aicpu();
  for (uint64_t t = 0; t < kTasks; ++t) {
    const uint32_t core = static_cast<uint32_t>(3 * (t % 3));  // three clusters, one lane
    Buf& in = *bufs[t];
    Buf& out = *bufs[t + 1];
    const Status st = rig.participate(core, t, false, [&] {
      for (size_t i = 0; i < kFloats; ++i) out.data[i] = in.data[i] + 1.f;
    });
    ASSERT_TRUE(st.ok()) << "task " << t << ": " << st.to_string();
  }
  EXPECT_GT(would_blocks.load(), 0u) << "the arena never pushed back";
  auto dump = rig.finish();
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->counts.total, 2 * kTasks);
  EXPECT_EQ(dump->counts.collected, 2 * kTasks);
  EXPECT_EQ(dump->counts.dropped, 0u) << "a would-block that cleared was charged";
  EXPECT_EQ(dump->counts.total, dump->counts.collected + dump->counts.dropped);
  ASSERT_EQ(dump->args.size(), 2 * kTasks);
  for (const DumpedArg& x : dump->args) {
    ASSERT_FALSE(x.truncated);
    ASSERT_EQ(x.bytes, kFloats * sizeof(float)) << "a short record";
    const double want = static_cast<double>(x.task + (x.stage == DumpStage::kBefore ? 1 : 2));
    EXPECT_EQ(dumped_element(*dump, x, 0), want) << "task " << x.task;
    EXPECT_EQ(dumped_element(*dump, x, kFloats - 1), want) << "task " << x.task;
  }
}

}  // namespace
}  // namespace simpler::testing
