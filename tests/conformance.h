// The conformance suite's parameters: every registered chip runtime on every
// registered backend and every geometry preset (issue 8), and twice more on
// `small`: with the process read as oversubscribed, and with fewer CPUs than
// AICPU threads (issue 16). A runtime or backend added later is tested by
// registering it: the suites instantiate over the registry, not over a list
// in the tests. Test-thread use only.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "base/load_sense.h"
#include "device/backend_registry.h"
#include "forced_load.h"
#include "runtime/runtime.h"
#include "simpler/simpler.h"

namespace simpler::testing {

struct ChipTarget {
  std::string runtime;
  std::string geometry;
  std::string backend = "sim";
  bool concurrent = true;  // the runtime runs tasks of one run at once on several cores
  // The orchestration runs on the device after launch (RuntimeInfo::streaming):
  // tasks submitted before a refusal or an orchestration error run.
  bool streaming = false;
  // The case runs with the process forced to read as oversubscribed
  // (hooks::force_load_state(1)): every wait parks after one batch, and the
  // AICPU-dispatch runtimes run short kernels inline on their AICPU threads.
  // Otherwise it is forced to read as quiet, so that the hand-off path is
  // the one tested whatever else the machine runs meanwhile.
  bool loaded = false;
  // The case runs with the process forced to see one usable CPU
  // (hooks::force_usable_cpus(1)), quiet: host_build_graph runs short
  // kernels inline but chain heads on their cores. Otherwise it sees a CPU
  // for every simulator thread.
  bool few_cpus = false;
};

inline void PrintTo(const ChipTarget& t, std::ostream* os) {
  *os << t.runtime << "/" << t.backend << "/" << t.geometry << (t.loaded ? "/loaded" : "")
      << (t.few_cpus ? "/few_cpus" : "");
}

// "host_build_graph_sim_small": a gtest-safe name for the instance.
inline std::string target_name(const ::testing::TestParamInfo<ChipTarget>& info) {
  return info.param.runtime + "_" + info.param.backend + "_" + info.param.geometry +
         (info.param.loaded ? "_loaded" : "") + (info.param.few_cpus ? "_few_cpus" : "");
}

// Every registered runtime on every registered backend and geometry preset,
// and on `small` loaded and with few CPUs.
inline std::vector<ChipTarget> every_target() {
  std::vector<ChipTarget> out;
  for (const RuntimeInfo* r : registered_runtimes()) {
    for (const BackendInfo* b : registered_backends()) {
      for (const Geometry& g : Geometry::presets())
        out.push_back({r->name, g.name, b->name, r->concurrent, r->streaming});
      out.push_back({r->name, Geometry::small().name, b->name, r->concurrent, r->streaming, /*loaded=*/true});
      out.push_back({r->name, Geometry::small().name, b->name, r->concurrent, r->streaming, /*loaded=*/false,
                     /*few_cpus=*/true});
    }
  }
  return out;
}

// The targets whose runtime executes tasks of one run concurrently: the
// cases that prove two tasks ran at the same moment (or never did) need one.
inline std::vector<ChipTarget> concurrent_targets() {
  std::vector<ChipTarget> out;
  for (const ChipTarget& t : every_target()) {
    if (t.concurrent) out.push_back(t);
  }
  return out;
}

// A chip Worker config for `target` with graphs of at most `max_tasks` tasks.
inline WorkerConfig target_config(const ChipTarget& target, uint32_t depth = 2, uint32_t max_tasks = 1024) {
  WorkerConfig c;
  c.geometry = *Geometry::by_name(target.geometry);
  c.runtime = target.runtime;
  c.backend = target.backend;
  c.pipeline_depth = depth;
  c.device_memory_bytes = 256ull << 20;
  c.max_tasks_per_run = max_tasks;
  return c;
}

// The fixture of a case that runs on every target it is instantiated for.
class TargetTest : public ::testing::TestWithParam<ChipTarget> {
 protected:
  void SetUp() override {
    hooks::force_load_state(GetParam().loaded ? 1 : 0);
    hooks::force_usable_cpus(GetParam().few_cpus ? 1 : ForcedLoadState::kPlentyCpus);
  }
  void TearDown() override {
    hooks::force_load_state(-1);
    hooks::force_usable_cpus(0);
  }
  WorkerConfig config(uint32_t depth = 2, uint32_t max_tasks = 1024) const {
    return target_config(GetParam(), depth, max_tasks);
  }
  // For cases that count device bytes exactly: no guard bytes around allocations, whatever the build.
  WorkerConfig unguarded_config() const {
    WorkerConfig c = config();
    c.guard_device_memory = false;
    return c;
  }
  Geometry geometry() const { return *Geometry::by_name(GetParam().geometry); }
};

}  // namespace simpler::testing

// Instantiates `suite` over every target (or the concurrent ones).
#define SIMPLER_ON_EVERY_TARGET(suite)                                                                  \
  INSTANTIATE_TEST_SUITE_P(Conformance, suite, ::testing::ValuesIn(::simpler::testing::every_target()), \
                           ::simpler::testing::target_name)
#define SIMPLER_ON_CONCURRENT_TARGETS(suite)                                                                  \
  INSTANTIATE_TEST_SUITE_P(Conformance, suite, ::testing::ValuesIn(::simpler::testing::concurrent_targets()), \
                           ::simpler::testing::target_name)
