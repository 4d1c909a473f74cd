// Layer src/task: TensorView validation, tile(), overlaps() (exact for tiles of one buffer, never missing
// a shared byte for any views), TaskArgs::validate, the vocabulary names and SHA-256 digests.
#include <gtest/gtest.h>

#include <bitset>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "simpler/simpler.h"
#include "task/digest.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::contains;

constexpr uint64_t kAddr = 0x100000;
constexpr uint64_t kOtherAddr = 0x200000;

DeviceBuffer buf(uint64_t bytes, uint64_t addr = kAddr) { return DeviceBuffer{addr, bytes}; }

// ---- TensorView --------------------------------------------------------------------------------

TEST(TensorView, DenseViewHasRowMajorStrides) {
  TensorView v = buf(2 * 3 * 4 * 4).view({2, 3, 4}, DType::F32);
  ASSERT_TRUE(v.validate().ok()) << v.validate().to_string();
  EXPECT_EQ(v.ndim(), 3);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.first_byte(), 0u);
  EXPECT_EQ(v.end_byte(), 96u);
  EXPECT_EQ(v.buffer().addr, kAddr);
}

TEST(TensorView, ExactFitIsValidOneMoreElementIsOutside) {
  EXPECT_TRUE(buf(64).view({16}, DType::F32).validate().ok());
  EXPECT_REFUSED(buf(64).view({17}, DType::F32).validate(), StatusCode::kOutOfRange, "buffer has 64 bytes");
  EXPECT_REFUSED(buf(64).view({9}, DType::I64).validate(), StatusCode::kOutOfRange, "bytes [0, 72)");
  // An offset pushes the view past the end.
  EXPECT_TRUE(TensorView(buf(64), {8}, DType::F32, 8).validate().ok());
  EXPECT_REFUSED(TensorView(buf(64), {8}, DType::F32, 9).validate(), StatusCode::kOutOfRange, "buffer has 64 bytes");
}

TEST(TensorView, NegativeShapeIsRefusedNamingTheDimension) {
  EXPECT_REFUSED(buf(1024).view({4, -2}, DType::F32).validate(), StatusCode::kInvalidArgument, "shape[1]");
  EXPECT_REFUSED(buf(1024).view({-1}, DType::F32).validate(), StatusCode::kInvalidArgument, "shape[0]");
}

TEST(TensorView, BadRankIsRefused) {
  EXPECT_REFUSED(buf(1 << 20).view({1, 1, 1, 1, 1, 1}, DType::F32).validate(), StatusCode::kInvalidArgument, "ndim");
  const int64_t shape[5] = {1, 1, 1, 1, 1};
  const int64_t stride[5] = {1, 1, 1, 1, 1};
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, -1, shape, stride, 0).validate(),
                 StatusCode::kInvalidArgument, "ndim");
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, 6, shape, stride, 0).validate(),
                 StatusCode::kInvalidArgument, "ndim");
  // Five dimensions is the limit and fine.
  EXPECT_TRUE(buf(64).view({1, 1, 1, 1, 16}, DType::F32).validate().ok());
  // A scalar-like rank-0 view is one element.
  EXPECT_TRUE(TensorView::from_parts(buf(4), DType::F32, 0, shape, stride, 0).validate().ok());
}

TEST(TensorView, BadDtypeOffsetAndStrideAreRefused) {
  const int64_t shape[1] = {4};
  const int64_t stride[1] = {1};
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::kCount, 1, shape, stride, 0).validate(),
                 StatusCode::kInvalidArgument, "dtype");
  EXPECT_REFUSED(TensorView::from_parts(buf(64), static_cast<DType>(77), 1, shape, stride, 0).validate(),
                 StatusCode::kInvalidArgument, "dtype");
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, 1, shape, stride, -1).validate(),
                 StatusCode::kInvalidArgument, "offset");
  const int64_t huge_stride[1] = {int64_t{1} << 50};
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, 1, shape, huge_stride, 0).validate(),
                 StatusCode::kInvalidArgument, "stride[0]");
  const int64_t huge_shape[1] = {int64_t{1} << 50};
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, 1, huge_shape, stride, 0).validate(),
                 StatusCode::kInvalidArgument, "shape[0]");
  // A negative stride walking before the buffer start.
  const int64_t back[1] = {-1};
  EXPECT_REFUSED(TensorView::from_parts(buf(64), DType::F32, 1, shape, back, 2).validate(), StatusCode::kOutOfRange,
                 "before its buffer");
  EXPECT_TRUE(TensorView::from_parts(buf(64), DType::F32, 1, shape, back, 3).validate().ok());
}

// A shape whose element count overflows 64 bits (2^32 x 2^32 = 2^64 wraps to 0)
// must not pass as an empty view: a kernel would walk 2^64 elements of a 64-byte buffer.
TEST(TensorView, ElementCountThatOverflowsIsRefused) {
  const int64_t big[3] = {int64_t{1} << 32, int64_t{1} << 32, 1};
  const int64_t unit[3] = {1, 1, 1};
  Status s = TensorView::from_parts(buf(64), DType::F32, 2, big, unit, 0).validate();
  EXPECT_FALSE(s.ok()) << "library bug: TensorView::validate accepts shape {2^32, 2^32} over a 64-byte buffer "
                          "(numel() overflows to 0 and the view is treated as empty)";
  const int64_t huge[3] = {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40};
  const int64_t strides[3] = {0, 0, 1};
  EXPECT_FALSE(TensorView::from_parts(buf(64), DType::F32, 3, huge, strides, 0).validate().ok())
      << "library bug: a 2^120-element view passes validate()";
}

TEST(TensorView, EmptyAndUnboundViewsValidate) {
  EXPECT_TRUE(buf(0).view({0, 4}, DType::F32).validate().ok());
  TensorView u = TensorView::unbound({1 << 20}, DType::F32);
  EXPECT_FALSE(u.buffer().bound());
  EXPECT_TRUE(u.validate().ok());  // no buffer to be outside of
  EXPECT_EQ(u.numel(), 1 << 20);
  EXPECT_REFUSED(TensorView::unbound({-3}, DType::F32).validate(), StatusCode::kInvalidArgument, "shape[0]");
}

TEST(TensorView, TileKeepsStridesAndMovesTheOffset) {
  TensorView v = buf(8 * 12 * 4).view({8, 12}, DType::F32);
  auto t = v.tile({2, 4}, {3, 5});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->offset(), 2 * 12 + 4);
  EXPECT_EQ(t->shape(0), 3);
  EXPECT_EQ(t->shape(1), 5);
  EXPECT_EQ(t->stride(0), 12);
  EXPECT_EQ(t->stride(1), 1);
  EXPECT_EQ(t->first_byte(), (2u * 12 + 4) * 4);
  EXPECT_EQ(t->end_byte(), ((2u + 2) * 12 + 4 + 4 + 1) * 4);
  EXPECT_TRUE(t->validate().ok());
  // A tile of a tile composes.
  auto tt = t->tile({1, 1}, {2, 2});
  ASSERT_TRUE(tt.ok());
  EXPECT_EQ(tt->offset(), 3 * 12 + 5);
  // The whole view and an empty tile are fine.
  EXPECT_TRUE(v.tile({0, 0}, {8, 12}).ok());
  EXPECT_TRUE(v.tile({8, 12}, {0, 0}).ok());
}

// start + len overflowing int64 must be refused, not wrap past the bounds check.
TEST(TensorView, TileWithAnOverflowingRangeIsRefused) {
  TensorView v = buf(8 * 12 * 4).view({8, 12}, DType::F32);
  auto t = v.tile({0, INT64_MAX}, {1, 1});
  EXPECT_FALSE(t.ok()) << "library bug: TensorView::tile accepts start = INT64_MAX (start + len overflows in the "
                          "bounds check) and returns offset "
                       << (t.ok() ? t->offset() : 0);
}

TEST(TensorView, TileOutsideTheViewIsRefusedNamingTheDimension) {
  TensorView v = buf(8 * 12 * 4).view({8, 12}, DType::F32);
  EXPECT_REFUSED(v.tile({0, 8}, {1, 5}).status(), StatusCode::kOutOfRange, "dimension 1");
  EXPECT_REFUSED(v.tile({7, 0}, {2, 1}).status(), StatusCode::kOutOfRange, "dimension 0");
  EXPECT_REFUSED(v.tile({-1, 0}, {1, 1}).status(), StatusCode::kOutOfRange, "dimension 0");
  EXPECT_REFUSED(v.tile({0, 0}, {1, -1}).status(), StatusCode::kOutOfRange, "dimension 1");
  EXPECT_REFUSED(v.tile({0}, {1}).status(), StatusCode::kInvalidArgument, "tile");
  EXPECT_REFUSED(v.tile({0, 0, 0}, {1, 1, 1}).status(), StatusCode::kInvalidArgument, "tile");
}

// ---- overlaps() --------------------------------------------------------------------------------

constexpr size_t kBytes = 4096;
using ByteSet = std::bitset<kBytes>;

// Every byte the view touches, walking every element (views must fit kBytes).
ByteSet touched(const TensorView& v) {
  ByteSet s;
  if (v.numel() == 0) return s;
  const int n = v.ndim();
  std::vector<int64_t> idx(std::max(n, 1), 0);
  const size_t es = dtype_size(v.dtype());
  for (;;) {
    int64_t e = v.offset();
    for (int d = 0; d < n; ++d) e += idx[d] * v.stride(d);
    for (size_t b = 0; b < es; ++b) s.set(static_cast<size_t>(e) * es + b);
    int d = n - 1;
    while (d >= 0 && ++idx[d] == v.shape(d)) idx[d--] = 0;
    if (d < 0) break;
  }
  return s;
}

TEST(Overlaps, DisjointQuadrantsOfOneBufferDoNotOverlap) {
  TensorView v = buf(8 * 8 * 4).view({8, 8}, DType::F32);
  std::vector<TensorView> quads;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) quads.push_back(*v.tile({4 * i, 4 * j}, {4, 4}));
  }
  for (size_t a = 0; a < quads.size(); ++a) {
    for (size_t b = 0; b < quads.size(); ++b) {
      EXPECT_EQ(quads[a].overlaps(quads[b]), a == b) << a << " vs " << b;
    }
    EXPECT_TRUE(quads[a].overlaps(v));
    EXPECT_TRUE(v.overlaps(quads[a]));
  }
}

TEST(Overlaps, InterleavedColumnBlocksDoNotOverlapThoughTheirByteRangesDo) {
  TensorView v = buf(4 * 8 * 4).view({4, 8}, DType::F32);
  TensorView left = *v.tile({0, 0}, {4, 4});
  TensorView right = *v.tile({0, 4}, {4, 4});
  ASSERT_LT(right.first_byte(), left.end_byte());  // the byte ranges interleave
  EXPECT_FALSE(left.overlaps(right));
  EXPECT_FALSE(right.overlaps(left));
}

TEST(Overlaps, OverlappingTilesOverlap) {
  TensorView v = buf(8 * 8 * 4).view({8, 8}, DType::F32);
  EXPECT_TRUE(v.tile({0, 0}, {4, 4})->overlaps(*v.tile({3, 3}, {4, 4})));
  EXPECT_TRUE(v.tile({0, 0}, {1, 8})->overlaps(*v.tile({0, 7}, {8, 1})));
  EXPECT_TRUE(v.tile({2, 2}, {1, 1})->overlaps(*v.tile({0, 0}, {8, 8})));
}

TEST(Overlaps, DifferentBuffersNeverOverlap) {
  TensorView a = buf(256, kAddr).view({64}, DType::F32);
  TensorView b = buf(256, kOtherAddr).view({64}, DType::F32);
  EXPECT_FALSE(a.overlaps(b));
  EXPECT_FALSE(b.overlaps(a));
  EXPECT_TRUE(a.overlaps(a));
}

TEST(Overlaps, EmptyViewsOverlapNothing) {
  TensorView v = buf(256).view({64}, DType::F32);
  TensorView empty = *v.tile({3}, {0});
  EXPECT_FALSE(empty.overlaps(v));
  EXPECT_FALSE(v.overlaps(empty));
}

TEST(Overlaps, ViewsOfOneBufferWithDifferentShapesAreComparedByBytes) {
  DeviceBuffer b = buf(64 * 4);
  TensorView flat = b.view({64}, DType::F32);
  TensorView grid = b.view({8, 8}, DType::F32);
  EXPECT_TRUE(flat.overlaps(*grid.tile({7, 7}, {1, 1})));
  EXPECT_FALSE(TensorView(b, {8}, DType::F32, 0).overlaps(*grid.tile({1, 0}, {1, 8})));
  TensorView bytes = b.view({256}, DType::U8);
  EXPECT_TRUE(bytes.tile({255}, {1})->overlaps(flat));
  EXPECT_FALSE(bytes.tile({0}, {4})->overlaps(*flat.tile({1}, {63})));
}

// Tiles of one dense parent: overlaps() is exact (no false edges between disjoint tiles).
TEST(Overlaps, TilesOfOneParentAreExactAgainstBruteForce) {
  std::mt19937 rng(12345);
  const std::vector<std::vector<int64_t>> parents = {{64}, {8, 12}, {4, 5, 6}, {3, 4, 2, 5}};
  for (const auto& shape : parents) {
    TensorView parent = buf(kBytes).view(shape, DType::F32);
    ASSERT_TRUE(parent.validate().ok());
    auto random_tile = [&] {
      std::vector<int64_t> start(shape.size()), len(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        start[d] = std::uniform_int_distribution<int64_t>(0, shape[d] - 1)(rng);
        len[d] = std::uniform_int_distribution<int64_t>(1, shape[d] - start[d])(rng);
      }
      return *parent.tile(start, len);
    };
    for (int i = 0; i < 3000; ++i) {
      TensorView a = random_tile(), b = random_tile();
      const bool truth = (touched(a) & touched(b)).any();
      ASSERT_EQ(a.overlaps(b), truth) << "parent rank " << shape.size() << " offsets " << a.offset() << " / "
                                      << b.offset();
      ASSERT_EQ(b.overlaps(a), truth);
    }
  }
}

// Any two valid views of one buffer: overlaps() may be conservative but must
// never miss a shared byte (a miss is a missing dependency edge).
TEST(Overlaps, NeverMissesASharedByteForArbitraryViews) {
  std::mt19937 rng(777);
  const DType dtypes[] = {DType::F32, DType::F16, DType::I64, DType::U8};
  auto random_view = [&]() -> TensorView {
    for (;;) {
      const int ndim = std::uniform_int_distribution<int>(1, 3)(rng);
      int64_t shape[kMaxDims] = {}, stride[kMaxDims] = {};
      for (int d = 0; d < ndim; ++d) {
        shape[d] = std::uniform_int_distribution<int64_t>(1, 5)(rng);
        stride[d] = std::uniform_int_distribution<int64_t>(-2, 12)(rng);
      }
      const int64_t offset = std::uniform_int_distribution<int64_t>(0, 60)(rng);
      const DType dt = dtypes[std::uniform_int_distribution<int>(0, 3)(rng)];
      TensorView v = TensorView::from_parts(buf(1024), dt, ndim, shape, stride, offset);
      if (v.validate().ok()) return v;
    }
  };
  int sharing = 0;
  for (int i = 0; i < 20000; ++i) {
    TensorView a = random_view(), b = random_view();
    if ((touched(a) & touched(b)).any()) {
      ++sharing;
      ASSERT_TRUE(a.overlaps(b)) << "missed overlap: a offset " << a.offset() << " ndim " << a.ndim() << ", b offset "
                                 << b.offset() << " ndim " << b.ndim();
      ASSERT_TRUE(b.overlaps(a));
    }
  }
  EXPECT_GT(sharing, 1000);
}

// ---- TaskArgs ----------------------------------------------------------------------------------

TEST(TaskArgs, BuildsTensorsAndScalarsInOrder) {
  TaskArgs a;
  a.add_tensor(buf(64).view({16}, DType::F32), Tag::Input)
      .add_scalar(-5)
      .add_scalar_f32(1.5f)
      .add_scalar_f64(2.25)
      .add_scalar_u64(~0ull)
      .add_output({4, 4}, DType::I32);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0].kind, TaskArg::Kind::Tensor);
  EXPECT_EQ(a[0].tag, Tag::Input);
  EXPECT_EQ(a[1].kind, TaskArg::Kind::Scalar);
  EXPECT_EQ(static_cast<int64_t>(a[1].scalar), -5);
  EXPECT_EQ(scalar_f32(static_cast<int64_t>(a[2].scalar)), 1.5f);
  EXPECT_EQ(scalar_f64(static_cast<int64_t>(a[3].scalar)), 2.25);
  EXPECT_EQ(a[4].scalar, ~0ull);
  EXPECT_EQ(a[5].tag, Tag::Output);
  EXPECT_FALSE(a[5].tensor.buffer().bound());
  EXPECT_TRUE(a.validate().ok()) << a.validate().to_string();
  a.clear();
  EXPECT_TRUE(a.empty());
}

TEST(TaskArgs, ValidateNamesTheOffendingIndex) {
  TaskArgs a;
  a.add_tensor(buf(64).view({16}, DType::F32), Tag::Input)
      .add_scalar(1)
      .add_tensor(buf(64).view({17}, DType::F32), Tag::OutputExisting);
  Status s = a.validate();
  EXPECT_REFUSED(s, StatusCode::kOutOfRange, "args[2]");
  EXPECT_TRUE(contains(s.message(), "output_existing")) << s.message();

  TaskArgs b;
  b.add_tensor(buf(64).view({4, -1}, DType::F32), Tag::InOut);
  EXPECT_REFUSED(b.validate(), StatusCode::kInvalidArgument, "args[0]");
}

TEST(TaskArgs, OnlyAnOutputMayBeUnbound) {
  for (Tag t : {Tag::Input, Tag::InOut, Tag::OutputExisting, Tag::NoDep}) {
    TaskArgs a;
    a.add_scalar(0).add_tensor(TensorView::unbound({4}, DType::F32), t);
    Status s = a.validate();
    EXPECT_REFUSED(s, StatusCode::kInvalidArgument, "args[1]");
    EXPECT_TRUE(contains(s.message(), tag_name(t))) << s.message();
  }
  TaskArgs ok;
  ok.add_output({4}, DType::F32);
  EXPECT_TRUE(ok.validate().ok());
}

TEST(TaskArgs, BadTagIsRefused) {
  TaskArgs a;
  a.add_tensor(buf(64).view({16}, DType::F32), Tag::Input);
  a[0].tag = static_cast<Tag>(9);
  EXPECT_REFUSED(a.validate(), StatusCode::kInvalidArgument, "args[0]");
  a[0].tag = Tag::Input;
  a[0].kind = static_cast<TaskArg::Kind>(7);
  EXPECT_REFUSED(a.validate(), StatusCode::kInvalidArgument, "args[0]");
}

TEST(TaskArgs, MoreThanTheLimitIsRefused) {
  TaskArgs a;
  for (size_t i = 0; i < kMaxTaskArgs; ++i) a.add_scalar(static_cast<int64_t>(i));
  EXPECT_TRUE(a.validate().ok());
  a.add_scalar(99);
  EXPECT_REFUSED(a.validate(), StatusCode::kInvalidArgument, "33 arguments");
}

// ---- Vocabulary --------------------------------------------------------------------------------

TEST(Types, DtypeSizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I8), 1u);
  EXPECT_EQ(dtype_size(DType::I16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_size(DType::U32), 4u);
  EXPECT_EQ(dtype_size(DType::U64), 8u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::kCount), 0u);
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::F64), "f64");
  EXPECT_STREQ(dtype_name(DType::kCount), "invalid");
  EXPECT_STREQ(tag_name(Tag::OutputExisting), "output_existing");
  EXPECT_STREQ(tag_name(Tag::kCount), "invalid");
  EXPECT_STREQ(core_type_name(CoreType::AIC), "AIC");
  EXPECT_STREQ(core_type_name(CoreType::AIV), "AIV");
  EXPECT_TRUE(tag_writes(Tag::Output) && tag_writes(Tag::InOut) && tag_writes(Tag::OutputExisting));
  EXPECT_FALSE(tag_writes(Tag::Input) || tag_writes(Tag::NoDep));
  EXPECT_TRUE(tag_reads(Tag::Input) && tag_reads(Tag::InOut));
  EXPECT_FALSE(tag_reads(Tag::Output) || tag_reads(Tag::OutputExisting) || tag_reads(Tag::NoDep));
}

// The numbers of DType are a wire format (args blobs, DeviceTensor::dtype):
// adding a type must not renumber the others.
TEST(Types, DtypeNumbersNeverChange) {
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::I8,  DType::I16, DType::I32,
                       DType::I64, DType::U8,  DType::U32,  DType::U64, DType::F64};
  for (size_t i = 0; i < std::size(all); ++i) EXPECT_EQ(static_cast<size_t>(all[i]), i) << dtype_name(all[i]);
  EXPECT_EQ(static_cast<size_t>(DType::kCount), std::size(all));
}

TEST(Digest, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(digest_hex(sha256("abc", 3)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest_hex(sha256("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.update("a");
  h.update("bc");
  EXPECT_EQ(h.finish(), sha256("abc", 3));
}

}  // namespace
}  // namespace simpler
