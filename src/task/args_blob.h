// The args blob: TaskArgs as bytes, the form in which arguments cross a
// boundary (a run-resource set today, a mailbox frame later). Encoding is for
// the submitting thread; decoding treats the bytes as untrusted: it is bounded
// by the input length and validates every field before building anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "simpler/task_args.h"

namespace simpler {

inline constexpr uint32_t kArgsBlobMagic = 0x47524153;  // "SARG"
inline constexpr uint16_t kArgsBlobVersion = 1;

struct ArgsBlobHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t count;
  uint32_t total_bytes;  // header + count records; must equal the decoded length
  uint32_t reserved;
};
static_assert(sizeof(ArgsBlobHeader) == 16);

struct ArgsBlobRecord {
  uint8_t kind;
  uint8_t tag;
  uint8_t dtype;
  uint8_t ndim;
  uint32_t reserved;
  uint64_t buffer_addr;
  uint64_t buffer_bytes;
  int64_t offset;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  uint64_t scalar;
};
static_assert(sizeof(ArgsBlobRecord) == 120);
static_assert(offsetof(ArgsBlobRecord, buffer_addr) == 8);
static_assert(offsetof(ArgsBlobRecord, shape) == 32);
static_assert(offsetof(ArgsBlobRecord, scalar) == 112);

inline constexpr size_t args_blob_size(size_t count) { return sizeof(ArgsBlobHeader) + count * sizeof(ArgsBlobRecord); }
inline constexpr size_t kArgsBlobMaxBytes = args_blob_size(kMaxTaskArgs);

// Appends the encoding of `args` to `out` (cleared first). Refuses more than
// kMaxTaskArgs arguments; does not otherwise validate (the decoder does).
Status encode_args_blob(const TaskArgs& args, std::vector<uint8_t>& out);
// The same encoding written to `out`, which holds `capacity` bytes (at least
// kArgsBlobMaxBytes always suffices); returns its length.
Result<size_t> encode_args_blob(const TaskArgs& args, uint8_t* out, size_t capacity);
// Decodes `n` bytes at `data`. Never reads past data + n; refuses a wrong magic
// or version, a count above kMaxTaskArgs, a length that disagrees with the
// header, and any record that TaskArgs::validate() refuses.
Result<TaskArgs> decode_args_blob(const uint8_t* data, size_t n);

}  // namespace simpler
