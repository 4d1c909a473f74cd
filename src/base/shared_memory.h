// SharedMapping: RAII over a MAP_SHARED|MAP_ANONYMOUS region, the memory a
// parent and the children it forks afterwards all see at the same address.
// Create it before fork; any thread may read the bytes; the owner unmaps on
// destruction (each process unmaps its own inherited copy).
#pragma once

#include <cstddef>
#include <utility>

#include "simpler/status.h"

namespace simpler {

class SharedMapping {
 public:
  // Maps `bytes` (> 0) of zeroed, page-rounded, process-shared memory.
  static Result<SharedMapping> create_anonymous(size_t bytes);

  SharedMapping() = default;
  SharedMapping(SharedMapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  SharedMapping& operator=(SharedMapping&& o) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping() { reset(); }

  void* data() const { return base_; }
  // The mapped extent: the request rounded up to whole pages.
  size_t size() const { return bytes_; }
  void reset();

 private:
  SharedMapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace simpler
