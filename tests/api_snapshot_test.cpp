// R71 (nothing new is user-visible): the installed headers match the
// checked-in snapshot of the public API, and an unconfigured Worker keeps its
// depth, its children's grant and its mailbox footprint (G = 2).
//
// The snapshot is tests/api_snapshot/public_api.txt (see api_normalize.h for
// what is normalized away). After a deliberate, reviewed API change, refresh
// it with
//   cmake --build --preset default --target update_api_snapshot
// and commit the snapshot's diff with the change.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "api_snapshot/api_normalize.h"
#include "chip/chip_worker.h"
#include "ipc/mailbox_layout.h"
#include "node/node_worker.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

// R71: recorded when the grant became configurable; an unconfigured Worker's
// mailbox must not grow.
constexpr size_t kDefaultMailboxBytes = 198'144;

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// R71: any difference names the first line that differs and how to refresh.
TEST(ApiSnapshot, R71PublicHeadersMatchTheSnapshot) {
  auto now = api_snapshot::normalize_public_headers(SIMPLER_PUBLIC_INCLUDE_DIR);
  ASSERT_TRUE(now.ok()) << now.status().to_string();
  const std::vector<std::string> recorded = read_lines(SIMPLER_API_SNAPSHOT);
  ASSERT_FALSE(recorded.empty()) << SIMPLER_API_SNAPSHOT << " is missing or empty; create it with "
                                 << api_snapshot::kRefreshCommand;
  size_t i = 0;
  while (i < recorded.size() && i < now->size() && recorded[i] == (*now)[i]) ++i;
  if (i == recorded.size() && i == now->size()) return;
  const std::string header = [&] {
    for (size_t j = std::min(i, now->size() - 1) + 1; j-- > 0;) {
      if ((*now)[j].rfind("=== ", 0) == 0) return (*now)[j].substr(4);
    }
    return std::string("(preamble)");
  }();
  ADD_FAILURE() << "the public API differs from " << SIMPLER_API_SNAPSHOT << " at line " << i + 1 << " (in " << header
                << "):\n"
                << "  snapshot: " << (i < recorded.size() ? recorded[i] : "<end of snapshot>") << "\n"
                << "  headers:  " << (i < now->size() ? (*now)[i] : "<end of headers>") << "\n"
                << "(" << recorded.size() << " snapshot lines, " << now->size() << " from the headers.)\n"
                << "If the change is deliberate, refresh the snapshot: " << api_snapshot::kRefreshCommand;
}

// The normalization drops comments and layout only: comment markers inside
// literals, digit separators and the code around a block comment survive.
TEST(ApiSnapshot, R71NormalizerDropsOnlyCommentsAndLayout) {
  const std::vector<std::string> got = api_snapshot::normalize_header(
      "// role\n"
      "\n"
      "int   f(int a,\t int b);  // why\n"
      "const char* url = \"http://x // y\"; /* gone */ char s = '/';\n"
      "uint64_t n = 1'000'000; /* spans\n"
      "   lines */ int g();\n"
      "const char* q = \"a\\\"//b\";\n");
  const std::vector<std::string> want{"int f(int a, int b);", "const char* url = \"http://x // y\"; char s = '/';",
                                      "uint64_t n = 1'000'000;", "int g();", "const char* q = \"a\\\"//b\";"};
  EXPECT_EQ(got, want);
}

// R71: the footprint of the default mailbox, (1 + K) * 64 KiB + (G + K) * S at
// G = 2, is unchanged, and it is what an unconfigured config asks for.
TEST(R71Defaults, MailboxFootprintIsUnchanged) {
  const WorkerConfig unconfigured;
  EXPECT_EQ(unconfigured.pipeline_depth, 2u);
  EXPECT_EQ(unconfigured.launch_depth, 0u);
  auto m = mailbox_size(unconfigured.pipeline_depth);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(*m, kDefaultMailboxBytes);
  EXPECT_EQ(*mailbox_size(2), kDefaultMailboxBytes);
}

// R71: an unconfigured chip grants 2 sets, and an unconfigured node's chip
// child grants 2 and serves a mailbox of exactly the recorded footprint.
TEST(R71Defaults, UnconfiguredWorkerCapacityIsUnchanged) {
  Watchdog dog;
  auto chip = ChipWorker::create(WorkerConfig{}, {});
  ASSERT_TRUE(chip.ok()) << chip.status().to_string();
  EXPECT_EQ((*chip)->grant(), 2u);
  EXPECT_EQ((*chip)->launch_depth(), 2u);
  EXPECT_TRUE((*chip)->close(std::chrono::seconds(30)).ok());

  NodeSpec node_spec;  // only the child count is set: a node needs one
  node_spec.config.chips = 1;
  auto node = NodeWorker::create(node_spec);
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  ForkedChild& child = (*node)->next_child(0);
  EXPECT_EQ(child.child_grant(), 2u);
  const MailboxView view = child.endpoint().view();
  EXPECT_EQ(view.control().granted_sets, 2u);
  EXPECT_EQ(view.bytes(), kDefaultMailboxBytes);
  EXPECT_TRUE((*node)->close(std::chrono::seconds(30)).ok());
}

}  // namespace
}  // namespace simpler::testing
