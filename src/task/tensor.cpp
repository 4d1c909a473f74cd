#include "simpler/tensor.h"

#include <algorithm>
#include <limits>

#include "base/errors.h"

namespace simpler {

TensorView DeviceBuffer::view(std::initializer_list<int64_t> shape, DType dtype) const {
  return TensorView(*this, std::vector<int64_t>(shape), dtype);
}
TensorView DeviceBuffer::view(const std::vector<int64_t>& shape, DType dtype) const {
  return TensorView(*this, shape, dtype);
}

TensorView::TensorView(DeviceBuffer buffer, const std::vector<int64_t>& shape, DType dtype, int64_t offset)
    : buffer_(buffer), dtype_(dtype), offset_(offset) {
  // An over-rank shape is kept as rank kMaxDims + 1 so validate() refuses it.
  ndim_ = shape.size() > static_cast<size_t>(kMaxDims) ? kMaxDims + 1 : static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = std::min(ndim_, kMaxDims) - 1; d >= 0; --d) {
    shape_[d] = shape[d];
    stride_[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
}

TensorView TensorView::unbound(const std::vector<int64_t>& shape, DType dtype) {
  return TensorView(DeviceBuffer{}, shape, dtype);
}

TensorView TensorView::from_parts(DeviceBuffer buffer, DType dtype, int ndim, const int64_t* shape,
                                  const int64_t* stride, int64_t offset) {
  TensorView v;
  v.buffer_ = buffer;
  v.dtype_ = dtype;
  v.ndim_ = ndim;
  v.offset_ = offset;
  for (int d = 0; d < std::min(ndim, kMaxDims); ++d) {
    v.shape_[d] = shape[d];
    v.stride_[d] = stride[d];
  }
  return v;
}

Result<TensorView> TensorView::tile(const std::vector<int64_t>& start, const std::vector<int64_t>& len) const {
  if (start.size() != static_cast<size_t>(ndim_) || len.size() != static_cast<size_t>(ndim_)) {
    return invalid_argument("tile: expected {} start and len values, got {} and {}", ndim_, start.size(), len.size());
  }
  TensorView t = *this;
  for (int d = 0; d < ndim_; ++d) {
    if (start[d] < 0 || len[d] < 0 || start[d] > shape_[d] || len[d] > shape_[d] - start[d]) {
      return out_of_range("tile: dimension {} start {} length {} is outside the view's extent {}", d, start[d], len[d],
                          shape_[d]);
    }
    t.offset_ += start[d] * stride_[d];
    t.shape_[d] = len[d];
  }
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_ && d < kMaxDims; ++d) n *= shape_[d];
  return n;
}

uint64_t TensorView::first_byte() const {
  // An empty view touches no byte: its range is empty at its offset. Its
  // strides are never applied, so validate() bounds none of their reaches.
  if (numel() == 0) return static_cast<uint64_t>(offset_) * dtype_size(dtype_);
  int64_t lo = offset_;
  for (int d = 0; d < ndim_; ++d) {
    if (stride_[d] < 0) lo += (shape_[d] - 1) * stride_[d];
  }
  return static_cast<uint64_t>(lo) * dtype_size(dtype_);
}

uint64_t TensorView::end_byte() const {
  if (numel() == 0) return first_byte();
  int64_t hi = offset_;
  for (int d = 0; d < ndim_; ++d) {
    if (stride_[d] > 0) hi += (shape_[d] - 1) * stride_[d];
  }
  return static_cast<uint64_t>(hi + 1) * dtype_size(dtype_);
}

Status TensorView::validate() const {
  if (static_cast<size_t>(dtype_) >= static_cast<size_t>(DType::kCount)) {
    return invalid_argument("dtype {} is not a valid DType", static_cast<int>(dtype_));
  }
  if (ndim_ < 0 || ndim_ > kMaxDims) return invalid_argument("ndim {} is outside [0, {}]", ndim_, kMaxDims);
  // Every quantity below is checked before use, so a hostile shape, stride or
  // offset (it may have crossed a mailbox) cannot wrap into a small, "valid" view.
  constexpr int64_t kLimit = int64_t{1} << 40;
  int64_t elements = 1;
  for (int d = 0; d < ndim_; ++d) {
    if (shape_[d] < 0 || shape_[d] > kLimit)
      return invalid_argument("shape[{}] = {} is outside [0, 2^40]", d, shape_[d]);
    if (stride_[d] < -kLimit || stride_[d] > kLimit)
      return invalid_argument("stride[{}] = {} is outside ±2^40", d, stride_[d]);
    if (__builtin_mul_overflow(elements, shape_[d], &elements) || elements > kLimit) {
      return invalid_argument("shape: the element count exceeds 2^40 at dimension {}", d);
    }
  }
  if (offset_ < 0 || offset_ > kLimit) return invalid_argument("offset {} is outside [0, 2^40]", offset_);
  // Consumers compute addr + byte offsets; a buffer that wraps the address
  // space has no such range.
  if (buffer_.bound() && buffer_.bytes > std::numeric_limits<uint64_t>::max() - buffer_.addr) {
    return out_of_range("buffer {:#x} of {} bytes wraps the address space", buffer_.addr, buffer_.bytes);
  }
  int64_t lo = offset_;
  for (int d = 0; d < ndim_ && elements != 0; ++d) {
    int64_t reach;
    if (__builtin_mul_overflow(shape_[d] - 1, stride_[d], &reach) || reach > kLimit * 4 || reach < -kLimit * 4) {
      return invalid_argument("dimension {}: shape {} x stride {} reaches beyond 2^42 elements", d, shape_[d],
                              stride_[d]);
    }
    if (reach < 0) lo += reach;
  }
  if (lo < 0) return out_of_range("view starts {} elements before its buffer", -lo);
  // An empty view too: its (empty) range sits at its offset, which consumers
  // merge into the spans they stage.
  if (buffer_.bound() && end_byte() > buffer_.bytes) {
    return out_of_range("view touches bytes [{}, {}) but its buffer has {} bytes", first_byte(), end_byte(),
                        buffer_.bytes);
  }
  return Status();
}

bool TensorView::overlaps(const TensorView& o) const {
  if (buffer_.addr != o.buffer_.addr) return false;
  if (numel() == 0 || o.numel() == 0) return false;
  if (end_byte() <= o.first_byte() || o.end_byte() <= first_byte()) return false;
  // Same element size and strides: decompose both offsets into per-dimension
  // coordinates (valid for dense row-major parents, which tiles keep) and
  // compare boxes. Otherwise the byte ranges overlapping is the answer.
  if (ndim_ != o.ndim_ || dtype_size(dtype_) != dtype_size(o.dtype_)) return true;
  for (int d = 0; d < ndim_; ++d) {
    if (stride_[d] != o.stride_[d] || stride_[d] <= 0) return true;
  }
  for (int d = 0; d + 1 < ndim_; ++d) {
    if (stride_[d] < stride_[d + 1] * o.shape_[d + 1] || stride_[d] < stride_[d + 1] * shape_[d + 1]) return true;
  }
  int64_t a = offset_, b = o.offset_;
  for (int d = 0; d < ndim_; ++d) {
    const int64_t ca = a / stride_[d], cb = b / stride_[d];
    a -= ca * stride_[d];
    b -= cb * stride_[d];
    if (d > 0 && ((ca + shape_[d]) * stride_[d] > stride_[d - 1] || (cb + o.shape_[d]) * stride_[d] > stride_[d - 1])) {
      return true;  // a box that wraps a row is not a box; stay conservative
    }
    if (ca + shape_[d] <= cb || cb + o.shape_[d] <= ca) return false;
  }
  return true;
}

}  // namespace simpler
