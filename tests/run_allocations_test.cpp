// Layer src/runtime/common: BorrowedAllocations, the caller allocations one
// run borrows (each pinned once while the run holds it), below and beyond the
// count it finds by a scan, and after a pin it was refused.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "device/sim/global_memory.h"
#include "runtime/common/run_allocations.h"
#include "test_util.h"

namespace simpler {
namespace {

constexpr size_t kCount = BorrowedAllocations::kScanned * 2 + 3;

class Borrowing : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = GlobalMemory::create(1 << 20);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    gm_ = std::move(made).value();
    for (size_t i = 0; i < kCount; ++i) {
      auto a = gm_->allocate(64);
      ASSERT_TRUE(a.ok());
      bases_.push_back(*a);
    }
  }
  // How many of bases_ free() refuses, each freed one allocated again at its address.
  size_t pinned() {
    size_t n = 0;
    for (uint64_t base : bases_) {
      if (!gm_->free(base).ok()) {
        ++n;
        continue;
      }
      auto again = gm_->allocate(64);
      EXPECT_TRUE(again.ok() && *again == base);
    }
    return n;
  }

  std::unique_ptr<GlobalMemory> gm_;
  std::vector<uint64_t> bases_;
};

// Every allocation borrowed any number of times is held once and pinned once,
// whether the run borrows fewer than kScanned or more; release unpins each.
TEST_F(Borrowing, EachAllocationIsPinnedOnceWhateverTheCount) {
  BorrowedAllocations b;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_TRUE(b.borrow(*gm_, bases_[pass == 0 ? i : kCount - 1 - i]).ok());
      ASSERT_TRUE(b.borrow(*gm_, bases_[i / 2]).ok());  // one borrowed before
    }
  }
  EXPECT_EQ(b.size(), kCount);
  EXPECT_EQ(pinned(), kCount);
  b.release(*gm_);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(pinned(), 0u);
  // The next run starts empty, below the scan's count again.
  ASSERT_TRUE(b.borrow(*gm_, bases_[0]).ok());
  ASSERT_TRUE(b.borrow(*gm_, bases_[0]).ok());
  EXPECT_EQ(b.size(), 1u);
  b.release(*gm_);
  EXPECT_EQ(pinned(), 0u);
}

// A pin refused (not the start of a live allocation) leaves nothing behind,
// also when it would have been the first entry past the scan's count: the
// same address is refused again, and the allocations borrowed after it are
// each held once.
TEST_F(Borrowing, ARefusedPinLeavesNothingBehind) {
  BorrowedAllocations b;
  for (size_t i = 0; i < BorrowedAllocations::kScanned; ++i) ASSERT_TRUE(b.borrow(*gm_, bases_[i]).ok());
  const uint64_t inside = bases_[0] + 8;
  EXPECT_REFUSED(b.borrow(*gm_, inside), StatusCode::kInvalidArgument, "not a live device allocation");
  EXPECT_EQ(b.size(), BorrowedAllocations::kScanned);
  for (size_t i = 0; i < kCount; ++i) ASSERT_TRUE(b.borrow(*gm_, bases_[i]).ok());
  EXPECT_REFUSED(b.borrow(*gm_, inside), StatusCode::kInvalidArgument, "not a live device allocation");
  EXPECT_EQ(b.size(), kCount);
  EXPECT_EQ(pinned(), kCount);
  b.release(*gm_);
  EXPECT_EQ(pinned(), 0u);
}

}  // namespace
}  // namespace simpler
