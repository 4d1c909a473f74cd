#include "task/args_blob.h"

#include <cstring>

#include "base/errors.h"

namespace simpler {

Status encode_args_blob(const TaskArgs& args, std::vector<uint8_t>& out) {
  if (args.size() > kMaxTaskArgs) {
    return invalid_argument("args: {} arguments exceed the limit of {}", args.size(), kMaxTaskArgs);
  }
  out.resize(args_blob_size(args.size()));
  return encode_args_blob(args, out.data(), out.size()).status();
}

Result<size_t> encode_args_blob(const TaskArgs& args, uint8_t* out, size_t capacity) {
  if (args.size() > kMaxTaskArgs) {
    return invalid_argument("args: {} arguments exceed the limit of {}", args.size(), kMaxTaskArgs);
  }
  const size_t bytes = args_blob_size(args.size());
  if (bytes > capacity) return invalid_argument("args: the blob takes {} bytes, {} given", bytes, capacity);
  ArgsBlobHeader h{kArgsBlobMagic, kArgsBlobVersion, static_cast<uint16_t>(args.size()), static_cast<uint32_t>(bytes),
                   0};
  std::memcpy(out, &h, sizeof h);
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    ArgsBlobRecord r{};
    r.kind = static_cast<uint8_t>(a.kind);
    r.tag = static_cast<uint8_t>(a.tag);
    r.scalar = a.scalar;
    if (a.kind == TaskArg::Kind::Tensor) {
      const TensorView& t = a.tensor;
      r.dtype = static_cast<uint8_t>(t.dtype());
      r.ndim = static_cast<uint8_t>(t.ndim());
      r.buffer_addr = t.buffer().addr;
      r.buffer_bytes = t.buffer().bytes;
      r.offset = t.offset();
      for (int d = 0; d < t.ndim() && d < kMaxDims; ++d) {
        r.shape[d] = t.shape(d);
        r.stride[d] = t.stride(d);
      }
    }
    std::memcpy(out + args_blob_size(i), &r, sizeof r);
  }
  return bytes;
}

Result<TaskArgs> decode_args_blob(const uint8_t* data, size_t n) {
  if (data == nullptr || n < sizeof(ArgsBlobHeader)) {
    return invalid_argument("args blob: {} bytes is shorter than its {}-byte header", n, sizeof(ArgsBlobHeader));
  }
  ArgsBlobHeader h;
  std::memcpy(&h, data, sizeof h);
  if (h.magic != kArgsBlobMagic)
    return invalid_argument("args blob: magic {:#x} is not {:#x}", h.magic, kArgsBlobMagic);
  if (h.version != kArgsBlobVersion) {
    return invalid_argument("args blob: version {} is not {}", h.version, kArgsBlobVersion);
  }
  if (h.count > kMaxTaskArgs) return invalid_argument("args blob: count {} exceeds {}", h.count, kMaxTaskArgs);
  if (h.total_bytes != args_blob_size(h.count)) {
    return invalid_argument("args blob: total_bytes {} disagrees with count {} ({} bytes)", h.total_bytes, h.count,
                            args_blob_size(h.count));
  }
  if (n != h.total_bytes) return invalid_argument("args blob: {} bytes given, header says {}", n, h.total_bytes);

  TaskArgs args;
  for (size_t i = 0; i < h.count; ++i) {
    ArgsBlobRecord r;
    std::memcpy(&r, data + args_blob_size(i), sizeof r);
    if (r.kind == static_cast<uint8_t>(TaskArg::Kind::Scalar)) {
      args.add_scalar_u64(r.scalar);
      continue;
    }
    if (r.kind != static_cast<uint8_t>(TaskArg::Kind::Tensor)) {
      return invalid_argument("args blob: record {} has kind {}", i, r.kind);
    }
    if (r.tag >= static_cast<uint8_t>(Tag::kCount))
      return invalid_argument("args blob: record {} has tag {}", i, r.tag);
    if (r.dtype >= static_cast<uint8_t>(DType::kCount)) {
      return invalid_argument("args blob: record {} has dtype {}", i, r.dtype);
    }
    if (r.ndim > kMaxDims) return invalid_argument("args blob: record {} has ndim {}", i, r.ndim);
    TensorView v = TensorView::from_parts(DeviceBuffer{r.buffer_addr, r.buffer_bytes}, static_cast<DType>(r.dtype),
                                          r.ndim, r.shape, r.stride, r.offset);
    args.add_tensor(v, static_cast<Tag>(r.tag));
  }
  SIMPLER_RETURN_IF_ERROR(args.validate(), "args blob");
  return args;
}

}  // namespace simpler
