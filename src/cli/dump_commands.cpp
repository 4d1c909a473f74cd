// `simpler dump show|diff`: what users ask of an argument dump, printed.
// A directory is one run's dump (manifest.json + args.bin), its parent
// holding args_dump/, or a node's or network's run directory, holding one
// per chip and node task (find_args_dumps).
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "diag/args_dump_file.h"

namespace simpler::cli {

namespace {

// Two node runs compare place by place (chip1/task3): a side whose dumps
// are all of one run loses that run's run<R>/ prefix, its own run id.
void strip_single_run(std::vector<std::pair<std::string, std::string>>& dumps) {
  std::string run;
  for (const auto& d : dumps) {
    const size_t slash = d.first.find('/');
    if (slash == std::string::npos || d.first.rfind("run", 0) != 0) return;
    if (!run.empty() && d.first.compare(0, slash, run) != 0) return;
    run = d.first.substr(0, slash);
  }
  for (auto& d : dumps) d.first.erase(0, run.size() + 1);
}

void print_dump(const ArgsDump& d, const std::string& label, int64_t task) {
  fmt::print("{}args dump of run {} ({}): {} records, {}; total {} = collected {} + dropped {} (truncated {})\n",
             label.empty() ? "" : label + ": ", d.run_epoch, d.selection, d.args.size(),
             d.complete ? "complete" : "INCOMPLETE (a lane stopped mid-argument: accounting unknown)", d.counts.total,
             d.counts.collected, d.counts.dropped, d.counts.truncated);
  fmt::print("{:>6} {:>6}  {:<16} {:<6} {:<6} {:>3}  {:<4} {:<14} {:>10}  {:>12} {:>12} {:>12} {:>5} {:>5}\n", "order",
             "task", "kernel", "role", "stage", "arg", "type", "shape", "bytes", "min", "max", "mean", "nan", "inf");
  for (const DumpedArg& a : d.args) {
    if (task >= 0 && a.task != static_cast<uint64_t>(task)) continue;
    const std::string shape = fmt::format("{}", fmt::join(a.shape, "x"));
    std::string bytes = std::to_string(a.bytes);
    if (a.truncated) bytes += "/" + std::to_string(a.logical_bytes);
    fmt::print("{:>6} {:>6}  {:<16} {:<6} {:<6} {:>3}  {:<4} {:<14} {:>10}", a.order, a.task, a.kernel,
               dump_role_name(a.role), dump_stage_name(a.stage), a.arg, dtype_name(a.dtype), shape, bytes);
    if (a.metadata_only) {
      fmt::print("  (metadata only)\n");
      continue;
    }
    const TensorSummary s = summarize(d, a);
    fmt::print("  {:>12.6g} {:>12.6g} {:>12.6g} {:>5} {:>5}\n", s.min, s.max, s.mean, s.nan, s.inf);
  }
}

}  // namespace

int cmd_dump_show(const DumpShowFlags& flags) {
  const auto dumps = find_args_dumps(flags.dir);
  if (dumps.empty()) {
    fmt::print(stderr, "simpler dump show: {} holds no argument dump (manifest.json + args.bin)\n", flags.dir);
    return kExitFailure;
  }
  for (const auto& [label, path] : dumps) {
    auto d = load_args_dump(path);
    if (!d.ok()) {
      fmt::print(stderr, "simpler dump show: {}\n", d.status().to_string());
      return kExitFailure;
    }
    print_dump(*d, label, flags.task);
  }
  return kExitOk;
}

int cmd_dump_diff(const DumpDiffFlags& flags) {
  auto a = find_args_dumps(flags.a);
  auto b = find_args_dumps(flags.b);
  if (a.empty() || b.empty()) {
    fmt::print(stderr, "simpler dump diff: {} holds no argument dump (manifest.json + args.bin)\n",
               a.empty() ? flags.a : flags.b);
    return kExitFailure;
  }
  strip_single_run(a);
  strip_single_run(b);
  std::vector<std::string> la, lb;
  for (const auto& x : a) la.push_back(x.first);
  for (const auto& x : b) lb.push_back(x.first);
  if (la != lb) {
    fmt::print(stderr,
               "simpler dump diff: the two directories hold dumps of different places: [{}] vs [{}] (a node "
               "directory with several runs: pass one run's directory, DIR/run<R>)\n",
               fmt::join(la, ", "), fmt::join(lb, ", "));
    return kExitFailure;
  }
  // The dumps come in execution order (by node task, then chip): the first
  // that differs names the task where the runs parted.
  std::string first;
  for (size_t i = 0; i < a.size(); ++i) {
    auto da = load_args_dump(a[i].second);
    auto db = load_args_dump(b[i].second);
    for (const auto* d : {&da, &db}) {
      if (!d->ok()) {
        fmt::print(stderr, "simpler dump diff: {}\n", d->status().to_string());
        return kExitFailure;
      }
    }
    if (!da->complete || !db->complete) {
      fmt::print("note: {} is incomplete; records it lacks are reported as differences\n",
                 da->complete ? b[i].second : a[i].second);
    }
    const DumpDifference d = diff_args_dumps(*da, *db, flags.rtol, flags.atol);
    const std::string line = fmt::format("{}{}", a[i].first.empty() ? "" : a[i].first + ": ", d.what);
    fmt::print("{}\n", line);
    if (d.differs && first.empty()) first = line;
  }
  if (a.size() > 1 && !first.empty()) fmt::print("first difference, in execution order: {}\n", first);
  return first.empty() ? kExitOk : kExitFailure;
}

}  // namespace simpler::cli
