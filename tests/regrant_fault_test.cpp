// R25: a regrant whose build fails at any allocation leaves the old grant
// whole. This binary replaces global operator new with one that throws
// std::bad_alloc at the k-th allocation of the arming thread, for every k.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "alloc_hook.h"
#include "chip/chip_worker.h"
#include "simpler/simpler.h"

namespace simpler {
namespace {

using testing::AllocHook;

extern "C" void noop_kernel(int64_t*) {}

TEST(Grant, R25RegrantFailsCleanlyAtEveryAllocation) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "noop_kernel", noop_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "noop", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(0, TaskArgs{}).status(); }, k,
      std::vector<Param>{});
  WorkerConfig cfg;
  cfg.pipeline_depth = 3;
  cfg.max_tasks_per_run = 32;
  cfg.device_memory_bytes = 64ull << 20;
  auto w = ChipWorker::create(cfg, std::move(cs));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ChipWorker& worker = **w;
  int failures = 0;
  for (long k_th = 0;; ++k_th) {
    AllocHook::fail_after = k_th;
    Status st = worker.set_run_resource_grant(7);
    AllocHook::fail_after = -1;
    if (st.ok()) break;
    ++failures;
    ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << "k = " << k_th << ": " << st.to_string();
    ASSERT_EQ(worker.grant(), 3u) << "k = " << k_th;
    for (const auto& [name, width] : worker.owner_widths()) ASSERT_EQ(width, 3u) << name << " at k = " << k_th;
    const ArenaCounts c = worker.set_counts();
    ASSERT_EQ(c.free, 3u);
    // The old grant still runs.
    ASSERT_TRUE(worker.submit(0, TaskArgs{}).wait_for(std::chrono::seconds(30)).ok()) << "k = " << k_th;
    ASSERT_LT(k_th, 100000) << "the build never succeeded";
  }
  EXPECT_GT(failures, 5) << "the build should allocate at several points";
  EXPECT_EQ(worker.grant(), 7u);
  for (const auto& [name, width] : worker.owner_widths()) EXPECT_EQ(width, 7u) << name;
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(worker.submit(0, TaskArgs{}).wait_for(std::chrono::seconds(30)).ok());
}

// R26: a host allocation failure at any point of a prepare that allocates
// intermediates leaves no device block owned by no record: device memory is
// back to its baseline after every failure, and the storage is still empty.
TEST(Grant, R26NoOrphanDeviceBlockAtAnyAllocationFailure) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "noop_kernel", noop_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "intermediates",
      [](ChipOrchestrator& o, const TaskArgs&) -> Status {
        for (int i = 0; i < 4; ++i) {
          Scope scope(o);
          auto t = o.alloc({256}, DType::F32);
          if (!t.ok()) return t.status();
          TaskArgs a;
          a.add_tensor(*t, Tag::OutputExisting);
          if (auto r = o.submit_aiv(0, a); !r.ok()) return r.status();
          TaskArgs b;
          b.add_output({128}, DType::F32);
          if (auto r = o.submit_aiv(0, b); !r.ok()) return r.status();
        }
        return Status();
      },
      k, std::vector<Param>{});
  WorkerConfig cfg;
  cfg.pipeline_depth = 1;
  cfg.max_tasks_per_run = 32;
  cfg.device_memory_bytes = 64ull << 20;
  auto w = ChipWorker::create(cfg, std::move(cs));
  ASSERT_TRUE(w.ok());
  ChipWorker& worker = **w;
  auto lease = worker.try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  NativeRunDescriptor d;
  d.lease = *lease;
  struct AlignedDelete {
    void operator()(void* p) const { ::operator delete (p, std::align_val_t{native_run_storage_alignment()}); }
  };
  std::unique_ptr<void, AlignedDelete> owned(
      ::operator new (native_run_storage_size(), std::align_val_t{native_run_storage_alignment()}));
  void* storage = owned.get();
  std::memset(storage, 0, native_run_storage_size());
  // Warm the bank arena so the baseline includes it.
  auto warm = worker.prepare(storage, native_run_storage_size(), d, 0, TaskArgs{});
  ASSERT_TRUE(warm.ok()) << warm.status().to_string();
  ASSERT_EQ(worker.finalize(storage, *warm).code(), StatusCode::kAborted);
  lease = worker.try_acquire_lease();
  d.lease = *lease;
  const uint64_t baseline = worker.memory_info().free_bytes;
  int failures = 0;
  for (long k_th = 0;; ++k_th) {
    AllocHook::fail_after = k_th;
    auto e = worker.prepare(storage, native_run_storage_size(), d, 0, TaskArgs{});
    AllocHook::fail_after = -1;
    if (e.ok()) {
      EXPECT_EQ(worker.finalize(storage, *e).code(), StatusCode::kAborted);
      break;
    }
    ++failures;
    ASSERT_EQ(e.status().code(), StatusCode::kResourceExhausted) << "k = " << k_th << ": " << e.status().to_string();
    ASSERT_EQ(worker.memory_info().free_bytes, baseline) << "k = " << k_th << ": a device block was orphaned";
    uint64_t magic;
    std::memcpy(&magic, storage, sizeof magic);
    ASSERT_EQ(magic, 0u) << "k = " << k_th;
    ASSERT_TRUE(worker.set_counts().live == 1) << "the lease is still the caller's";
    ASSERT_LT(k_th, 2000) << e.status().to_string();
  }
  EXPECT_GT(failures, 10);
  EXPECT_EQ(worker.memory_info().free_bytes, baseline);
}

}  // namespace
}  // namespace simpler
