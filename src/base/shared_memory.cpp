#include "base/shared_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errors.h"
#include "base/fault_hooks.h"

namespace simpler {

Result<SharedMapping> SharedMapping::create_anonymous(size_t bytes) {
  if (bytes == 0) return invalid_argument("shared mapping of 0 bytes");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - (page - 1))
    return invalid_argument("shared mapping of {} bytes cannot be page-rounded", bytes);
  const size_t rounded = (bytes + page - 1) / page * page;
  void* p = hooks::alloc_fault_hit("shared mapping")
                ? (errno = ENOMEM, MAP_FAILED)
                : mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("mmap of {} shared bytes failed: {}", rounded, std::strerror(errno));
  }
  return SharedMapping(p, rounded);
}

SharedMapping& SharedMapping::operator=(SharedMapping&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void SharedMapping::reset() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

}  // namespace simpler
