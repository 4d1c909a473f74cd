// `simpler bench --json <name>` for the streaming benchmarks, in tiny sizes
// chosen through the environment: each prints one JSON object with its
// figures and counts. Timings are never asserted, only that they were taken.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace simpler {
namespace {

using simpler::testing::CommandResult;
using simpler::testing::run_command;
using simpler::testing::Watchdog;

// Its output is stdout only: the one JSON line.
CommandResult run_bench(const std::string& name, const std::string& env) {
  return run_command(env + " timeout 90 " SIMPLER_CLI_PATH " bench --json " + name);
}

nlohmann::json parse(const CommandResult& c) {
  nlohmann::json j = nlohmann::json::parse(c.output, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << c.output;
  return j;
}

TEST(Bench, FirstTaskReportsEverySizeForBothRuntimes) {
  Watchdog dog(std::chrono::seconds(120));
  CommandResult c = run_bench("first_task", "SIMPLER_BENCH_FIRST_TASK_SIZES=20,300");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const nlohmann::json j = parse(c);
  ASSERT_TRUE(j.is_object()) << c.output;
  EXPECT_EQ(j["bench"], "first_task");
  ASSERT_TRUE(j.contains("sizes")) << c.output;
  for (const char* size : {"20", "300"}) {
    ASSERT_TRUE(j["sizes"].contains(size)) << size << "\n" << c.output;
    const nlohmann::json& s = j["sizes"][size];
    EXPECT_EQ(s["tasks"], std::stoi(size));
    EXPECT_GE(s["reps"].get<int>(), 1);
    for (const char* runtime : {"tmr_first_task_us", "hbg_first_task_us"}) {
      EXPECT_GT(s[runtime]["p50"].get<double>(), 0.0) << runtime;
      EXPECT_LE(s[runtime]["p50"].get<double>(), s[runtime]["max"].get<double>()) << runtime;
    }
    EXPECT_GT(s["ratio_vs_peer"].get<double>(), 0.0);
    EXPECT_TRUE(s["goal_met"].is_boolean());
  }
  EXPECT_TRUE(j["goal"]["met"].is_boolean());
}

TEST(Bench, StreamCountsItsTasksAndIntermediates) {
  Watchdog dog(std::chrono::seconds(120));
  CommandResult c = run_bench("stream", "SIMPLER_BENCH_STREAM_TASKS=2000");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const nlohmann::json j = parse(c);
  ASSERT_TRUE(j.is_object()) << c.output;
  EXPECT_EQ(j["bench"], "stream");
  EXPECT_EQ(j["tasks"], 2000);
  EXPECT_EQ(j["steps"], 500);
  EXPECT_EQ(j["total_intermediate_bytes"], 500 * 1024);
  EXPECT_EQ(j["tmr"]["tasks"], 2000);
  EXPECT_EQ(j["tmr"]["runs"], 1);
  EXPECT_EQ(j["peer"]["tasks"], 2000);
  EXPECT_GT(j["tmr"]["tasks_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peer"]["tasks_per_s"].get<double>(), 0.0);
  // Every step's intermediate is released during the run, by its scope's end or its last reader.
  EXPECT_EQ(j["tmr"]["released_early"], 500);
  EXPECT_GE(j["tmr"]["memory_samples"].get<int>(), 1);
  EXPECT_GT(j["ratio_vs_peer"]["tasks_per_s"].get<double>(), 0.0);
}

}  // namespace
}  // namespace simpler
