// StorePrimitive: the one way the child loop writes the shared mailbox, so a
// test can record the order of the real loop's stores (R5, R6). Called from
// the serve-loop thread and from any thread completing a run; implementations
// must be thread-safe. Owns nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ipc/mailbox_layout.h"

namespace simpler {

class StorePrimitive {
 public:
  virtual ~StorePrimitive() = default;
  // Release stores: everything the caller stored before is visible to a reader
  // that acquires this word.
  virtual void store32(uint32_t& word, uint32_t value) = 0;
  virtual void store64(uint64_t& word, uint64_t value) = 0;
  // Plain bytes, published by a later release store.
  virtual void store_bytes(void* dst, const void* src, size_t n) = 0;
};

// Production: plain atomic stores on the mapping.
class PlainStores final : public StorePrimitive {
 public:
  void store32(uint32_t& word, uint32_t value) override { store_release(word, value); }
  void store64(uint64_t& word, uint64_t value) override { store_release(word, value); }
  void store_bytes(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
};

}  // namespace simpler
