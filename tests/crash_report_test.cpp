// Issue 9 item 14: a chip-level kernel that crashes takes the user's process
// down (it runs in it), but not silently: one line names the kernel and the
// task, and the process still dies of the signal itself.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include "conformance.h"
#include "kernels.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

void aborting_kernel(int64_t*) { std::abort(); }

void run_aborting_kernel(const WorkerConfig& config) {
  Worker w(Level::Chip, config);
  auto h = w.register_callable(ChipCallable(
      "crashes",
      [](ChipOrchestrator& o, const TaskArgs&) -> Status {
        if (auto r = o.submit_aiv(1, {}); !r.ok()) return r.status();
        return o.submit_aiv(2, {}).status();
      },
      make_kernels({{1, CoreType::AIV, "count", count_kernel}, {2, CoreType::AIV, "aborts", aborting_kernel}}), {}));
  if (!h.ok() || !w.init().ok()) std::exit(3);
  (void)w.submit(*h, {}).wait_for(std::chrono::seconds(30));
  std::exit(4);  // not reached: the kernel aborted the process
}

class CrashReport : public TargetTest {};

TEST_P(CrashReport, AKernelThatAbortsIsNamedInOneLineAndTheProcessDiesOfIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_aborting_kernel(config()), ::testing::KilledBySignal(SIGABRT),
              "simpler: SIGABRT in kernel 'aborts' \\(func_id 2\\) of task 1: .*Level::Node");
}
SIMPLER_ON_EVERY_TARGET(CrashReport);

}  // namespace
}  // namespace simpler
