// Layer src/base: the first-fit allocator (alignment, exact accounting,
// fragmentation and coalescing, refusals, range lookups), and what its two
// users, GlobalMemory and SharedHeap, share through it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "base/first_fit_allocator.h"
#include "device/sim/global_memory.h"
#include "node/shared_heap.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::contains;

// The allocator never touches the range, so the tests use addresses nothing maps.
constexpr uint64_t kBase = uint64_t{1} << 32;
constexpr uint64_t kAlign = 64;

TEST(FirstFitAllocator, HandsOutOnlyWholeAlignedBlocksOfItsRange) {
  FirstFitAllocator exact(kBase, 1000, kAlign, "block");
  EXPECT_EQ(exact.free_bytes(), 960u);
  FirstFitAllocator skewed(kBase + 8, 1000, kAlign, "block");  // 56 head bytes are skipped, 48 tail bytes too
  EXPECT_EQ(skewed.free_bytes(), 896u);
  auto a = skewed.allocate(896);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a, kBase + 64);
  EXPECT_EQ(skewed.free_bytes(), 0u);
  FirstFitAllocator tiny(kBase + 8, 100, kAlign, "block");
  EXPECT_EQ(tiny.free_bytes(), 0u);
  EXPECT_REFUSED(tiny.allocate(1).status(), StatusCode::kResourceExhausted, "bytes = 1");
}

TEST(FirstFitAllocator, AllocationsAreAlignedFirstFitAndAccountedExactly) {
  FirstFitAllocator ff(kBase, 1 << 20, kAlign, "block");
  const uint64_t total = ff.free_bytes();
  auto a = ff.allocate(1);
  auto b = ff.allocate(64);
  auto c = ff.allocate(65);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, kBase);
  EXPECT_EQ(*b, kBase + 64);
  EXPECT_EQ(*c, kBase + 128);
  EXPECT_EQ(ff.block_size(*a), 64u);
  EXPECT_EQ(ff.block_size(*b), 64u);
  EXPECT_EQ(ff.block_size(*c), 128u);
  EXPECT_EQ(ff.block_size(*c + 64), 0u);
  EXPECT_EQ(ff.live_blocks(), 3u);
  EXPECT_EQ(ff.free_bytes(), total - 256);
  EXPECT_TRUE(ff.free(*b).ok());
  EXPECT_EQ(ff.free_bytes(), total - 192);
  EXPECT_EQ(ff.live_blocks(), 2u);
  auto again = ff.allocate(10);  // the lowest hole that fits
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *b);
  for (uint64_t addr : {*a, *again, *c}) EXPECT_TRUE(ff.free(addr).ok());
  EXPECT_EQ(ff.free_bytes(), total);
  EXPECT_EQ(ff.live_blocks(), 0u);
}

// Each way a freed block can meet the free list: alone, joining the block
// after it, the block before it, and both at once.
TEST(FirstFitAllocator, FreedNeighboursCoalesceSoTheWholeRangeIsAllocatableAgain) {
  FirstFitAllocator ff(kBase, 64 * 1024, kAlign, "block");
  const uint64_t total = ff.free_bytes();
  const uint64_t quarter = total / 4;
  auto a = ff.allocate(quarter), b = ff.allocate(quarter), c = ff.allocate(quarter), d = ff.allocate(quarter);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ(ff.free_bytes(), 0u);
  // a and c free: half is free, but in two pieces.
  ASSERT_TRUE(ff.free(*a).ok());
  ASSERT_TRUE(ff.free(*c).ok());
  EXPECT_EQ(ff.free_bytes(), 2 * quarter);
  Status big = ff.allocate(2 * quarter).status();
  EXPECT_REFUSED(big, StatusCode::kResourceExhausted, "fragmented");
  EXPECT_EQ(ff.free_bytes(), 2 * quarter);  // a refusal changes nothing
  // b joins a before it and c after it.
  ASSERT_TRUE(ff.free(*b).ok());
  auto three = ff.allocate(3 * quarter);
  ASSERT_TRUE(three.ok()) << three.status().to_string();
  EXPECT_EQ(*three, *a);
  // The free block after it only: freeing the three quarters joins d's hole.
  ASSERT_TRUE(ff.free(*d).ok());
  ASSERT_TRUE(ff.free(*three).ok());
  auto all = ff.allocate(total);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_TRUE(ff.free(*all).ok());
  // The free block before it only.
  a = ff.allocate(quarter);
  b = ff.allocate(quarter);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(ff.free(*a).ok());
  ASSERT_TRUE(ff.free(*b).ok());
  all = ff.allocate(total);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(ff.free_bytes(), 0u);
  ASSERT_TRUE(ff.free(*all).ok());
  EXPECT_EQ(ff.free_bytes(), total);
}

// A shadow model of every live block checks each answer: no overlap, the
// free total exact after every step, sizes and range lookups right.
TEST(FirstFitAllocator, RandomAllocateFreeKeepsExactAccounting) {
  FirstFitAllocator ff(kBase, 1 << 20, kAlign, "block");
  const uint64_t total = ff.free_bytes();
  std::mt19937 rng(99);
  std::map<uint64_t, uint64_t> live;  // addr -> rounded size
  uint64_t used = 0;
  int refused = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t want = std::uniform_int_distribution<uint64_t>(1, 16384)(rng);
      auto a = ff.allocate(want);
      if (!a.ok()) {
        ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted);
        ++refused;
        continue;
      }
      const uint64_t rounded = (want + kAlign - 1) / kAlign * kAlign;
      ASSERT_EQ(*a % kAlign, 0u);
      ASSERT_GE(*a, kBase);
      ASSERT_LE(*a + rounded, kBase + total);
      auto next = live.lower_bound(*a);
      if (next != live.end()) {
        ASSERT_LE(*a + rounded, next->first);
      }
      if (next != live.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, *a);
      }
      live[*a] = rounded;
      used += rounded;
      ASSERT_EQ(ff.block_size(*a), rounded);
      auto found = ff.containing(*a + rounded - 1, 1);
      ASSERT_TRUE(found.ok()) << found.status().to_string();
      ASSERT_EQ(found->addr, *a);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(ff.free(it->first).ok());
      ASSERT_EQ(ff.block_size(it->first), 0u);
      used -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(ff.free_bytes(), total - used);
    ASSERT_EQ(ff.live_blocks(), live.size());
  }
  EXPECT_GT(refused, 0) << "the heap never filled; the test did not reach fragmentation";
  for (auto [addr, size] : live) ASSERT_TRUE(ff.free(addr).ok());
  EXPECT_EQ(ff.free_bytes(), total);
  EXPECT_TRUE(ff.allocate(total).ok());  // fully coalesced again
}

TEST(FirstFitAllocator, DoubleFreeAndForeignAddressesAreRefusedByName) {
  FirstFitAllocator ff(kBase, 1 << 16, kAlign, "widget");
  auto a = ff.allocate(256);
  ASSERT_TRUE(a.ok());
  const uint64_t before = ff.free_bytes();
  EXPECT_EQ(ff.free(*a + 64),
            Status(StatusCode::kInvalidArgument, fmt::format("addr = {:#x} is not a live widget", *a + 64)));
  EXPECT_REFUSED(ff.free(0), StatusCode::kInvalidArgument, "addr = 0x0 is not a live widget");
  EXPECT_EQ(ff.free_bytes(), before);
  EXPECT_EQ(ff.live_blocks(), 1u);
  ASSERT_TRUE(ff.free(*a).ok());
  EXPECT_REFUSED(ff.free(*a), StatusCode::kInvalidArgument, fmt::format("addr = {:#x} is not a live widget", *a));
  EXPECT_EQ(ff.free_bytes(), before + 256);
}

TEST(FirstFitAllocator, ExhaustionNamesTheRequestAndWhatIsFree) {
  FirstFitAllocator ff(kBase, 4096, kAlign, "widget");
  EXPECT_REFUSED(ff.allocate(0).status(), StatusCode::kInvalidArgument, "bytes = 0: a widget must have a size");
  EXPECT_REFUSED(ff.allocate(4097).status(), StatusCode::kResourceExhausted, "bytes = 4097");
  EXPECT_REFUSED(ff.allocate(~uint64_t{0}).status(), StatusCode::kResourceExhausted, "4096 of 4096 bytes free");
  auto a = ff.allocate(4000);
  ASSERT_TRUE(a.ok());
  Status s = ff.allocate(128).status();
  EXPECT_REFUSED(s, StatusCode::kResourceExhausted, "bytes = 128: no room for a widget that large");
  EXPECT_TRUE(contains(s.message(), "(64 of 4096 bytes free)")) << s.message();
  EXPECT_TRUE(ff.allocate(64).ok());
  EXPECT_EQ(ff.free_bytes(), 0u);
}

TEST(FirstFitAllocator, ContainingAcceptsOnlyRangesInsideOneLiveBlock) {
  FirstFitAllocator ff(kBase, 1 << 16, kAlign, "widget");
  auto a = ff.allocate(256), b = ff.allocate(256), c = ff.allocate(256);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto whole = ff.containing(*a + 100, 156);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(whole->addr, *a);
  EXPECT_EQ(whole->bytes, 256u);
  EXPECT_TRUE(ff.containing(*a, 256).ok());
  EXPECT_TRUE(ff.containing(*a, 0).ok());
  EXPECT_TRUE(ff.containing(*a + 256, 0).ok());  // the empty range at its end
  EXPECT_REFUSED(ff.containing(*a, 257).status(), StatusCode::kOutOfRange, "runs past its widget");  // into b
  EXPECT_REFUSED(ff.containing(*a + 200, 100).status(), StatusCode::kOutOfRange, "runs past");
  EXPECT_REFUSED(ff.containing(*a + 8, ~0ull).status(), StatusCode::kOutOfRange, "runs past");  // would wrap
  EXPECT_REFUSED(ff.containing(kBase - 64, 8).status(), StatusCode::kOutOfRange, "is not inside a live widget");
  ASSERT_TRUE(ff.free(*b).ok());
  ASSERT_TRUE(ff.free(*c).ok());
  // Freed space after a live block belongs to no block, however short the range.
  EXPECT_REFUSED(ff.containing(*b, 8).status(), StatusCode::kOutOfRange, "runs past its widget");
  EXPECT_REFUSED(ff.containing(*c, 8).status(), StatusCode::kOutOfRange, "is not inside a live widget");
  EXPECT_REFUSED(ff.containing(*c + 64, 0).status(), StatusCode::kOutOfRange, "is not inside a live widget");
}

// The allocator locks itself: threads allocating and freeing at once leave it
// exactly as they found it (and ThreadSanitizer sees every access ordered).
TEST(FirstFitAllocator, ConcurrentAllocateFreeKeepsExactAccounting) {
  testing::Watchdog dog;
  FirstFitAllocator ff(kBase, 1 << 20, kAlign, "block");
  const uint64_t total = ff.free_bytes();
  std::vector<std::thread> threads;
  std::vector<int> refusals(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ff, &refusals, t] {
      std::mt19937 rng(t);
      std::vector<uint64_t> mine;
      for (int i = 0; i < 4000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          auto a = ff.allocate(std::uniform_int_distribution<uint64_t>(1, 4096)(rng));
          if (a.ok()) {
            mine.push_back(*a);
          } else {
            ++refusals[t];
          }
        } else {
          if (!ff.free(mine.back()).ok()) ++refusals[t];
          mine.pop_back();
        }
      }
      for (uint64_t addr : mine) {
        if (!ff.free(addr).ok()) ++refusals[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r : refusals) EXPECT_EQ(r, 0);
  EXPECT_EQ(ff.free_bytes(), total);
  EXPECT_EQ(ff.live_blocks(), 0u);
  EXPECT_TRUE(ff.allocate(total).ok());
}

// ---- Its two users --------------------------------------------------------------------------------

// Both users answer an unknown address alike: one code, one message shape,
// each naming its own kind of block.
TEST(FirstFitAllocatorUsers, RefuseAnUnknownAddressAlike) {
  auto gm = GlobalMemory::create(1 << 16);
  auto heap = SharedHeap::create(1 << 16);
  ASSERT_TRUE(gm.ok() && heap.ok());
  auto d = (*gm)->allocate(256);
  auto h = (*heap)->alloc(256);
  ASSERT_TRUE(d.ok() && h.ok());
  const Status from_gm = (*gm)->free(*d + 64);
  const Status from_heap = (*heap)->free(*h + 64);
  EXPECT_EQ(from_gm.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(from_heap.code(), from_gm.code());
  EXPECT_EQ(from_gm.message(), fmt::format("addr = {:#x} is not a live device allocation", *d + 64));
  EXPECT_EQ(from_heap.message(), fmt::format("addr = {:#x} is not a live shared-heap block", *h + 64));
  ASSERT_TRUE((*gm)->free(*d).ok());
  ASSERT_TRUE((*heap)->free(*h).ok());
  EXPECT_EQ((*gm)->free(*d).code(), (*heap)->free(*h).code());  // a double free too
}

TEST(FirstFitAllocatorUsers, GlobalMemoryHandsOutItsOwnHostMemory) {
  auto gm = GlobalMemory::create(1000);
  ASSERT_TRUE(gm.ok());
  auto all = (*gm)->allocate(960);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(*all, (*gm)->base());
  std::memset(reinterpret_cast<void*>(*all), 0x5a, 960);
  EXPECT_EQ((*gm)->free_bytes(), 0u);
  EXPECT_EQ((*gm)->total_bytes(), 1000u);
}

TEST(FirstFitAllocatorUsers, SharedHeapHandsOutZeroedBlocks) {
  auto heap = SharedHeap::create(4096);
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->alloc(100);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*heap)->block_size(*a), 128u);
  std::memset(reinterpret_cast<void*>(*a), 0xff, 128);
  ASSERT_TRUE((*heap)->free(*a).ok());
  auto b = (*heap)->alloc(128);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(*b, *a);  // the same bytes, handed out again
  const auto* bytes = reinterpret_cast<const unsigned char*>(*b);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i;
}

// A freed block that does not touch the live block before it is no longer
// "within a live block" (the heap's own check once measured from that block
// and wrapped around).
TEST(FirstFitAllocatorUsers, SharedHeapRangeChecksSeeOnlyLiveBlocks) {
  auto heap = SharedHeap::create(4096);
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->alloc(64), b = (*heap)->alloc(64), c = (*heap)->alloc(64);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE((*heap)->within_live_block(*c, 64));
  EXPECT_FALSE((*heap)->within_live_block(*c, 65));
  ASSERT_TRUE((*heap)->free(*b).ok());
  ASSERT_TRUE((*heap)->free(*c).ok());
  EXPECT_TRUE((*heap)->within_live_block(*a + 8, 56));
  EXPECT_FALSE((*heap)->within_live_block(*b, 8));
  EXPECT_FALSE((*heap)->within_live_block(*c, 8));
  EXPECT_EQ((*heap)->live_blocks(), 1u);
}

// A held block (a transfer MPI could not cancel may still touch it, issue
// 15) outlives its free: it is not handed out again and not live to range
// checks until its last hold ends; a write hold is visible until it ends.
TEST(FirstFitAllocatorUsers, AHeldSharedHeapBlockIsReusedOnlyAfterItsLastHold) {
  auto heap = SharedHeap::create(4096);
  ASSERT_TRUE(heap.ok());
  SharedHeap& h = **heap;
  auto a = h.alloc(64);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(h.hold(*a + 4096, SharedHeap::HoldKind::kRead), nullptr) << "a hold on no live block";
  std::shared_ptr<void> writing = h.hold(*a + 8, SharedHeap::HoldKind::kWrite);
  std::shared_ptr<void> reading = h.hold(*a, SharedHeap::HoldKind::kRead);
  ASSERT_NE(writing, nullptr);
  ASSERT_NE(reading, nullptr);
  EXPECT_TRUE(h.write_held(*a + 63));
  EXPECT_EQ(h.held_blocks(), 1u);
  ASSERT_TRUE(h.free(*a).ok());
  EXPECT_FALSE(h.within_live_block(*a, 8)) << "a freed block is live to range checks while held";
  EXPECT_EQ(h.free(*a).code(), StatusCode::kInvalidArgument) << "a second free of a held block";
  auto b = h.alloc(64);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*b, *a) << "a held block was handed out again";
  writing.reset();
  EXPECT_FALSE(h.write_held(*a));
  auto c = h.alloc(64);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a) << "a block still read was handed out again";
  reading.reset();
  EXPECT_EQ(h.held_blocks(), 0u);
  auto d = h.alloc(64);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, *a) << "the block did not come back when its last hold ended";
}

// A hold that outlives its heap keeps the memory mapped: the late transfer
// it stands for still has somewhere to land.
TEST(FirstFitAllocatorUsers, AHoldOutlivesItsSharedHeap) {
  auto heap = SharedHeap::create(4096);
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->alloc(64);
  ASSERT_TRUE(a.ok());
  std::shared_ptr<void> writing = (*heap)->hold(*a, SharedHeap::HoldKind::kWrite);
  ASSERT_TRUE((*heap)->free(*a).ok());
  heap->reset();
  std::memset(reinterpret_cast<void*>(*a), 0x5a, 64);  // a SIGSEGV if the heap unmapped it
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(*a)[63], 0x5a);
  writing.reset();
}

}  // namespace
}  // namespace simpler
