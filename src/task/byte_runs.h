// The contiguous byte runs a tensor view covers, for the copies that move a
// view's elements and nothing else between two memories (a chip child's
// staging, a remote node's outputs). A pure function; any thread.
#pragma once

#include <array>
#include <cstdint>

#include "base/errors.h"
#include "simpler/tensor.h"

namespace simpler {

// Calls `copy(byte_offset, bytes)` (returning Status) for each run of
// contiguous bytes `v` covers, relative to its buffer start: the whole span
// when the view is dense, else its innermost rows (or single elements when
// those are strided). Stops at the first error.
template <typename F>
Status for_each_byte_run(const TensorView& v, F&& copy) {
  const int64_t n = v.numel();
  if (n == 0) return Status();
  const uint64_t esize = dtype_size(v.dtype());
  if (v.end_byte() - v.first_byte() == static_cast<uint64_t>(n) * esize) {
    return copy(v.first_byte(), v.end_byte() - v.first_byte());
  }
  const int nd = v.ndim();
  const bool dense_rows = v.stride(nd - 1) == 1;
  const int outer = dense_rows ? nd - 1 : nd;
  const uint64_t run_bytes = dense_rows ? static_cast<uint64_t>(v.shape(nd - 1)) * esize : esize;
  std::array<int64_t, kMaxDims> idx{};
  for (;;) {
    int64_t e = v.offset();
    for (int d = 0; d < outer; ++d) e += idx[d] * v.stride(d);
    SIMPLER_RETURN_IF_ERROR(copy(static_cast<uint64_t>(e) * esize, run_bytes));
    int d = outer - 1;
    while (d >= 0 && ++idx[d] == v.shape(d)) idx[d--] = 0;
    if (d < 0) return Status();
  }
}

// Whether `v`'s elements fill [first_byte, end_byte) with no gap.
inline bool is_dense(const TensorView& v) {
  return v.end_byte() - v.first_byte() == static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype());
}

}  // namespace simpler
