// Device buffers and tensor views over them. Values, copyable, any thread.
// A DeviceBuffer names device memory owned by a Worker (or by a run, for
// runtime-allocated outputs); a TensorView is a strided window into one.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "simpler/types.h"

namespace simpler {

inline constexpr int kMaxDims = 5;

class TensorView;

struct DeviceBuffer {
  uint64_t addr = 0;  // device address; 0 means "not bound yet" (runtime-allocated output)
  uint64_t bytes = 0;

  bool bound() const { return addr != 0; }
  // A dense row-major view of the whole buffer start; fails validation later if it
  // does not fit.
  TensorView view(std::initializer_list<int64_t> shape, DType dtype) const;
  TensorView view(const std::vector<int64_t>& shape, DType dtype) const;
};

class TensorView {
 public:
  TensorView() = default;
  // A dense row-major view of `shape` at element `offset` of `buffer`.
  TensorView(DeviceBuffer buffer, const std::vector<int64_t>& shape, DType dtype, int64_t offset = 0);
  // A view with no buffer yet, for a runtime-allocated Tag::Output.
  static TensorView unbound(const std::vector<int64_t>& shape, DType dtype);

  // The sub-window [start, start + len) of each dimension; strides are kept, so
  // tiles of one buffer stay disjoint for dependency analysis.
  Result<TensorView> tile(const std::vector<int64_t>& start, const std::vector<int64_t>& len) const;

  const DeviceBuffer& buffer() const { return buffer_; }
  DType dtype() const { return dtype_; }
  int ndim() const { return ndim_; }
  int64_t shape(int d) const { return shape_[d]; }
  int64_t stride(int d) const { return stride_[d]; }  // in elements
  int64_t offset() const { return offset_; }          // in elements, from the buffer start
  int64_t numel() const;
  // Byte range [first, last) touched by the view, relative to the buffer start.
  uint64_t first_byte() const;
  uint64_t end_byte() const;
  // The view fits in its buffer with a valid dtype, rank and non-negative shape.
  Status validate() const;
  // True when the two views may touch a common byte. Views of different
  // buffers never overlap; tiles with equal strides are compared per dimension.
  bool overlaps(const TensorView& other) const;

  // Raw construction, used by decoders; validate() before use.
  static TensorView from_parts(DeviceBuffer buffer, DType dtype, int ndim, const int64_t* shape, const int64_t* stride,
                               int64_t offset);

 private:
  DeviceBuffer buffer_{};
  DType dtype_ = DType::F32;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> stride_{};
  int64_t offset_ = 0;
};

}  // namespace simpler
