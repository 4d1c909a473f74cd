// AccessIndex, the dependency analysis of host_build_graph: conflicts found
// through hashed granules, large accesses, sub-buffers, covering writes and
// O(1) clearing between runs. Results are compared with a brute-force oracle.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "runtime/common/access_index.h"

namespace simpler {
namespace {

struct Access {
  uint64_t alloc;
  TensorView view;
  uint64_t first, end;
  bool write;
};

Access make(uint64_t alloc, uint64_t buffer_offset, const TensorView& v, bool write) {
  return Access{alloc, v, buffer_offset + v.first_byte(), buffer_offset + v.end_byte(), write};
}

std::set<uint32_t> conflicts_of(AccessIndex& index, const Access& a, uint32_t task) {
  std::set<uint32_t> out;
  index.add(a.alloc, a.view, a.first, a.end, task, a.write, [&](uint32_t t) { out.insert(t); });
  return out;
}

TEST(AccessIndex, ReadAfterWriteWriteAfterReadAndDisjointTiles) {
  AccessIndex index(64);
  const DeviceBuffer buf{0x1000, 64 * 64 * 4};
  const TensorView m = buf.view({64, 64}, DType::F32);
  const TensorView t00 = *m.tile({0, 0}, {32, 32});
  const TensorView t01 = *m.tile({0, 32}, {32, 32});
  EXPECT_TRUE(conflicts_of(index, make(buf.addr, 0, t00, true), 0).empty());
  EXPECT_TRUE(conflicts_of(index, make(buf.addr, 0, t01, true), 1).empty()) << "disjoint tiles of one buffer";
  EXPECT_EQ(conflicts_of(index, make(buf.addr, 0, t00, false), 2), std::set<uint32_t>{0}) << "read after write";
  EXPECT_EQ(conflicts_of(index, make(buf.addr, 0, t00, false), 3), std::set<uint32_t>{0}) << "reads do not order reads";
  EXPECT_EQ(conflicts_of(index, make(buf.addr, 0, t00, true), 4), (std::set<uint32_t>{0, 2, 3})) << "write after read";
  EXPECT_EQ(conflicts_of(index, make(buf.addr, 0, m, false), 5), (std::set<uint32_t>{1, 4}))
      << "a whole-buffer read meets the latest writer of each tile";
}

TEST(AccessIndex, CoveredAccessesAreForgotten) {
  AccessIndex index(64);
  const DeviceBuffer buf{0x2000, 1024};
  const TensorView v = buf.view({256}, DType::F32);
  for (uint32_t t = 0; t < 100; ++t) {
    auto c = conflicts_of(index, make(buf.addr, 0, v, true), t);
    if (t > 0) {
      EXPECT_EQ(c, std::set<uint32_t>{t - 1}) << "a chain orders each write after the last";
    }
  }
  EXPECT_EQ(index.live_records(), 1u) << "each write covered the one before";
}

TEST(AccessIndex, SubBuffersOfOneAllocationMeet) {
  AccessIndex index(64);
  const uint64_t alloc = 0x3000;
  const DeviceBuffer whole{alloc, 512}, tail{alloc + 256, 256};
  EXPECT_TRUE(conflicts_of(index, make(alloc, 0, whole.view({128}, DType::F32), true), 0).empty());
  EXPECT_EQ(conflicts_of(index, make(alloc, 256, tail.view({64}, DType::F32), false), 1), std::set<uint32_t>{0});
  const DeviceBuffer other{0x9000, 512};
  EXPECT_TRUE(conflicts_of(index, make(other.addr, 0, other.view({128}, DType::F32), true), 2).empty())
      << "another allocation never meets";
}

// A bucket is shared by every allocation hashing there: 256 allocations in a
// 64-bucket table must collide, and writes at the same offsets of different
// allocations still never meet.
TEST(AccessIndex, CollidingAllocationsDoNotMeet) {
  AccessIndex index(16);
  for (uint32_t t = 0; t < 256; ++t) {
    const DeviceBuffer buf{0x100000 + uint64_t{t} * 0x1000, 64};
    const TensorView v = buf.view({16}, DType::F32);
    EXPECT_TRUE(conflicts_of(index, make(buf.addr, 0, v, true), t).empty()) << "allocation " << t;
  }
}

TEST(AccessIndex, ClearForgetsEverything) {
  AccessIndex index(64);
  const DeviceBuffer buf{0x4000, 256};
  const TensorView v = buf.view({64}, DType::F32);
  (void)conflicts_of(index, make(buf.addr, 0, v, true), 0);
  index.clear();
  EXPECT_TRUE(conflicts_of(index, make(buf.addr, 0, v, true), 0).empty());
}

// Random accesses of mixed sizes (tiles, rows, whole buffers, sub-buffers):
// the index reports exactly the conflicts a brute-force scan over every live
// earlier access reports.
TEST(AccessIndex, MatchesBruteForce) {
  std::mt19937 rng(7);
  AccessIndex index(256);
  const uint64_t alloc = 0x10000;
  const DeviceBuffer buf{alloc, 128 * 128 * 4};
  const TensorView m = buf.view({128, 128}, DType::F32);
  std::vector<Access> live;
  std::vector<uint32_t> live_task;
  for (uint32_t t = 0; t < 3000; ++t) {
    Access a;
    switch (rng() % 4) {
      case 0: {
        const int64_t r = rng() % 8, c = rng() % 8;
        a = make(alloc, 0, *m.tile({r * 16, c * 16}, {16, 16}), rng() % 2 == 0);
        break;
      }
      case 1:
        a = make(alloc, 0, *m.tile({static_cast<int64_t>(rng() % 128), 0}, {1, 128}), rng() % 2 == 0);
        break;
      case 2:
        a = make(alloc, 0, m, rng() % 8 == 0);
        break;
      default: {
        const uint64_t off = (rng() % 64) * 1024;
        const DeviceBuffer sub{alloc + off, 1024};
        a = make(alloc, off, sub.view({256}, DType::F32), rng() % 2 == 0);
        break;
      }
    }
    std::set<uint32_t> want;
    std::vector<Access> next_live;
    std::vector<uint32_t> next_task;
    for (size_t i = 0; i < live.size(); ++i) {
      const Access& e = live[i];
      const bool bytes = e.first < a.end && a.first < e.end;
      const bool same = e.view.buffer().addr == a.view.buffer().addr;
      if (bytes && (a.write || e.write) && (!same || e.view.overlaps(a.view))) want.insert(live_task[i]);
      if (!(a.write && same && bytes && write_covers(a.view, e.view))) {
        next_live.push_back(e);
        next_task.push_back(live_task[i]);
      }
    }
    ASSERT_EQ(conflicts_of(index, a, t), want) << "task " << t;
    next_live.push_back(a);
    next_task.push_back(t);
    live.swap(next_live);
    live_task.swap(next_task);
  }
}

}  // namespace
}  // namespace simpler
