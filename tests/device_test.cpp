// Layer src/device: GM's configured size (its allocator is tested in
// first_fit_allocator_test.cpp), geometry presets, kernel loading and callable
// identity, one core's register hand-off (ACK, then FIN with the token), and
// SimDevice start/stop.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device/sim/core.h"
#include "device/sim/global_memory.h"
#include "device/sim/sim_device.h"
#include "forced_load.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::eventually;
using testing::Watchdog;

// ---- GlobalMemory ------------------------------------------------------------------------------

std::unique_ptr<GlobalMemory> make_gm(uint64_t bytes) {
  auto gm = GlobalMemory::create(bytes);
  EXPECT_TRUE(gm.ok()) << gm.status().to_string();
  return gm.ok() ? std::move(gm).value() : nullptr;
}

TEST(GlobalMemory, CreateRefusesAbsurdSizes) {
  EXPECT_REFUSED(GlobalMemory::create(0).status(), StatusCode::kInvalidArgument, "device_memory_bytes");
  EXPECT_REFUSED(GlobalMemory::create(63).status(), StatusCode::kInvalidArgument, "device_memory_bytes");
  EXPECT_REFUSED(GlobalMemory::create((uint64_t{1} << 44) + 1).status(), StatusCode::kInvalidArgument,
                 "device_memory_bytes");
  auto gm = make_gm(1000);  // the total is reported as configured; whole 64-byte blocks are allocatable
  ASSERT_NE(gm, nullptr);
  EXPECT_EQ(gm->total_bytes(), 1000u);
  EXPECT_EQ(gm->free_bytes(), 960u);
  EXPECT_TRUE(gm->allocate(960).ok());
  EXPECT_EQ(gm->free_bytes(), 0u);
}

// Pins count, guarded or not: free() is refused while any pin is left,
// unpinning more often than pinned never leaves a pin behind nor wraps the
// count, and an address that was never pinned is ignored. An allocation freed
// after its pins went back carries none into the allocation made at its
// address next.
TEST(GlobalMemory, PinsCountAndEveryUnpinIsMatched) {
  for (const bool guarded : {false, true}) {
    SCOPED_TRACE(guarded ? "guarded" : "unguarded");
    auto made = GlobalMemory::create(1 << 16, guarded);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    GlobalMemory& gm = **made;
    auto a = gm.allocate(256);
    ASSERT_TRUE(a.ok());
    gm.unpin(*a);  // never pinned: ignored
    ASSERT_TRUE(gm.pin(*a).ok());
    ASSERT_TRUE(gm.pin(*a).ok());
    gm.unpin(*a);
    EXPECT_REFUSED(gm.free(*a), StatusCode::kFailedPrecondition, "in use by a live run");
    gm.unpin(*a);
    gm.unpin(*a);  // one more than pinned: ignored, not a count below zero
    ASSERT_TRUE(gm.pin(*a).ok());
    EXPECT_REFUSED(gm.free(*a), StatusCode::kFailedPrecondition, "in use by a live run");
    gm.unpin(*a);
    ASSERT_TRUE(gm.free(*a).ok());
    EXPECT_REFUSED(gm.pin(*a), StatusCode::kInvalidArgument, "not a live device allocation");
    auto b = gm.allocate(256);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, *a);  // first fit: the same address again
    EXPECT_TRUE(gm.free(*b).ok()) << "the freed allocation's pins carried over";
  }
}

// ---- Geometry ----------------------------------------------------------------------------------

TEST(Geometry, PresetsHaveTheDocumentedShapes) {
  Geometry s = Geometry::small();
  EXPECT_EQ(s.name, "small");
  EXPECT_EQ(s.clusters, 2u);
  EXPECT_EQ(s.aic_cores(), 2u);
  EXPECT_EQ(s.aiv_cores(), 4u);
  EXPECT_EQ(s.cores(), 6u);
  EXPECT_EQ(s.aicpu_threads, 2u);
  Geometry a = Geometry::a2a3();
  EXPECT_EQ(a.clusters, 24u);
  EXPECT_EQ(a.cores(), 72u);
  EXPECT_EQ(a.aicpu_threads, 4u);
  Geometry f = Geometry::a5();
  EXPECT_EQ(f.clusters, 36u);
  EXPECT_EQ(f.cores(), 108u);
  ASSERT_EQ(Geometry::presets().size(), 3u);
  for (const Geometry& g : Geometry::presets()) {
    EXPECT_TRUE(g.validate().ok());
    auto by = Geometry::by_name(g.name);
    ASSERT_TRUE(by.ok());
    EXPECT_EQ(by->clusters, g.clusters);
  }
  EXPECT_EQ(WorkerConfig{}.geometry.name, "small");  // the default
}

TEST(Geometry, BadGeometryIsRefusedNamingTheField) {
  EXPECT_REFUSED(Geometry::by_name("huge").status(), StatusCode::kInvalidArgument, "huge");
  EXPECT_REFUSED((Geometry{"g", 0, 2}.validate()), StatusCode::kInvalidArgument, "geometry.clusters");
  EXPECT_REFUSED((Geometry{"g", 100000, 2}.validate()), StatusCode::kInvalidArgument, "geometry.clusters");
  EXPECT_REFUSED((Geometry{"g", 2, 0}.validate()), StatusCode::kInvalidArgument, "geometry.aicpu_threads");
  EXPECT_REFUSED((Geometry{"g", 2, 1000}.validate()), StatusCode::kInvalidArgument, "geometry.aicpu_threads");
}

// ---- KernelLibrary and ChipCallable ------------------------------------------------------------

void noop_kernel(int64_t*) {}
void other_kernel(int64_t*) {}

TEST(KernelLibrary, RegistersFunctionsAndRefusesDuplicates) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(3, CoreType::AIC, "noop", noop_kernel).ok());
  EXPECT_REFUSED(k.add_function(3, CoreType::AIV, "other", other_kernel), StatusCode::kInvalidArgument, "func_id 3");
  EXPECT_REFUSED(k.add_function(4, CoreType::AIV, "null", nullptr), StatusCode::kInvalidArgument, "func_id 4");
  const KernelInfo* info = k.find(3);
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->core, CoreType::AIC);
  EXPECT_EQ(info->fn, &noop_kernel);
  EXPECT_EQ(info->name, "noop");
  EXPECT_EQ(k.find(4), nullptr);
  EXPECT_EQ(k.all().size(), 1u);
}

TEST(KernelLibrary, LoadsAKernelSharedObjectBuiltWithTheCMakeHelper) {
  KernelLibrary k;
  Status s = k.add_file(7, CoreType::AIV, SIMPLER_TEST_KERNEL);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const KernelInfo* info = k.find(7);
  ASSERT_NE(info, nullptr);
  EXPECT_NE(info->fn, nullptr);
  EXPECT_EQ(info->name, SIMPLER_TEST_KERNEL);
  // Its identity is the file content: loading the same file twice gives the same digest.
  KernelLibrary k2;
  ASSERT_TRUE(k2.add_file(7, CoreType::AIV, SIMPLER_TEST_KERNEL).ok());
  EXPECT_EQ(k2.find(7)->content, info->content);
  // Call it directly on host memory.
  float x[4] = {1, 2, 3, 4};
  DeviceTensor t{reinterpret_cast<uint64_t>(x), static_cast<uint32_t>(DType::F32), 1, {4}, {1}};
  float factor = 2.0f;
  uint32_t bits;
  std::memcpy(&bits, &factor, 4);
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&t)), static_cast<int64_t>(bits)};
  info->fn(args);
  EXPECT_EQ(x[3], 8.0f);
}

TEST(KernelLibrary, BadKernelFilesAreRefusedNamingThePath) {
  KernelLibrary k;
  EXPECT_REFUSED(k.add_file(1, CoreType::AIV, "/nonexistent/kernel.so"), StatusCode::kNotFound,
                 "/nonexistent/kernel.so");
  const std::string junk = ::testing::TempDir() + "simpler_not_a_kernel.so";
  {
    std::ofstream out(junk, std::ios::binary);
    out << "this is not an ELF file";
  }
  EXPECT_REFUSED(k.add_file(1, CoreType::AIV, junk), StatusCode::kInvalidArgument, junk);
  std::remove(junk.c_str());
  // A real shared object without kernel_entry.
  EXPECT_REFUSED(k.add_file(1, CoreType::AIV, SIMPLER_LIBRARY_PATH), StatusCode::kInvalidArgument, "kernel_entry");
  EXPECT_TRUE(k.all().empty());  // nothing half-registered
  ASSERT_TRUE(k.add_file(1, CoreType::AIV, SIMPLER_TEST_KERNEL).ok());
  EXPECT_REFUSED(k.add_file(1, CoreType::AIV, SIMPLER_TEST_KERNEL), StatusCode::kInvalidArgument, "func_id 1");
}

Status no_orchestration(ChipOrchestrator&, const TaskArgs&) { return Status(); }

TEST(ChipCallable, DigestCoversNameSignatureAndKernels) {
  auto lib = [](CoreType core, simpler_kernel_fn fn, const char* name) {
    KernelLibrary k;
    EXPECT_TRUE(k.add_function(0, core, name, fn).ok());
    return k;
  };
  const std::vector<Param> sig = {Param::input(), Param::output()};
  ChipCallable base("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"), sig);
  ChipCallable same("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"), sig);
  EXPECT_EQ(base.digest(), same.digest());
  EXPECT_EQ(digest_hex(base.digest()).size(), 64u);
  ChipCallable renamed("d", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"), sig);
  ChipCallable resigned("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"), {Param::input()});
  ChipCallable redirected("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"),
                          {Param::input(), Param::inout()});
  ChipCallable recored("c", no_orchestration, lib(CoreType::AIC, noop_kernel, "noop"), sig);
  ChipCallable rekerneled("c", no_orchestration, lib(CoreType::AIV, other_kernel, "other"), sig);
  ChipCallable retyped("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"),
                       {Param::input().with_dtype(DType::F32), Param::output()});
  ChipCallable reshaped("c", no_orchestration, lib(CoreType::AIV, noop_kernel, "noop"),
                        {Param::input(), Param::output().with_shape({-1, 4})});
  EXPECT_NE(retyped.digest(), reshaped.digest());
  for (const ChipCallable* c : {&renamed, &resigned, &redirected, &recored, &rekerneled, &retyped, &reshaped}) {
    EXPECT_NE(c->digest(), base.digest()) << c->name();
  }
}

// ---- One core: the register hand-off -----------------------------------------------------------

std::atomic<bool> g_release_kernel{false};
std::atomic<int> g_kernel_calls{0};

void counting_kernel(int64_t* args) {
  g_kernel_calls.fetch_add(1);
  *reinterpret_cast<int64_t*>(static_cast<uintptr_t>(args[0])) += args[1];
}
void blocking_kernel(int64_t*) {
  testing::eventually([] { return g_release_kernel.load(); });
}
std::atomic<int> g_calls_when_released{-1};
// Blocks like blocking_kernel, then notes how many counting kernels had run.
void blocking_then_count(int64_t*) {
  testing::eventually([] { return g_release_kernel.load(); });
  g_calls_when_released = g_kernel_calls.load();
}
void failing_kernel(int64_t*) {
  simpler_kernel_fail("first report");
  simpler_kernel_fail("second report is ignored");
}
void throwing_kernel(int64_t*) { throw std::runtime_error("kernel threw this"); }
void long_message_kernel(int64_t*) { simpler_kernel_fail(std::string(1000, 'x').c_str()); }

class CoreHandoff : public ::testing::Test {
 protected:
  void SetUp() override { core_.start(SpinPolicy{}); }
  void TearDown() override { core_.stop(); }

  // Posts the next token the way an AICPU does; returns it.
  uint32_t dispatch(simpler_kernel_fn fn, int64_t* args) { return post(++token_, fn, args, 0); }
  // Posts the next token as one queued behind another (revocable).
  uint32_t queue(simpler_kernel_fn fn, int64_t* args) { return post(++token_, fn, args, CoreRegisters::kRevocable); }
  uint32_t post(uint32_t token, simpler_kernel_fn fn, int64_t* args, uint64_t flags) {
    CoreRegisters& r = core_.regs();
    CoreRegisters::Descriptor& d = r.descriptor[CoreRegisters::slot_of(token)];
    d.fn = fn;
    d.args = args;
    d.token.store(token | flags, std::memory_order_release);
    r.bell.ring();
    return token;
  }
  // The AICPU's take-back of a queued token: true when the core had not claimed it.
  bool take_back(uint32_t token) {
    uint64_t posted = token | CoreRegisters::kRevocable;
    return core_.regs().descriptor[CoreRegisters::slot_of(token)].token.compare_exchange_strong(
        posted, posted | CoreRegisters::kRevoked);
  }
  // Waits (bounded) until the status says `token` ended; returns how it ended.
  CoreRegisters::Ended wait_end(uint32_t token) {
    const bool ended = eventually([&] {
      const uint64_t st = core_.regs().status.load(std::memory_order_acquire);
      return static_cast<int32_t>(CoreRegisters::ended_token(st) - token) >= 0;
    });
    EXPECT_TRUE(ended) << "token " << token << " never ended";
    return core_.regs().ended[CoreRegisters::slot_of(token)];
  }
  const char* message(uint32_t token) { return core_.regs().failure[CoreRegisters::slot_of(token)].message; }
  uint64_t status() { return core_.regs().status.load(std::memory_order_acquire); }

  Watchdog dog_;
  Doorbell owner_;
  Core core_{5, CoreType::AIV, 1, &owner_};
  uint32_t token_ = 0;
};

TEST_F(CoreHandoff, RunsTheKernelAndAnswersFinWithTheToken) {
  EXPECT_EQ(core_.id(), 5u);
  EXPECT_EQ(core_.type(), CoreType::AIV);
  EXPECT_EQ(core_.cluster(), 1u);
  int64_t value = 10;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 7};
  {
    // The core rings its owner with ring_parked(): only a waiter counted by
    // a Parking, as an AICPU thread on its way to a park, makes it ring.
    Doorbell::Parking parking(owner_);
    const uint32_t armed = owner_.arm();
    g_kernel_calls = 0;
    const uint32_t t = dispatch(counting_kernel, args);
    EXPECT_EQ(wait_end(t).failed, 0u);
    EXPECT_EQ(status(), CoreRegisters::kFin | t);
    EXPECT_EQ(value, 17);
    EXPECT_EQ(g_kernel_calls.load(), 1);
    EXPECT_EQ(core_.executed(), 1u);
    // The core rings after its FIN store, so the ring may still be on its way.
    EXPECT_TRUE(eventually([&] { return owner_.arm() != armed; }))
        << "the core did not ring its owner's doorbell on FIN";
  }
  // The next task runs too (a new token), and exactly once each.
  const uint32_t t2 = dispatch(counting_kernel, args);
  wait_end(t2);
  EXPECT_EQ(value, 24);
  EXPECT_EQ(g_kernel_calls.load(), 2);
}

TEST_F(CoreHandoff, AcksBeforeTheKernelFinishes) {
  g_release_kernel = false;
  const uint32_t t = dispatch(blocking_kernel, nullptr);
  uint64_t st = 0;
  ASSERT_TRUE(eventually([&] {
    st = status();
    return (st & CoreRegisters::kTokenMask) == t;
  }));
  EXPECT_EQ(st, CoreRegisters::kAck | t) << "expected ACK while the kernel runs";
  EXPECT_EQ(CoreRegisters::ended_token(st), t - 1) << "an ACK says only the tokens before it ended";
  g_release_kernel = true;
  wait_end(t);
}

// Tokens posted behind a running one wait for it, then run in order without
// another post; each ends with its own record, and the status after an ACK
// already says the token before it ended.
TEST_F(CoreHandoff, QueuedTokensRunInOrderOnceTheRunningOneEnds) {
  static_assert(CoreRegisters::kDepth >= 2, "a core holds a queued token");
  g_release_kernel = false;
  g_kernel_calls = 0;
  int64_t value = 0;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 1};
  g_calls_when_released = -1;
  const uint32_t blocked = dispatch(blocking_then_count, nullptr);
  ASSERT_TRUE(eventually([&] { return status() == (CoreRegisters::kAck | blocked); }));
  std::vector<uint32_t> queued;
  for (uint32_t i = 1; i < CoreRegisters::kDepth; ++i) queued.push_back(dispatch(counting_kernel, args));
  EXPECT_EQ(status(), CoreRegisters::kAck | blocked);
  g_release_kernel = true;
  EXPECT_EQ(wait_end(queued.back()).failed, 0u);
  EXPECT_EQ(g_calls_when_released.load(), 0) << "a queued token ran beside the one before it";
  EXPECT_EQ(g_kernel_calls.load(), static_cast<int>(queued.size()));
  EXPECT_EQ(value, static_cast<int64_t>(queued.size()));
  EXPECT_EQ(core_.executed(), 1u + queued.size());
}

// A queued token taken back before the core claimed it never runs as
// posted: the core waits for that token number's repost, and runs that.
TEST_F(CoreHandoff, AQueuedTokenTakenBackRunsOnlyAsReposted) {
  g_release_kernel = false;
  g_kernel_calls = 0;
  int64_t value = 0;
  int64_t first[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 1};
  int64_t reposted[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 100};
  const uint32_t blocked = dispatch(blocking_kernel, nullptr);
  ASSERT_TRUE(eventually([&] { return status() == (CoreRegisters::kAck | blocked); }));
  const uint32_t queued = queue(counting_kernel, first);
  ASSERT_TRUE(take_back(queued)) << "the core claimed a token queued behind a blocked kernel";
  g_release_kernel = true;
  wait_end(blocked);
  (void)post(queued, counting_kernel, reposted, 0);
  EXPECT_EQ(wait_end(queued).failed, 0u);
  EXPECT_EQ(value, 100) << "the core ran the token as first posted";
  EXPECT_EQ(g_kernel_calls.load(), 1);
}

// Once the core claimed a queued token it runs it, and taking it back fails.
TEST_F(CoreHandoff, AClaimedQueuedTokenCannotBeTakenBack) {
  g_release_kernel = false;
  int64_t value = 0;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 1};
  const uint32_t blocked = dispatch(blocking_kernel, nullptr);
  const uint32_t queued = queue(counting_kernel, args);
  g_release_kernel = true;
  wait_end(blocked);
  wait_end(queued);
  EXPECT_FALSE(take_back(queued)) << "a token the core ran was taken back";
  EXPECT_EQ(value, 1);
}

TEST_F(CoreHandoff, KernelFailureIsRecordedWithTheFirstMessage) {
  const uint32_t t = dispatch(failing_kernel, nullptr);
  EXPECT_NE(wait_end(t).failed, 0u);
  EXPECT_STREQ(message(t), "first report");
  // The next task starts clean.
  int64_t value = 0;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 1};
  EXPECT_EQ(wait_end(dispatch(counting_kernel, args)).failed, 0u);
}

// A failure among queued tokens is the failing token's own: the records of
// the tokens around it, in other slots, say they succeeded.
TEST_F(CoreHandoff, EachQueuedTokenKeepsItsOwnFailure) {
  static_assert(CoreRegisters::kDepth >= 3, "three tokens are held at once");
  g_release_kernel = false;
  int64_t value = 0;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 1};
  const uint32_t blocked = dispatch(blocking_kernel, nullptr);
  const uint32_t failing = dispatch(failing_kernel, nullptr);
  const uint32_t fine = dispatch(counting_kernel, args);
  g_release_kernel = true;
  EXPECT_EQ(wait_end(fine).failed, 0u);
  EXPECT_EQ(wait_end(blocked).failed, 0u);
  EXPECT_NE(wait_end(failing).failed, 0u);
  EXPECT_STREQ(message(failing), "first report");
  const uint32_t throwing = dispatch(throwing_kernel, nullptr);
  EXPECT_NE(wait_end(throwing).failed, 0u);
  EXPECT_STREQ(message(throwing), "kernel threw this");
  EXPECT_STREQ(message(failing), "first report") << "a later failure overwrote another slot's message";
}

TEST_F(CoreHandoff, AThrowingKernelFailsItsTaskWithTheExceptionText) {
  const uint32_t t = dispatch(throwing_kernel, nullptr);
  EXPECT_NE(wait_end(t).failed, 0u);
  EXPECT_STREQ(message(t), "kernel threw this");
}

TEST_F(CoreHandoff, ALongFailureMessageIsTruncated) {
  const uint32_t t = dispatch(long_message_kernel, nullptr);
  EXPECT_NE(wait_end(t).failed, 0u);
  EXPECT_EQ(std::strlen(message(t)), kKernelErrorBytes - 1);
}

// A stray call, on a thread running no kernel, is dropped: it neither
// crashes nor fails the next task a core runs.
TEST_F(CoreHandoff, AKernelFailOutsideAnyKernelFailsNothing) {
  simpler_kernel_fail("not on a core");
  int64_t value = 1;
  int64_t args[2] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(&value)), 2};
  EXPECT_EQ(wait_end(dispatch(counting_kernel, args)).failed, 0u);
  EXPECT_EQ(value, 3);
}

// ---- SimDevice ---------------------------------------------------------------------------------

class CountingProgram final : public AicpuProgram {
 public:
  explicit CountingProgram(uint32_t n) : polls_(n) {
    for (auto& p : polls_) p = 0;
  }
  bool poll(uint32_t aicpu) override {
    polls_[aicpu].fetch_add(1);
    return false;
  }
  uint64_t polls(uint32_t a) const { return polls_[a].load(); }

 private:
  std::vector<std::atomic<uint64_t>> polls_;
};

// Parks only when its program asks to be polled again by a time: once, on thread 0.
class PollAgainProgram final : public AicpuProgram {
 public:
  bool poll(uint32_t) override { return false; }
  uint64_t poll_again_by(uint32_t aicpu) override {
    if (aicpu != 0) return 0;
    return asked_.fetch_add(1) == 0 ? now_ns() + 2'000'000 : 0;
  }
  uint32_t asked() const { return asked_.load(); }

 private:
  std::atomic<uint32_t> asked_{0};
};

// A parked AICPU thread polls again by the time its program asked for,
// though nothing rings it (how a dispatcher takes back what waits behind a
// kernel that blocked, which rings nothing): it asks again before its next park.
TEST(SimDevice, AParkedAicpuThreadPollsAgainWhenItsProgramAsked) {
  Watchdog dog;
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  PollAgainProgram program;
  (*dev)->start(&program);
  EXPECT_TRUE(eventually([&] { return program.asked() >= 2; }))
      << "AICPU 0 parked past the time its program asked to be polled again";
  (*dev)->stop();
}

// Polls nothing; asks AICPU thread 0 to poll far longer than the device's
// window before it parks (what tensormap_and_ringbuffer's orchestrator asks
// while it waits for a host that comes back quickly).
class LongWindowProgram final : public AicpuProgram {
 public:
  static constexpr uint64_t kWindowNs = 600'000'000'000ull;
  bool poll(uint32_t aicpu) override {
    if (aicpu == 0) polls_.fetch_add(1);
    return false;
  }
  uint64_t idle_spin_ns(uint32_t aicpu, uint64_t spin_ns) const override { return aicpu == 0 ? kWindowNs : spin_ns; }
  uint64_t polls() const { return polls_.load(); }

 private:
  std::atomic<uint64_t> polls_{0};
};

// Issue 11: an AICPU thread polls for the window its program asks, not the
// device's: thread 0 is still polling after every other one parked (red when
// the device ignores the program's window: thread 0 parks with the others).
TEST(SimDevice, AnAicpuThreadPollsForTheWindowItsProgramAsks) {
  Watchdog dog;
  testing::ForcedLoadState quiet(0);
  testing::LoadSenseOff whole_windows;
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  LongWindowProgram program;
  const uint32_t others = Geometry::small().aicpu_threads - 1;
  (*dev)->start(&program);
  ASSERT_TRUE(eventually([&] { return (*dev)->aicpu_parks() >= others; })) << "the other AICPU threads never parked";
  const uint64_t polls = program.polls();
  EXPECT_TRUE(eventually([&] { return program.polls() > polls + 1000; }))
      << "AICPU 0 stopped polling inside its program's window: it parked";
  (*dev)->stop();
}

// Work that arrives, rung, while a thread's last empty poll runs: every
// second empty poll sleeps past the spin window (so that the thread heads for
// its park right after it), then publishes one item and rings the thread's
// bell. A thread that armed its bell only after that poll would park on the
// new value and never poll again.
class LastPollDelivery {
 public:
  static constexpr uint32_t kItems = 3;
  explicit LastPollDelivery(std::function<void()> ring) : ring_(std::move(ring)) {}
  // On the polling thread only.
  bool poll() {
    if (pending_) {
      pending_ = false;
      handled_.fetch_add(1);
      return true;
    }
    if (handled_.load() >= kItems) return false;
    std::this_thread::sleep_for(std::chrono::nanoseconds(SpinPolicy{}.spin_ns + 10'000));
    if (++empty_ % 2 == 0) {
      pending_ = true;
      ring_();
    }
    return false;
  }
  uint32_t handled() const { return handled_.load(); }

 private:
  std::function<void()> ring_;
  bool pending_ = false;
  uint32_t empty_ = 0;
  std::atomic<uint32_t> handled_{0};
};

class LastPollAicpuProgram final : public AicpuProgram {
 public:
  explicit LastPollAicpuProgram(SimDevice& device) : delivery_([&device] { device.ring_aicpu(0); }) {}
  bool poll(uint32_t aicpu) override { return aicpu == 0 && delivery_.poll(); }
  uint32_t handled() const { return delivery_.handled(); }

 private:
  LastPollDelivery delivery_;
};

// An AICPU thread arms its bell before the poll it parks after, so a ring
// that lands while that poll runs wakes it (red when the bell is armed after
// that poll: the thread sleeps on the ring's value).
TEST(SimDevice, ARingDuringAnAicpuThreadsLastPollIsNotLost) {
  Watchdog dog;
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  LastPollAicpuProgram program(**dev);
  (*dev)->start(&program);
  EXPECT_TRUE(eventually([&] { return program.handled() >= LastPollDelivery::kItems; }))
      << "AICPU 0 handled " << program.handled() << " of " << LastPollDelivery::kItems
      << " items: it parked through the ring of one published during its last poll";
  (*dev)->stop();
}

// The same on a core that runs a core program (the resident route's loop).
class LastPollCoreProgram final : public CoreProgram {
 public:
  explicit LastPollCoreProgram(SimDevice& device) : delivery_([&device] { device.core_registers(0).bell.ring(); }) {}
  bool core_poll(uint32_t core, CoreExecutor&) override { return core == 0 && delivery_.poll(); }
  uint32_t handled() const { return delivery_.handled(); }

 private:
  LastPollDelivery delivery_;
};

class WithCoreProgram final : public AicpuProgram {
 public:
  explicit WithCoreProgram(CoreProgram* on_cores) : on_cores_(on_cores) {}
  bool poll(uint32_t) override { return false; }
  CoreProgram* core_program() override { return on_cores_; }

 private:
  CoreProgram* on_cores_;
};

TEST(SimDevice, ARingDuringACoreProgramsLastPollIsNotLost) {
  Watchdog dog;
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  LastPollCoreProgram on_cores(**dev);
  WithCoreProgram program(&on_cores);
  (*dev)->start(&program);
  EXPECT_TRUE(eventually([&] { return on_cores.handled() >= LastPollDelivery::kItems; }))
      << "core 0 handled " << on_cores.handled() << " of " << LastPollDelivery::kItems
      << " items: it parked through the ring of one published during its last poll";
  (*dev)->stop();
}

void start_stop(const Geometry& g) {
  Watchdog dog;
  const int threads_before = testing::thread_count();
  auto dev = SimDevice::create(g, 1 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  SimDevice& d = **dev;
  ASSERT_EQ(d.core_count(), g.cores());
  for (uint32_t c = 0; c < g.clusters; ++c) {
    EXPECT_EQ(d.core(3 * c).type(), CoreType::AIC);
    EXPECT_EQ(d.core(3 * c + 1).type(), CoreType::AIV);
    EXPECT_EQ(d.core(3 * c + 2).type(), CoreType::AIV);
    EXPECT_EQ(d.core(3 * c + 2).cluster(), c);
    EXPECT_LT(d.owner_of_cluster(c), g.aicpu_threads);
  }
  EXPECT_EQ(testing::thread_count(), threads_before);  // nothing runs before start
  CountingProgram program(g.aicpu_threads);
  d.start(&program);
  EXPECT_EQ(testing::thread_count(), threads_before + static_cast<int>(g.cores() + g.aicpu_threads));
  for (uint32_t a = 0; a < g.aicpu_threads; ++a) {
    EXPECT_TRUE(eventually([&] { return program.polls(a) > 0; })) << "AICPU " << a << " never polled";
  }
  // With no work, every AICPU thread parks.
  EXPECT_TRUE(eventually([&] { return d.aicpu_parks() >= g.aicpu_threads; }));
  d.stop();
  EXPECT_EQ(testing::thread_count(), threads_before);
  d.stop();  // idempotent
  dev->reset();
}

TEST(SimDevice, SmallStartsAndStops) { start_stop(Geometry::small()); }
TEST(SimDevice, A2a3StartsAndStops) { start_stop(Geometry::a2a3()); }
TEST(SimDevice, A5StartsAndStops) { start_stop(Geometry::a5()); }

TEST(SimDevice, IdleDeviceThreadsAllSleep) {
  Watchdog dog;
  auto dev = SimDevice::create(Geometry::a2a3(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  CountingProgram program(4);
  (*dev)->start(&program);
  // Every other thread (72 cores, 4 AICPUs) ends up blocked in
  // the kernel, not spinning: the no-unbounded-spinning rule.
  std::vector<char> states;
  const bool all_sleep = eventually([&] {
    states = testing::other_thread_states();
    for (char c : states) {
      if (c != 'S') return false;
    }
    return states.size() >= 76;
  });
  EXPECT_TRUE(all_sleep) << "thread states: " << std::string(states.begin(), states.end());
  (*dev)->stop();
}

// A device never started is destroyed without a thread to join and
// without a byte kept (the leak half is LeakSanitizer's, in the ASan job).
TEST(SimDevice, DestroyWithoutStopJoinsNothingAndLeaksNothing) {
  Watchdog dog;
  const int threads = testing::thread_count();
  auto dev = SimDevice::create(Geometry::small(), 1 << 20);
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ((*dev)->memory().free_bytes(), (*dev)->memory().total_bytes());
  EXPECT_EQ(testing::thread_count(), threads) << "creating a device started threads";
  dev->reset();
  EXPECT_EQ(testing::settled_thread_count(threads), threads);
}

TEST(SimDevice, CreateRefusesBadGeometryAndMemory) {
  EXPECT_REFUSED(SimDevice::create(Geometry{"g", 0, 1}, 1 << 20).status(), StatusCode::kInvalidArgument,
                 "geometry.clusters");
  EXPECT_REFUSED(SimDevice::create(Geometry::small(), 0).status(), StatusCode::kInvalidArgument, "device_memory_bytes");
}

}  // namespace
}  // namespace simpler
