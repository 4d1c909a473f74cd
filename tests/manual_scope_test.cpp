// Manual scopes on every runtime (issue 11): inside one, the accesses to
// the intermediates made there order nothing and set_dependencies() does;
// every other tensor is still ordered by its accesses; a failure poisons
// through the stated dependencies exactly as the reference runtime decides;
// misuse is refused naming the call.
#include <gtest/gtest.h>

#include <algorithm>

#include <atomic>
#include <functional>
#include <tuple>
#include <vector>

#include "conformance.h"
#include "kernels.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

enum : uint32_t { kFill = 1, kCopy, kGatedFill, kCheck, kCount };

std::atomic<int> g_copy_before_gate{0};

void gated_fill_kernel(int64_t* args) {
  gate_kernel(args);
  fill_kernel(args);
}

// Copies; a start while the gate is still closed is counted instead, and
// touches no data (the held writer owns it).
void watched_copy_kernel(int64_t* args) {
  if (!g_gate_open.load()) {
    g_copy_before_gate.fetch_add(1);
    return;
  }
  copy_kernel(args);
}

KernelLibrary kernels() {
  return make_kernels({{kFill, CoreType::AIV, "fill", fill_kernel},
                       {kCopy, CoreType::AIV, "copy", watched_copy_kernel},
                       {kGatedFill, CoreType::AIV, "gated_fill", gated_fill_kernel},
                       {kCheck, CoreType::AIV, "check", check_kernel},
                       {kCount, CoreType::AIV, "count", count_kernel}});
}

class ManualScopes : public TargetTest {};
class ManualScopesConcurrent : public TargetTest {};
SIMPLER_ON_EVERY_TARGET(ManualScopes);
SIMPLER_ON_CONCURRENT_TARGETS(ManualScopesConcurrent);

// fill(t, 7) then copy(t -> y) on an intermediate of the manual scope, the
// copy following the fill by set_dependencies(): y is 7 on every runtime.
// `state_order` false leaves the order unstated instead.
Status fill_then_copy(ChipOrchestrator& o, const TensorView& y, bool state_order, uint32_t fill_fn) {
  Scope scope(o, ScopeMode::kManual);
  auto t = o.alloc({8}, DType::I64);
  if (!t.ok()) return t.status();
  TaskArgs fill, copy;
  fill.add_tensor(*t, Tag::OutputExisting).add_scalar(7);
  copy.add_tensor(*t, Tag::Input).add_tensor(y, Tag::OutputExisting);
  auto f = o.submit_aiv(fill_fn, fill);
  if (!f.ok()) return f.status();
  if (state_order) {
    if (Status s = o.set_dependencies({f->id}); !s.ok()) return s;
  }
  return o.submit_aiv(kCopy, copy).status();
}

// Every thread of the process but the caller and the core spinning in the
// held kernel sleeps: the scheduler threads parked with nothing ready, so a
// task that has not started by now waits for the held one.
bool quiet_but_the_gated_core() {
  const std::vector<char> states = other_thread_states();
  return std::count_if(states.begin(), states.end(), [](char c) { return c != 'S'; }) <= 1;
}

TEST_P(ManualScopes, StatedDependenciesOrderTasksOnTheScopesIntermediates) {
  Watchdog dog;
  g_gate_open = true;
  Harness hw(
      ChipCallable("manual",
                   [](ChipOrchestrator& o, const TaskArgs& a) { return fill_then_copy(o, a[0].tensor, true, kFill); },
                   kernels(), {Param::output()}),
      config());
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(8, 0));
  TaskArgs a;
  a.add_tensor(y.view({8}, DType::I64), Tag::OutputExisting);
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(hw.run(a).ok());
    EXPECT_EQ(download<int64_t>(hw.w, y, 8), std::vector<int64_t>(8, 7)) << "round " << round;
  }
}

// With the fill held at a gate, the copy that states it follows the fill
// never starts before it; the copy that states nothing is not ordered by
// its access to the scope's intermediate and starts while the fill is held.
TEST_P(ManualScopesConcurrent, AnAccessToTheScopesIntermediateOrdersNothing) {
  Watchdog dog;
  for (bool state_order : {true, false}) {
    SCOPED_TRACE(state_order ? "order stated" : "order not stated");
    g_gate_open = false;
    g_copy_before_gate = 0;
    Harness hw(ChipCallable("manual",
                            [state_order](ChipOrchestrator& o, const TaskArgs& a) {
                              return fill_then_copy(o, a[0].tensor, state_order, kGatedFill);
                            },
                            kernels(), {Param::output()}),
               config());
    DeviceBuffer y = upload(hw.w, std::vector<int64_t>(8, 0));
    TaskArgs a;
    a.add_tensor(y.view({8}, DType::I64), Tag::OutputExisting);
    g_gate_entered = 0;
    RunHandle r = hw.submit(a);
    if (!state_order) {
      ASSERT_TRUE(eventually([] { return g_copy_before_gate.load() == 1; }))
          << "the copy waited for the fill although nothing ordered it";
    } else {
      ASSERT_TRUE(eventually([] { return g_gate_entered.load() == 1 && quiet_but_the_gated_core(); }))
          << "the device never went quiet around the held fill";
      EXPECT_EQ(g_copy_before_gate.load(), 0) << "the copy started before the fill it follows finished";
    }
    g_gate_open = true;
    ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
    if (state_order) {
      EXPECT_EQ(g_copy_before_gate.load(), 0) << "the copy started before the fill it follows finished";
      EXPECT_EQ(download<int64_t>(hw.w, y, 8), std::vector<int64_t>(8, 7));
    }
  }
}

// In a manual scope, a held fill writes caller buffer x and a copy reads x
// into y: the copy must wait for the fill. `scope_intermediate_first` puts a
// task before them whose argument 0, like the fill's, is the scope's own
// intermediate (an access that orders nothing).
void expect_copy_follows_held_fill(const WorkerConfig& worker_config, bool scope_intermediate_first) {
  g_gate_open = false;
  g_gate_entered = 0;
  g_copy_before_gate = 0;
  Harness hw(ChipCallable("boundary",
                          [scope_intermediate_first](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            Scope scope(o, ScopeMode::kManual);
                            if (scope_intermediate_first) {
                              auto t = o.alloc({8}, DType::I64);
                              if (!t.ok()) return t.status();
                              TaskArgs local;
                              local.add_tensor(*t, Tag::OutputExisting).add_scalar(1);
                              if (auto l = o.submit_aiv(kFill, local); !l.ok()) return l.status();
                            }
                            TaskArgs fill, copy;
                            fill.add_tensor(a[0].tensor, Tag::OutputExisting).add_scalar(9);
                            copy.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                            if (auto f = o.submit_aiv(kGatedFill, fill); !f.ok()) return f.status();
                            return o.submit_aiv(kCopy, copy).status();
                          },
                          kernels(), {Param::output(), Param::output()}),
             worker_config);
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(8, 0));
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(8, 0));
  TaskArgs a;
  a.add_tensor(x.view({8}, DType::I64), Tag::OutputExisting).add_tensor(y.view({8}, DType::I64), Tag::OutputExisting);
  RunHandle r = hw.submit(a);
  ASSERT_TRUE(eventually([] { return g_gate_entered.load() >= 1 && quiet_but_the_gated_core(); }))
      << "the device never went quiet around the held fill";
  EXPECT_EQ(g_copy_before_gate.load(), 0) << "the copy started while the fill of x was held";
  g_gate_open = true;
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(g_copy_before_gate.load(), 0);
  EXPECT_EQ(download<int64_t>(hw.w, y, 8), std::vector<int64_t>(8, 9));
}

// A caller buffer used inside a manual scope is ordered by its accesses as
// anywhere: the copy reading x follows the held fill writing x.
TEST_P(ManualScopes, TensorsFromOutsideTheScopeKeepTheirAccessOrder) {
  Watchdog dog;
  expect_copy_follows_held_fill(config(), false);
}

// The builder reuses one record for every submit: a task whose argument 0
// is the scope's own intermediate must leave nothing behind for the next
// task's argument 0, a caller buffer, whose accesses order as anywhere.
TEST_P(ManualScopes, ACallerTensorAfterTheScopesIntermediateAtTheSameArgumentKeepsItsOrder) {
  Watchdog dog;
  expect_copy_follows_held_fill(config(), true);
}

// A failing task poisons the tasks that state they follow it, and only
// those, with the same outcome on every runtime as on the reference.
TEST_P(ManualScopes, AFailurePoisonsThroughStatedDependenciesLikeOnTheReference) {
  Watchdog dog;
  auto run_on = [](WorkerConfig c) {
    g_count = 0;
    Harness hw(ChipCallable("poison",
                            [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                              Scope scope(o, ScopeMode::kManual);
                              auto t = o.alloc({8}, DType::I64);
                              if (!t.ok()) return t.status();
                              TaskArgs bad, follower, bystander;
                              bad.add_tensor(*t, Tag::OutputExisting).add_scalar(-3);
                              follower.add_tensor(*t, Tag::Input).add_tensor(a[0].tensor, Tag::OutputExisting);
                              bystander.add_tensor(a[1].tensor, Tag::OutputExisting).add_scalar(4);
                              auto b = o.submit_aiv(kCheck, bad);
                              if (!b.ok()) return b.status();
                              (void)o.submit_aiv(kCount, {});
                              if (Status s = o.set_dependencies({b->id}); !s.ok()) return s;
                              if (auto f = o.submit_aiv(kCopy, follower); !f.ok()) return f.status();
                              return o.submit_aiv(kFill, bystander).status();
                            },
                            kernels(), {Param::output(), Param::output()}),
               c);
    DeviceBuffer y = upload(hw.w, std::vector<int64_t>(8, 1));
    DeviceBuffer z = upload(hw.w, std::vector<int64_t>(8, 1));
    TaskArgs a;
    a.add_tensor(y.view({8}, DType::I64), Tag::OutputExisting).add_tensor(z.view({8}, DType::I64), Tag::OutputExisting);
    RunHandle r = hw.submit(a);
    const Status s = wait_run(r);
    return std::tuple{s, r.stats().executed, download<int64_t>(hw.w, y, 8), download<int64_t>(hw.w, z, 8)};
  };
  g_gate_open = true;
  const auto [want_s, want_executed, want_y, want_z] =
      run_on(target_config(ChipTarget{"reference", "small", GetParam().backend}));
  const auto [s, executed, y, z] = run_on(config());
  EXPECT_EQ(s.code(), StatusCode::kKernelFailed) << s.to_string();
  EXPECT_EQ(s, want_s);
  EXPECT_EQ(executed, want_executed);
  EXPECT_EQ(executed, 3u) << "the failing task, the counter and the bystander run; the follower does not";
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(y, std::vector<int64_t>(8, 1)) << "the follower of the failed task ran";
  EXPECT_EQ(z, want_z);
  EXPECT_EQ(z, std::vector<int64_t>(8, 4));
}

TEST_P(ManualScopes, MisuseIsRefusedNamingTheCall) {
  Watchdog dog;
  struct Case {
    const char* what;
    std::function<Status(ChipOrchestrator&)> orchestrate;
    StatusCode code;
    const char* names;
    // An intermediate of an ended scope is still live on a runtime that
    // builds first (refused by the manual-scope rule) but may be reused on a
    // streaming one (refused as not live): both name the ended scope.
    StatusCode streaming_code = code;
  };
  const std::vector<Case> cases = {
      {"set_dependencies outside", [](ChipOrchestrator& o) { return o.set_dependencies({0}); },
       StatusCode::kFailedPrecondition, "set_dependencies outside a manual scope"},
      {"nested",
       [](ChipOrchestrator& o) {
         Scope outer(o, ScopeMode::kManual);
         return o.manual_scope_begin();
       },
       StatusCode::kFailedPrecondition, "manual scopes do not nest"},
      {"a task from before the scope",
       [](ChipOrchestrator& o) {
         auto first = o.submit_aiv(kCount, {});
         if (!first.ok()) return first.status();
         Scope scope(o, ScopeMode::kManual);
         return o.set_dependencies({first->id});
       },
       StatusCode::kInvalidArgument, "task 0 was not submitted in this manual scope"},
      {"an intermediate of an ended manual scope",
       [](ChipOrchestrator& o) {
         TensorView kept;
         TaskArgs a;
         {
           Scope scope(o, ScopeMode::kManual);
           auto t = o.alloc({8}, DType::I64);
           if (!t.ok()) return t.status();
           kept = *t;
           a.add_tensor(kept, Tag::OutputExisting).add_scalar(1);
           if (auto r = o.submit_aiv(kFill, a); !r.ok()) return r.status();
         }
         return o.submit_aiv(kFill, a).status();
       },
       StatusCode::kFailedPrecondition, "scope that has ended", StatusCode::kOutOfRange},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Harness hw(
        ChipCallable("misuse", [&](ChipOrchestrator& o, const TaskArgs&) { return c.orchestrate(o); }, kernels(), {}),
        config());
    const uint64_t before = free_bytes(hw.w);
    const Status s = hw.run();
    EXPECT_EQ(s.code(), GetParam().streaming ? c.streaming_code : c.code) << s.to_string();
    EXPECT_TRUE(contains(s.message(), c.names)) << s.to_string();
    EXPECT_LE(free_bytes(hw.w), before);
  }
}

}  // namespace
}  // namespace simpler
