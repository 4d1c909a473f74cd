// `simpler dump show|diff`: what users ask of an argument dump, printed.
// A directory is one run's dump (manifest.json + args.bin), its parent
// holding args_dump/, or a node's, holding one such directory per chip.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "diag/args_dump_file.h"

namespace simpler::cli {

namespace {

namespace fs = std::filesystem;

bool is_dump(const fs::path& p) { return fs::exists(p / "manifest.json") && fs::exists(p / "args.bin"); }

// (label, dump directory) pairs under `dir`: "" for a run's own dump, the
// chip's directory name for each chip of a node.
std::vector<std::pair<std::string, std::string>> dumps_under(const std::string& dir) {
  const fs::path root(dir);
  if (is_dump(root)) return {{"", root.string()}};
  if (is_dump(root / "args_dump")) return {{"", (root / "args_dump").string()}};
  std::vector<std::pair<std::string, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    if (is_dump(e.path() / "args_dump")) {
      found.emplace_back(name, (e.path() / "args_dump").string());
    } else if (is_dump(e.path())) {
      found.emplace_back(name, e.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
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
  const auto dumps = dumps_under(flags.dir);
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
  const auto a = dumps_under(flags.a);
  const auto b = dumps_under(flags.b);
  if (a.empty() || b.empty()) {
    fmt::print(stderr, "simpler dump diff: {} holds no argument dump (manifest.json + args.bin)\n",
               a.empty() ? flags.a : flags.b);
    return kExitFailure;
  }
  std::vector<std::string> la, lb;
  for (const auto& x : a) la.push_back(x.first);
  for (const auto& x : b) lb.push_back(x.first);
  if (la != lb) {
    fmt::print(stderr, "simpler dump diff: the two runs' dumps are of different chips: [{}] vs [{}]\n",
               fmt::join(la, ", "), fmt::join(lb, ", "));
    return kExitFailure;
  }
  bool differs = false;
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
    fmt::print("{}{}\n", a[i].first.empty() ? "" : a[i].first + ": ", d.what);
    differs = differs || d.differs;
  }
  return differs ? kExitFailure : kExitOk;
}

}  // namespace simpler::cli
