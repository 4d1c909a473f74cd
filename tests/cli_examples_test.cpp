// Tests of the examples library (run in-process, every output verified) and of
// the `simpler` binary's exit codes and messages (run as a child under
// `timeout`). Every blocking step has a deadline.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "conformance.h"
#include "examples.h"
#include "test_util.h"

namespace simpler::examples {
namespace {

// Every test body runs under a Watchdog: a hang in Worker::close (which no
// wait_for can bound) still fails fast.
using simpler::testing::Watchdog;

ExampleOptions small_options(int runs, uint32_t depth) {
  ExampleOptions o;
  o.runs = runs;
  o.pipeline_depth = depth;
  o.run_timeout = std::chrono::seconds(30);
  return o;
}

// Every example's bit-exact check, on every runtime and geometry (the node
// and network examples through chip children of that runtime and geometry).
class ExamplesOnEveryTarget : public simpler::testing::TargetTest {};

TEST_P(ExamplesOnEveryTarget, EveryExampleVerifies) {
  Watchdog dog(std::chrono::seconds(120));
  for (const std::string& name : example_names()) {
    ExampleOptions o = small_options(4, 2);
    o.runtime = GetParam().runtime;
    o.backend = GetParam().backend;
    o.geometry = geometry();
    Result<ExampleReport> r = run_example(name, o);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
    EXPECT_TRUE(r->verified) << name << ": " << r->detail;
    EXPECT_EQ(r->runs, 4) << name;
    EXPECT_GT(r->tasks, 0u) << name;
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

struct Child {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs the built `simpler` with `args` under `timeout 60`; `env` prefixes the command.
Child run_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " timeout 60 " SIMPLER_CLI_PATH " " + args + " 2>&1";
  Child c{-1, {}};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return c;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) c.output.append(buf, n);
  const int status = pclose(pipe);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
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
      {"run vector_add --pipeline-depth 0", "--pipeline-depth"},
      {"run vector_add --pipeline-depth 4294967296", "--pipeline-depth"},
      {"run vector_add --geometry huge", "--geometry"},
      {"run", "example"},
      {"bench --bogus", "--bogus"},
      {"", "subcommand"},
  };
  for (const Case& c : cases) {
    Child r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << "simpler " << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << "simpler " << c.args << "\n" << r.output;
  }
}

// --pipeline-depth takes every depth WorkerConfig::pipeline_depth can hold (the
// library sets no upper limit); one the Worker cannot serve is the Worker's
// refusal, naming the field, not a usage error.
TEST(Cli, PipelineDepthTakesWhatTheWorkerTakes) {
  Child deep = run_cli("run vector_add --runs 4 --pipeline-depth 65");
  EXPECT_EQ(deep.exit_code, 0) << deep.output;
  EXPECT_NE(deep.output.find(" ok"), std::string::npos) << deep.output;
  Child huge = run_cli("run vector_add --runs 1 --pipeline-depth 4294967295");
  EXPECT_EQ(huge.exit_code, 1) << huge.output;
  EXPECT_NE(huge.output.find("pipeline_depth"), std::string::npos) << huge.output;
}

TEST(Cli, HelpAndInfoSucceed) {
  Child help = run_cli("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("demo"), std::string::npos) << help.output;
  Child info = run_cli("info");
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("a2a3"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("build:"), std::string::npos) << info.output;
}

TEST(Cli, RunVerifiesAndStaysQuietWithoutATerminal) {
  Child r = run_cli("run matmul_chain --runs 2 --pipeline-depth 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" ok"), std::string::npos) << r.output;
  // stderr is a pipe here, so no progress line may be drawn.
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
}

// `simpler demo` runs node_pipeline and network_pipeline first (their Workers
// fork at init), then the chip examples, and passes only if every one verified.
TEST(Cli, DemoRunsTheNodeAndNetworkExamplesAndVerifiesEveryExample) {
  Child r = run_cli("demo");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("node_pipeline"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("network_pipeline"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("examples verified: PASS"), std::string::npos) << r.output;
}

TEST(Cli, RunNodePipelineVerifies) {
  Child r = run_cli("run node_pipeline --runs 8 --pipeline-depth 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" ok"), std::string::npos) << r.output;
}

TEST(Cli, MissingKernelsFailWithTheDirectoryNamed) {
  Child r = run_cli("run vector_add --runs 1", "SIMPLER_KERNEL_DIR=/nonexistent/kernels");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/kernels"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace simpler::examples
