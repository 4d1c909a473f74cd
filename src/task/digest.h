// SHA-256 digests for callable identity. Any thread; owns nothing.
#pragma once

#include <cstddef>
#include <string_view>

#include "simpler/callable.h"

namespace simpler {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest finish();

 private:
  void* ctx_;
};

Digest sha256(const void* data, size_t n);

}  // namespace simpler
