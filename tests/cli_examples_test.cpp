// Tests of the examples library (run in-process, every output verified) and of
// the `simpler` binary's exit codes and messages (run as a child under
// `timeout`). Every blocking step has a deadline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "conformance.h"
#include "examples.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::examples {
namespace {

// Every test body runs under a Watchdog: a hang in Worker::close (which no
// wait_for can bound) still fails fast.
using simpler::testing::CommandResult;
using simpler::testing::run_command;
using simpler::testing::scratch_dir;
using simpler::testing::Watchdog;

ExampleOptions small_options(int runs, uint32_t depth) {
  ExampleOptions o;
  o.runs = runs;
  o.pipeline_depth = depth;
  o.run_timeout = std::chrono::seconds(30);
  return o;
}

// A sized example's run in the tests: still 4.9x its 4096-task window and
// 5x its heap ring in intermediates, at a fiftieth of `simpler run`'s size,
// for the sanitizer builds.
constexpr uint32_t kSizedExampleTasks = 20'000;

// Every example's bit-exact check, on every runtime and geometry it applies
// to (the node and network examples through chip children of that runtime
// and geometry); where it does not apply, its refusal.
class ExamplesOnEveryTarget : public simpler::testing::TargetTest {};

TEST_P(ExamplesOnEveryTarget, EveryExampleVerifiesOrRefusesWhereItDoesNotApply) {
  Watchdog dog(std::chrono::seconds(120));
  // The examples' own list of streaming runtimes agrees with the registry.
  EXPECT_EQ(is_streaming_runtime(GetParam().runtime), GetParam().streaming);
  for (const ExampleInfo& info : example_list()) {
    ExampleOptions o = small_options(4, 2);
    o.runtime = GetParam().runtime;
    o.backend = GetParam().backend;
    o.geometry = geometry();
    if (info.default_tasks != 0) {
      o.runs = 2;
      o.tasks_per_run = kSizedExampleTasks;
    }
    Result<ExampleReport> r = run_example(info.name, o);
    if (!applies_to(info, o.runtime)) {
      ASSERT_FALSE(r.ok()) << info.name << " ran on " << o.runtime << ", which it does not apply to";
      EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().to_string();
      // A streaming example off a streaming runtime, or an MPI example outside an MPI job.
      const char* why = info.needs_mpi ? "runs under mpirun" : "needs a streaming runtime";
      EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().to_string();
      continue;
    }
    ASSERT_TRUE(r.ok()) << info.name << ": " << r.status().to_string();
    EXPECT_TRUE(r->verified) << info.name << ": " << r->detail;
    EXPECT_EQ(r->runs, o.runs) << info.name;
    EXPECT_GT(r->tasks, 0u) << info.name;
    if (info.default_tasks != 0) {
      EXPECT_EQ(r->tasks, uint64_t{kSizedExampleTasks} * 2) << info.name;
    }
  }
}

SIMPLER_ON_EVERY_TARGET(ExamplesOnEveryTarget);

TEST(Examples, MatmulChainHasHundredsOfTasksPerRun) {
  Watchdog dog(std::chrono::seconds(60));
  Result<ExampleReport> r = run_example("matmul_chain", small_options(1, 1));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->verified) << r->detail;
  EXPECT_GE(r->tasks, 300u);
  EXPECT_LE(r->tasks, 600u);
}

TEST(Examples, MatmulChainVerifiesOnA2a3WithDeepPipeline) {
  Watchdog dog(std::chrono::seconds(120));
  ExampleOptions o = small_options(6, 6);
  o.geometry = Geometry::a2a3();
  Result<ExampleReport> r = run_example("matmul_chain", o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->verified) << r->detail;
}

TEST(Examples, KernelFailureReportsTheKernelsMessage) {
  Watchdog dog(std::chrono::seconds(60));
  Result<ExampleReport> r = run_example("kernel_failure", small_options(2, 1));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->verified) << r->detail;
  EXPECT_NE(r->detail.find("x[1234] = -1 is negative"), std::string::npos) << r->detail;
}

// The node level: two forked chip children and a sub worker; three tasks per
// run (one per chip, one sub), every sum checked against the host.
TEST(Examples, NodePipelineVerifiesAcrossTwoChipsAndASubWorker) {
  Watchdog dog(std::chrono::seconds(120));
  Result<ExampleReport> r = run_example("node_pipeline", small_options(16, 8));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->verified) << r->detail;
  EXPECT_EQ(r->runs, 16);
  EXPECT_EQ(r->tasks, 16u * 3u);
}

// The network level: two forked nodes, each with its own chip child and sub
// worker, run a NodeCallable per run; the network's sub task joins them.
TEST(Examples, NetworkPipelineVerifiesAcrossTwoForkedNodes) {
  Watchdog dog(std::chrono::seconds(120));
  Result<ExampleReport> r = run_example("network_pipeline", small_options(8, 4));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->verified) << r->detail;
  EXPECT_EQ(r->runs, 8);
  EXPECT_EQ(r->tasks, 8u * 3u);
}

// The streaming example takes only sizes that stream (above its window, in
// whole steps); a fixed-size example takes none.
TEST(Examples, SizesAreCheckedBeforeAnythingRuns) {
  Watchdog dog(std::chrono::seconds(30));
  ExampleOptions o = small_options(1, 1);
  o.runtime = "tensormap_and_ringbuffer";
  for (uint32_t tasks : {4096u, 20'008u}) {
    o.tasks_per_run = tasks;
    Result<ExampleReport> r = run_example("attention_stream", o);
    ASSERT_FALSE(r.ok()) << tasks;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find("tasks_per_run"), std::string::npos) << r.status().to_string();
  }
  o.tasks_per_run = 100;
  Result<ExampleReport> fixed = run_example("vector_add", o);
  ASSERT_FALSE(fixed.ok());
  EXPECT_EQ(fixed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fixed.status().message().find("fixed size"), std::string::npos) << fixed.status().to_string();
}

TEST(Examples, ProgressIsReportedPerRun) {
  Watchdog dog(std::chrono::seconds(60));
  ExampleOptions o = small_options(3, 2);
  int calls = 0;
  int last_done = 0;
  o.progress = [&](const ExampleProgress& p) {
    ++calls;
    last_done = p.runs_done;
    EXPECT_EQ(p.runs_total, 3);
  };
  Result<ExampleReport> r = run_example("vector_add", o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(last_done, 3);
}

TEST(Examples, RefusesUnknownNamesAndBadOptions) {
  Watchdog dog(std::chrono::seconds(30));
  Result<ExampleReport> unknown = run_example("no_such_example", small_options(1, 1));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  Result<ExampleReport> depth = run_example("vector_add", small_options(1, 0));
  ASSERT_FALSE(depth.ok());
  EXPECT_EQ(depth.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(depth.status().message().find("pipeline_depth"), std::string::npos);
}

// Runs the built `simpler` with `args` under `timeout`; `env` prefixes the
// command. Its output is stdout and stderr together.
CommandResult run_cli(const std::string& args, const std::string& env = "", int timeout_s = 60) {
  return run_command(fmt::format("{} timeout {} {} {} 2>&1", env, timeout_s, SIMPLER_CLI_PATH, args));
}

TEST(Cli, BadUsageExitsTwoNamingTheFlag) {
  struct Case {
    const char* args;
    const char* names;
  };
  const Case cases[] = {
      {"--bogus", "--bogus"},
      {"run vector_add --bogus", "--bogus"},
      {"run no_such_example", "example"},
      {"run vector_add --runs abc", "--runs"},
      {"run vector_add --runs 0", "--runs"},
      {"run vector_add --runs -3", "--runs"},
      {"run attention_stream --tasks 0", "--tasks"},
      {"run attention_stream --tasks lots", "--tasks"},
      {"run vector_add --pipeline-depth 0", "--pipeline-depth"},
      {"run vector_add --pipeline-depth 4294967296", "--pipeline-depth"},
      {"run vector_add --geometry huge", "--geometry"},
      {"run", "example"},
      {"run vector_add --dump-args full", "--trace"},
      {"run vector_add --trace /tmp/simpler_never_written --dump-args most", "--dump-args"},
      {"run vector_add --trace /tmp/simpler_never_written --swimlane 5", "--swimlane"},
      {"bench --bogus", "--bogus"},
      {"", "subcommand"},
  };
  for (const Case& c : cases) {
    CommandResult r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << "simpler " << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << "simpler " << c.args << "\n" << r.output;
  }
}

// --pipeline-depth takes every depth WorkerConfig::pipeline_depth can hold (the
// library sets no upper limit); one the Worker cannot serve is the Worker's
// refusal, naming the field, not a usage error.
TEST(Cli, PipelineDepthTakesWhatTheWorkerTakes) {
  CommandResult deep = run_cli("run vector_add --runs 4 --pipeline-depth 65");
  EXPECT_EQ(deep.exit_code, 0) << deep.output;
  EXPECT_NE(deep.output.find(" ok"), std::string::npos) << deep.output;
  CommandResult huge = run_cli("run vector_add --runs 1 --pipeline-depth 4294967295");
  EXPECT_EQ(huge.exit_code, 1) << huge.output;
  EXPECT_NE(huge.output.find("pipeline_depth"), std::string::npos) << huge.output;
}

TEST(Cli, HelpAndInfoSucceed) {
  CommandResult help = run_cli("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("demo"), std::string::npos) << help.output;
  CommandResult info = run_cli("info");
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("a2a3"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("build:"), std::string::npos) << info.output;
}

TEST(Cli, RunVerifiesAndStaysQuietWithoutATerminal) {
  CommandResult r = run_cli("run matmul_chain --runs 2 --pipeline-depth 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" ok"), std::string::npos) << r.output;
  // stderr is a pipe here, so no progress line may be drawn.
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
}

// The rows `simpler dump show` printed: lines whose first two fields are the
// capture order and the task.
std::vector<std::pair<uint64_t, uint64_t>> dump_rows(const std::string& output) {
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  size_t at = 0;
  while (at < output.size()) {
    const size_t end = std::min(output.find('\n', at), output.size());
    unsigned long long order = 0, task = 0;
    char kernel[64] = {};
    if (std::sscanf(output.substr(at, end - at).c_str(), "%llu %llu %63s", &order, &task, kernel) == 3) {
      rows.emplace_back(order, task);
    }
    at = end + 1;
  }
  return rows;
}

// The argument dump of a real run through the CLI: `run --dump-args full`
// writes DIR/args_dump (and no trace.json at --swimlane 0), `dump show`
// prints every captured tensor of the run's 384 tasks, and `dump diff`
// finds nothing between the same example run on two runtimes.
TEST(Cli, RunDumpsArgumentsThatDumpShowAndDiffRead) {
  Watchdog dog(std::chrono::seconds(120));
  const std::string a = scratch_dir("cli", "dump_a");
  CommandResult run =
      run_cli(fmt::format("run matmul_chain --runs 2 --trace {} --swimlane 0 --dump-args full", a), "", 90);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(fmt::format("argument dump (full, the last run): {}/args_dump", a)), std::string::npos)
      << run.output;
  EXPECT_FALSE(std::filesystem::exists(a + "/trace.json"));
  // Only the published dump is left: no run's staging directory.
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(a)) entries += e.path().filename() == "args_dump" ? 0 : 1;
  EXPECT_EQ(entries, 0u);

  CommandResult show = run_cli(fmt::format("dump show {}", a));
  ASSERT_EQ(show.exit_code, 0) << show.output;
  unsigned long long records = 0, total = 0, collected = 0, dropped = 9;
  const size_t head = show.output.find("records, complete; total");
  ASSERT_NE(head, std::string::npos) << show.output.substr(0, 2000);
  const size_t line = show.output.rfind("args dump of run", head);
  ASSERT_NE(line, std::string::npos);
  ASSERT_EQ(std::sscanf(show.output.c_str() + line,
                        "args dump of run %*s (full): %llu records, complete; total %llu = "
                        "collected %llu + dropped %llu",
                        &records, &total, &collected, &dropped),
            4)
      << show.output.substr(line, 200);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(total, collected);
  EXPECT_EQ(records, collected);
  // Per 32x32 output tile: 4 matmuls (a, b in; the accumulator out, and in
  // too from the second on), bias_add (acc in and out, bias in), relu (acc
  // in, c out).
  constexpr uint64_t kTiles = 64, kTasks = kTiles * 6;
  EXPECT_EQ(records, kTiles * ((3 + 3 * 4) + 3 + 2));
  const auto rows = dump_rows(show.output);
  ASSERT_EQ(rows.size(), records) << show.output.substr(0, 2000);
  std::vector<bool> seen(kTasks, false);
  for (const auto& [order, task] : rows) {
    ASSERT_LT(task, kTasks);
    seen[task] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), static_cast<long>(kTasks));

  const std::string b = scratch_dir("cli", "dump_b");
  CommandResult other = run_cli(fmt::format("run matmul_chain --runs 1 --runtime tensormap_and_ringbuffer --trace {} "
                                            "--swimlane 0 --dump-args full",
                                            b),
                                "", 90);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  CommandResult same = run_cli(fmt::format("dump diff {} {}", a, b));
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find(fmt::format("no difference in {} outputs compared", kTiles * 6)), std::string::npos)
      << same.output;
}

// `simpler demo` runs node_pipeline and network_pipeline first (their Workers
// fork at init), then the chip examples, each on every runtime; it passes only
// if every row verified or is an example's refusal of a runtime it does not
// apply to, and its summary counts every row.
TEST(Cli, DemoRunsEveryExampleOnEveryRuntimeAndCountsEveryRow) {
  // Every example on every runtime is a few seconds here and ten times that
  // in the sanitizer builds; the deadline is for a hang, within ctest's 240 s.
  CommandResult r = run_cli("demo", "", 200);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t rows = 0, not_applicable = 0;
  for (const ExampleInfo& info : example_list()) {
    for (const ComponentInfo& runtime : available_runtimes()) {
      ++rows;
      const bool applies = applies_to(info, runtime.name);
      not_applicable += applies ? 0 : 1;
      const std::string row = fmt::format("{:<16} {:<24} ", info.name, runtime.name);
      const size_t at = r.output.find(row);
      ASSERT_NE(at, std::string::npos) << row << "\n" << r.output;
      const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
      EXPECT_TRUE(line.ends_with(applies ? "  ok" : "  n/a")) << line;
    }
  }
  EXPECT_NE(r.output.find(fmt::format("{}/{} rows verified, {} not applicable (n/a), 0 failed: PASS",
                                      rows - not_applicable, rows, not_applicable)),
            std::string::npos)
      << r.output;
}

// The streaming example on the streaming runtime, at a size of the caller's;
// on the default runtime it refuses at once, saying what it needs.
TEST(Cli, RunAttentionStreamVerifiesOnTheStreamingRuntimeOnly) {
  CommandResult ok = run_cli("run attention_stream --runtime tensormap_and_ringbuffer --tasks 20000");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find(" 20000 "), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find(" ok"), std::string::npos) << ok.output;
  CommandResult refused = run_cli("run attention_stream --runs 1");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("needs a streaming runtime such as tensormap_and_ringbuffer"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("n/a"), std::string::npos) << refused.output;
}

TEST(Cli, RunNodePipelineVerifies) {
  CommandResult r = run_cli("run node_pipeline --runs 8 --pipeline-depth 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" ok"), std::string::npos) << r.output;
}

TEST(Cli, MissingKernelsFailWithTheDirectoryNamed) {
  CommandResult r = run_cli("run vector_add --runs 1", "SIMPLER_KERNEL_DIR=/nonexistent/kernels");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/kernels"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace simpler::examples
