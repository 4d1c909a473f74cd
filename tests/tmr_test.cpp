// The tensormap_and_ringbuffer runtime beyond the conformance suite: its
// TensorMap (overlap, supersession, retirement, tombstones), streaming (tasks
// run while the orchestration still submits), the rings (wrap-around,
// back-pressure, reuse of a scope's intermediates, the errors of a ring that
// can never fit or never drains) and RuntimeEnv. Issue 11.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "chip/chip_worker.h"
#include "kernels.h"
#include "runtime/tmr/tensor_map.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

constexpr const char* kTmr = "tensormap_and_ringbuffer";

// ---- TensorMap -------------------------------------------------------------------------------

struct MapProbe {
  tmr::TensorMap map;
  MapProbe() { map.reset(16); }
  // The earlier tasks task `task` conflicts with, in the order reported.
  std::vector<uint32_t> add(const TensorView& v, uint32_t task, bool write, uint64_t alloc = 0) {
    std::vector<uint32_t> found;
    const uint64_t shift = v.buffer().addr - (alloc == 0 ? v.buffer().addr : alloc);
    map.add(alloc == 0 ? v.buffer().addr : alloc, v, shift + v.first_byte(), shift + v.end_byte(), task, task % 16,
            write, [&](uint32_t earlier) { found.push_back(earlier); });
    std::sort(found.begin(), found.end());
    return found;
  }
};

const DeviceBuffer kBuf{0x10000, 64 * 8};
TensorView range(int64_t first, int64_t n) { return TensorView(kBuf, {n}, DType::I64, first); }

TEST(TensorMap, DisjointViewsOfOneBufferMakeNoEdgeAndPartialOverlapDoes) {
  MapProbe p;
  EXPECT_TRUE(p.add(range(0, 32), 0, true).empty());
  EXPECT_TRUE(p.add(range(32, 32), 1, true).empty()) << "disjoint halves of one buffer conflicted";
  EXPECT_EQ(p.add(range(16, 32), 2, false), (std::vector<uint32_t>{0, 1})) << "a read over both halves";
  EXPECT_EQ(p.add(range(0, 8), 3, false), (std::vector<uint32_t>{0})) << "the read of task 2 is no conflict";
  EXPECT_EQ(p.add(range(4, 8), 4, true), (std::vector<uint32_t>{0, 3})) << "a write after a write and a read";
  // Strided views that interleave without sharing an element are disjoint.
  const TensorView evens(kBuf, {32}, DType::I64, 0);
  MapProbe q;
  EXPECT_TRUE(q.add(*TensorView(kBuf, {32, 2}, DType::I64, 0).tile({0, 0}, {32, 1}), 0, true).empty());
  EXPECT_TRUE(q.add(*TensorView(kBuf, {32, 2}, DType::I64, 0).tile({0, 1}, {32, 1}), 1, true).empty())
      << "odd and even elements conflicted";
  EXPECT_EQ(q.add(evens, 2, false), (std::vector<uint32_t>{0, 1})) << "a dense read over both";
}

TEST(TensorMap, AWriteThatCoversOlderEntriesSupersedesThem) {
  MapProbe p;
  (void)p.add(range(0, 16), 0, true);
  (void)p.add(range(16, 16), 1, true);
  EXPECT_EQ(p.add(range(0, 64), 2, true), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(p.map.live_records(), 1u) << "the covered entries are still there";
  EXPECT_EQ(p.add(range(8, 4), 3, false), (std::vector<uint32_t>{2})) << "a reader of a superseded region";
}

TEST(TensorMap, SubBuffersOfOneAllocationMeetByBytes) {
  MapProbe p;
  const DeviceBuffer lo{kBuf.addr, 32 * 8}, hi{kBuf.addr + 16 * 8, 48 * 8};
  EXPECT_TRUE(p.add(lo.view({32}, DType::I64), 0, true, kBuf.addr).empty());
  EXPECT_EQ(p.add(*hi.view({48}, DType::I64).tile({0}, {4}), 1, false, kBuf.addr), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(p.add(*hi.view({48}, DType::I64).tile({16}, {4}), 2, false, kBuf.addr).empty());
}

TEST(TensorMap, ARetiredTaskLeavesNothingAndAFailedOneATombstone) {
  MapProbe p;
  (void)p.add(range(0, 8), 0, true);
  (void)p.add(range(8, 8), 1, true);
  p.map.retire(0, /*failed=*/false);
  p.map.retire(1, /*failed=*/true);
  EXPECT_TRUE(p.add(range(0, 8), 2, false).empty()) << "a retired task's entry still made an edge";
  EXPECT_EQ(p.add(range(8, 8), 3, false), (std::vector<uint32_t>{tmr::TensorMap::kTombstone}))
      << "a reader of a failed task's output must be poisoned";
  p.map.forget_allocation(kBuf.addr);
  EXPECT_EQ(p.map.live_records(), 0u);
  EXPECT_TRUE(p.add(range(8, 8), 4, true).empty()) << "memory handed out again still carries the tombstone";
}

// The map hashes records into granule buckets and keeps long ones apart; a
// plain list scanned whole is the model it must agree with, on random tasks
// that mix row tiles, strided columns, long ranges (past the granules a
// record may be hashed into), sub-buffers of one allocation, failed tasks
// and reused allocations.
TEST(TensorMap, AgreesWithAWholeScanOnRandomTasks) {
  struct ModelRec {
    uint64_t alloc, first, end;
    TensorView view;
    uint32_t task;
    bool write;
  };
  constexpr uint32_t kWindow = 16;
  constexpr uint32_t kInFlight = 12;
  const DeviceBuffer a{0x100000, 64 * 64 * 4}, b{0x200000, 64 * 64 * 4};
  const DeviceBuffer a_hi{a.addr + 32 * 64 * 4, 32 * 64 * 4};  // a sub-buffer of a's allocation
  uint64_t state = 42;
  const auto next = [&](uint32_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>((state >> 33) % n);
  };
  const auto random_view = [&]() -> std::pair<uint64_t, TensorView> {
    const DeviceBuffer& buf = next(3) == 0 ? b : (next(2) == 0 ? a : a_hi);
    const int64_t rows = static_cast<int64_t>(buf.bytes / (64 * 4));
    const TensorView whole = buf.view({rows, 64}, DType::F32);
    switch (next(4)) {
      case 0: {  // a tile of rows
        const int64_t r = next(static_cast<uint32_t>(rows)), n = 1 + next(3);
        return {buf.addr, *whole.tile({std::min(r, rows - n), 0}, {n, 64})};
      }
      case 1:  // a strided column
        return {buf.addr, *whole.tile({0, next(64)}, {rows, 1})};
      case 2: {  // a long flat range
        const int64_t n = 64 * (8 + next(24));
        return {buf.addr, TensorView(buf, {n}, DType::F32, next(static_cast<uint32_t>(rows * 64 - n)))};
      }
      default:  // the same small tile, often
        return {buf.addr, *whole.tile({next(2), 0}, {1, 64})};
    }
  };
  tmr::TensorMap map;
  map.reset(kWindow);
  std::vector<ModelRec> model;
  uint32_t oldest = 0;
  for (uint32_t task = 0; task < 4000; ++task) {
    if (task - oldest == kInFlight) {  // retire the oldest, sometimes as a failure
      const bool failed = next(8) == 0;
      map.retire(oldest % kWindow, failed);
      for (size_t i = 0; i < model.size();) {
        if (model[i].task != oldest) {
          ++i;
        } else if (failed) {
          model[i++].task = tmr::TensorMap::kTombstone;
        } else {
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      ++oldest;
    }
    if (next(64) == 0) {  // b's memory is handed out again
      map.forget_allocation(b.addr);
      std::erase_if(model, [&](const ModelRec& m) { return m.alloc == b.addr; });
    }
    const uint32_t args = 1 + next(3);
    for (uint32_t k = 0; k < args; ++k) {
      auto [buffer, v] = random_view();
      const uint64_t alloc = buffer == a_hi.addr ? a.addr : buffer;
      const uint64_t first = buffer - alloc + v.first_byte(), end = buffer - alloc + v.end_byte();
      const bool write = next(2) == 0;
      std::vector<uint32_t> got, want;
      map.add(alloc, v, first, end, task, task % kWindow, write, [&](uint32_t e) { got.push_back(e); });
      for (size_t i = 0; i < model.size();) {
        const ModelRec& m = model[i];
        const bool same_buffer = m.view.buffer().addr == v.buffer().addr;
        if (m.alloc != alloc || m.end <= first || m.first >= end || m.task == task) {
          ++i;
          continue;
        }
        if ((write || m.write) && (!same_buffer || m.view.overlaps(v))) want.push_back(m.task);
        if (write && same_buffer && write_covers(v, m.view)) {
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      model.push_back(ModelRec{alloc, first, end, v, task, write});
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      ASSERT_EQ(got, want) << "task " << task << " argument " << k;
      ASSERT_EQ(map.live_records(), model.size()) << "task " << task << " argument " << k;
    }
  }
}

// ---- Streaming on a chip ----------------------------------------------------------------------

WorkerConfig tmr_config(uint32_t window = 64, uint32_t depth = 2) {
  WorkerConfig c = small_config(depth, window);
  c.runtime = kTmr;
  return c;
}

enum : uint32_t { kFill = 1, kCopy, kAffine, kGate, kCount, kCheck, kOrdered, kSignalFill };

std::atomic<int> g_filled{0};

// Fills like fill_kernel, then says so: the test thread waits on this, not
// on device memory a kernel may still be writing.
void signalled_fill_kernel(int64_t* args) {
  fill_kernel(args);
  g_filled.fetch_add(1);
}

std::atomic<bool> g_submitted{false};
std::atomic<int> g_ordered_early{0};

// Copies like copy_kernel, and counts a start while the gate is still closed.
void ordered_copy_kernel(int64_t* args) {
  if (!g_gate_open.load()) g_ordered_early.fetch_add(1);
  copy_kernel(args);
}

// Fills args[0] with args[1] once the gate is open.
void gated_fill_kernel(int64_t* args) {
  gate_kernel(args);
  fill_kernel(args);
}

KernelLibrary kernels() {
  return make_kernels({{kFill, CoreType::AIV, "fill", fill_kernel},
                       {kCopy, CoreType::AIV, "copy", copy_kernel},
                       {kAffine, CoreType::AIV, "affine", affine_kernel},
                       {kGate, CoreType::AIV, "gated_fill", gated_fill_kernel},
                       {kCount, CoreType::AIV, "count", count_kernel},
                       {kCheck, CoreType::AIV, "check", check_kernel},
                       {kOrdered, CoreType::AIV, "ordered_copy", ordered_copy_kernel},
                       {kSignalFill, CoreType::AIV, "signalled_fill", signalled_fill_kernel}});
}

// R86: launch returns once the device took the run, and the first task runs
// while the orchestration still submits: the orchestration waits for the
// test thread to see submit() return, then for task 0 to have run, before it
// submits task 1. A runtime that builds first would fail both waits.
TEST(Streaming, R86FirstTasksRunWhileTheOrchestrationStillSubmits) {
  Watchdog dog;
  g_count = 0;
  g_submitted = false;
  Harness hw(ChipCallable("overlap",
                          [](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            if (!eventually([] { return g_submitted.load(); }, std::chrono::seconds(10))) {
                              return Status(StatusCode::kDeadlineExceeded, "submit() did not return first");
                            }
                            if (auto r = o.submit_aiv(kCount, {}); !r.ok()) return r.status();
                            if (!eventually([] { return g_count.load() == 1; }, std::chrono::seconds(10))) {
                              return Status(StatusCode::kDeadlineExceeded, "task 0 did not run while we submitted");
                            }
                            return o.submit_aiv(kCount, {}).status();
                          },
                          kernels(), {}),
             tmr_config());
  RunHandle r = hw.submit();
  g_submitted = true;
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(g_count.load(), 2);
  EXPECT_EQ(r.stats().tasks, 2u);
}

// Task A (held at a gate) writes x[0:32], B writes x[32:64]: no edge, so B
// finishes while A is held. C reads x[16:48], overlapping both: it must not
// start before A finished (it counts a start with the gate closed), and sees
// both writes. D, independent, shows the scheduler ran past C meanwhile.
TEST(Streaming, DisjointViewsRunTogetherAndAPartialOverlapWaits) {
  Watchdog dog;
  g_gate_open = false;
  g_ordered_early = 0;
  g_filled = 0;
  Harness hw(ChipCallable("overlap",
                          [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            const TensorView& x = a[0].tensor;
                            TaskArgs ta, tb, tc, td;
                            ta.add_tensor(*x.tile({0}, {32}), Tag::OutputExisting).add_scalar(1);
                            tb.add_tensor(*x.tile({32}, {32}), Tag::OutputExisting).add_scalar(2);
                            tc.add_tensor(*x.tile({16}, {32}), Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                            td.add_tensor(a[2].tensor, Tag::OutputExisting).add_scalar(3);
                            for (auto [fn, args] : {std::pair{kGate, &ta}, std::pair{kSignalFill, &tb},
                                                    std::pair{kOrdered, &tc}, std::pair{kSignalFill, &td}}) {
                              if (auto r = o.submit_aiv(fn, *args); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          kernels(), {Param::output(), Param::output(), Param::output()}),
             tmr_config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(64, 0));
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(32, 0));
  DeviceBuffer z = upload(hw.w, std::vector<int64_t>(8, 0));
  TaskArgs args;
  args.add_tensor(x.view({64}, DType::I64), Tag::OutputExisting)
      .add_tensor(y.view({32}, DType::I64), Tag::OutputExisting)
      .add_tensor(z.view({8}, DType::I64), Tag::OutputExisting);
  RunHandle r = hw.submit(args);
  // B and D finish while A is held at its gate.
  ASSERT_TRUE(eventually([] { return g_filled.load() == 2; }))
      << "the task writing the other half (or the independent one) waited for the held task";
  EXPECT_FALSE(r.done());
  g_gate_open = true;
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(g_ordered_early.load(), 0) << "the overlapping reader started before the writer finished";
  std::vector<int64_t> want(32);
  for (int i = 0; i < 32; ++i) want[i] = i < 16 ? 1 : 2;
  EXPECT_EQ(download<int64_t>(hw.w, y, 32), want);
}

// ---- Rings ------------------------------------------------------------------------------------

// The step of the ring workload: t = x; t = affine(t, i); x = t, with t an
// intermediate of a scope per step.
Status affine_steps(ChipOrchestrator& o, const TensorView& x, int steps, std::vector<uint64_t>* addrs = nullptr) {
  for (int i = 0; i < steps; ++i) {
    Scope scope(o);
    auto t = o.alloc({x.shape(0)}, DType::I64);
    if (!t.ok()) return t.status();
    if (addrs != nullptr) addrs->push_back(t->buffer().addr);
    TaskArgs in, step, out;
    in.add_tensor(x, Tag::Input).add_tensor(*t, Tag::OutputExisting);
    step.add_tensor(*t, Tag::InOut).add_scalar(i);
    out.add_tensor(*t, Tag::Input).add_tensor(x, Tag::OutputExisting);
    for (auto [fn, args] : {std::pair{kCopy, &in}, std::pair{kAffine, &step}, std::pair{kCopy, &out}}) {
      if (auto r = o.submit_aiv(fn, *args); !r.ok()) return r.status();
    }
  }
  return Status();
}

std::vector<int64_t> affine_host(std::vector<int64_t> v, int steps) {
  for (int i = 0; i < steps; ++i) {
    for (auto& e : v) e = (e * 3 + i) % 1000003;
  }
  return v;
}

// Eight runs of 1,500 tasks each through a 16-slot window and 64 KiB heap
// rings, four admitted and two launched at once: every window and ring wraps
// many times under back-pressure, and every result is exact.
TEST(Rings, WrapAroundAndBackPressureUnderLaunchDepth) {
  Watchdog dog(std::chrono::seconds(120));
  constexpr int kSteps = 500, kRuns = 8;
  constexpr int64_t kLen = 256;  // 2 KiB per intermediate
  WorkerConfig c = tmr_config(16, 4);
  c.launch_depth = 2;
  c.runtime_env.heap_ring_bytes = 64 << 10;
  Harness hw(
      ChipCallable("steps", [](ChipOrchestrator& o, const TaskArgs& a) { return affine_steps(o, a[0].tensor, kSteps); },
                   kernels(), {Param::inout()}),
      c);
  // Two rounds of the eight: the first sets up the arenas the sets keep, so
  // the second must give back exactly what it took.
  for (int round = 0; round < 2; ++round) {
    std::vector<DeviceBuffer> xs;
    std::vector<std::vector<int64_t>> init;
    std::vector<RunHandle> runs;
    for (int r = 0; r < kRuns; ++r) {
      std::vector<int64_t> v(kLen);
      for (int64_t i = 0; i < kLen; ++i) v[i] = i * (r + 1) + round;
      init.push_back(v);
      xs.push_back(upload(hw.w, v));
    }
    const uint64_t before = free_bytes(hw.w);
    for (int r = 0; r < kRuns; ++r) {
      TaskArgs a;
      a.add_tensor(xs[r].view({kLen}, DType::I64), Tag::InOut);
      runs.push_back(hw.submit(a));
    }
    for (int r = 0; r < kRuns; ++r) {
      ASSERT_TRUE(wait_run(runs[r]).ok()) << "run " << r << ": " << runs[r].result().to_string();
      EXPECT_EQ(runs[r].stats().tasks, 3u * kSteps);
      EXPECT_EQ(runs[r].stats().released_early, static_cast<uint32_t>(kSteps)) << "run " << r;
      EXPECT_EQ(download<int64_t>(hw.w, xs[r], kLen), affine_host(init[r], kSteps)) << "run " << r;
    }
    if (round == 1) {
      EXPECT_EQ(free_bytes(hw.w), before) << "pipelined runs kept device memory";
    }
    for (const DeviceBuffer& x : xs) ASSERT_TRUE(hw.w.free(x).ok());
  }
}

// A scope's intermediate is reused once the scope ended and its consumers
// finished: 200 steps of 4 KiB intermediates (800 KiB in all) fit a 16 KiB
// ring, and every one of them lies inside one ring's span.
TEST(Rings, AScopesIntermediateIsReusedOnceItsScopeEndedAndItsConsumersFinished) {
  Watchdog dog;
  constexpr int kSteps = 200;
  constexpr int64_t kLen = 512;  // 4 KiB
  constexpr uint64_t kRing = 16 << 10;
  std::vector<uint64_t> addrs;
  WorkerConfig c = tmr_config();
  c.guard_device_memory = false;
  c.runtime_env.heap_ring_bytes = kRing;
  Harness hw(
      ChipCallable("reuse",
                   [&](ChipOrchestrator& o, const TaskArgs& a) { return affine_steps(o, a[0].tensor, kSteps, &addrs); },
                   kernels(), {Param::inout()}),
      c);
  std::vector<int64_t> v(kLen);
  for (int64_t i = 0; i < kLen; ++i) v[i] = i;
  DeviceBuffer x = upload(hw.w, v);
  TaskArgs a;
  a.add_tensor(x.view({kLen}, DType::I64), Tag::InOut);
  RunHandle r = hw.submit(a);
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(download<int64_t>(hw.w, x, kLen), affine_host(v, kSteps));
  ASSERT_EQ(addrs.size(), static_cast<size_t>(kSteps));
  const auto [lo, hi] = std::minmax_element(addrs.begin(), addrs.end());
  EXPECT_LE(*hi + kLen * 8 - *lo, kRing) << "intermediates spread beyond one heap ring: memory was not reused";
  EXPECT_LE(std::set<uint64_t>(addrs.begin(), addrs.end()).size(), kRing / (kLen * 8));
  EXPECT_EQ(r.stats().released_early, static_cast<uint32_t>(kSteps));
}

TEST(Rings, AnIntermediateLargerThanItsRingFailsAtThatSubmitNamingTheRing) {
  Watchdog dog;
  g_count = 0;
  WorkerConfig c = tmr_config();
  c.runtime_env.heap_ring_bytes = 64 << 10;
  Harness hw(ChipCallable("too_big",
                          [](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            (void)o.submit_aiv(kCount, {});
                            TaskArgs t;
                            t.add_output({16 << 10}, DType::I64);  // 128 KiB
                            return o.submit_aiv(kCount, t).status();
                          },
                          kernels(), {}),
             c);
  const Status s = hw.run();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "can never fit heap ring 0 of 65536 bytes")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "runtime_env.heap_ring_bytes")) << s.to_string();
  EXPECT_EQ(g_count.load(), 1) << "the task submitted before the refusal did not run";
}

// One scope holds more than its ring: once the tasks in flight retired,
// nothing can ever free a block, and the run fails naming the ring instead
// of waiting forever.
TEST(Rings, AScopeHoldingMoreThanItsRingFailsNamingTheRingInsteadOfHanging) {
  Watchdog dog;
  WorkerConfig c = tmr_config();
  c.guard_device_memory = false;
  c.runtime_env.heap_ring_bytes = 64 << 10;
  Harness hw(ChipCallable("hoard",
                          [](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            Scope scope(o);
                            for (int i = 0; i < 32; ++i) {  // 32 x 4 KiB in one scope
                              TaskArgs t;
                              t.add_output({512}, DType::I64);
                              if (auto r = o.submit_aiv(kCount, t); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          kernels(), {}),
             c);
  const Status s = hw.run();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "heap ring 1 (65536 bytes, runtime_env.heap_ring_bytes) is full")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "no task is in flight")) << s.to_string();
  // The first run set up the set's arena; from here on a run keeps nothing.
  const uint64_t steady = free_bytes(hw.w);
  EXPECT_EQ(hw.run().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(free_bytes(hw.w), steady) << "the failed run kept its rings";
}

// A scope that allocates more intermediates than a set's table holds
// (2 x task_window + 64) fails at the first one too many, naming the field
// that sizes the table.
TEST(Rings, MoreLiveIntermediatesThanTheTableHoldsFailNamingTheWindow) {
  Watchdog dog;
  WorkerConfig c = tmr_config(4);
  int made = 0;
  Harness hw(ChipCallable("many",
                          [&](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            Scope scope(o);
                            for (;;) {
                              SIMPLER_RETURN_IF_ERROR(o.alloc({8}, DType::I64).status());
                              ++made;
                            }
                          },
                          kernels(), {}),
             c);
  const Status s = hw.run();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "2 x runtime_env.task_window + 64 = 2 x 4 + 64")) << s.to_string();
  EXPECT_EQ(made, 2 * 4 + 64);
}

// The window is full of tasks held at a gate: with no task retiring for the
// stall timeout, the orchestration's submit fails naming the window; the
// held tasks still run to the end once released, and the run fails with it.
TEST(Rings, NoRetirementWithinTheStallTimeoutFailsNamingTheWindow) {
  Watchdog dog;
  g_gate_open = false;
  g_gate_entered = 0;
  std::atomic<bool> returned{false};
  Status fifth;
  WorkerConfig c = tmr_config(4);
  c.runtime_env.stall_timeout = std::chrono::milliseconds(200);
  Harness hw(ChipCallable("stuck",
                          [&](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            for (int i = 0; i < 5 && fifth.ok(); ++i) {
                              TaskArgs t;
                              t.add_tensor(*a[0].tensor.tile({i}, {1}), Tag::OutputExisting).add_scalar(i);
                              fifth = o.submit_aiv(kGate, t).status();
                            }
                            returned = true;
                            return fifth;
                          },
                          kernels(), {Param::output()}),
             c);
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(8, -1));
  TaskArgs a;
  a.add_tensor(x.view({8}, DType::I64), Tag::OutputExisting);
  RunHandle r = hw.submit(a);
  ASSERT_TRUE(eventually([&] { return returned.load(); })) << "the orchestration never gave up on the full window";
  EXPECT_FALSE(r.done()) << "the run ended while four of its tasks were still held";
  g_gate_open = true;
  // Not wait_run: it reads DEADLINE_EXCEEDED as its own timeout.
  ASSERT_TRUE(eventually([&] { return r.done(); })) << "the run never ended";
  const Status s = r.result();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "task window")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "runtime_env.stall_timeout")) << s.to_string();
  EXPECT_EQ(fifth, s);
  EXPECT_EQ(download<int64_t>(hw.w, x, 8), (std::vector<int64_t>{0, 1, 2, 3, -1, -1, -1, -1}));
}

// A full 16-slot window refills in bursts of two finishes: its oldest task
// is held while the other fifteen finish, so one finish is all that can
// still come when the orchestrator begins to wait for room (it waits for
// the fifteen before its next submit). It parks; that one finish must wake it
// (a target of two more finishes, never reached, slept until the stall
// timeout, here far beyond the wait below).
TEST(Rings, AFullWindowWakesWhenItsOldestTaskRetiresAfterAllTheOthers) {
  Watchdog dog(std::chrono::seconds(120));
  g_gate_open = false;
  g_gate_entered = 0;
  g_count = 0;
  std::atomic<bool> returned{false};
  WorkerConfig c = tmr_config(16);
  c.runtime_env.stall_timeout = std::chrono::seconds(60);
  Harness hw(ChipCallable("oldest",
                          [&](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            TaskArgs held;
                            held.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(7);
                            SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kGate, held).status());
                            for (int i = 1; i < 16; ++i) SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kCount, {}).status());
                            // The wait for room begins with the fifteen finished.
                            if (!eventually([] { return g_count.load() == 15; }))
                              return internal_error("tasks 1-15 never finished");
                            SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kCount, {}).status());
                            returned = true;
                            return Status();
                          },
                          kernels(), {Param::output()}),
             c);
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(1, -1));
  TaskArgs a;
  a.add_tensor(x.view({1}, DType::I64), Tag::OutputExisting);
  RunHandle r = hw.submit(a);
  ASSERT_TRUE(eventually([] { return g_count.load() == 15 && g_gate_entered.load() == 1; }));
  ASSERT_TRUE(eventually([] { return named_thread_state("orchestrator0") == 'S'; }))
      << "the orchestrator never parked waiting for the full window";
  EXPECT_FALSE(returned.load());
  g_gate_open = true;
  EXPECT_TRUE(eventually([&] { return returned.load(); }))
      << "the held task retired, yet the orchestrator still waits for room in the window";
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(g_count.load(), 16);
  EXPECT_EQ(download<int64_t>(hw.w, x, 1), std::vector<int64_t>{7});
}

// A 64 KiB heap ring: a 30 KiB intermediate in one scope, then a 40 KiB one
// in the next, which does not fit the ring's end and goes to its start. Once
// the first is gone the ring is empty, and the gap the wrap skipped must not
// count as held (it did: the run failed, "no task is in flight").
TEST(Rings, AnEmptyRingTakesAnyIntermediateThatFitsIt) {
  Watchdog dog;
  g_count = 0;
  WorkerConfig c = tmr_config();
  c.guard_device_memory = false;
  c.runtime_env.heap_ring_bytes = 64 << 10;
  Harness hw(ChipCallable("gap",
                          [](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            for (int64_t n : {30 << 7, 40 << 7}) {  // I64 elements: 30 KiB, then 40 KiB
                              Scope scope(o);
                              TaskArgs t;
                              t.add_output({n}, DType::I64);
                              SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kCount, t).status());
                            }
                            return Status();
                          },
                          kernels(), {}),
             c);
  const Status s = hw.run();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(g_count.load(), 2);
}

// The descriptor ring of a 4-task set holds 32 descriptors, one task's most:
// a task of 32 tensors after one of a single tensor wraps to the ring's
// start, and once the first retired it fits (the skipped gap is no one's).
TEST(Rings, ATaskOfTheMostTensorsFitsTheDescriptorRingOnceItIsEmpty) {
  Watchdog dog;
  g_count = 0;
  WorkerConfig c = tmr_config(4);
  Harness hw(ChipCallable("wide",
                          [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            TaskArgs one;
                            one.add_tensor(a[0].tensor, Tag::Input);
                            SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kCount, one).status());
                            TaskArgs wide;
                            for (size_t i = 0; i < kMaxTaskArgs; ++i) wide.add_tensor(a[0].tensor, Tag::Input);
                            SIMPLER_RETURN_IF_ERROR(o.submit_aiv(kCount, wide).status());
                            return Status();
                          },
                          kernels(), {Param::input()}),
             c);
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(1, 0));
  TaskArgs a;
  a.add_tensor(x.view({1}, DType::I64), Tag::Input);
  const Status s = hw.run(a);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(g_count.load(), 2);
}

// A kernel fails; a hundred later tasks push it out of the 8-slot window
// (its slot is reused); a reader of its output is still poisoned through the
// TensorMap's tombstone, exactly as the reference runtime decides.
TEST(Streaming, AReaderOfARetiredFailedTaskIsPoisonedLikeOnTheReference) {
  Watchdog dog;
  auto run_on = [](const char* runtime) {
    g_count = 0;
    WorkerConfig c = tmr_config(128);
    c.runtime = runtime;
    c.runtime_env.task_window = 8;
    Harness hw(ChipCallable("tombstone",
                            [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                              TaskArgs bad;
                              bad.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(-1);
                              (void)o.submit_aiv(kCheck, bad);
                              for (int i = 0; i < 100; ++i) (void)o.submit_aiv(kCount, {});
                              TaskArgs reader;
                              reader.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                              return o.submit_aiv(kCopy, reader).status();
                            },
                            kernels(), {Param::output(), Param::output()}),
               c);
    DeviceBuffer x = upload(hw.w, std::vector<int64_t>(8, 5));
    DeviceBuffer y = upload(hw.w, std::vector<int64_t>(8, 6));
    TaskArgs a;
    a.add_tensor(x.view({8}, DType::I64), Tag::OutputExisting).add_tensor(y.view({8}, DType::I64), Tag::OutputExisting);
    RunHandle r = hw.submit(a);
    const Status s = wait_run(r);
    return std::tuple{s, r.stats().executed, g_count.load(), download<int64_t>(hw.w, y, 8)};
  };
  const auto [want_status, want_executed, want_count, want_y] = run_on("reference");
  const auto [status, executed, count, y] = run_on(kTmr);
  EXPECT_EQ(status.code(), StatusCode::kKernelFailed) << status.to_string();
  EXPECT_EQ(status, want_status);
  EXPECT_EQ(executed, want_executed);
  EXPECT_EQ(count, 100);
  EXPECT_EQ(count, want_count);
  EXPECT_EQ(y, want_y) << "the reader of the failed task's output ran";
  EXPECT_EQ(y, std::vector<int64_t>(8, 6));
}

// An orchestration that throws or returns an error mid-stream: the tasks it
// submitted all run, the run fails with its error, and nothing is kept:
// device memory returns and every set comes back (more runs than sets
// follow, each of which would block forever on a lost set).
TEST(Streaming, AnOrchestrationFailingMidStreamEndsAfterItsTasksAndKeepsNothing) {
  Watchdog dog;
  bool throws = false;
  WorkerConfig c = tmr_config(8);
  Harness hw(ChipCallable("fails_midway",
                          [&](ChipOrchestrator& o, const TaskArgs&) -> Status {
                            Scope scope(o);
                            for (int i = 0; i < 50; ++i) {
                              TaskArgs t;
                              t.add_output({64}, DType::I64);
                              if (auto r = o.submit_aiv(kCount, t); !r.ok()) return r.status();
                            }
                            if (throws) throw std::runtime_error("midway");
                            return Status(StatusCode::kInvalidArgument, "orchestration: step 50 is wrong");
                          },
                          kernels(), {}),
             c);
  for (int round = 0; round < 6; ++round) {
    throws = round % 2 == 1;
    g_count = 0;
    RunHandle r = hw.submit();
    const Status s = wait_run(r);
    if (throws) {
      EXPECT_EQ(s.code(), StatusCode::kUserCodeFailed) << s.to_string();
      EXPECT_TRUE(contains(s.message(), "midway")) << s.to_string();
    } else {
      EXPECT_EQ(s, Status(StatusCode::kInvalidArgument, "orchestration: step 50 is wrong"));
    }
    EXPECT_EQ(g_count.load(), 50) << "round " << round << ": a submitted task did not run";
    EXPECT_EQ(r.stats().tasks, 50u);
  }
  const uint64_t steady = free_bytes(hw.w);
  EXPECT_FALSE(hw.run().ok());
  EXPECT_EQ(free_bytes(hw.w), steady);
}

// ---- RuntimeEnv -------------------------------------------------------------------------------

TEST(RuntimeEnvTest, OutOfRangeFieldsAreRefusedAtInitNamingTheField) {
  struct Case {
    RuntimeEnv env;
    const char* field;
  };
  RuntimeEnv wide, ring, odd, stall;
  wide.task_window = 65;
  ring.heap_ring_bytes = 64;
  odd.heap_ring_bytes = (64 << 10) + 8;
  stall.stall_timeout = std::chrono::milliseconds(-1);
  for (const Case& k : {Case{wide, "runtime_env.task_window = 65"}, Case{ring, "runtime_env.heap_ring_bytes = 64"},
                        Case{odd, "runtime_env.heap_ring_bytes"}, Case{stall, "runtime_env.stall_timeout"}}) {
    WorkerConfig c = tmr_config(64);
    c.runtime_env = k.env;
    Worker w(Level::Chip, c);
    const Status s = w.init();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_TRUE(contains(s.message(), k.field)) << s.to_string();
  }
}

// A native run brings its own RuntimeEnv: a window of 2 that it streams
// through, and one wider than the sets is refused at prepare, naming the
// field, with the storage left empty.
TEST(RuntimeEnvTest, ANativeRunCarriesItsOwnEnv) {
  Watchdog dog;
  g_count = 0;
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "count",
      [](ChipOrchestrator& o, const TaskArgs&) {
        for (int i = 0; i < 40; ++i) {
          if (auto r = o.submit_aiv(kCount, {}); !r.ok()) return r.status();
        }
        return Status();
      },
      kernels(), std::vector<Param>{});
  auto w = ChipWorker::create(tmr_config(64), std::move(cs));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ChipWorker& chip = **w;
  alignas(native_run_storage_alignment()) static unsigned char storage[native_run_storage_size()];
  std::memset(storage, 0, sizeof storage);
  auto lease = chip.try_acquire_lease();
  ASSERT_TRUE(lease.has_value());
  NativeRunDescriptor d;
  d.lease = *lease;
  RunConfig too_wide;
  too_wide.runtime_env = RuntimeEnv{};
  too_wide.runtime_env->task_window = 128;
  Result<uint64_t> refused = chip.prepare(storage, sizeof storage, d, 0, TaskArgs{}, too_wide);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().to_string();
  EXPECT_TRUE(contains(refused.status().message(), "runtime_env.task_window = 128")) << refused.status().to_string();
  uint64_t first_word;
  std::memcpy(&first_word, storage, sizeof first_word);
  EXPECT_EQ(first_word, 0u) << "a refused prepare left something in the storage";
  RunConfig narrow;
  narrow.runtime_env = RuntimeEnv{};
  narrow.runtime_env->task_window = 2;
  auto epoch = chip.prepare(storage, sizeof storage, d, 0, TaskArgs{}, narrow);
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  ASSERT_TRUE(chip.launch(storage, *epoch).ok());
  ASSERT_TRUE(chip.wait(storage, *epoch, now_ns() + 30'000'000'000ull).ok());
  EXPECT_TRUE(chip.finalize(storage, *epoch).ok());
  EXPECT_EQ(g_count.load(), 40);
}

// The native lifecycle of runs whose orchestration fails mid-stream, on
// every set in turn: each run's tasks all run, finalize returns the error,
// and the set partition is whole after every run (R21: free + live +
// quarantined == grant, with every set free).
TEST(Streaming, AFailingOrchestrationGivesItsSetBack) {
  Watchdog dog;
  std::vector<ChipCallable> cs;
  cs.emplace_back(
      "fails_midway",
      [](ChipOrchestrator& o, const TaskArgs&) -> Status {
        for (int i = 0; i < 20; ++i) {
          TaskArgs t;
          t.add_output({8}, DType::I64);
          if (auto r = o.submit_aiv(kCount, t); !r.ok()) return r.status();
        }
        return Status(StatusCode::kInvalidArgument, "orchestration: midway");
      },
      kernels(), std::vector<Param>{});
  auto w = ChipWorker::create(tmr_config(8, 3), std::move(cs));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ChipWorker& chip = **w;
  alignas(native_run_storage_alignment()) static unsigned char storage[native_run_storage_size()];
  for (int round = 0; round < 6; ++round) {
    g_count = 0;
    std::memset(storage, 0, sizeof storage);
    auto lease = chip.try_acquire_lease();
    ASSERT_TRUE(lease.has_value()) << "round " << round << ": no set is free";
    NativeRunDescriptor d;
    d.lease = *lease;
    d.arena_bank = lease->slot;
    auto epoch = chip.prepare(storage, sizeof storage, d, 0, TaskArgs{});
    ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
    ASSERT_TRUE(chip.launch(storage, *epoch).ok());
    EXPECT_EQ(chip.finalize(storage, *epoch), Status(StatusCode::kInvalidArgument, "orchestration: midway"));
    EXPECT_EQ(g_count.load(), 20) << "round " << round;
    const ArenaCounts c = chip.set_counts();
    EXPECT_EQ(c.free + c.live + c.quarantined, chip.grant());
    EXPECT_EQ(c.free, chip.grant()) << "round " << round << ": a set was kept";
  }
}

}  // namespace
}  // namespace simpler
