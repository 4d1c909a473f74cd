#include "runtime/common/access_index.h"

#include <algorithm>

namespace simpler {

AccessIndex::AccessIndex(size_t expected_accesses) {
  size_t n = 64;
  while (n < expected_accesses * 2) n *= 2;
  heads_.assign(n, 0);
  mask_ = n - 1;
}

void AccessIndex::clear() {
  recs_.clear();
  links_.clear();
  allocs_.clear();
  if (++epoch_ == 0) {  // after 2^32 runs the tags could repeat: start clean
    std::fill(heads_.begin(), heads_.end(), 0);
    epoch_ = 1;
  }
}

size_t AccessIndex::live_records() const {
  return static_cast<size_t>(std::count_if(recs_.begin(), recs_.end(), [](const Rec& r) { return !r.dead; }));
}

size_t AccessIndex::bucket(uint64_t alloc, uint64_t granule) const { return granule_bucket(alloc, granule, mask_); }

uint32_t AccessIndex::head(size_t b) const {
  const uint64_t h = heads_[b];
  return static_cast<uint32_t>(h >> 32) == epoch_ ? static_cast<uint32_t>(h) : 0;
}

void AccessIndex::set_head(size_t b, uint32_t link) { heads_[b] = uint64_t{epoch_} << 32 | link; }

}  // namespace simpler
