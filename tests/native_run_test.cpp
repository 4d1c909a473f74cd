// The chip's native-run lifecycle, run-resource grant and HostApi (issue 3):
// R20-R25, R48, R50, R51, R52, R53, R72, R73, R78, R79, R81-R86, plus launch_depth.
// Drives ChipWorker directly on the small simulated chip.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/leak.h"
#include "chip/chip_worker.h"
#include "chip/pipeline_contract.h"
#include "conformance.h"
#include "device/backend_registry.h"
#include "gate.h"
#include "runtime/common/run_builder.h"
#include "runtime/common/task_graph.h"
#include "simpler/simpler.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace std::chrono_literals;
using testing::deadline;
using testing::eventually;
using testing::Gate;

Gate* g_gate = nullptr;

extern "C" void gate_kernel(int64_t*) { g_gate->pass(); }

extern "C" void add_one_kernel(int64_t* args) {
  const DeviceTensor* t = tensor_arg(args, 0);
  for (int64_t i = 0; i < t->shape[0]; ++i) tensor_data<float>(t)[i] += 1.0f;
}

struct Fixture {
  explicit Fixture(uint32_t depth = 2, uint32_t launch_depth = 0,
                   const testing::ChipTarget& target = {"host_build_graph", "small", "sim"},
                   std::chrono::milliseconds run_timeout = std::chrono::minutes(10)) {
    KernelLibrary k;
    EXPECT_TRUE(k.add_function(0, CoreType::AIV, "add_one_kernel", add_one_kernel).ok());
    EXPECT_TRUE(k.add_function(1, CoreType::AIV, "gate_kernel", gate_kernel).ok());
    std::vector<ChipCallable> cs;
    cs.emplace_back(
        "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
        std::vector<Param>{Param::inout()});
    cs.emplace_back(
        "gated", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(1, TaskArgs{}).status(); }, k,
        std::vector<Param>{});
    WorkerConfig cfg;
    cfg.runtime = target.runtime;
    cfg.backend = target.backend;
    cfg.geometry = *Geometry::by_name(target.geometry);
    cfg.pipeline_depth = depth;
    cfg.launch_depth = launch_depth;
    cfg.max_tasks_per_run = 64;
    cfg.device_memory_bytes = 256ull << 20;
    cfg.run_timeout = run_timeout;
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
  Storage()
      : p(static_cast<unsigned char*>(
            ::operator new (native_run_storage_size() + 64, std::align_val_t{native_run_storage_alignment()}))) {
    std::memset(p, 0, native_run_storage_size() + 64);
  }
  ~Storage() { ::operator delete (p, std::align_val_t{native_run_storage_alignment()}); }
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

// The lifecycle cases run on every runtime and geometry (R89).
class Lifecycle : public testing::TargetTest {};

// R86: the phase matrix of one run, with every misuse refused and harmless.
TEST_P(Lifecycle, R86PhaseMatrix) {
  Fixture f(2, 0, GetParam());
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
TEST_P(Lifecycle, R86FinalizeAbortsPreparedRun) {
  Fixture f(2, 0, GetParam());
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
TEST_P(Lifecycle, R86LaunchingRefusesFinalizeAndWait) {
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
  Fixture f(2, 1, GetParam());
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

// R78: every registered backend's table is complete; a missing callback is named.
TEST(HostApi, R78TableIsComplete) {
  const auto backends = registered_backends();
  ASSERT_FALSE(backends.empty());
  for (const BackendInfo* b : backends) {
    auto device = b->create(DeviceOptions{Geometry::small(), 1 << 20});
    ASSERT_TRUE(device.ok()) << b->name << ": " << device.status().to_string();
    auto runner = (*device)->create_runner(4096);
    ASSERT_TRUE(runner.ok()) << b->name << ": " << runner.status().to_string();
    const HostApiOps& ops = (*runner)->ops();
    EXPECT_TRUE(check_host_api_ops(ops).ok()) << b->name;
    EXPECT_STREQ(ops.backend, b->name);
    HostApiOps broken = ops;
    broken.arena_setup = nullptr;
    Status st = check_host_api_ops(broken);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("arena_setup"), std::string::npos) << st.message();
  }
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
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
  const HostApiOps ops{"recording", rec_malloc,   rec_free,  rec_copy_to, rec_copy_from,
                       rec_memset,  rec_retained, rec_arena, rec_upload,  rec_level};
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
TEST(HostApi, R79R90RetainedTempIsPerSlot) {
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

// R90: a real run path uses the retained temp buffer per slot. prepare()
// stages each run's args blob in its slot's retained buffer: two runs
// prepared at once in slots 0 and 1 each find their own blob at their own
// slot's retained address, and a later run of slot 0 reuses that buffer
// without allocating device memory.
void r90_retained_args_per_slot(const testing::ChipTarget& target) {
  Fixture f(2, 0, target);
  auto second = f.worker->malloc(64 * 4);
  ASSERT_TRUE(second.ok());
  TaskArgs other;
  other.add_tensor(second->view({64}, DType::F32), Tag::InOut);
  Storage s0, s1;
  auto l0 = f.worker->try_acquire_lease();
  auto l1 = f.worker->try_acquire_lease();
  ASSERT_TRUE(l0 && l1);
  auto e0 = f.worker->prepare(s0.get(), native_run_storage_size(), desc_for(*l0), 0, f.inout_args());
  auto e1 = f.worker->prepare(s1.get(), native_run_storage_size(), desc_for(*l1), 0, other);
  ASSERT_TRUE(e0.ok() && e1.ok());
  const uint64_t r0 = f.worker->runner().retained_addr(l0->slot);
  const uint64_t r1 = f.worker->runner().retained_addr(l1->slot);
  ASSERT_NE(r0, 0u) << "the first run staged nothing in its slot's retained buffer";
  ASSERT_NE(r1, 0u) << "the second run staged nothing in its slot's retained buffer";
  EXPECT_NE(r0, r1) << "two slots share a staging buffer";
  auto staged = [](uint64_t addr) {
    auto a = decode_args_blob(reinterpret_cast<const uint8_t*>(addr), args_blob_size(1));
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    return a.ok() ? (*a)[0].tensor.buffer().addr : 0;
  };
  EXPECT_EQ(staged(r0), f.buf.addr) << "the first slot's buffer holds another run's arguments";
  EXPECT_EQ(staged(r1), second->addr) << "the second slot's buffer holds another run's arguments";
  for (auto [s, e] : {std::pair{&s0, *e0}, std::pair{&s1, *e1}}) {
    ASSERT_TRUE(f.worker->launch(s->get(), e).ok());
    ASSERT_TRUE(f.worker->wait(s->get(), e, deadline()).ok());
    ASSERT_TRUE(f.worker->finalize(s->get(), e).ok());
  }
  const uint64_t free_before = f.worker->memory_info().free_bytes;
  Storage again;
  auto l = f.worker->try_acquire_lease();
  ASSERT_TRUE(l.has_value());
  const uint64_t retained = l->slot == l0->slot ? r0 : r1;
  const uint64_t previous = l->slot == l0->slot ? f.buf.addr : second->addr;
  auto e = f.worker->prepare(again.get(), native_run_storage_size(), desc_for(*l), 0,
                             previous == f.buf.addr ? other : f.inout_args());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(f.worker->runner().retained_addr(l->slot), retained) << "the slot's buffer is retained across its runs";
  EXPECT_NE(staged(retained), previous) << "the later run staged its own arguments";
  EXPECT_EQ(f.worker->memory_info().free_bytes, free_before) << "a retained buffer is not allocated again";
  ASSERT_TRUE(f.worker->launch(again.get(), *e).ok());
  ASSERT_TRUE(f.worker->wait(again.get(), *e, deadline()).ok());
  ASSERT_TRUE(f.worker->finalize(again.get(), *e).ok());
}

TEST(HostApi, R90PreparedRunsStageTheirArgsInTheirSlotsRetainedBuffer) {
  // On every runtime: staging is the chip's, whatever runs the orchestration.
  for (const RuntimeInfo* runtime : registered_runtimes()) {
    SCOPED_TRACE(runtime->name);
    r90_retained_args_per_slot(testing::ChipTarget{runtime->name, "small", "sim"});
  }
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
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
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
  std::atomic<bool> waiter_back{false};
  ASSERT_TRUE(gate->wait_entered(1));
  std::thread waiter([&] {
    waited = f.worker->wait(waiter_storage.get(), *we, deadline());
    waiter_back.store(true);
  });
  // The waiter is inside wait(), holding its run, before any admission; the
  // kernel cannot end until the gate opens, so it stays parked there.
  ASSERT_TRUE(eventually([&] { return entry->users() == 1; }));
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
  EXPECT_FALSE(waiter_back.load()) << "the waiter must still be parked after the 23 admissions";
  EXPECT_EQ(entry->users(), 1u);
  EXPECT_EQ(NativeRunContext::from_storage(waiter_storage.get()), entry);
  EXPECT_EQ(entry->descriptor().lease, *wl);
  gate->release();
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited.to_string();
  EXPECT_TRUE(f.worker->finalize(waiter_storage.get(), *we).ok());
  for (size_t i = 0; i < later.size(); ++i)
    EXPECT_EQ(f.worker->finalize(later[i]->get(), epochs[i]).code(), StatusCode::kAborted);
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
  // The argument tensor is still referenced until finalize, though the run
  // itself ended (issue 9 item 1): it cannot be freed and handed out again.
  f.worker->execution_context().restore();
  EXPECT_TRUE(f.worker->wait(s.get(), *epoch, deadline()).ok());
  EXPECT_EQ(f.worker->free(f.buf).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
  EXPECT_EQ(f.worker->set_counts().live, 0u);
  EXPECT_TRUE(f.worker->free(f.buf).ok());
}

// R52: the device belongs to the process that made it. A fork() child (the
// pid is cached, refreshed by an atfork handler) is refused at preflight,
// naming both pids; the parent's prepared run is untouched and launches.
TEST(NativeRun, R52AForkedChildIsRefusedTheParentsDevice) {
  testing::Watchdog dog(std::chrono::seconds(60));
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 refused as expected, 1 launched, 2 refused for another reason.
    const Status st = f.worker->launch(s.get(), *epoch);
    const std::string want = fmt::format("belongs to pid {}, caller is pid {}", getppid(), getpid());
    _exit(st.ok() ? 1 : st.message().find(want) != std::string::npos ? 0 : 2);
  }
  const std::optional<int> wstatus = testing::reap_within(child);
  ASSERT_TRUE(wstatus.has_value()) << "the forked child did not exit by the deadline";
  ASSERT_TRUE(WIFEXITED(*wstatus)) << "the forked child died of a signal";
  EXPECT_EQ(WEXITSTATUS(*wstatus), 0) << "1: the child launched the parent's run; 2: refused without naming both pids";
  EXPECT_EQ(NativeRunContext::from_storage(s.get())->phase(), RunPhase::Prepared);
  ASSERT_TRUE(f.worker->launch(s.get(), *epoch).ok());
  EXPECT_TRUE(f.worker->wait(s.get(), *epoch, deadline()).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *epoch).ok());
}

// R52: a prepared run that never launched references its argument buffers
// too: free() of one is refused until finalize (here, the abort) retires it.
TEST(NativeRun, R52PreparedRunPinsItsArguments) {
  Fixture f;
  Storage s;
  auto lease = f.worker->try_acquire_lease();
  auto epoch = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*lease), 0, f.inout_args());
  ASSERT_TRUE(epoch.ok());
  const Status refused = f.worker->free(f.buf);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_NE(f.worker->memory_info().free_bytes, 0u);
  EXPECT_EQ(f.worker->finalize(s.get(), *epoch).code(), StatusCode::kAborted);
  EXPECT_TRUE(f.worker->free(f.buf).ok());
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

// R22: a slot whose generation would overflow is refused, never wrapped to 0
// (or to a generation an old lease carries); it still counts against the grant.
TEST(Grant, R22GenerationOverflowRefusesInsteadOfWrapping) {
  RunResourceArena arena = std::move(RunResourceArena::create(2)).value();
  arena.set_generation_for_test(0, RunResourceArena::kLastGeneration - 1);
  auto last = arena.try_acquire();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->slot, 0u);
  EXPECT_EQ(last->generation, RunResourceArena::kLastGeneration);
  EXPECT_TRUE(arena.release(*last));
  auto next = arena.try_acquire();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->slot, 1u) << "slot 0 was reissued with generation " << next->generation;
  EXPECT_NE(next->generation, 0u);
  EXPECT_FALSE(arena.try_acquire().has_value()) << "slot 0's generations are spent";
  EXPECT_FALSE(arena.owns(*last));
  const ArenaCounts c = arena.counts();
  EXPECT_EQ(c.free, 0u);
  EXPECT_EQ(c.live, 1u);
  EXPECT_EQ(c.quarantined, 1u);
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

// R53: caller-stream ordering is grant-sized. With G = 6, run A of caller
// stream 7 holds set 5 on the device (its kernel gated); run B of stream 7,
// launched after it, stays queued until A has left the device, while run C
// of stream 9 and run D of no stream, launched after B, pass it by and
// complete. Every per-set owner, the caller orders included, is 6 wide.
TEST(CallerStream, R53OrderIsKeptPerStreamAndSizedByTheGrant) {
  testing::Watchdog dog;  // joins the thread parked in B's launch
  Fixture f(6, 6);
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 6u) << name;
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  std::vector<std::optional<Lease>> by_slot(6);
  for (int i = 0; i < 6; ++i) {
    auto l = f.worker->try_acquire_lease();
    ASSERT_TRUE(l.has_value());
    by_slot.at(l->slot) = *l;
  }
  const auto on = [&](uint32_t slot, uint64_t stream) {
    NativeRunDescriptor d = desc_for(*by_slot[slot]);
    d.caller_stream = stream;
    return d;
  };
  const auto zeroed = [&] {
    auto b = f.worker->malloc(64 * 4);
    EXPECT_TRUE(b.ok());
    std::vector<float> zeros(64, 0.f);
    EXPECT_TRUE(f.worker->copy_to(*b, zeros.data(), 64 * 4, 0).ok());
    return *b;
  };
  const auto add_one_on = [](const DeviceBuffer& b) {
    TaskArgs a;
    a.add_tensor(b.view({64}, DType::F32), Tag::InOut);
    return a;
  };
  const auto first = [&](const DeviceBuffer& b) {
    float x = -1.f;
    EXPECT_TRUE(f.worker->copy_from(&x, b, 4, 0).ok());
    return x;
  };
  const DeviceBuffer b_buf = zeroed(), c_buf = zeroed(), d_buf = zeroed();
  Storage sa, sb, sc, sd;
  const size_t bytes = native_run_storage_size();
  auto a = f.worker->prepare(sa.get(), bytes, on(5, 7), 1, TaskArgs{});
  auto b = f.worker->prepare(sb.get(), bytes, on(0, 7), 0, add_one_on(b_buf));
  auto c = f.worker->prepare(sc.get(), bytes, on(1, 9), 0, add_one_on(c_buf));
  auto d = f.worker->prepare(sd.get(), bytes, on(2, 0), 0, add_one_on(d_buf));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  ASSERT_TRUE(f.worker->launch(sa.get(), *a).ok());
  ASSERT_TRUE(gate->wait_entered(1));
  Status b_launch = internal_error("B's launch never returned");
  std::thread launcher([&] { b_launch = f.worker->launch(sb.get(), *b); });
  ASSERT_TRUE(eventually([&] { return f.worker->queued_launches() == std::vector<uint64_t>{*b}; }))
      << "B, behind A on stream 7, was not held in the launch queue";
  for (auto [s, e] : {std::pair{&sc, *c}, std::pair{&sd, *d}}) {
    ASSERT_TRUE(f.worker->launch(s->get(), e).ok());
    EXPECT_TRUE(f.worker->wait(s->get(), e, deadline()).ok());
  }
  EXPECT_EQ(first(c_buf), 1.f);
  EXPECT_EQ(first(d_buf), 1.f);
  EXPECT_EQ(f.worker->queued_launches(), std::vector<uint64_t>{*b})
      << "B left the queue while A, before it on stream 7, was still on the device";
  EXPECT_EQ(first(b_buf), 0.f) << "B ran before A left the device";
  gate->release();
  launcher.join();
  EXPECT_TRUE(b_launch.ok()) << b_launch.to_string();
  EXPECT_TRUE(f.worker->wait(sb.get(), *b, deadline()).ok());
  EXPECT_EQ(first(b_buf), 1.f);
  for (auto [s, e] : {std::pair{&sa, *a}, std::pair{&sb, *b}, std::pair{&sc, *c}, std::pair{&sd, *d}}) {
    EXPECT_TRUE(f.worker->finalize(s->get(), e).ok());
  }
  for (uint32_t unused : {3u, 4u}) EXPECT_TRUE(f.worker->release_lease(*by_slot[unused]));
  EXPECT_EQ(f.worker->set_counts().free, 6u);
}

TEST(LaunchDepth, AboveGrantIsRefused) {
  WorkerConfig cfg;
  cfg.pipeline_depth = 2;
  cfg.launch_depth = 3;
  auto w = ChipWorker::create(cfg, {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("launch_depth = 3"), std::string::npos) << w.status().message();
}

// R73: the runtime's program contract declares no upper depth. 9, 1024 and
// 2^32 - 1 validate; 9 and 1024 are what ChipWorker::create (the path of
// Worker::init) grants, every owner that wide, and a run is served at each.
TEST(PipelineContract, R73ProgramContractHasNoUpperDepth) {
  for (uint32_t d : {1u, 9u, 1024u, 4294967295u}) {
    EXPECT_TRUE(is_valid_pipeline_contract(PipelineContract{d, 0}).ok()) << d;
    EXPECT_TRUE(is_valid_pipeline_contract(PipelineContract{d, d}).ok()) << d;
  }
  const Status over = is_valid_pipeline_contract(PipelineContract{9, 10});
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("launch_depth = 10"), std::string::npos) << over.message();
  for (uint32_t d : {9u, 1024u}) {
    Fixture f(d);
    ASSERT_NE(f.worker, nullptr) << d;
    EXPECT_EQ(f.worker->grant(), d);
    for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, d) << name;
    EXPECT_TRUE(f.worker->submit(0, f.inout_args()).wait_for(30s).ok()) << d;
    EXPECT_TRUE(f.worker->close(30s).ok());
  }
}

// R73 through the public facade: a chip Worker initialises at depth 9 and 1024.
TEST(PipelineContract, R73WorkerInitAcceptsDeepGrants) {
  for (uint32_t d : {9u, 1024u}) {
    WorkerConfig cfg;
    cfg.pipeline_depth = d;
    cfg.max_tasks_per_run = 64;
    cfg.device_memory_bytes = 256ull << 20;
    Worker w(Level::Chip, cfg);
    EXPECT_TRUE(w.init().ok()) << d;
    EXPECT_TRUE(w.memory_info().ok()) << d;
    EXPECT_TRUE(w.close().ok()) << d;
  }
}

// R73: depth 0 is refused naming the field, by the contract, by create, by the
// facade and by a regrant, and changes nothing: the facade stays
// uninitialised, and the regranted worker keeps its grant of 2 and serves.
TEST(PipelineContract, R73DepthZeroIsRefusedAndChangesNothing) {
  const Status zero = is_valid_pipeline_contract(PipelineContract{0, 0});
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("pipeline_depth = 0"), std::string::npos) << zero.message();
  WorkerConfig cfg;
  cfg.pipeline_depth = 0;
  auto created = ChipWorker::create(cfg, {});
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(created.status().message().find("pipeline_depth = 0"), std::string::npos);
  Worker facade(Level::Chip, cfg);
  const Status init = facade.init();
  EXPECT_EQ(init.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(init.message().find("pipeline_depth"), std::string::npos) << init.message();
  EXPECT_EQ(facade.memory_info().status().code(), StatusCode::kFailedPrecondition) << "init did not happen";

  Fixture f(2);
  const Status regrant = f.worker->set_run_resource_grant(0);
  EXPECT_EQ(regrant.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(regrant.message().find("pipeline_depth = 0"), std::string::npos) << regrant.message();
  EXPECT_EQ(f.worker->grant(), 2u);
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 2u) << name;
  EXPECT_EQ(f.worker->set_counts().free, 2u);
  EXPECT_TRUE(f.worker->submit(0, f.inout_args()).wait_for(30s).ok());
}

// R73, asserted apart from the program contract: the kernel contract, what a
// callable is served by an unconfigured Worker, declares pipeline_depth 2 (and
// launch_depth = depth), and an unconfigured chip grants exactly that.
TEST(PipelineContract, R73KernelContractDeclaresDepthTwo) {
  const PipelineContract kernel = program_contract(WorkerConfig{});
  EXPECT_EQ(kernel.pipeline_depth, 2u);
  EXPECT_EQ(kernel.launch_depth, 0u);
  EXPECT_TRUE(is_valid_pipeline_contract(kernel).ok());
  auto w = ChipWorker::create(WorkerConfig{}, {});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ((*w)->grant(), kernel.pipeline_depth);
  EXPECT_EQ((*w)->launch_depth(), kernel.pipeline_depth);
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
  // The run's storage is abandoned, but not the caller: close() gave the run
  // its one terminal (issue 9 item 3).
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r.result().code(), StatusCode::kDeadlineExceeded);
}

// R72: total bytes exact (above 2^32 too), free bytes well formed.
TEST(MemoryInfo, R72ExactTotalAboveFourGiB) {
  WorkerConfig cfg;
  cfg.device_memory_bytes = 5 * (uint64_t{1} << 32) + 7;
  cfg.max_tasks_per_run = 16;
  cfg.guard_device_memory = false;  // exact accounting: no guard bytes around allocations
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

// R27 + R31: the grant is exactly what was asked for, and it reaches the runtime.
TEST(Grant, R27R31GrantIsTheRequestAndReachesTheRuntime) {
  for (uint32_t g : {1u, 5u, 17u}) {
    Fixture f(g);
    EXPECT_EQ(f.worker->grant(), g);
    EXPECT_EQ(f.worker->runtime().width(), g);
    for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, g) << name;
  }
}

// R31: a runtime whose grant hook refuses. It is the reference runtime with
// a hook that refuses any grant of 3 sets; registered by the test that uses
// it, after the conformance suites took their list of runtimes.
class RefusesThreeSets final : public ChipRuntime {
 public:
  explicit RefusesThreeSets(std::unique_ptr<ChipRuntime> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<Pending>> build_grant(uint32_t grant) const override {
    if (grant == 3) return failed_precondition("refuses_three_sets: a grant of 3 sets is refused");
    return inner_->build_grant(grant);
  }
  void commit_grant(Pending& pending) noexcept override { inner_->commit_grant(pending); }
  uint32_t width() const override { return inner_->width(); }
  uint64_t arena_bytes() const override { return inner_->arena_bytes(); }
  Status build(const HostApi& api, const ChipCallable& c, const TaskArgs& a, const RuntimeEnv& env,
               const diag::RunTrace& trace) override {
    return inner_->build(api, c, a, env, trace);
  }
  uint32_t orchestrator_threads() const override { return inner_->orchestrator_threads(); }
  void discard(uint32_t slot) override { inner_->discard(slot); }
  void launch(uint32_t slot) override { inner_->launch(slot); }
  bool binding_held(uint32_t slot) const override { return inner_->binding_held(slot); }
  bool poll(uint32_t aicpu) override { return inner_->poll(aicpu); }

  static Result<std::unique_ptr<ChipRuntime>> create(Device& device, const RuntimeOptions& options, RunDoneFn done) {
    SIMPLER_ASSIGN_OR_RETURN(const RuntimeInfo* reference, runtime_named("reference"));
    SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<ChipRuntime> inner, reference->create(device, options, std::move(done)));
    return std::unique_ptr<ChipRuntime>(new RefusesThreeSets(std::move(inner)));
  }

 private:
  std::unique_ptr<ChipRuntime> inner_;
};

TEST(Grant, R31ARuntimeThatRefusesTheGrantFailsStartupAndRegrant) {
  static const bool registered = register_runtime(
      RuntimeInfo{"refuses_three_sets", "test runtime: refuses a grant of 3", false, false, &RefusesThreeSets::create});
  ASSERT_TRUE(registered);
  const testing::ChipTarget target{"refuses_three_sets", "small", "sim"};
  {
    WorkerConfig cfg;
    cfg.runtime = target.runtime;
    cfg.pipeline_depth = 3;
    cfg.max_tasks_per_run = 64;
    cfg.device_memory_bytes = 256ull << 20;
    auto refused = ChipWorker::create(cfg, {});
    ASSERT_FALSE(refused.ok()) << "startup must fail when the runtime refuses the grant";
    EXPECT_NE(refused.status().message().find("a grant of 3 sets is refused"), std::string::npos)
        << refused.status().message();
  }
  Fixture f(2, 0, target);
  ASSERT_NE(f.worker, nullptr);
  const Status st = f.worker->set_run_resource_grant(3);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("the runtime refused"), std::string::npos) << st.message();
  EXPECT_EQ(f.worker->grant(), 2u);
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 2u) << name;
  EXPECT_EQ(f.worker->set_counts().free, 2u);
  EXPECT_TRUE(f.worker->submit(0, f.inout_args()).wait_for(30s).ok()) << "the old grant still serves";
  ASSERT_TRUE(f.worker->set_run_resource_grant(4).ok());
  for (const auto& [name, width] : f.worker->owner_widths()) EXPECT_EQ(width, 4u) << name;
}

// R28: a descriptor naming slot or bank G is refused and touches no storage.
TEST(Grant, R28DescriptorCheckedAgainstTheGrant) {
  Fixture f(3);
  Storage s;
  NativeRunDescriptor d = desc_for(*f.worker->try_acquire_lease());
  d.arena_bank = 3;
  Status st = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_NE(st.message().find("arena_bank = 3"), std::string::npos) << st.message();
  EXPECT_EQ(s.magic(), 0u);
  d = desc_for(Lease{3, 1});
  st = f.worker->prepare(s.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_NE(st.message().find("lease.slot = 3"), std::string::npos) << st.message();
  EXPECT_EQ(s.magic(), 0u);
}

// R29: the generation filter is grant-wide and refuses replays.
TEST(Grant, R29GenerationFilter) {
  Fixture f(4);
  std::vector<Lease> l;
  for (int i = 0; i < 4; ++i) l.push_back(*f.worker->try_acquire_lease());
  Storage s;
  auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(l[3]), 0, f.inout_args());
  ASSERT_TRUE(e.ok()) << "slot 3 is admitted";
  EXPECT_EQ(f.worker->finalize(s.get(), *e).code(), StatusCode::kAborted);
  Storage s4;
  EXPECT_EQ(
      f.worker->prepare(s4.get(), native_run_storage_size(), desc_for(Lease{4, 1}), 0, f.inout_args()).status().code(),
      StatusCode::kInvalidArgument)
      << "slot 4 is refused";
  auto fresh = f.worker->try_acquire_lease();
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(fresh->slot, 3u);
  EXPECT_EQ(f.worker->prepare(s.get(), native_run_storage_size(), desc_for(l[3]), 0, f.inout_args()).status().code(),
            StatusCode::kFailedPrecondition)
      << "the replayed old generation of slot 3";
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(f.worker->release_lease(l[i]));
  EXPECT_TRUE(f.worker->release_lease(*fresh));
}

// R29: the refusal of a replayed generation is the filter's own, not the
// arena's (which would refuse the stale lease too, naming it "not held").
TEST(Grant, R29TheFilterRefusesTheReplay) {
  Fixture f(2);
  auto first = f.worker->try_acquire_lease();
  ASSERT_TRUE(first.has_value());
  Storage s;
  auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*first), 0, f.inout_args());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(f.worker->finalize(s.get(), *e).code(), StatusCode::kAborted);
  auto second = f.worker->try_acquire_lease();
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(second->slot, first->slot);
  auto admitted = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*second), 0, f.inout_args());
  ASSERT_TRUE(admitted.ok());
  Storage replay;
  NativeRunDescriptor d = desc_for(*first);
  d.arena_bank = 1;  // a free bank: only the generation can refuse it
  const Status st = f.worker->prepare(replay.get(), native_run_storage_size(), d, 0, f.inout_args()).status();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("is a replay"), std::string::npos) << st.message();
  EXPECT_EQ(replay.magic(), 0u);
  EXPECT_EQ(f.worker->finalize(s.get(), *admitted).code(), StatusCode::kAborted);
}

// R29: the filter itself: G = 4 admits slot 3 and refuses slot 4 and older
// generations; an empty filter (the documented fixture trap) refuses everything.
TEST(Grant, R29GenerationFilterUnit) {
  GenerationFilter filter(4);
  EXPECT_EQ(filter.width(), 4u);
  EXPECT_TRUE(filter.is_admissible(Lease{3, 1}));
  EXPECT_FALSE(filter.is_admissible(Lease{4, 1}));
  EXPECT_FALSE(filter.is_admissible(Lease{3, 0})) << "generation 0 is never issued";
  filter.admit(Lease{3, 5});
  EXPECT_FALSE(filter.is_admissible(Lease{3, 4}));
  EXPECT_TRUE(filter.is_admissible(Lease{3, 5}));
  EXPECT_TRUE(filter.is_admissible(Lease{3, 6}));
  GenerationFilter empty;
  for (uint32_t slot : {0u, 1u, 3u}) {
    for (uint64_t gen : {1ull, 2ull, 1000ull}) EXPECT_FALSE(empty.is_admissible(Lease{slot, gen})) << slot;
  }
}

// R30 (the part that applies to host_build_graph): after one warm bind,
// compatible binds of the same bank are wired to the recorded arena by
// address and do not set it up again. This runtime rebuilds a run's graph
// into the arena on every bind, so the seed's sentinel goes over every byte
// the one-task run below does not write: all task records but the first and
// all descriptors but the first task's (the layout is HbgRuntime's: tasks,
// then descriptors at the next 64-byte boundary). A second static-arena setup
// (constructing the task records again) overwrites it; so does any bind that
// writes the arena beyond what its graph needs. No bind allocates device memory.
TEST(Grant, R30RepeatedBindsReuseTheArena) {
  Fixture f(1);
  auto bind_once = [&] {
    Storage s;
    auto l = f.worker->try_acquire_lease();
    auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l), 0, f.inout_args());
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(f.worker->launch(s.get(), *e).ok());
    ASSERT_TRUE(f.worker->wait(s.get(), *e, deadline()).ok());
    ASSERT_TRUE(f.worker->finalize(s.get(), *e).ok());
  };
  bind_once();
  const uint64_t arena = f.worker->runner().arena_addr(0);
  const uint64_t free_after_warm = f.worker->memory_info().free_bytes;
  ASSERT_NE(arena, 0u);
  EXPECT_TRUE(f.worker->runner().callable_uploaded(0));
  const uint64_t bytes = f.worker->runtime().arena_bytes();
  const uint64_t tasks_end = (sizeof(GraphTask) * 64 + 63) / 64 * 64;  // Fixture: max_tasks_per_run = 64
  const uint64_t first_task_descriptors = tasks_end + kDescriptorsPerTask * sizeof(DeviceTensor);
  ASSERT_LT(first_task_descriptors, bytes);
  auto* p = reinterpret_cast<uint8_t*>(arena);
  constexpr uint8_t kSentinel = 0xC5;
  std::memset(p + sizeof(GraphTask), kSentinel, tasks_end - sizeof(GraphTask));
  std::memset(p + first_task_descriptors, kSentinel, bytes - first_task_descriptors);
  for (int i = 0; i < 8; ++i) bind_once();
  EXPECT_EQ(f.worker->runner().arena_addr(0), arena);
  EXPECT_EQ(f.worker->memory_info().free_bytes, free_after_warm);
  uint64_t changed = 0;
  for (uint64_t b = sizeof(GraphTask); b < tasks_end; ++b) changed += p[b] != kSentinel;
  for (uint64_t b = first_task_descriptors; b < bytes; ++b) changed += p[b] != kSentinel;
  EXPECT_EQ(changed, 0u) << "a compatible bind wrote the arena beyond its graph (set it up again)";
  float x = 0;
  ASSERT_TRUE(f.worker->copy_from(&x, f.buf, 4, 0).ok());
  EXPECT_EQ(x, 9.0f) << "every bind ran its graph";
}

// R49: a phase call parked in wait() holds the run: a concurrent finalize waits
// for it to leave, and a regrant is refused meanwhile.
TEST(NativeRun, R49CallsHoldTheRun) {
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
  Fixture f(2);
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  Storage s;
  auto l = f.worker->try_acquire_lease();
  auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l), 1, TaskArgs{});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(f.worker->launch(s.get(), *e).ok());
  ASSERT_TRUE(gate->wait_entered(1));
  NativeRunContext* ctx = NativeRunContext::from_storage(s.get());
  Status waited = internal_error("not waited"), finalized = internal_error("not finalized");
  std::atomic<bool> waiter_back{false}, finalizer_back{false};
  std::thread waiter([&] {
    waited = f.worker->wait(s.get(), *e, deadline());
    waiter_back.store(true);
  });
  // The waiter holds the run inside wait() (the kernel cannot end yet)
  // before finalize is called at all.
  ASSERT_TRUE(eventually([&] { return ctx->users() == 1; }));
  std::thread finalizer([&] {
    finalized = f.worker->finalize(s.get(), *e);
    finalizer_back.store(true);
  });
  ASSERT_TRUE(eventually([&] { return ctx->users() == 2; }));
  EXPECT_FALSE(waiter_back.load());
  EXPECT_FALSE(finalizer_back.load());
  EXPECT_EQ(f.worker->set_run_resource_grant(4).code(), StatusCode::kFailedPrecondition);
  gate->release();
  waiter.join();
  finalizer.join();
  // Finalize waited for the parked waiter to leave: the waiter got the
  // terminal from a live run, never a destroyed one.
  EXPECT_TRUE(waited.ok()) << waited.to_string();
  EXPECT_TRUE(finalized.ok()) << finalized.to_string();
  EXPECT_EQ(s.magic(), 0u);
  EXPECT_TRUE(f.worker->set_run_resource_grant(4).ok());
}

// R54: close drains wide: five unwaited runs, one failing, all terminal after
// close with a repeatable outcome; nothing stays registered or live.
extern "C" void fail_kernel(int64_t*) { simpler_kernel_fail("fail_kernel: planned failure"); }

TEST(NativeRun, R54CloseDrainsWide) {
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "add_one_kernel", add_one_kernel).ok());
  ASSERT_TRUE(k.add_function(2, CoreType::AIV, "fail_kernel", fail_kernel).ok());
  ASSERT_TRUE(k.add_function(1, CoreType::AIV, "gate_kernel", gate_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{Param::inout()});
  cs.emplace_back(
      "fails", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(2, TaskArgs{}).status(); }, k,
      std::vector<Param>{});
  cs.emplace_back(
      "gated", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(1, TaskArgs{}).status(); }, k,
      std::vector<Param>{});
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  WorkerConfig cfg;
  cfg.pipeline_depth = 5;
  cfg.max_tasks_per_run = 16;
  cfg.device_memory_bytes = 64ull << 20;
  auto w = ChipWorker::create(cfg, std::move(cs));
  ASSERT_TRUE(w.ok());
  // Runs of one chip are independent of each other: each gets its own buffer.
  // Run 4 waits on the gate, so it is still in flight when close() starts.
  std::vector<RunHandle> runs;
  for (int i = 0; i < 5; ++i) {
    TaskArgs a;
    auto buf = (*w)->malloc(64 * 4);
    ASSERT_TRUE(buf.ok());
    if (i != 2 && i != 4) a.add_tensor(buf->view({64}, DType::F32), Tag::InOut);
    runs.push_back((*w)->submit(i == 2 ? 1 : (i == 4 ? 2 : 0), a));
  }
  ASSERT_TRUE(gate->wait_entered(1));
  Status closed = internal_error("close() never returned");
  std::atomic<pid_t> closer_tid{0};
  std::thread closer([&] {
    closer_tid = gettid();
    closed = (*w)->close(std::chrono::milliseconds(30'000));
  });
  ASSERT_TRUE(eventually([&] { return closer_tid.load() != 0 && testing::thread_state(closer_tid.load()) == 'S'; }));
  EXPECT_FALSE(runs[4].done()) << "the gated run ended before its gate opened";
  gate->release();
  closer.join();
  ASSERT_TRUE(closed.ok()) << closed.to_string();
  EXPECT_EQ((*w)->registered_runs(), 0u);
  EXPECT_EQ((*w)->set_counts().free, 5u);
  EXPECT_EQ((*w)->launched_now(), 0u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(runs[i].done()) << i;
    const Status first = runs[i].result();
    EXPECT_EQ(first.ok(), i != 2) << first.to_string();
    for (int j = 0; j < 3; ++j) EXPECT_EQ(runs[i].result(), first);
  }
  EXPECT_NE(runs[2].result().message().find("planned failure"), std::string::npos);
  EXPECT_EQ((*w)->submit(0, TaskArgs{}).result().code(), StatusCode::kFailedPrecondition);
}

// R80: no ambient selection setter exists in the library.
TEST(HostApi, R80NoAmbientSetters) {
  void* self = dlopen(nullptr, RTLD_NOW);
  for (const char* name : {"select_pipeline_slot_ctx", "select_arena_bank_ctx", "set_native_run_identity_ctx",
                           "set_task_accepted_state_ctx"}) {
    EXPECT_EQ(dlsym(self, name), nullptr) << name;
    EXPECT_EQ(dlsym(RTLD_DEFAULT, name), nullptr) << name;
  }
  EXPECT_NE(dlsym(RTLD_DEFAULT, "simpler_kernel_fail"), nullptr) << "the probe itself must work";
}

// R87: a launcher parked behind launch_depth burns no CPU, and is released.
TEST(NativeRun, R87LaunchWaitBurnsNoCpu) {
  testing::Watchdog dog;  // joins threads parked in calls without a deadline
  Fixture f(2, 1);
  std::unique_ptr<Gate> gate(new Gate);
  g_gate = gate.get();
  RunHandle blocker = f.worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  Storage s;
  auto l = f.worker->try_acquire_lease();
  auto e = f.worker->prepare(s.get(), native_run_storage_size(), desc_for(*l), 0, f.inout_args());
  ASSERT_TRUE(e.ok());
  std::atomic<bool> launched{false};
  Doorbell launched_bell;
  clockid_t cpu_clock{};
  std::atomic<bool> have_clock{false};
  std::thread launcher([&] {
    pthread_getcpuclockid(pthread_self(), &cpu_clock);
    have_clock.store(true);
    EXPECT_TRUE(f.worker->launch(s.get(), *e).ok());
    launched.store(true);
    launched_bell.ring();
  });
  ASSERT_TRUE(eventually(
      [&] { return have_clock.load() && NativeRunContext::from_storage(s.get())->phase() == RunPhase::Launching; }));
  auto cpu = [&] {
    timespec ts{};
    clock_gettime(cpu_clock, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  const double before = cpu();
  std::this_thread::sleep_for(200ms);  // the measured window, not a synchronisation
  const double burned = cpu() - before;
  EXPECT_FALSE(launched.load());
  EXPECT_LT(burned, 20.0) << "ms of CPU burned by a parked launcher over 200 ms";
  gate->release();
  // R87's bound: the notification releases the parked launcher within 1 s.
  EXPECT_TRUE(spin_then_park(
      launched_bell, [&] { return launched.load(); }, SpinPolicy{}, now_ns() + 1'000'000'000ull))
      << "the launcher was not released within 1 s of the notification";
  launcher.join();
  EXPECT_TRUE(launched.load());
  EXPECT_TRUE(blocker.wait_for(30s).ok());
  EXPECT_TRUE(f.worker->finalize(s.get(), *e).ok());
}

// R88: the runtime's HostApi binding is dropped on every exit from a build.
TEST(HostApi, R88BindingClearedOnEveryExit) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "add_one_kernel", add_one_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "refuses", [](ChipOrchestrator&, const TaskArgs&) { return invalid_argument("planned refusal"); }, k,
      std::vector<Param>{});
  cs.emplace_back(
      "throws", [](ChipOrchestrator&, const TaskArgs&) -> Status { throw std::runtime_error("planned"); }, k,
      std::vector<Param>{});
  cs.emplace_back(
      "ok", [](ChipOrchestrator&, const TaskArgs&) { return Status(); }, k, std::vector<Param>{});
  WorkerConfig cfg;
  cfg.max_tasks_per_run = 16;
  cfg.device_memory_bytes = 64ull << 20;
  auto w = ChipWorker::create(cfg, std::move(cs));
  ASSERT_TRUE(w.ok());
  for (uint32_t c = 0; c < 3; ++c) {
    Storage s;
    auto l = (*w)->try_acquire_lease();
    auto e = (*w)->prepare(s.get(), native_run_storage_size(), desc_for(*l), c, TaskArgs{});
    EXPECT_EQ(e.ok(), c == 2) << e.status().to_string();
    EXPECT_FALSE((*w)->runtime().binding_held(l->slot)) << "callable " << c;
    if (e.ok())
      EXPECT_EQ((*w)->finalize(s.get(), *e).code(), StatusCode::kAborted);
    else
      EXPECT_TRUE((*w)->release_lease(*l));
  }
}

// Issue 9 item 3: a submitted run still on the device run_timeout after its
// launch ends DEADLINE_EXCEEDED; its kernel cannot be stopped, so its set is
// quarantined and the chip is wedged: later submits are refused and close()
// abandons the device at once. When the kernel does return at last, the run
// gets no second terminal (RunState::complete aborts on one).
TEST_P(Lifecycle, RunTimeoutEndsTheRunAndWedgesTheChip) {
  testing::Watchdog dog;
  Fixture f(2, 0, GetParam(), 100ms);
  Gate* gate = abandon(new Gate);  // a kernel may still wait on it after the test
  g_gate = gate;
  RunHandle r = f.worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  const Status s = r.wait_for(30s);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("run_timeout = 100 ms"), std::string::npos) << s.message();
  EXPECT_TRUE(f.worker->wedged());
  EXPECT_EQ(f.worker->set_counts().quarantined, 1u);
  const RunHandle refused = f.worker->submit(0, f.inout_args());
  ASSERT_TRUE(refused.done());
  EXPECT_EQ(refused.result().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.result().message().find("wedged"), std::string::npos) << refused.result().message();
  gate->release();
  EXPECT_TRUE(eventually([&] { return f.worker->launched_now() == 0; })) << "the late end of the run never came";
  EXPECT_EQ(r.result(), s) << "a run's terminal is delivered once";
  EXPECT_EQ(f.worker->close(30s).code(), StatusCode::kDeadlineExceeded);
  abandon(f.worker.release());  // its device threads were left running
}

// Issue 9 item 3: close() is bounded by its timeout, and every submitted run
// gets a terminal from it: DEADLINE_EXCEEDED if it was launched, ABORTED if
// it was still queued behind launch_depth. Runs that end later get no second one.
TEST_P(Lifecycle, CloseIsBoundedAndGivesEveryRunATerminal) {
  testing::Watchdog dog;
  Fixture f(2, 1, GetParam(), 0ms);  // no run_timeout: only close() ends the run
  Gate* gate = abandon(new Gate);
  g_gate = gate;
  RunHandle launched = f.worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  RunHandle queued = f.worker->submit(1, TaskArgs{});
  ChipWorker::CompletionGate* late = f.worker->completion_gate_for_test();  // abandoned by close(), kept alive
  const Status closed = f.worker->close(200ms);
  EXPECT_EQ(closed.code(), StatusCode::kDeadlineExceeded) << closed.to_string();
  ASSERT_TRUE(launched.done());
  EXPECT_EQ(launched.result().code(), StatusCode::kDeadlineExceeded) << launched.result().to_string();
  ASSERT_TRUE(queued.done());
  EXPECT_EQ(queued.result().code(), StatusCode::kAborted) << queued.result().to_string();
  EXPECT_NE(queued.result().message().find("never launched"), std::string::npos) << queued.result().message();
  const Status first = launched.result();
  gate->release();
  // The abandoned device ends the run at last; the worker no longer hears it.
  EXPECT_TRUE(spin_then_park(
      late->dropped_bell(), [&] { return late->dropped() == 1; }, SpinPolicy{}, deadline()))
      << "the late end of the run never came";
  EXPECT_EQ(launched.result(), first);
  abandon(f.worker.release());
}

// Bug (issue 10): after an abandoning close(), a kernel that ends once the
// owner has destroyed the ChipWorker must touch only the abandoned storage
// kept alive for it, never the freed worker. The freed memory is refilled
// with garbage so that the use after free faults without ASan too.
TEST_P(Lifecycle, LateCompletionAfterTheWorkerIsDestroyedTouchesNoFreedMemory) {
  testing::Watchdog dog;
  auto f = std::make_unique<Fixture>(2, 0, GetParam(), 0ms);
  Gate* gate = abandon(new Gate);
  g_gate = gate;
  RunHandle r = f->worker->submit(1, TaskArgs{});
  ASSERT_TRUE(gate->wait_entered(1));
  ChipWorker::CompletionGate* late = f->worker->completion_gate_for_test();
  EXPECT_EQ(f->worker->close(50ms).code(), StatusCode::kDeadlineExceeded);
  f.reset();  // the owner destroys the worker while its kernel still runs
  std::vector<std::unique_ptr<unsigned char[]>> litter;
  for (size_t bytes : {sizeof(ChipWorker), sizeof(Fixture), size_t{64}, size_t{128}}) {
    for (int i = 0; i < 8; ++i) {
      litter.emplace_back(new unsigned char[bytes]);
      std::memset(litter.back().get(), 0xA5, bytes);
    }
  }
  gate->release();  // the kernel returns now, after the worker is gone
  ASSERT_TRUE(spin_then_park(
      late->dropped_bell(), [&] { return late->dropped() == 1; }, SpinPolicy{}, deadline()))
      << "the late completion never reached the abandoned gate";
  ASSERT_TRUE(r.done());
  EXPECT_EQ(r.result().code(), StatusCode::kDeadlineExceeded) << "close() gave the run its one terminal";
}

// R89: every runtime on every geometry of the sim backend passes the same
// lifecycle, and reaches its device only through the callback contract: with
// two runs in flight at once, each set's graph went into its own bank's arena
// (arena_setup), each run's arguments into its own slot's retained buffer
// (retained_temp), the callable was uploaded, and every callback of a bound
// HostApi does what the contract says.
TEST_P(Lifecycle, R89SameLifecycleContract) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "add_one_kernel", add_one_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "add_one", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
      std::vector<Param>{Param::inout()});
  WorkerConfig cfg;
  cfg.geometry = *Geometry::by_name(GetParam().geometry);
  cfg.runtime = GetParam().runtime;
  cfg.backend = GetParam().backend;
  cfg.pipeline_depth = 2;
  cfg.max_tasks_per_run = 16;
  cfg.device_memory_bytes = 64ull << 20;
  auto w = ChipWorker::create(cfg, std::move(cs));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(check_host_api_ops((*w)->runner().ops()).ok());
  DeviceBuffer bufs[2];
  TaskArgs args[2];
  for (int i = 0; i < 2; ++i) {
    auto b = (*w)->malloc(64 * 4);
    ASSERT_TRUE(b.ok());
    bufs[i] = *b;
    std::vector<float> zeros(64, 0.f);
    ASSERT_TRUE((*w)->copy_to(bufs[i], zeros.data(), 64 * 4, 0).ok());
    args[i].add_tensor(bufs[i].view({64}, DType::F32), Tag::InOut);
  }
  for (int round = 0; round < 3; ++round) {
    Storage s[2];
    uint64_t epochs[2] = {};
    for (int i = 0; i < 2; ++i) {
      auto l = (*w)->try_acquire_lease();
      ASSERT_TRUE(l.has_value());
      auto e = (*w)->prepare(s[i].get(), native_run_storage_size(), desc_for(*l), 0, args[i]);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      epochs[i] = *e;
      EXPECT_EQ((*w)->poll(s[i].get(), *e).status().code(), StatusCode::kFailedPrecondition);
    }
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*w)->launch(s[i].get(), epochs[i]).ok());
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE((*w)->wait(s[i].get(), epochs[i], deadline()).ok());
      EXPECT_TRUE((*w)->finalize(s[i].get(), epochs[i]).ok());
    }
  }
  for (int i = 0; i < 2; ++i) {
    float x = 0;
    ASSERT_TRUE((*w)->copy_from(&x, bufs[i], 4, 0).ok());
    EXPECT_EQ(x, 3.0f);
  }
  DeviceRunner& runner = (*w)->runner();
  EXPECT_TRUE(runner.callable_uploaded(0));
  EXPECT_NE(runner.arena_addr(0), 0u);
  EXPECT_NE(runner.arena_addr(1), 0u);
  EXPECT_NE(runner.arena_addr(0), runner.arena_addr(1)) << "two banks share an arena";
  EXPECT_NE(runner.retained_addr(0), 0u);
  EXPECT_NE(runner.retained_addr(1), 0u);
  EXPECT_NE(runner.retained_addr(0), runner.retained_addr(1)) << "two slots share a retained buffer";
  // The callbacks themselves, through a binding of slot 1, bank 1.
  auto api = runner.bind(1, 1);
  ASSERT_TRUE(api.ok());
  EXPECT_EQ(*api->retained_temp(16), runner.retained_addr(1));
  EXPECT_EQ(*api->arena_setup(nullptr), runner.arena_addr(1));
  EXPECT_EQ(api->swimlane_level(), 0u);
  auto scratch = api->device_malloc(256);
  ASSERT_TRUE(scratch.ok());
  const uint8_t pattern[4] = {1, 2, 3, 4};
  ASSERT_TRUE(api->memset_device(*scratch, 0x5a, 256).ok());
  ASSERT_TRUE(api->copy_to_device(*scratch + 8, pattern, sizeof pattern).ok());
  uint8_t back[16] = {};
  ASSERT_TRUE(api->copy_from_device(back, *scratch, sizeof back).ok());
  const uint8_t expected[16] = {0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 1, 2, 3, 4, 0x5a, 0x5a, 0x5a, 0x5a};
  EXPECT_EQ(std::memcmp(back, expected, sizeof back), 0);
  EXPECT_TRUE(api->device_free(*scratch).ok());
  EXPECT_FALSE(api->device_free(*scratch).ok()) << "a freed address is not freed twice";
}
SIMPLER_ON_EVERY_TARGET(Lifecycle);

}  // namespace
}  // namespace simpler
