// The args-blob codec: round trip, and the decoder against untrusted bytes (every truncation, extra
// bytes, bad header/record fields, random corruption), on exact-size buffers so ASan sees any over-read.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "simpler/simpler.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::contains;

TaskArgs sample_args() {
  DeviceBuffer a{0x10000, 4096};
  DeviceBuffer b{0x20000, 1 << 20};
  TaskArgs args;
  args.add_tensor(a.view({16, 16}, DType::F32), Tag::Input)
      .add_tensor(*b.view({64, 64}, DType::I64).tile({8, 16}, {4, 32}), Tag::InOut)
      .add_scalar(-42)
      .add_tensor(TensorView(a, {3, 2, 5}, DType::F16, 7), Tag::OutputExisting)
      .add_scalar_f32(3.5f)
      .add_output({7, 9}, DType::BF16)
      .add_tensor(b.view({1, 1, 1, 1, 8}, DType::U8), Tag::NoDep)
      .add_scalar_u64(0xfedcba9876543210ull)
      .add_tensor(b.view({32}, DType::F64), Tag::Input)
      .add_scalar_f64(-0.125);
  return args;
}

void expect_same(const TaskArgs& x, const TaskArgs& y) {
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(x[i].kind, y[i].kind);
    if (x[i].kind == TaskArg::Kind::Scalar) {
      EXPECT_EQ(x[i].scalar, y[i].scalar);
      continue;
    }
    const TensorView &a = x[i].tensor, &b = y[i].tensor;
    EXPECT_EQ(x[i].tag, y[i].tag);
    EXPECT_EQ(a.buffer().addr, b.buffer().addr);
    EXPECT_EQ(a.buffer().bytes, b.buffer().bytes);
    EXPECT_EQ(a.dtype(), b.dtype());
    EXPECT_EQ(a.offset(), b.offset());
    ASSERT_EQ(a.ndim(), b.ndim());
    for (int d = 0; d < a.ndim(); ++d) {
      EXPECT_EQ(a.shape(d), b.shape(d));
      EXPECT_EQ(a.stride(d), b.stride(d));
    }
  }
}

std::vector<uint8_t> encode(const TaskArgs& args) {
  std::vector<uint8_t> out;
  Status s = encode_args_blob(args, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

// Decodes a copy of exactly `n` bytes so that any over-read hits ASan's redzone.
Result<TaskArgs> decode_exact(const std::vector<uint8_t>& bytes, size_t n) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n == 0 ? 1 : n]);
  if (n != 0) std::memcpy(copy.get(), bytes.data(), std::min(n, bytes.size()));
  if (n > bytes.size()) std::memset(copy.get() + bytes.size(), 0xAB, n - bytes.size());
  return decode_args_blob(copy.get(), n);
}

ArgsBlobHeader header_of(const std::vector<uint8_t>& b) {
  ArgsBlobHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  return h;
}
void set_header(std::vector<uint8_t>& b, const ArgsBlobHeader& h) { std::memcpy(b.data(), &h, sizeof h); }

ArgsBlobRecord record_of(const std::vector<uint8_t>& b, size_t i) {
  ArgsBlobRecord r;
  std::memcpy(&r, b.data() + args_blob_size(i), sizeof r);
  return r;
}
void set_record(std::vector<uint8_t>& b, size_t i, const ArgsBlobRecord& r) {
  std::memcpy(b.data() + args_blob_size(i), &r, sizeof r);
}

TEST(ArgsBlob, RoundTripKeepsEveryField) {
  const TaskArgs args = sample_args();
  ASSERT_TRUE(args.validate().ok());
  std::vector<uint8_t> bytes = encode(args);
  EXPECT_EQ(bytes.size(), args_blob_size(args.size()));
  auto back = decode_exact(bytes, bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(args, *back);
  // Re-encoding the decoded arguments gives the same bytes.
  EXPECT_EQ(encode(*back), bytes);
}

TEST(ArgsBlob, EmptyAndFullArgumentListsRoundTrip) {
  TaskArgs empty;
  std::vector<uint8_t> e = encode(empty);
  EXPECT_EQ(e.size(), sizeof(ArgsBlobHeader));
  auto de = decode_exact(e, e.size());
  ASSERT_TRUE(de.ok()) << de.status().to_string();
  EXPECT_TRUE(de->empty());

  TaskArgs full;
  for (size_t i = 0; i < kMaxTaskArgs; ++i) {
    if (i % 2) {
      full.add_scalar(static_cast<int64_t>(i) * 1000);
    } else {
      full.add_tensor(DeviceBuffer{0x1000 * (i + 1), 256}.view({8, 8}, DType::F32), static_cast<Tag>(i % 5));
    }
  }
  std::vector<uint8_t> f = encode(full);
  EXPECT_EQ(f.size(), kArgsBlobMaxBytes);
  auto df = decode_exact(f, f.size());
  ASSERT_TRUE(df.ok()) << df.status().to_string();
  expect_same(full, *df);
}

TEST(ArgsBlob, EncodeRefusesTooManyArguments) {
  TaskArgs a;
  for (size_t i = 0; i <= kMaxTaskArgs; ++i) a.add_scalar(1);
  std::vector<uint8_t> out;
  EXPECT_REFUSED(encode_args_blob(a, out), StatusCode::kInvalidArgument, "33 arguments");
}

// In place (how prepare stages a run's arguments in its slot's buffer): the
// same bytes as the vector's, and nothing written past a capacity too small.
TEST(ArgsBlob, InPlaceEncodingIsTheSameBytesAndStaysInItsCapacity) {
  const TaskArgs args = sample_args();
  std::vector<uint8_t> expected;
  ASSERT_TRUE(encode_args_blob(args, expected).ok());
  std::vector<uint8_t> buf(kArgsBlobMaxBytes + 8, 0xEE);
  auto n = encode_args_blob(args, buf.data(), kArgsBlobMaxBytes);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_EQ(*n, expected.size());
  EXPECT_EQ(std::memcmp(buf.data(), expected.data(), expected.size()), 0);
  std::vector<uint8_t> small(expected.size() - 1, 0xEE);
  EXPECT_REFUSED(encode_args_blob(args, small.data(), small.size()).status(), StatusCode::kInvalidArgument, "bytes");
  for (uint8_t b : small) ASSERT_EQ(b, 0xEE) << "wrote into a capacity too small";
  TaskArgs too_many;
  for (size_t i = 0; i <= kMaxTaskArgs; ++i) too_many.add_scalar(1);
  EXPECT_REFUSED(encode_args_blob(too_many, buf.data(), buf.size()).status(), StatusCode::kInvalidArgument,
                 "33 arguments");
}

TEST(ArgsBlob, EveryTruncationIsRefused) {
  const std::vector<uint8_t> bytes = encode(sample_args());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = decode_exact(bytes, n);
    ASSERT_FALSE(r.ok()) << "a " << n << "-byte prefix of " << bytes.size() << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_FALSE(decode_args_blob(nullptr, 0).ok());
  EXPECT_FALSE(decode_args_blob(nullptr, bytes.size()).ok());
}

TEST(ArgsBlob, ExtraBytesAreRefused) {
  const std::vector<uint8_t> bytes = encode(sample_args());
  for (size_t extra : {size_t{1}, size_t{7}, sizeof(ArgsBlobRecord), size_t{4096}}) {
    auto r = decode_exact(bytes, bytes.size() + extra);
    ASSERT_FALSE(r.ok()) << extra << " extra bytes were accepted";
    EXPECT_REFUSED(r.status(), StatusCode::kInvalidArgument, "header says");
  }
}

TEST(ArgsBlob, WrongMagicOrVersionIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobHeader h = header_of(bytes);
  ArgsBlobHeader bad = h;
  bad.magic ^= 1;
  set_header(bytes, bad);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "magic");
  bad = h;
  bad.version = kArgsBlobVersion + 1;
  set_header(bytes, bad);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "version");
  bad.version = 0;
  set_header(bytes, bad);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "version");
}

TEST(ArgsBlob, CountAboveTheLimitIsRefusedEvenWhenTheLengthAgrees) {
  TaskArgs a;
  for (size_t i = 0; i < kMaxTaskArgs; ++i) a.add_scalar(1);
  std::vector<uint8_t> bytes = encode(a);
  // Grow to 33 well-formed scalar records with a consistent header.
  ArgsBlobRecord extra = record_of(bytes, 0);
  bytes.resize(args_blob_size(kMaxTaskArgs + 1));
  set_record(bytes, kMaxTaskArgs, extra);
  ArgsBlobHeader h = header_of(bytes);
  h.count = kMaxTaskArgs + 1;
  h.total_bytes = static_cast<uint32_t>(bytes.size());
  set_header(bytes, h);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "count 33");
  h.count = 0xffff;
  set_header(bytes, h);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "count 65535");
}

TEST(ArgsBlob, HeaderLengthThatDisagreesWithCountIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobHeader h = header_of(bytes);
  for (uint32_t total :
       {h.total_bytes - 1, h.total_bytes + 1, 0u, 0xffffffffu, static_cast<uint32_t>(args_blob_size(h.count - 1))}) {
    ArgsBlobHeader bad = h;
    bad.total_bytes = total;
    set_header(bytes, bad);
    EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "total_bytes");
  }
  // A smaller count with a matching total but the original length: refused by length.
  ArgsBlobHeader fewer = h;
  fewer.count = h.count - 1;
  fewer.total_bytes = static_cast<uint32_t>(args_blob_size(fewer.count));
  set_header(bytes, fewer);
  EXPECT_FALSE(decode_exact(bytes, bytes.size()).ok());
}

TEST(ArgsBlob, BadRecordFieldsAreRefusedNamingTheRecord) {
  const std::vector<uint8_t> good = encode(sample_args());
  struct Case {
    const char* what;
    void (*mutate)(ArgsBlobRecord&);
    const char* names;
  };
  const Case cases[] = {
      {"kind", [](ArgsBlobRecord& r) { r.kind = 2; }, "record 0 has kind 2"},
      {"kind", [](ArgsBlobRecord& r) { r.kind = 0xff; }, "record 0 has kind 255"},
      {"tag", [](ArgsBlobRecord& r) { r.tag = static_cast<uint8_t>(Tag::kCount); }, "record 0 has tag 5"},
      {"dtype", [](ArgsBlobRecord& r) { r.dtype = static_cast<uint8_t>(DType::kCount); }, "record 0 has dtype 11"},
      {"ndim", [](ArgsBlobRecord& r) { r.ndim = kMaxDims + 1; }, "record 0 has ndim 6"},
      {"ndim", [](ArgsBlobRecord& r) { r.ndim = 200; }, "record 0 has ndim 200"},
      {"shape", [](ArgsBlobRecord& r) { r.shape[1] = -1; }, "shape[1]"},
      {"offset", [](ArgsBlobRecord& r) { r.offset = -4; }, "offset"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> bytes = good;
    ArgsBlobRecord r = record_of(bytes, 0);
    c.mutate(r);
    set_record(bytes, 0, r);
    auto d = decode_exact(bytes, bytes.size());
    ASSERT_FALSE(d.ok());
    EXPECT_REFUSED(d.status(), StatusCode::kInvalidArgument, c.names);
  }
}

TEST(ArgsBlob, TensorOutsideItsBufferIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);  // 16x16 f32 over 4096 bytes
  r.buffer_bytes = 1023;
  set_record(bytes, 0, r);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kOutOfRange, "args[0]");
  r = record_of(encode(sample_args()), 1);  // a tile with a large offset
  std::vector<uint8_t> b2 = encode(sample_args());
  r.offset = (int64_t{1} << 20) / 8;
  set_record(b2, 1, r);
  EXPECT_REFUSED(decode_exact(b2, b2.size()).status(), StatusCode::kOutOfRange, "args[1]");
}

// The decoder is the trust boundary: a record whose element count overflows
// (2^32 x 2^32 elements over a 64-byte buffer) must be refused.
TEST(ArgsBlob, RecordWhoseElementCountOverflowsIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);
  r.ndim = 2;
  r.buffer_bytes = 64;
  r.offset = 0;
  r.shape[0] = r.shape[1] = int64_t{1} << 32;
  r.stride[0] = r.stride[1] = 1;
  set_record(bytes, 0, r);
  auto d = decode_exact(bytes, bytes.size());
  EXPECT_FALSE(d.ok()) << "library bug: decode_args_blob accepts a 2^64-element tensor over a 64-byte buffer";
}

// Found by fuzz_args_blob (T7). A zero-element view never applies its
// strides, so validate() bounded none of their reaches, yet first_byte()
// multiplied them out: (2^40 - 1) x -2^40 overflowed int64 (UB) and the
// "empty" range landed anywhere in the address space.
TEST(ArgsBlob, ZeroElementViewTouchesNoByteWhateverItsStrides) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);  // f32 over 4096 bytes
  r.ndim = 2;
  r.offset = 8;
  r.shape[0] = 0;
  r.shape[1] = int64_t{1} << 40;
  r.stride[0] = 1;
  r.stride[1] = -(int64_t{1} << 40);
  set_record(bytes, 0, r);
  auto d = decode_exact(bytes, bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const TensorView& t = (*d)[0].tensor;
  EXPECT_EQ(t.first_byte(), 32u);
  EXPECT_EQ(t.end_byte(), 32u);
}

// Found by fuzz_args_blob (T7): an empty view's range sits at its offset,
// and the chip child merges it into the span it stages, so an empty view
// past its buffer's end stretched that span past the buffer.
TEST(ArgsBlob, EmptyViewPastItsBufferIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);  // f32 over 4096 bytes
  r.ndim = 2;
  r.shape[0] = 0;
  r.shape[1] = 2;
  r.offset = 1025;
  set_record(bytes, 0, r);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kOutOfRange, "args[0]");
  r.offset = 1024;  // at the end: still inside
  set_record(bytes, 0, r);
  EXPECT_TRUE(decode_exact(bytes, bytes.size()).ok());
}

// Found by fuzz_args_blob (T7): every consumer adds byte offsets to the
// buffer address, so a buffer past the top of the address space must not decode.
TEST(ArgsBlob, BufferThatWrapsTheAddressSpaceIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);  // 16x16 f32 over 4096 bytes
  r.buffer_addr = ~uint64_t{0} - 4096;     // ends at 2^64 - 1, the highest end an address can name
  set_record(bytes, 0, r);
  EXPECT_TRUE(decode_exact(bytes, bytes.size()).ok());
  r.buffer_addr += 1;
  set_record(bytes, 0, r);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kOutOfRange, "wraps the address space");
}

TEST(ArgsBlob, UnboundTensorThatIsNotAnOutputIsRefused) {
  std::vector<uint8_t> bytes = encode(sample_args());
  ArgsBlobRecord r = record_of(bytes, 0);
  r.buffer_addr = 0;
  set_record(bytes, 0, r);
  EXPECT_REFUSED(decode_exact(bytes, bytes.size()).status(), StatusCode::kInvalidArgument, "args[0]");
}

// Random corruption of a valid blob: every outcome is either a refusal or
// arguments that validate; nothing crashes or reads out of bounds.
TEST(ArgsBlob, RandomCorruptionIsRefusedOrWellFormed) {
  const std::vector<uint8_t> good = encode(sample_args());
  std::mt19937 rng(4242);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes = good;
    const int flips = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int f = 0; f < flips; ++f) {
      const size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng);
      bytes[at] = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    const size_t n = (i % 10 == 0) ? std::uniform_int_distribution<size_t>(0, bytes.size() + 130)(rng) : bytes.size();
    auto d = decode_exact(bytes, n);
    if (d.ok()) {
      ++accepted;
      ASSERT_TRUE(d->validate().ok()) << d->validate().to_string();
      ASSERT_LE(d->size(), kMaxTaskArgs);
    } else {
      ASSERT_FALSE(d.status().message().empty());
    }
  }
  EXPECT_GT(accepted, 0);  // flips of scalar payloads stay valid
}

}  // namespace
}  // namespace simpler
