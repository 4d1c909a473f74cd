// What a chip keeps in device memory between runs (README, "Memory a Worker
// keeps"): each run-resource set a run has used keeps its graph arena, sized
// by max_tasks_per_run, as a cache until close; a chip never holds more than
// pipeline_depth of them. Run with -V to see the figures the README quotes.
#include <atomic>
#include <cstdio>
#include <vector>

#include "test_util.h"

namespace simpler::testing {
namespace {

// A kernel that holds its core until the test releases it, so that a burst of
// runs is in flight at once; it fails its task rather than wait past kWait.
std::atomic<int> g_entered{0};
std::atomic<bool> g_release{false};

extern "C" void latch_kernel(int64_t*) {
  g_entered.fetch_add(1);
  if (!eventually([] { return g_release.load(); })) simpler_kernel_fail("latch_kernel: never released");
}

struct Burst {
  Worker worker;
  CallableHandle callable;
  std::vector<DeviceBuffer> buffers;  // one per run, so the runs do not depend on one another
};

void open(Burst& b) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "latch_kernel", latch_kernel).ok());
  auto h = b.worker.register_callable(
      ChipCallable("latch", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
                   {Param::inout()}));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  b.callable = *h;
  ASSERT_TRUE(b.worker.init().ok());
  for (uint32_t i = 0; i < b.worker.config().pipeline_depth; ++i) {
    auto x = b.worker.malloc(256);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    b.buffers.push_back(*x);
  }
}

// Submits one run per buffer, sees them all inside the kernel at once (each
// holding its own set), releases them and waits for every one.
void run_burst(Burst& b) {
  g_entered = 0;
  g_release = false;
  std::vector<RunHandle> runs;
  for (const DeviceBuffer& x : b.buffers) {
    TaskArgs a;
    a.add_tensor(x.view({64}, DType::F32), Tag::InOut);
    runs.push_back(b.worker.submit(b.callable, a));
  }
  const int want = static_cast<int>(runs.size());
  const bool all_in = eventually([want] { return g_entered.load() == want; });
  g_release = true;
  ASSERT_TRUE(all_in) << g_entered.load() << " of " << want << " runs reached the kernel together";
  for (const RunHandle& r : runs) ASSERT_TRUE(wait_run(r).ok());
}

uint64_t used(const Worker& w) { return w.config().device_memory_bytes - free_bytes(w); }

// Device bytes the runs of one burst left allocated after they all finished.
uint64_t retained_by_burst(uint32_t depth, uint32_t max_tasks) {
  Burst b{Worker(Level::Chip, {.pipeline_depth = depth, .max_tasks_per_run = max_tasks}), {}, {}};
  open(b);
  const uint64_t before = used(b.worker);
  run_burst(b);
  const uint64_t after = used(b.worker);
  // A second burst reuses what the first left: it is a cache, not a leak.
  run_burst(b);
  EXPECT_EQ(used(b.worker), after) << "a second burst of " << depth << " runs allocated more";
  EXPECT_TRUE(b.worker.close().ok());
  std::printf("pipeline_depth %u, max_tasks_per_run %u: %llu device bytes kept after the runs\n", depth, max_tasks,
              static_cast<unsigned long long>(after - before));
  return after - before;
}

TEST(RetainedMemory, EachUsedSetKeepsOneArenaSizedByMaxTasksPerRun) {
  Watchdog watchdog;
  const uint64_t one = retained_by_burst(1, 16384);
  EXPECT_GT(one, 0u);
  // Up to pipeline_depth sets, one arena each.
  EXPECT_EQ(retained_by_burst(4, 16384), 4 * one);
  // The arena scales with max_tasks_per_run: a sixteenth of the tasks, a
  // sixteenth of the bytes, up to the rounding of its parts.
  const uint64_t small = retained_by_burst(1, 1024);
  EXPECT_GT(small, 0u);
  EXPECT_LE(small * 16, one + 16 * 4096);
  EXPECT_GE(small * 16, one);
}

}  // namespace
}  // namespace simpler::testing
