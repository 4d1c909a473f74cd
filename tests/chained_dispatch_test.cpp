// Issue 16, chained dispatch: a lone task's successor that waits on it alone
// is posted right behind it on its core (kAfterOk), so a chain runs link
// after link without a round trip through the AICPU thread between them; a
// link behind a failed kernel ends unrun. The ChainedDispatch cases drive a
// CoreDispatcher by hand (the test thread is AICPU thread 0 of a device whose
// own AICPU threads poll nothing), so what runs between two polls is exact;
// the ChainedRun cases run chains through both AICPU-dispatch runtimes end
// to end (their RunStats count the links posted).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "device/core_registers.h"
#include "device/sim/core.h"
#include "device/sim/sim_device.h"
#include "forced_load.h"
#include "kernels.h"
#include "runtime/common/core_dispatcher.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

constexpr uint32_t kLinks = CoreRegisters::kDepth;  // the one a core runs and kDepth - 1 behind it

// Each link notes when it ran; link 0 waits for g_open, the link named by
// g_fail fails.
std::atomic<bool> g_open{false};
std::atomic<int> g_fail{-1};
std::atomic<int> g_ran{0};
std::array<std::atomic<int>, kLinks + 1> g_order{};  // which run, 1-based, each task was (0: never)
std::array<std::thread::id, kLinks + 1> g_thread{};  // written before g_order, read after it
void link_kernel(int64_t* args) {
  const auto link = static_cast<int>(args[0]);
  if (link == 0) {
    EXPECT_TRUE(eventually([] { return g_open.load(); }));
  }
  g_thread[static_cast<size_t>(link)] = std::this_thread::get_id();
  g_order[static_cast<size_t>(link)] = g_ran.fetch_add(1) + 1;
  if (link == g_fail.load()) simpler_kernel_fail("link: told to fail");
}

// Holds a core before it skips a link until g_skip_open (set_core_skip_hook).
std::atomic<bool> g_skip_open{true};
void hold_skip() {
  EXPECT_TRUE(eventually([] { return g_skip_open.load(); }));
}

class IdleProgram final : public AicpuProgram {
 public:
  bool poll(uint32_t) override { return false; }
};

// Tasks 0 -> 1 -> ... -> kLinks - 1 (AIV), and one more with no edge; the
// runtime's half (what chain_after and a completion do) as host_build_graph
// does it, on these few tasks.
class ChainedDispatch : public ::testing::Test {
 protected:
  ForcedLoadState quiet_{0};  // how the cores are fed, not inline runs
  void SetUp() override {
    g_open = false;
    g_fail = -1;
    g_ran = 0;
    for (auto& o : g_order) o = 0;
    auto dev = SimDevice::create(Geometry::small(), 1 << 20);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    dev_ = std::move(dev).value();
    dev_->start(&idle_);
    d_ = std::make_unique<CoreDispatcher>(*dev_);
    CoreDispatcher::Storage storage = std::move(d_->make_storage(16, 1)).value();
    d_->swap_storage(storage);
    for (uint32_t i = 0; i < tasks_.size(); ++i) {
      GraphTask& t = tasks_[i];
      t.kind = TaskKind::AIV;
      t.blocks = 1;
      t.id = i;
      t.fn[0] = link_kernel;
      t.name[0] = "link";
      t.args[0] = i;
      t.fanin = i == 0 || i == kLinks ? 0 : 1;
      t.fanin_left = t.fanin;
      t.subtasks_left = 1;
    }
  }
  void TearDown() override {
    g_skip_open = true;
    set_core_skip_hook(nullptr);
    if (dev_) dev_->stop();
  }

  bool poll() {
    return d_->poll(
        0, [&](ReadyItem it) -> GraphTask& { return tasks_[it.task]; },
        [&](const CoreDispatcher::Inflight& f, const char* failure, std::vector<ReadyItem>& ready) {
          completed_.push_back(f.task);
          // The release: a failure poisons its successors and ends them unrun, down the chain.
          const bool failed = failure != nullptr;
          failure_completed_ |= failed;
          for (uint32_t t = f.task; t + 1 < kLinks; ++t) {
            GraphTask& s = tasks_[t + 1];
            if (failed) s.poisoned = 1;
            if (s.fanin_left.fetch_sub(1) != 1) break;
            if (!failed) {
              if (s.chained == 0) ready.push_back(ReadyItem{0, t + 1});
              break;
            }
          }
          d_->publish(ready, [&](ReadyItem it) -> GraphTask& { return tasks_[it.task]; });
        },
        [&](ReadyItem after, TaskKind kind, ReadyItem& next) {
          if (failure_completed_) asked_after_failure_.push_back(after.task);
          const uint32_t s = after.task + 1;
          if (after.task >= kLinks - 1 || tasks_[s].kind != kind || tasks_[s].fanin_left.load() != 1) return false;
          tasks_[s].chained = 1;
          next = ReadyItem{0, s};
          return true;
        });
  }
  // Whether some core's status says token `token` ended.
  bool some_core_ended(uint32_t token) {
    for (uint32_t c = 0; c < dev_->core_count(); ++c) {
      if (CoreRegisters::ended_token(dev_->core_registers(c).status.load()) >= token) return true;
    }
    return false;
  }
  bool poll_until(const std::function<bool()>& cond) {
    const uint64_t deadline = now_ns() + static_cast<uint64_t>(std::chrono::nanoseconds(kWait).count());
    while (!cond() && now_ns() < deadline) (void)poll();
    return cond();
  }

  IdleProgram idle_;
  std::unique_ptr<SimDevice> dev_;
  std::unique_ptr<CoreDispatcher> d_;
  std::array<GraphTask, kLinks + 1> tasks_{};
  std::vector<uint32_t> completed_;
  bool failure_completed_ = false;
  std::vector<uint32_t> asked_after_failure_;  // the tasks chain_after was asked to extend after that
};

// One poll posts the whole chain to one core: link 0 and the kDepth - 1
// links behind it. Opened with no poll after that, the core runs every link,
// in order; the polls that follow complete each once, in order.
TEST_F(ChainedDispatch, ACoreRunsAChainsLinksOneAfterAnotherWithNoPollBetween) {
  d_->push(tasks_[0], ReadyItem{0, 0});
  ASSERT_TRUE(poll());
  g_open = true;
  EXPECT_TRUE(eventually([] { return g_ran.load() == static_cast<int>(kLinks); }))
      << g_ran.load() << " of " << kLinks << " links ran with no poll after the first";
  for (uint32_t i = 0; i < kLinks; ++i) EXPECT_EQ(g_order[i].load(), static_cast<int>(i) + 1) << "link " << i;
  ASSERT_TRUE(poll_until([&] { return completed_.size() == kLinks; }));
  EXPECT_EQ(completed_, (std::vector<uint32_t>{0, 1, 2, 3}));
}

// Link 1 fails: the core ends links 2 and 3 unrun, and the dispatcher does
// not complete them (the failure's release ended them) but frees the core:
// the next task starts on it (the first idle core of its kind).
TEST_F(ChainedDispatch, ALinkBehindAFailedKernelEndsUnrunAndIsNotCompletedAgain) {
  g_fail = 1;
  d_->push(tasks_[0], ReadyItem{0, 0});
  ASSERT_TRUE(poll());
  g_open = true;
  ASSERT_TRUE(poll_until([&] { return completed_.size() == 2 && some_core_ended(kLinks); }))
      << completed_.size() << " tasks completed, expected links 0 and 1 only";
  (void)poll();
  d_->push(tasks_[kLinks], ReadyItem{0, kLinks});
  ASSERT_TRUE(poll_until([&] { return g_ran.load() == 3 && completed_.size() == 3; }))
      << "the task after the chain did not run: " << g_ran.load() << " kernels ran";
  EXPECT_EQ(completed_, (std::vector<uint32_t>{0, 1, kLinks}));
  EXPECT_EQ(g_thread[kLinks], g_thread[0]) << "the chain's core was not free for the next task";
  EXPECT_EQ(g_order[2].load(), 0) << "a link behind the failed kernel ran";
  EXPECT_EQ(g_order[3].load(), 0) << "a link behind the failed kernel ran";
  EXPECT_EQ(tasks_[3].poisoned.load(), 1u);
}

// Link 1 fails while its core is held before it skips links 2 and 3. The
// failure's release ended them: on a runtime their run may be over and its
// set already rebuilt for the next run, so the dispatcher never asks what
// may follow them (CI's TSan run caught host_build_graph's chain_after
// reading a set the next run was being built into).
TEST_F(ChainedDispatch, NoSuccessorIsSoughtBehindALinkTheFailureEnded) {
  g_fail = 1;
  g_skip_open = false;
  set_core_skip_hook(hold_skip);
  d_->push(tasks_[0], ReadyItem{0, 0});
  ASSERT_TRUE(poll());
  g_open = true;
  ASSERT_TRUE(poll_until([&] { return completed_.size() == 2; })) << completed_.size() << " tasks completed";
  EXPECT_FALSE(some_core_ended(3)) << "the core skipped link 2 while held";
  EXPECT_EQ(asked_after_failure_, std::vector<uint32_t>{}) << "asked what follows a link the failure ended";
  g_skip_open = true;
  ASSERT_TRUE(poll_until([&] { return some_core_ended(kLinks); }));
  (void)poll();
  EXPECT_EQ(asked_after_failure_, std::vector<uint32_t>{}) << "asked what follows a link the failure ended";
  EXPECT_EQ(completed_, (std::vector<uint32_t>{0, 1}));
}

// Through each AICPU-dispatch runtime: a chain of kChain tasks, each adding
// one to the same value. Link kFailAt does as the run's scalar says: nothing
// else (kPlain), fail (kFail) or also write past its tensor (kOverrun).
constexpr int64_t kChain = 256;
constexpr int64_t kFailAt = 100;
enum : uint32_t { kAddOne = 1 };
enum : int64_t { kPlain = 0, kFail = 1, kOverrun = 2 };
void add_one_kernel(int64_t* args) {
  int64_t* value = tensor_data<int64_t>(tensor_arg(args, 0));
  if (args[1] == kFail) {
    simpler_kernel_fail("add_one: told to fail");
    return;
  }
  value[0] += 1;
  if (args[1] == kOverrun) value[1] = -1;
}

ChipCallable chain_callable() {
  return ChipCallable(
      "chain",
      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
        for (int64_t i = 0; i < kChain; ++i) {
          TaskArgs t;
          t.add_tensor(a[0].tensor, Tag::InOut).add_scalar(i == kFailAt ? static_cast<int64_t>(a[1].scalar) : kPlain);
          if (auto r = o.submit_aiv(kAddOne, t); !r.ok()) return r.status();
        }
        return Status();
      },
      make_kernels({{kAddOne, CoreType::AIV, "add_one", add_one_kernel}}), {Param::inout(), Param::scalar()});
}

struct ChainRun {
  Status status;
  int64_t value = 0;
  uint32_t links = 0;  // chain links posted (RunStats::chained)
};
ChainRun run_chain(Harness& hw, int64_t what) {
  DeviceBuffer value = upload(hw.w, std::vector<int64_t>{0});
  TaskArgs a;
  a.add_tensor(value.view({1}, DType::I64), Tag::InOut).add_scalar(static_cast<uint64_t>(what));
  ChainRun r;
  const RunHandle run = hw.submit(a);
  r.status = wait_run(run);
  r.links = run.stats().chained;
  r.value = download<int64_t>(hw.w, value, 1)[0];
  return r;
}

// With link kFailAt failing, the run reports that link's error and no later
// link ran (the value stops at kFailAt). Guards off: a task with guards
// gets no link, and guards are on by default in sanitizer builds.
TEST(ChainedRun, AChainRunsThroughLinksAndStopsAtAFailedOne) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : {"host_build_graph", "tensormap_and_ringbuffer"}) {
    SCOPED_TRACE(runtime);
    WorkerConfig c = small_config();
    c.runtime = runtime;
    c.guard_device_memory = false;
    Harness hw(chain_callable(), c);
    for (int rep = 0; rep < 3; ++rep) {
      const ChainRun ok = run_chain(hw, kPlain);
      EXPECT_TRUE(ok.status.ok()) << ok.status.to_string();
      EXPECT_EQ(ok.value, kChain);
      EXPECT_GT(ok.links, 0u) << "no link was posted behind its predecessor";
      const ChainRun failed = run_chain(hw, kFail);
      EXPECT_EQ(failed.status.code(), StatusCode::kKernelFailed) << failed.status.to_string();
      EXPECT_NE(failed.status.message().find("add_one: told to fail"), std::string::npos) << failed.status.to_string();
      EXPECT_EQ(failed.value, kFailAt) << "links after the failed one ran";
    }
  }
}

// With guards on, a kernel can succeed and its task still fail at the guard
// check its AICPU thread runs after it: so no link follows a guarded task,
// and nothing after the link that wrote past its tensor runs.
TEST(ChainedRun, NoLinkFollowsATaskWhoseGuardCheckMayFailIt) {
  ForcedLoadState quiet(0);  // how the cores are fed, not inline runs
  for (const char* runtime : {"host_build_graph", "tensormap_and_ringbuffer"}) {
    SCOPED_TRACE(runtime);
    WorkerConfig c = small_config();
    c.runtime = runtime;
    c.guard_device_memory = true;
    Harness hw(chain_callable(), c);
    const ChainRun r = run_chain(hw, kOverrun);
    EXPECT_EQ(r.status.code(), StatusCode::kKernelFailed) << r.status.to_string();
    EXPECT_NE(r.status.message().find("past tensor argument 0"), std::string::npos) << r.status.to_string();
    EXPECT_EQ(r.value, kFailAt + 1) << "links after the one that wrote past its tensor ran";
    EXPECT_EQ(r.links, 0u);
  }
}

}  // namespace
}  // namespace simpler
