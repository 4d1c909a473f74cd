// SPMD tasks on every runtime (issue 11): one task, block_num blocks, each
// run once with its own simpler_block_index(), at once where cores are free;
// the task ends when every block has, fails with its lowest failing block,
// and orders its dependents like any task.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <tuple>
#include <vector>

#include "conformance.h"
#include "kernels.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

enum : uint32_t { kStamp = 1, kCopy, kMeet, kAicStamp };

// Each block arrives and waits (bounded) for args[1] blocks to be inside at
// once, then writes 1 into its own element of args[0]; fails otherwise.
void meet_kernel(int64_t* args) {
  const int want = static_cast<int>(args[1]);
  g_arrived.fetch_add(1);
  if (!eventually([&] { return g_arrived.load() >= want; }, std::chrono::seconds(10))) {
    simpler_kernel_fail("meet: the blocks never were inside at once");
    return;
  }
  tensor_data<int64_t>(tensor_arg(args, 0))[simpler_block_index()] = 1;
}

std::atomic<int> g_stamps{0};

// Writes (block index, block count) into its block's two elements of
// args[0]; fails when args[1] says its block must (block % args[1] == 2).
void stamp_kernel(int64_t* args) {
  const uint32_t b = simpler_block_index();
  const DeviceTensor* x = tensor_arg(args, 0);
  g_stamps.fetch_add(1);
  if (args[1] != 0 && b % static_cast<uint32_t>(args[1]) == 2) {
    simpler_kernel_fail("stamp: this block fails on purpose");
    return;
  }
  tensor_data<int64_t>(x)[2 * b] = b;
  tensor_data<int64_t>(x)[2 * b + 1] = simpler_block_num();
}

KernelLibrary kernels() {
  return make_kernels({{kStamp, CoreType::AIV, "stamp", stamp_kernel},
                       {kAicStamp, CoreType::AIC, "aic_stamp", stamp_kernel},
                       {kCopy, CoreType::AIV, "copy", copy_kernel},
                       {kMeet, CoreType::AIV, "meet", meet_kernel}});
}

class Spmd : public TargetTest {};
class SpmdConcurrent : public TargetTest {};
SIMPLER_ON_EVERY_TARGET(Spmd);
SIMPLER_ON_CONCURRENT_TARGETS(SpmdConcurrent);

// Stamps x with `blocks` blocks (AIV, then AIC), then copies x to y: the copy
// follows every block.
ChipCallable stamp_then_copy(uint32_t blocks, int64_t fail_every) {
  return ChipCallable("stamp",
                      [blocks, fail_every](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        TaskArgs stamp, copy;
                        stamp.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(fail_every);
                        copy.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                        if (auto r = o.submit_aiv_spmd(kStamp, stamp, blocks); !r.ok()) return r.status();
                        if (auto r = o.submit_aic_spmd(kAicStamp, stamp, blocks); !r.ok()) return r.status();
                        return o.submit_aiv(kCopy, copy).status();
                      },
                      kernels(), {Param::output(), Param::output()});
}

struct Outcome {
  Status status;
  uint32_t executed;
  std::vector<int64_t> x, y;
};

Outcome run_stamps(const WorkerConfig& c, uint32_t blocks, int64_t fail_every) {
  g_stamps = 0;
  Harness hw(stamp_then_copy(blocks, fail_every), c);
  const int64_t n = blocks == 0 ? 2 : 2 * int64_t{blocks};
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(n, -1));
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(n, -1));
  TaskArgs a;
  a.add_tensor(x.view({n}, DType::I64), Tag::OutputExisting).add_tensor(y.view({n}, DType::I64), Tag::OutputExisting);
  RunHandle r = hw.submit(a);
  Outcome o;
  o.status = wait_run(r);
  o.executed = r.stats().executed;
  o.x = download<int64_t>(hw.w, x, n);
  o.y = download<int64_t>(hw.w, y, n);
  return o;
}

TEST_P(Spmd, EveryBlockRunsOnceWithItsIndexAndTheDependentFollowsThemAll) {
  Watchdog dog;
  constexpr uint32_t kBlocks = 37;  // more blocks than cores: cores take several each
  const Outcome o = run_stamps(config(), kBlocks, 0);
  ASSERT_TRUE(o.status.ok()) << o.status.to_string();
  std::vector<int64_t> want(2 * kBlocks);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    want[2 * b] = b;
    want[2 * b + 1] = kBlocks;
  }
  EXPECT_EQ(o.x, want);
  EXPECT_EQ(o.y, want) << "the copy ran before every block had written";
  EXPECT_EQ(g_stamps.load(), 2 * static_cast<int>(kBlocks)) << "a block ran twice or never";
  EXPECT_EQ(o.executed, 2 * kBlocks + 1);
}

// Blocks 2 and 5 of 8 fail: the run fails with block 2's error, every block
// of that task ran, and its dependents (the AIC task writing the same tensor,
// the copy) are poisoned, exactly as on the reference runtime.
TEST_P(Spmd, TheLowestFailingBlockIsTheTasksErrorLikeOnTheReference) {
  Watchdog dog;
  const Outcome want = run_stamps(target_config(ChipTarget{"reference", "small", GetParam().backend}), 8, 3);
  const Outcome got = run_stamps(config(), 8, 3);
  EXPECT_EQ(got.status.code(), StatusCode::kKernelFailed) << got.status.to_string();
  EXPECT_TRUE(contains(got.status.message(), "task 0 (AIV kernel, func_id 1, block 2 of 8) failed"))
      << got.status.to_string();
  EXPECT_EQ(got.status, want.status);
  EXPECT_EQ(got.executed, want.executed);
  EXPECT_EQ(got.executed, 8u) << "every block of the failing task runs; its two dependents do not";
  EXPECT_EQ(got.x, want.x);
  EXPECT_EQ(got.y, std::vector<int64_t>(16, -1)) << "the dependent of the failed task ran";
}

TEST_P(Spmd, ABlockNumOutsideItsRangeIsRefusedNamingIt) {
  Watchdog dog;
  for (uint32_t bad : {0u, ChipOrchestrator::kMaxBlocks + 1}) {
    const Outcome o = run_stamps(config(), bad, 0);
    EXPECT_EQ(o.status.code(), StatusCode::kInvalidArgument) << o.status.to_string();
    EXPECT_TRUE(contains(o.status.message(), fmt::format("block_num = {}", bad))) << o.status.to_string();
    EXPECT_EQ(o.executed, 0u);
  }
}

// Four blocks meet inside their kernels: they ran at the same moment.
TEST_P(SpmdConcurrent, BlocksRunAtOnceOnFreeCores) {
  Watchdog dog;
  g_arrived = 0;
  Harness hw(ChipCallable("meet",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            TaskArgs t;
                            t.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(4);
                            return o.submit_aiv_spmd(kMeet, t, 4).status();
                          },
                          kernels(), {Param::output()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(4, 0));
  TaskArgs a;
  a.add_tensor(x.view({4}, DType::I64), Tag::OutputExisting);
  const Status s = hw.run(a);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(g_arrived.load(), 4);
  EXPECT_EQ(download<int64_t>(hw.w, x, 4), std::vector<int64_t>(4, 1));
}

}  // namespace
}  // namespace simpler
