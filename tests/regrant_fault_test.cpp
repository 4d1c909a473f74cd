// R25: a regrant whose build fails at any allocation leaves the old grant
// whole. This binary replaces global operator new with one that throws
// std::bad_alloc at the k-th allocation of the arming thread, for every k.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <new>

#include "chip/chip_worker.h"

namespace {
thread_local long t_allocations_left = -1;  // -1: not armed
}

void* operator new(std::size_t n) {
  if (t_allocations_left == 0) {
    t_allocations_left = -1;
    throw std::bad_alloc();
  }
  if (t_allocations_left > 0) --t_allocations_left;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace simpler {
namespace {

extern "C" void noop_kernel(int64_t*) {}

TEST(Grant, R25RegrantFailsCleanlyAtEveryAllocation) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "noop_kernel", noop_kernel).ok());
  std::vector<ChipCallable> cs;
  cs.emplace_back("noop", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(0, TaskArgs{}).status(); }, k,
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
    t_allocations_left = k_th;
    Status st = worker.set_run_resource_grant(7);
    t_allocations_left = -1;
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

}  // namespace
}  // namespace simpler
