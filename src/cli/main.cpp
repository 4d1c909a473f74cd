// The `simpler` command: parses the command line (CLI11) and dispatches to
// commands.cpp. Usage errors exit 2 with a message naming the flag.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <limits>

#include <fmt/core.h>
#include <simpler/version.h>
#include <CLI/CLI.hpp>

#include "commands.h"

namespace {

// CLI11's Range reports "abc" as out of range; this says what was wrong.
template <typename T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && ptr == end && value >= lo && value <= hi) return {};
        return fmt::format("expects an integer in [{}, {}], got '{}'", lo, hi, text);
      },
      fmt::format("[{} - {}]", lo, hi));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace simpler::cli;
  CLI::App app{"simpler: a hierarchical task runtime for tile accelerators, on a simulated chip", "simpler"};
  app.set_version_flag("--version", simpler::version_string());
  // At most one; none is reported after parsing so that an unknown flag is
  // named rather than hidden behind "a subcommand is required".
  app.require_subcommand(0, 1);

  CLI::App* demo = app.add_subcommand(
      "demo", "Run every example on every runtime it applies to, on the default geometry; verify, print a table");

  RunFlags run_flags;
  CLI::App* run = app.add_subcommand("run", "Run one example and verify its outputs");
  run->add_option("example", run_flags.example, "Example to run")->required()->check(CLI::IsMember(example_names()));
  run->add_option("--geometry", run_flags.geometry, "Chip geometry preset")
      ->check(CLI::IsMember(geometry_names()))
      ->capture_default_str();
  run->add_option("--runtime", run_flags.runtime, "Chip runtime (see `simpler info`)")
      ->check(CLI::IsMember(runtime_names()))
      ->capture_default_str();
  run->add_option("--runs", run_flags.runs, "Runs to submit (default: the example's own)")
      ->check(integer_in(1, 1000000));
  run->add_option("--tasks", run_flags.tasks, "Tasks per run of a sized example (default: the example's own)")
      ->check(integer_in<uint32_t>(1, std::numeric_limits<uint32_t>::max()));
  // Every depth WorkerConfig::pipeline_depth can hold; one the Worker cannot
  // serve is refused by its init, naming the field.
  run->add_option("--pipeline-depth", run_flags.pipeline_depth, "Runs in flight before waiting on the oldest")
      ->check(integer_in<uint32_t>(1, std::numeric_limits<uint32_t>::max()))
      ->capture_default_str();
  CLI::Option* trace_option =
      run->add_option("--trace", run_flags.trace_dir,
                      "Write a swimlane trace of each run to DIR/trace.json (Perfetto; the last run's "
                      "stays; docs/diagnostics.md)");
  run->add_option("--swimlane", run_flags.swimlane,
                  "Swimlane level of --trace: 1 tasks, 2 + AICPU dispatch, 3 + scheduler phases, 4 + submits; 0 "
                  "writes no trace.json (for --dump-args alone)")
      ->check(integer_in<uint32_t>(0, 4))
      ->needs(trace_option)
      ->capture_default_str();
  run->add_option("--dump-args", run_flags.dump_args,
                  "Argument dump of each run into DIR/args_dump (the last run's stays; simpler dump show|diff): "
                  "partial (marked arguments), hybrid (metadata of all, bytes of marked), full")
      ->check(CLI::IsMember({"off", "partial", "hybrid", "full"}))
      ->needs(trace_option)
      ->capture_default_str();

  CLI::App* info =
      app.add_subcommand("info", "Print the version, geometry presets, runtimes, backends and build options");

  BenchFlags bench_flags;
  CLI::App* bench = app.add_subcommand("bench", "Run benchmarks (all, or the named ones)");
  bench->add_flag("--list", bench_flags.list, "List the benchmarks and exit");
  bench->add_flag("--json", bench_flags.json, "Print one JSON object per benchmark");
  bench->add_option("--neighbours", bench_flags.neighbours,
                    "Run beside N busy-loop processes (forked, killed and reaped when each benchmark ends)");
  bench->add_flag("--compare-load", bench_flags.compare_load,
                  "Run each benchmark quiet, then beside --neighbours (default 2) busy processes, and report "
                  "loaded_over_quiet for every figure");
  bench->add_option("name", bench_flags.names, "Benchmarks to run");

  TraceFlags trace_flags;
  CLI::App* trace_cmd = app.add_subcommand("trace", "Read a trace directory (DIR/trace.json)");
  trace_cmd->require_subcommand(1);
  CLI::App* trace_view =
      trace_cmd->add_subcommand("view", "Write DIR/timeline.html: a self-contained timeline of the trace");
  trace_view->add_option("dir", trace_flags.dir, "Trace directory")->required();
  CLI::App* trace_summary = trace_cmd->add_subcommand(
      "summary", "Print busy % per core lane, scheduler overhead per task and each run's critical path");
  trace_summary->add_option("dir", trace_flags.dir, "Trace directory")->required();
  trace_summary->add_flag("--json", trace_flags.json, "Print one JSON object");
  CLI::App* dump = app.add_subcommand("dump", "Read a run's argument dump");
  dump->require_subcommand(1);
  DumpShowFlags show_flags;
  CLI::App* show = dump->add_subcommand("show", "Print each captured argument with min, max, mean, NaN and Inf");
  show->add_option("dir", show_flags.dir, "The dump directory (or its run's, or a node's)")->required();
  show->add_option("--task", show_flags.task, "Only this task")->check(integer_in<int64_t>(0, INT64_MAX));
  DumpDiffFlags diff_flags;
  CLI::App* diff = dump->add_subcommand(
      "diff", "Name the first task, in execution order, whose output differs between two runs' dumps");
  diff->add_option("a", diff_flags.a, "The first run's dump directory")->required();
  diff->add_option("b", diff_flags.b, "The second run's dump directory")->required();
  diff->add_option("--rtol", diff_flags.rtol, "Relative tolerance")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  diff->add_option("--atol", diff_flags.atol, "Absolute tolerance")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are successes; every other parse error is a usage error.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (demo->parsed()) return cmd_demo();
  if (run->parsed()) return cmd_run(run_flags);
  if (info->parsed()) return cmd_info();
  if (bench->parsed()) return cmd_bench(bench_flags);
  if (trace_view->parsed()) return cmd_trace_view(trace_flags);
  if (trace_summary->parsed()) return cmd_trace_summary(trace_flags);
  if (show->parsed()) return cmd_dump_show(show_flags);
  if (diff->parsed()) return cmd_dump_diff(diff_flags);
  std::fputs(app.help().c_str(), stderr);
  std::fputs("\nA subcommand is required.\n", stderr);
  return kExitUsage;
}
