// The chip's native-run lifecycle, run-resource grant and HostApi (issue 3):
// R20-R25, R48, R50, R51, R52, R72, R78, R79, R81-R86, plus launch_depth.
// Drives ChipWorker directly on the small simulated chip.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "chip/chip_worker.h"

namespace simpler {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kDeadlineNs = 30'000'000'000ull;  // every blocking wait here

uint64_t deadline() { return now_ns() + kDeadlineNs; }

// For states that no doorbell announces: re-checks, yielding, until the deadline.
template <typename Pred>
bool eventually(Pred pred) {
  const uint64_t end = deadline();
  while (!pred()) {
    if (now_ns() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

// A gate kernels can block on: parks (futex) until opened. Heap-allocated and
// never freed, so a kernel left blocked on an abandoned device cannot outlive it.
struct Gate {
  std::atomic<uint32_t> open{0};
  std::atomic<uint32_t> entered{0};
  Doorbell bell;
  void release() {
    open.store(1);
    bell.ring();
  }
  bool wait_entered(uint32_t n) {
    return spin_then_park(bell, [&] { return entered.load() >= n; }, SpinPolicy{}, deadline());
  }
};
Gate* g_gate = nullptr;

extern "C" void gate_kernel(int64_t*) {
  Gate* g = g_gate;
  g->entered.fetch_add(1);
  g->bell.ring();
  spin_then_park(g->bell, [&] { return g->open.load() != 0; }, SpinPolicy{});
}

extern "C" void add_one_kernel(int64_t* args) {
  const DeviceTensor* t = tensor_arg(args, 0);
  for (int64_t i = 0; i < t->shape[0]; ++i) tensor_data<float>(t)[i] += 1.0f;
}

struct Fixture {
  explicit Fixture(uint32_t depth = 2, uint32_t launch_depth = 0) {
    KernelLibrary k;
    EXPECT_TRUE(k.add_function(0, CoreType::AIV, "add_one_kernel", add_one_kernel).ok());
    EXPECT_TRUE(k.add_function(1, CoreType::AIV, "gate_kernel", gate_kernel).ok());
    std::vector<ChipCallable> cs;
    cs.emplace_back("add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
                    std::vector<Param>{Param::inout()});
    cs.emplace_back("gated", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(1, TaskArgs{}).status(); },
                    k, std::vector<Param>{});
    WorkerConfig cfg;
    cfg.pipeline_depth = depth;
    cfg.launch_depth = launch_depth;
    cfg.max_tasks_per_run = 64;
    cfg.device_memory_bytes = 256ull << 20;
    auto w = ChipWorker::create(cfg, std::move(cs));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    worker = std::move(w).value();
    auto b = worker->malloc(64 * 4);
    EXPECT_TRUE(b.ok());
    buf = *b;
    std::vector<float> zeros(64, 0.f);
    EXPECT_TRUE(worker->copy_to(buf, zeros.data(), 64 * 4, 0).ok());
  }
  TaskArgs inout_args() const {
    TaskArgs a;
    a.add_tensor(buf.view({64}, DType::F32), Tag::InOut);
    return a;
  }
  std::unique_ptr<ChipWorker> worker;
  DeviceBuffer buf;
};

// Zeroed, correctly aligned caller storage for one native run.
struct Storage {
  Storage() : p(static_cast<unsigned char*>(::operator new(native_run_storage_size() + 64,
                                                            std::align_val_t{native_run_storage_alignment()}))) {
    std::memset(p, 0, native_run_storage_size() + 64);
  }
  ~Storage() { ::operator delete(p, std::align_val_t{native_run_storage_alignment()}); }
  void* get() { return p; }
  uint64_t magic() const {
    uint64_t m;
    std::memcpy(&m, p, sizeof m);
    return m;
  }
  unsigned char* p;
};

NativeRunDescriptor desc_for(const Lease& l) {
  NativeRunDescriptor d;
  d.lease = l;
  d.arena_bank = l.slot;
  return d;
}

// R86: the phase matrix of one run, with every misuse refused and harmless.
TEST(NativeRun, R86PhaseMatrix) {
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  EXPECT_EQ(s.magic(), NativeRunContext::kMagic);
  // Prepared: poll and wait are refused, nothing changes.
  EXPECT_EQ(f.worker->poll(s.get(), *epoch).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.worker->wait(s.get(), *epoch, deadline()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  EXPECT_EQ(f.worker->launch(s.get(), *epoch).code(), StatusCode::kFailedPrecondition) << "launch twice";
  EXPECT_TRUE(f.worker->wait(s.get(), *epoch, deadline()).ok());
  auto p = f.worker->poll(s.get(), *epoch);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, PollState::Complete);
  // wait released nothing: the set is still live until finalize.
  EXPECT_EQ(f.worker->set_counts().live, 1u);
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
  EXPECT_EQ(s.magic(), 0u);
  EXPECT_EQ(f.worker->set_counts().free, 2u);
  EXPECT_EQ(f.worker->finalize(s.get(), *epoch).code(), StatusCode::kFailedPrecondition) << "finalize twice";
  float x;
  ASSERT_TRUE(f.worker->copy_from(&x, f.buf, 4, 0).ok());
  EXPECT_EQ(x, 1.0f);
}

// R86: finalize aborts a prepared run that never launched; the set comes back.
TEST(NativeRun, R86FinalizeAbortsPreparedRun) {
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  Status st = f.worker->finalize(s.get(), *epoch);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_NE(st.message().find("before launch"), std::string::npos) << st.message();
  EXPECT_EQ(f.worker->set_counts().free, 2u);
  EXPECT_EQ(f.worker->registered_runs(), 0u);
  float x;
  ASSERT_TRUE(f.worker->copy_from(&x, f.buf, 4, 0).ok());
  EXPECT_EQ(x, 0.0f) << "an aborted run must not have run";
}

// R86 + launch_depth: a launch queued behind launch_depth parks in Launching;
// finalize and wait refuse it then, poll says NOT_READY.
TEST(NativeRun, R86LaunchingRefusesFinalizeAndWait) {
  Fixture f(2, 1);
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  RunHandle blocker = f.worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  std::thread launcher([&] { EXPECT_TRUE(f.worker->launch(s.get(), *epoch).ok()); });
  NativeRunContext* ctx = NativeRunContext::from_storage(s.get());
  ASSERT_TRUE(eventually([&] { return ctx->phase() == RunPhase::Launching; }));
  EXPECT_EQ(f.worker->finalize(s.get(), *epoch).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.worker->wait(s.get(), *epoch, deadline()).code(), StatusCode::kFailedPrecondition);
  auto p = f.worker->poll(s.get(), *epoch);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, PollState::NotReady);
  EXPECT_EQ(f.worker->launched_now(), 1u);
  gate->release();
  launcher.join();
  EXPECT_TRUE(blocker.wait_for(30s).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
  EXPECT_EQ(f.worker->launched_peak(), 1u);
}

// R78: the sim backend's table is complete; a missing callback is named.
TEST(HostApi, R78TableIsComplete) {
  EXPECT_TRUE(check_host_api_ops(SimRunner::ops()).ok());
  HostApiOps broken = SimRunner::ops();
  broken.arena_setup = nullptr;
  Status st = check_host_api_ops(broken);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("arena_setup"), std::string::npos) << st.message();
}

// R79: two HostApi values driven from two threads released by one gate; every
// call lands on its own binding (recorded by a backend that records).
struct Recorded {
  void* runner;
  uint32_t slot;
  uint32_t bank;
};
struct RecordingRunner {
  std::vector<Recorded> calls;
};
Result<uint64_t> rec_malloc(const HostApi& api, uint64_t) {
  static_cast<RecordingRunner*>(api.runner)->calls.push_back({api.runner, api.slot, api.bank});
  return uint64_t{64};
}
Status rec_free(const HostApi& api, uint64_t) {
  static_cast<RecordingRunner*>(api.runner)->calls.push_back({api.runner, api.slot, api.bank});
  return Status();
}
Status rec_copy_to(const HostApi&, uint64_t, const void*, uint64_t) { return Status(); }
Status rec_copy_from(const HostApi&, void*, uint64_t, uint64_t) { return Status(); }
Status rec_memset(const HostApi&, uint64_t, int, uint64_t) { return Status(); }
Result<uint64_t> rec_retained(const HostApi& api, uint64_t) { return uint64_t{api.slot} + 1; }
Result<uint64_t> rec_arena(const HostApi& api, uint64_t*) { return uint64_t{api.bank} + 1; }
Status rec_upload(const HostApi&, uint32_t) { return Status(); }
uint32_t rec_level(const HostApi&) { return 0; }

TEST(HostApi, R79BindingIsPerValue) {
  const HostApiOps ops{"recording", rec_malloc, rec_free,   rec_copy_to, rec_copy_from, rec_memset,
                       rec_retained, rec_arena, rec_upload, rec_level};
  ASSERT_TRUE(check_host_api_ops(ops).ok());
  RecordingRunner r0, r1;
  const HostApi a{&r0, 3, 5, &ops};
  const HostApi b{&r1, 6, 1, &ops};
  std::barrier start(2);
  auto drive = [&](const HostApi& api) {
    start.arrive_and_wait();
    for (int i = 0; i < 64; ++i) {
      EXPECT_TRUE(api.device_malloc(16).ok());
      EXPECT_TRUE(api.device_free(64).ok());
      EXPECT_EQ(*api.retained_temp(1), uint64_t{api.slot} + 1);
      EXPECT_EQ(*api.arena_setup(nullptr), uint64_t{api.bank} + 1);
    }
  };
  std::thread t0([&] { drive(a); });
  std::thread t1([&] { drive(b); });
  t0.join();
  t1.join();
  ASSERT_EQ(r0.calls.size(), 128u);
  ASSERT_EQ(r1.calls.size(), 128u);
  for (const Recorded& c : r0.calls) EXPECT_TRUE(c.runner == &r0 && c.slot == 3 && c.bank == 5);
  for (const Recorded& c : r1.calls) EXPECT_TRUE(c.runner == &r1 && c.slot == 6 && c.bank == 1);
}

// R79 on the sim backend: each slot's retained temp buffer is its own.
TEST(HostApi, R79RetainedTempIsPerSlot) {
  Fixture f(4);
  auto a = f.worker->runner().bind(0, 0);
  auto b = f.worker->runner().bind(3, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ra = a->retained_temp(4096);
  auto rb = b->retained_temp(4096);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NE(*ra, *rb);
  EXPECT_EQ(*a->retained_temp(1024), *ra) << "retained across calls of one slot";
  EXPECT_EQ(f.worker->runner().retained_addr(3), *rb);
  EXPECT_EQ(f.worker->runner().bind(4, 0).status().code(), StatusCode::kInvalidArgument);
}

// R81: a context whose construction throws leaves the storage empty and reusable.
TEST(NativeRun, R81ThrowingConstructionLeavesStorageReusable) {
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  fail_next_native_run_construction_for_test();
  auto bad = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_EQ(s.magic(), 0u);
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
}

// R82: storage preconditions and foreign contexts, each refused with no change.
TEST(NativeRun, R82StorageRefusals) {
  Fixture f;
  Fixture other;
  auto lease = f.worker->try_acquire_lease();
  const NativeRunDescriptor d = desc_for(*lease);
  Storage s;
  EXPECT_EQ(f.worker->prepare(nullptr, native_run_storage_size(), d, 0, f.inout_args()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(f.worker->prepare(s.p + 1, native_run_storage_size(), d, 0, f.inout_args()).status().code(),
            StatusCode::kInvalidArgument)
      << "misaligned";
  EXPECT_EQ(f.worker->prepare(s.get(), native_run_storage_size() - 1, d, 0, f.inout_args()).status().code(),
            StatusCode::kInvalidArgument)
      << "too small";
  s.p[0] = 0x5a;
  Status dirty = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_NE(dirty.message().find("zero"), std::string::npos) << dirty.message();
  s.p[0] = 0;
  EXPECT_EQ(f.worker->prepare(s.get(), native_run_storage_size(), d, 7, f.inout_args()).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(f.worker->registered_runs(), 0u);
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  Status again = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_NE(again.message().find("finalize before reuse"), std::string::npos) << again.message();
  // Another worker's phase calls refuse this context and change nothing.
  Status foreign = other.worker->launch(s.get(), *epoch);
  EXPECT_NE(foreign.message().find("another ChipWorker"), std::string::npos) << foreign.message();
  EXPECT_EQ(NativeRunContext::from_storage(s.get())->phase(), RunPhase::Prepared);
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
}

// R83: the descriptor is copied at prepare.
TEST(NativeRun, R83DescriptorIsCopied) {
  Fixture f(4);
  auto lease = f.worker->try_acquire_lease();
  auto other = f.worker->try_acquire_lease();
  Storage s;
  auto d = std::make_unique<NativeRunDescriptor>(desc_for(*lease));
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), *d, 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  std::memset(static_cast<void*>(d.get()), 0xab, sizeof *d);
  d.reset();
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
  EXPECT_EQ(f.worker->set_counts().live, 1u) << "finalize released the original lease, found through the copy";
  EXPECT_TRUE(f.worker->release_lease(*other));
  EXPECT_EQ(f.worker->set_counts().free, 4u);
}

// R84: the acceptance sink is written once, at the launch marker, and never
// on a refusal before it or after finalize.
TEST(NativeRun, R84AcceptanceSinkAtMarker) {
  Fixture f;
  auto lease = f.worker->try_acquire_lease();
  {
    Storage s;
    auto sink = std::make_unique<std::atomic<uint32_t>>(0);
    NativeRunDescriptor d = desc_for(*lease);
    d.accepted_sink = sink.get();
    d.accepted_value = 7;
    auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args());
    ASSERT_TRUE(epoch.ok());
    EXPECT_EQ(sink->load(), 0u) << "after prepare";
    f.worker->execution_context().suspend();
    EXPECT_EQ(f.worker->launch(s.get(), *epoch).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(sink->load(), 0u) << "after a launch refused before the marker";
    f.worker->execution_context().restore();
    ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
    EXPECT_EQ(sink->load(), 7u) << "after launch";
    EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
    sink.reset();  // freed: ASan catches any later write
  }
  lease = f.worker->try_acquire_lease();
  Storage s;
  auto sink = std::make_unique<std::atomic<uint32_t>>(0);
  NativeRunDescriptor d = desc_for(*lease);
  d.accepted_sink = sink.get();
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  EXPECT_EQ(f.worker->finalize(s.get(), *epoch).code(), StatusCode::kAborted);
  EXPECT_EQ(sink->load(), 0u) << "finalize without launch";
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(f.worker->submit(0, f.inout_args()).wait_for(30s).ok());
}

// R48 + R85: runs are keyed by epoch; a call with the right storage but another
// epoch is refused, and consecutive runs on one slot have distinct epochs.
TEST(NativeRun, R48R85EpochIsTheIdentity) {
  Fixture f(1);
  Storage s;
  auto l1 = f.worker->try_acquire_lease();
  auto e1 = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l1), 0, f.inout_args());
  ASSERT_TRUE(e1.ok());
  ASSERT_TRUE(f.worker->launch(s.get(), *e1).ok());
  EXPECT_EQ(f.worker->poll(s.get(), *e1 + 1000).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(f.worker->finalize(s.get(), *e1).ok());
  auto l2 = f.worker->try_acquire_lease();
  ASSERT_TRUE(l2.has_value());
  EXPECT_EQ(l2->slot, l1->slot);
  EXPECT_NE(l2->generation, l1->generation);
  // The old lease is stale at admission.
  EXPECT_EQ(f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l1), 0, f.inout_args()).status().code(),
            StatusCode::kFailedPrecondition);
  auto e2 = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l2), 0, f.inout_args());
  ASSERT_TRUE(e2.ok());
  EXPECT_NE(*e1, *e2);
  Status delayed = f.worker->poll(s.get(), *e1).status();
  EXPECT_EQ(delayed.code(), StatusCode::kFailedPrecondition) << "a delayed poll with the first epoch";
  ASSERT_TRUE(f.worker->launch(s.get(), *e2).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *e2).ok());
}

// R50: a waiter parked in wait() keeps its entry while 23 later admissions grow
// the run table.
TEST(NativeRun, R50TableGrowsUnderAParkedWaiter) {
  Fixture f(32);
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  Storage waiter_storage;
  auto wl = f.worker->try_acquire_lease();
  auto we = f.worker->prepare(waiter_storage.get(), native_run_storage_size(), desc_for(*wl), 1, TaskArgs{});
  ASSERT_TRUE(we.ok());
  ASSERT_TRUE(f.worker->launch(waiter_storage.get(), *we).ok());
  NativeRunContext* entry = NativeRunContext::from_storage(waiter_storage.get());
  Status waited = internal_error("not waited");
  std::thread waiter([&] { waited = f.worker->wait(waiter_storage.get(), *we, deadline()); });
  ASSERT_TRUE(gate->wait_entered(1));
  const size_t buckets_before = f.worker->run_table_buckets();
  std::vector<std::unique_ptr<Storage>> later;
  std::vector<uint64_t> epochs;
  for (int i = 0; i < 23; ++i) {
    later.push_back(std::make_unique<Storage>());
    auto l = f.worker->try_acquire_lease();
    ASSERT_TRUE(l.has_value());
    auto e = f.worker->prepare(later.back()->get(), native_run_storage_size(), desc_for(*l), 0, f.inout_args());
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    epochs.push_back(*e);
  }
  EXPECT_GT(f.worker->run_table_buckets(), buckets_before) << "the table must have grown";
  EXPECT_EQ(NativeRunContext::from_storage(waiter_storage.get()), entry);
  EXPECT_EQ(entry->descriptor().lease, *wl);
  gate->release();
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.to_string();
  EXPECT_TRUE(f.worker->finalize(waiter_storage.get(), *we).ok());
  for (size_t i = 0; i < later.size(); ++i) EXPECT_EQ(f.worker->finalize(later[i]->get(), epochs[i]).code(), StatusCode::kAborted);
  EXPECT_EQ(f.worker->set_counts().free, 32u);
}

// R52: a refused execution context changes nothing; the same run then completes.
TEST(NativeRun, R52PreflightRefusalIsRetryable) {
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  f.worker->execution_context().suspend();
  EXPECT_EQ(f.worker->launch(s.get(), *epoch).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(NativeRunContext::from_storage(s.get())->phase(), RunPhase::Prepared);
  f.worker->execution_context().restore();
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  f.worker->execution_context().suspend();
  EXPECT_EQ(f.worker->wait(s.get(), *epoch, deadline()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.worker->poll(s.get(), *epoch).status().code(), StatusCode::kFailedPrecondition);
  Status refused = f.worker->finalize(s.get(), *epoch);
  EXPECT_NE(refused.message().find("execution context refused"), std::string::npos) << refused.message();
  EXPECT_EQ(f.worker->registered_runs(), 1u) << "a refusal retires nothing";
  EXPECT_EQ(f.worker->set_counts().live, 1u);
  f.worker->execution_context().restore();
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
  EXPECT_EQ(f.worker->set_counts().live, 0u);
}

// R20: every per-set owner is exactly the grant wide; slot G-1 works, slot G is refused.
TEST(Grant, R20EveryOwnerIsGrantWide) {
  Fixture f(8);
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 8u) << name;
  std::vector<Lease> leases;
  for (int i = 0; i < 8; ++i) leases.push_back(*f.worker->try_acquire_lease());
  EXPECT_EQ(leases.back().slot, 7u);
  Storage s;
  auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(leases.back()), 0, f.inout_args());
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(f.worker->launch(s.get(), *e).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *e).ok());
  Storage s8;
  NativeRunDescriptor d = desc_for(Lease{8, 1});
  Status st = f.worker->prepare(s8.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_NE(st.message().find("outside the grant of 8"), std::string::npos) << st.message();
  EXPECT_EQ(s8.magic(), 0u);
}

// R21: free + live + quarantined == G after every step of random sequences.
TEST(Grant, R21ArenaPartitionsTheGrant) {
  std::mt19937 rng(42);
  for (uint32_t g : {1u, 2u, 3u, 8u, 64u}) {
    RunResourceArena arena = std::move(RunResourceArena::create(g)).value();
    std::vector<Lease> held, old;
    for (int step = 0; step < 4000; ++step) {
      switch (rng() % 5) {
        case 0:
        case 1:
          if (auto l = arena.try_acquire()) {
            EXPECT_NE(l->generation, 0u);
            held.push_back(*l);
          }
          break;
        case 2:
          if (!held.empty()) {
            const size_t i = rng() % held.size();
            EXPECT_TRUE(arena.release(held[i]));
            old.push_back(held[i]);
            held.erase(held.begin() + static_cast<long>(i));
          }
          break;
        case 3:
          if (!old.empty()) (void)arena.release(old[rng() % old.size()]);  // stale: refused or idempotent
          break;
        case 4:
          if (!held.empty() && rng() % 8 == 0) {
            const size_t i = rng() % held.size();
            EXPECT_TRUE(arena.quarantine(held[i]));
            held.erase(held.begin() + static_cast<long>(i));
          }
          break;
      }
      const ArenaCounts c = arena.counts();
      ASSERT_EQ(c.free + c.live + c.quarantined, g) << "step " << step;
      ASSERT_EQ(c.live, held.size());
    }
  }
}

// R22: leases carry a generation; an old lease is dead once its slot is reissued.
TEST(Grant, R22LeaseGenerations) {
  RunResourceArena arena = std::move(RunResourceArena::create(1)).value();
  auto a = arena.try_acquire();
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(arena.owns(*a));
  EXPECT_TRUE(arena.release(*a));
  EXPECT_TRUE(arena.release(*a)) << "releasing the current generation twice is idempotent";
  auto b = arena.try_acquire();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->slot, a->slot);
  EXPECT_FALSE(arena.owns(*a));
  EXPECT_FALSE(arena.release(*a));
  EXPECT_TRUE(arena.owns(*b));
}

// R23: a quarantined set never returns and still counts.
TEST(Grant, R23QuarantineCannotBuyConcurrency) {
  RunResourceArena arena = std::move(RunResourceArena::create(2)).value();
  auto a = arena.try_acquire();
  ASSERT_TRUE(arena.quarantine(*a));
  EXPECT_FALSE(arena.release(*a));
  auto b = arena.try_acquire();
  EXPECT_TRUE(b.has_value());
  EXPECT_FALSE(arena.try_acquire().has_value());
  const ArenaCounts c = arena.counts();
  EXPECT_EQ(c.free, 0u);
  EXPECT_EQ(c.live, 1u);
  EXPECT_EQ(c.quarantined, 1u);
}

// R24: a regrant while a set is held is refused before anything is built.
TEST(Grant, R24RegrantRefusedWhileHeld) {
  Fixture f(2);
  auto lease = f.worker->try_acquire_lease();
  const MemoryInfo before = f.worker->memory_info();
  Status st = f.worker->set_run_resource_grant(6);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("live"), std::string::npos) << st.message();
  EXPECT_EQ(f.worker->grant(), 2u);
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 2u) << name;
  EXPECT_EQ(f.worker->memory_info().free_bytes, before.free_bytes);
  EXPECT_TRUE(f.worker->release_lease(*lease));
  ASSERT_TRUE(f.worker->set_run_resource_grant(6).ok());
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 6u) << name;
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(f.worker->submit(0, f.inout_args()).wait_for(30s).ok());
  float x;
  ASSERT_TRUE(f.worker->copy_from(&x, f.buf, 4, 0).ok());
  EXPECT_EQ(x, 8.0f);
}

// launch_depth (R42 at chip level): with pipeline_depth 8 and launch_depth 4,
// eight runs hold sets while exactly four are launched; 5/5 launches five.
TEST(LaunchDepth, EightHeldFourLaunched) {
  for (auto [depth, launch] : {std::pair{8u, 4u}, std::pair{5u, 5u}}) {
    Fixture f(depth, launch);
    std::unique_ptr<Gate> gate(new Gate);
    g_gate = gate.get();
    std::vector<RunHandle> runs;
    for (uint32_t i = 0; i < depth; ++i) runs.push_back(f.worker->submit(1, TaskArgs{}));
    EXPECT_EQ(f.worker->set_counts().live, depth);
    EXPECT_EQ(f.worker->launched_now(), launch);
    gate->release();
    for (auto& r : runs) EXPECT_TRUE(r.wait_for(30s).ok());
    EXPECT_EQ(f.worker->launched_peak(), launch);
    EXPECT_EQ(f.worker->set_counts().free, depth);
  }
}

TEST(LaunchDepth, AboveGrantIsRefused) {
  WorkerConfig cfg;
  cfg.pipeline_depth = 2;
  cfg.launch_depth = 3;
  auto w = ChipWorker::create(cfg, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("launch_depth = 3"), std::string::npos) << w.status().message();
}

// R51: storage whose destruction cannot be proved is abandoned, never freed.
// The kernel below never returns, so the device threads never touch the worker again.
TEST(NativeRun, R51AbandonedStorageOutlivesTheWorker) {
  auto* f = new Fixture(2);
  Gate* gate = new Gate;  // never released, never freed: the kernel stays on the device
  g_gate = gate;
  RunHandle r = f->worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  auto* carrier = static_cast<uint64_t*>(f->worker->native_storage_for_test(0));
  Status st = f->worker->close(50ms);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("abandoned"), std::string::npos) << st.message();
  carrier[1] = 0x5749544e45535321ull;  // the witness
  delete f;
  EXPECT_EQ(carrier[1], 0x5749544e45535321ull);
  EXPECT_FALSE(r.done());
}

// R72: total bytes exact (above 2^32 too), free bytes well formed.
TEST(MemoryInfo, R72ExactTotalAboveFourGiB) {
  WorkerConfig cfg;
  cfg.device_memory_bytes = 5 * (uint64_t{1} << 32) + 7;
  cfg.max_tasks_per_run = 16;
  auto w = ChipWorker::create(cfg, {});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const MemoryInfo a = (*w)->memory_info();
  EXPECT_EQ(a.total_bytes, 5 * (uint64_t{1} << 32) + 7);
  EXPECT_LE(a.free_bytes, a.total_bytes);
  auto b = (*w)->malloc(uint64_t{1} << 33);
  ASSERT_TRUE(b.ok());
  const MemoryInfo c = (*w)->memory_info();
  EXPECT_EQ(c.total_bytes, a.total_bytes);
  EXPECT_EQ(a.free_bytes - c.free_bytes, uint64_t{1} << 33);
}

}  // namespace
}  // namespace simpler
