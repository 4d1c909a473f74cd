// The layer order of docs/architecture.md, enforced: every `#include "..."`
// under src/ points at the including file's own folder or a folder above it
// in that page's table, and no file outside a runtime's or backend's folder
// includes from it (they are reached through their registries).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "src/runtime/hbg/x.h" -> {"runtime", "runtime/hbg"}; the layer is the first
// folder under src/, the plug-in folder (if any) the first two.
struct Place {
  std::string layer;
  std::string plugin;  // "runtime/hbg", "device/sim", or empty
};

Place place_of(const std::string& rel) {
  Place p;
  const size_t a = rel.find('/');
  p.layer = rel.substr(0, a);
  const size_t b = a == std::string::npos ? std::string::npos : rel.find('/', a + 1);
  if (b != std::string::npos && (p.layer == "runtime" || p.layer == "device")) {
    const std::string sub = rel.substr(0, b);
    if (sub != "runtime/common") p.plugin = sub;
  }
  return p;
}

// The layers in the order of the table's `src/...` rows.
std::map<std::string, int> layer_ranks() {
  std::map<std::string, int> rank;
  std::istringstream doc(read(SIMPLER_SOURCE_DIR "/docs/architecture.md"));
  const std::regex row(R"(^\| `src/([a-z_]+)/)");
  std::string line;
  int next = 0;
  for (std::smatch m; std::getline(doc, line);) {
    if (std::regex_search(line, m, row) && rank.count(m[1]) == 0) rank[m[1]] = next++;
  }
  return rank;
}

struct Include {
  std::string file;  // relative to src/
  int line;
  std::string target;
};

std::vector<Include> includes_under_src() {
  std::vector<Include> out;
  const fs::path src = SIMPLER_SOURCE_DIR "/src";
  const std::regex inc(R"re(^\s*#\s*include\s+"([^"]+)")re");
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp")) continue;
    std::istringstream text(read(e.path()));
    std::string line;
    int n = 0;
    for (std::smatch m; std::getline(text, line);) {
      ++n;
      if (std::regex_search(line, m, inc)) out.push_back({fs::relative(e.path(), src).string(), n, m[1]});
    }
  }
  return out;
}

TEST(Layering, TheTableNamesEveryFolderUnderSrc) {
  const auto rank = layer_ranks();
  ASSERT_GE(rank.size(), 8u) << "docs/architecture.md lost its layer table";
  for (const auto& e : fs::directory_iterator(SIMPLER_SOURCE_DIR "/src")) {
    if (!e.is_directory()) continue;
    EXPECT_EQ(rank.count(e.path().filename().string()), 1u)
        << "src/" << e.path().filename().string() << "/ has no row in docs/architecture.md's layer table";
  }
}

TEST(Layering, NoIncludePointsDownTheLayerTable) {
  const auto rank = layer_ranks();
  const auto includes = includes_under_src();
  ASSERT_GT(includes.size(), 100u);
  for (const Include& i : includes) {
    const std::string to = place_of(i.target).layer;
    if (rank.count(to) == 0) continue;  // public headers, same-folder names
    const int from_rank = rank.at(place_of(i.file).layer);
    EXPECT_LE(rank.at(to), from_rank) << "src/" << i.file << ":" << i.line << " includes \"" << i.target
                                      << "\", which is below " << place_of(i.file).layer << " in the layer order";
  }
}

TEST(Layering, RuntimesAndBackendsAreIncludedOnlyFromTheirOwnFolder) {
  for (const Include& i : includes_under_src()) {
    const std::string plugin = place_of(i.target).plugin;
    if (plugin.empty()) continue;
    EXPECT_EQ(place_of(i.file).plugin, plugin)
        << "src/" << i.file << ":" << i.line << " includes \"" << i.target << "\": only " << plugin
        << "/ may name it; everything else finds it through its registry";
  }
}

}  // namespace
