// The first-fit allocator under host allocation failure: free() never
// allocates, in the allocator and in both of its users, and an allocate()
// that meets std::bad_alloc loses no block. This binary replaces global
// operator new with one that counts, or fails, the allocations of the arming
// thread.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <optional>

#include "alloc_hook.h"
#include "base/first_fit_allocator.h"
#include "device/sim/global_memory.h"
#include "node/shared_heap.h"

namespace simpler {
namespace {

using testing::AllocHook;

constexpr uint64_t kBase = uint64_t{1} << 32;

// The allocations `fn` makes on this thread.
template <typename F>
long allocations_of(F&& fn) {
  AllocHook::allocations = 0;
  AllocHook::counting = true;
  fn();
  AllocHook::counting = false;
  return AllocHook::allocations;
}

// Every way a free can meet the free list: a block with live neighbours on
// both sides, then one joining a free block after it, one joining a free
// block before it, and one joining both.
TEST(FirstFitFault, FreeNeverAllocates) {
  FirstFitAllocator ff(kBase, 1 << 16, 64, "block");
  uint64_t b[6];
  for (uint64_t& addr : b) {
    auto a = ff.allocate(64);
    ASSERT_TRUE(a.ok());
    addr = *a;
  }
  for (int i : {1, 4, 3, 2, 0, 5}) {
    Status s;
    EXPECT_EQ(allocations_of([&] { s = ff.free(b[i]); }), 0) << "freeing block " << i;
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_EQ(ff.live_blocks(), 0u);
  EXPECT_TRUE(ff.allocate(1 << 16).ok()) << "the frees did not coalesce";
}

TEST(FirstFitFault, TheUsersFreeWithoutAllocating) {
  auto gm = GlobalMemory::create(1 << 16);
  auto heap = SharedHeap::create(1 << 16);
  ASSERT_TRUE(gm.ok() && heap.ok());
  for (int round = 0; round < 2; ++round) {  // with a live block after the freed one, then without
    auto d0 = (*gm)->allocate(64), d1 = (*gm)->allocate(64);
    auto h0 = (*heap)->alloc(64), h1 = (*heap)->alloc(64);
    ASSERT_TRUE(d0.ok() && d1.ok() && h0.ok() && h1.ok());
    const uint64_t d = round == 0 ? *d0 : *d1, h = round == 0 ? *h0 : *h1;
    Status from_gm, from_heap;
    EXPECT_EQ(allocations_of([&] { from_gm = (*gm)->free(d); }), 0) << "GlobalMemory, round " << round;
    EXPECT_EQ(allocations_of([&] { from_heap = (*heap)->free(h); }), 0) << "SharedHeap, round " << round;
    EXPECT_TRUE(from_gm.ok()) << from_gm.to_string();
    EXPECT_TRUE(from_heap.ok()) << from_heap.to_string();
    ASSERT_TRUE((*gm)->free(round == 0 ? *d1 : *d0).ok());
    ASSERT_TRUE((*heap)->free(round == 0 ? *h1 : *h0).ok());
  }
}

// With every host allocation failing, a free still succeeds, and a refused
// one still answers with its code instead of throwing.
TEST(FirstFitFault, FreeSucceedsWhenEveryAllocationFails) {
  FirstFitAllocator ff(kBase, 1 << 16, 64, "block");
  auto a = ff.allocate(64), b = ff.allocate(64);
  ASSERT_TRUE(a.ok() && b.ok());
  AllocHook::fail_once = false;
  AllocHook::fail_after = 0;
  const Status freed = ff.free(*a);
  const Status refused = ff.free(*a);
  AllocHook::fail_after = -1;
  AllocHook::fail_once = true;
  EXPECT_TRUE(freed.ok()) << freed.to_string();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ff.live_blocks(), 1u);
  EXPECT_EQ(ff.free_bytes(), (uint64_t{1} << 16) - 64);
}

// An allocate that fails at its k-th host allocation, for every k, leaves
// the free list whole; then one succeeds where the first fit says: in a hole
// it fills exactly, and in the tail it splits.
TEST(FirstFitFault, AllocateLosesNoBlockOnBadAlloc) {
  for (uint64_t want : {uint64_t{64}, uint64_t{128}}) {
    FirstFitAllocator ff(kBase, 1 << 16, 64, "block");
    auto a = ff.allocate(64), hole = ff.allocate(64), c = ff.allocate(64);
    ASSERT_TRUE(a.ok() && hole.ok() && c.ok());
    ASSERT_TRUE(ff.free(*hole).ok());  // free list: the hole, then the tail
    const uint64_t free_before = ff.free_bytes();
    int failures = 0;
    for (long k = 0;; ++k) {
      AllocHook::fail_after = k;
      std::optional<Result<uint64_t>> got;
      try {
        got.emplace(ff.allocate(want));
      } catch (const std::bad_alloc&) {
        // got stays empty: this k failed the allocate
      }
      AllocHook::fail_after = -1;
      if (got) {
        ASSERT_TRUE(got->ok()) << got->status().to_string();
        EXPECT_EQ(**got, want == 64 ? *hole : *c + 64) << "want = " << want;
        break;
      }
      ++failures;
      ASSERT_EQ(ff.free_bytes(), free_before) << "want = " << want << ", k = " << k;
      ASSERT_EQ(ff.live_blocks(), 2u) << "want = " << want << ", k = " << k;
      ASSERT_LT(k, 100) << "the allocation never succeeded";
    }
    EXPECT_GT(failures, 0) << "want = " << want << ": allocate never reached a host allocation";
    ASSERT_TRUE(ff.free(*a).ok());
    ASSERT_TRUE(ff.free(*c).ok());
    EXPECT_EQ(ff.free_bytes(), (uint64_t{1} << 16) - want);
  }
}

}  // namespace
}  // namespace simpler
