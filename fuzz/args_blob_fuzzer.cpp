// T7: decode_args_blob, the decoder every child (chip, sub worker, node) runs
// on the argument bytes it copied out of a request frame. Input: the blob.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.h"
#include "simpler/task_args.h"
#include "task/args_blob.h"

namespace simpler {
namespace {

using Wide = __int128;

bool same_args(const TaskArgs& x, const TaskArgs& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    const TaskArg &a = x[i], &b = y[i];
    if (a.kind != b.kind) return false;
    if (a.kind == TaskArg::Kind::Scalar) {
      if (a.scalar != b.scalar) return false;
      continue;
    }
    const TensorView &s = a.tensor, &t = b.tensor;
    if (a.tag != b.tag || s.buffer().addr != t.buffer().addr || s.buffer().bytes != t.buffer().bytes ||
        s.dtype() != t.dtype() || s.ndim() != t.ndim() || s.offset() != t.offset()) {
      return false;
    }
    for (int d = 0; d < s.ndim(); ++d) {
      if (s.shape(d) != t.shape(d) || s.stride(d) != t.stride(d)) return false;
    }
  }
  return true;
}

bool same_result(const Result<TaskArgs>& x, const Result<TaskArgs>& y) {
  if (x.ok() != y.ok()) return false;
  return x.ok() ? same_args(*x, *y) : x.status() == y.status();
}

// The view's element and byte extent, recomputed in 128 bits (each factor is
// below 2^64, so no product of two can wrap), checked against what the
// library's 64-bit arithmetic says.
void check_tensor(const TaskArg& a) {
  FUZZ_CHECK(static_cast<size_t>(a.tag) < static_cast<size_t>(Tag::kCount));
  const TensorView& t = a.tensor;
  FUZZ_CHECK(static_cast<size_t>(t.dtype()) < static_cast<size_t>(DType::kCount));
  FUZZ_CHECK(t.ndim() >= 0 && t.ndim() <= kMaxDims);
  FUZZ_CHECK(t.offset() >= 0);
  const Wide size = static_cast<Wide>(dtype_size(t.dtype()));
  Wide elements = 1;
  Wide lo = t.offset(), hi = t.offset();
  for (int d = 0; d < t.ndim(); ++d) {
    FUZZ_CHECK(t.shape(d) >= 0);
    elements *= t.shape(d);
    FUZZ_CHECK(elements <= (Wide{1} << 62));  // a wide product stays far from wrapping the next one
    const Wide reach = static_cast<Wide>(t.shape(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  FUZZ_CHECK(t.numel() == elements);
  const uint64_t first = t.first_byte(), end = t.end_byte();
  FUZZ_CHECK(first <= end);
  if (elements == 0) {
    FUZZ_CHECK(first == end);  // touches no byte
  } else {
    FUZZ_CHECK(lo >= 0);
    FUZZ_CHECK(static_cast<Wide>(first) == lo * size);
    FUZZ_CHECK(static_cast<Wide>(end) == (hi + 1) * size);
  }
  if (!t.buffer().bound()) {
    FUZZ_CHECK(a.tag == Tag::Output);  // only a runtime-allocated output travels without a buffer
    return;
  }
  FUZZ_CHECK(end <= t.buffer().bytes);
  FUZZ_CHECK(static_cast<Wide>(t.buffer().addr) + t.buffer().bytes <= static_cast<Wide>(UINT64_MAX));
}

}  // namespace
}  // namespace simpler

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace simpler;
  const Result<TaskArgs> decoded = decode_args_blob(data, size);
  FUZZ_CHECK(same_result(decoded, decode_args_blob(data, size)));
  if (!decoded.ok()) return 0;
  FUZZ_CHECK(size == args_blob_size(decoded->size()));
  FUZZ_CHECK(decoded->size() <= kMaxTaskArgs);
  for (size_t i = 0; i < decoded->size(); ++i) {
    const TaskArg& a = (*decoded)[i];
    FUZZ_CHECK(a.kind == TaskArg::Kind::Scalar || a.kind == TaskArg::Kind::Tensor);
    if (a.kind == TaskArg::Kind::Tensor) check_tensor(a);
  }
  std::vector<uint8_t> encoded;
  FUZZ_CHECK(encode_args_blob(*decoded, encoded).ok());
  FUZZ_CHECK(same_result(decode_args_blob(encoded.data(), encoded.size()), decoded));
  return 0;
}
