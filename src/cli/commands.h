// The `simpler` subcommands, after parsing. Called from main's thread only; each
// returns the process exit code (0 ok, 1 failure, 2 bad usage) and owns the
// Workers it opens for the length of the call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <simpler/types.h>
#include <simpler/worker_config.h>

namespace simpler::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct RunFlags {
  std::string example;
  std::string geometry = "small";
  std::string runtime = WorkerConfig().runtime;
  int runs = 0;        // 0: the example's default
  uint32_t tasks = 0;  // tasks per run of a sized example; 0: its default
  uint32_t pipeline_depth = 4;
  std::string trace_dir;          // non-empty: every run writes trace_dir/trace.json (the last run's stays)
  uint32_t swimlane = 1;          // the level of --trace; 0: no trace.json
  std::string dump_args = "off";  // off, partial, hybrid, full: into trace_dir/args_dump
};

struct BenchFlags {
  bool list = false;
  bool json = false;
  std::vector<std::string> names;  // empty: all
  uint32_t neighbours = 0;         // busy-loop processes beside every benchmark
  bool compare_load = false;       // each benchmark quiet, then loaded; loaded ÷ quiet
};

struct TraceFlags {
  std::string dir;
  bool json = false;
};

struct DumpShowFlags {
  std::string dir;
  int64_t task = -1;  // -1: every task
};

struct DumpDiffFlags {
  std::string a, b;
  double rtol = 0, atol = 0;
};

int cmd_demo();
int cmd_run(const RunFlags& flags);
int cmd_info();
int cmd_bench(const BenchFlags& flags);
// trace_commands.cpp: `simpler trace view|summary DIR` over DIR/trace.json.
int cmd_trace_view(const TraceFlags& flags);
int cmd_trace_summary(const TraceFlags& flags);
// Exit 1 when the dumps differ (diff) or cannot be read.
int cmd_dump_show(const DumpShowFlags& flags);
int cmd_dump_diff(const DumpDiffFlags& flags);

// Names accepted by --geometry, --runtime and by `simpler run`, for the parser's checks.
std::vector<std::string> geometry_names();
std::vector<std::string> runtime_names();
std::vector<std::string> example_names();

}  // namespace simpler::cli
