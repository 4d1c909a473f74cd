// The MPI wire's decoders (src/dist/wire.h), without MPI: every message a
// remote rank could send is decoded and classified by these pure functions
// before either endpoint acts on it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "dist/mpi_io.h"
#include "dist/wire.h"
#include "gate.h"
#include "task/args_blob.h"

namespace simpler::dist {
namespace {

constexpr uint64_t kSession = 0x5e55;

std::vector<uint8_t> request_bytes(const TaskArgs& args, uint32_t entry = 0, uint64_t generation = 1) {
  std::vector<uint8_t> blob;
  EXPECT_TRUE(encode_args_blob(args, blob).ok());
  auto plan = plan_tensors(args);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  return encode_request(kSession, entry, generation, 7, Digest{1, 2, 3}, plan->rows, blob);
}

TaskArgs two_tensor_args() {
  TaskArgs a;
  a.add_tensor(DeviceBuffer{0x10000, 64}.view({16}, DType::F32), Tag::Input);
  a.add_tensor(DeviceBuffer{0x20000, 64}.view({16}, DType::F32), Tag::OutputExisting);
  a.add_scalar(3);
  return a;
}

void set_header(std::vector<uint8_t>& m, const WireHeader& h) { std::memcpy(m.data(), &h, sizeof h); }
WireHeader get_header(const std::vector<uint8_t>& m) {
  WireHeader h;
  std::memcpy(&h, m.data(), sizeof h);
  return h;
}

TEST(DistWire, RequestRoundTrips) {
  const TaskArgs args = two_tensor_args();
  const auto bytes = request_bytes(args, 2, 5);
  auto m = decode_message(bytes);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->kind, MsgKind::kRequest);
  EXPECT_EQ(m->h.entry, 2u);
  EXPECT_EQ(m->h.generation, 5u);
  EXPECT_EQ(m->callable, (Digest{1, 2, 3}));
  ASSERT_EQ(m->rows.size(), 2u);
  EXPECT_EQ(m->rows[0].flags, kToNode);
  EXPECT_EQ(m->rows[1].flags, kToNode | kFromNode);  // an output's unwritten bytes keep the caller's
  auto decoded = decode_args_blob(m->args_blob.data(), m->args_blob.size());
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->size(), 3u);
}

TEST(DistWire, OneRowPerBufferWithTheUnionOfDirectionsAndSpans) {
  TaskArgs a;
  const DeviceBuffer b{0x10000, 4096};
  a.add_tensor(TensorView(b, {16}, DType::F32, 40), Tag::Input);            // bytes [160, 224)
  a.add_tensor(TensorView(b, {16}, DType::F32, 300), Tag::OutputExisting);  // bytes [1200, 1264)
  a.add_tensor(DeviceBuffer{0x20000, 256}.view({64}, DType::F32), Tag::Input);
  auto plan = plan_tensors(a);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->rows.size(), 2u);
  const TensorRow& r = plan->rows[0];
  EXPECT_EQ(r.flags, kToNode | kFromNode);
  EXPECT_EQ(r.buffer_bytes, 4096u);
  EXPECT_EQ(r.offset, 128u);  // 160, down to a 64-byte boundary
  EXPECT_EQ(r.bytes, 1264u - 128u);
  ASSERT_EQ(plan->writes[0].size(), 1u);  // only the written view comes back
  EXPECT_EQ(plan->writes[0][0].offset(), 300);
  EXPECT_EQ(plan->rows[1].flags, kToNode);
  EXPECT_TRUE(plan->writes[1].empty());
}

// A returned row lands in place only when it holds nothing but the run's
// written elements; otherwise exactly those elements are copied out, and
// the bytes between them (a task beside this one may be writing them) stay.
TEST(DistWire, AReturnedRowWritesExactlyTheRunsElements) {
  std::vector<float> caller(64, -7.0f);
  const DeviceBuffer y{reinterpret_cast<uint64_t>(caller.data()), caller.size() * sizeof(float)};
  const int64_t shape[] = {32}, stride[] = {2};
  const TensorView even = TensorView::from_parts(y, DType::F32, 1, shape, stride, 0);
  TaskArgs a;
  a.add_tensor(even, Tag::OutputExisting);
  auto plan = plan_tensors(a);
  ASSERT_TRUE(plan.ok());
  const TensorRow& row = plan->rows[0];
  EXPECT_FALSE(row_lands_in_place(row, plan->writes[0]));
  std::vector<float> received(row.bytes / sizeof(float), 1.5f);  // what the node sent back: every byte of the row
  scatter_writes(row, plan->writes[0], reinterpret_cast<const uint8_t*>(received.data()),
                 reinterpret_cast<uint8_t*>(y.addr));
  for (size_t i = 0; i < caller.size(); ++i) {
    ASSERT_EQ(caller[i], i % 2 == 0 && i < 63 ? 1.5f : -7.0f) << "element " << i;
  }
  TaskArgs dense;
  dense.add_tensor(TensorView(y, {16}, DType::F32, 16), Tag::OutputExisting);
  auto p2 = plan_tensors(dense);
  ASSERT_TRUE(p2.ok());
  EXPECT_TRUE(row_lands_in_place(p2->rows[0], p2->writes[0]));
  dense.add_tensor(TensorView(y, {4}, DType::F32, 40), Tag::Input);  // now the row holds an input's bytes too
  p2 = plan_tensors(dense);
  ASSERT_TRUE(p2.ok());
  EXPECT_FALSE(row_lands_in_place(p2->rows[0], p2->writes[0]));
}

TEST(DistWire, RuntimeAllocatedOutputIsRefusedForARemoteNode) {
  TaskArgs a;
  a.add_output({4}, DType::F32);
  auto plan = plan_tensors(a);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("runtime-allocated Output"), std::string::npos);
}

// The node rebases each view into its row's bytes: a row that does not
// hold a view, or is not a 64-byte aligned span of its buffer, is refused.
TEST(DistWire, ARowThatDoesNotHoldItsViewsIsRefused) {
  TaskArgs a;
  const DeviceBuffer b{0x10000, 4096};
  a.add_tensor(TensorView(b, {16}, DType::F32, 300), Tag::Input);  // bytes [1200, 1264)
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(a, blob).ok());
  const auto refused = [&](TensorRow row, const char* why) {
    const auto bytes = encode_request(kSession, 0, 1, 0, Digest{}, std::span(&row, 1), blob);
    auto m = decode_message(bytes);
    ASSERT_FALSE(m.ok()) << why;
    EXPECT_NE(m.status().message().find(why), std::string::npos) << m.status().message();
  };
  refused({0x10000, 4096, 1216, 64, kToNode, 0}, "outside tensor row 0");  // starts after the view
  refused({0x10000, 4096, 1152, 64, kToNode, 0}, "outside tensor row 0");  // ends before it
  refused({0x10000, 4096, 1200, 64, kToNode, 0}, "aligned");
  refused({0x10000, 4096, 4032, 128, kToNode, 0}, "aligned");  // past the buffer's end
  const TensorRow good{0x10000, 4096, 1152, 128, kToNode, 0};
  EXPECT_TRUE(decode_message(encode_request(kSession, 0, 1, 0, Digest{}, std::span(&good, 1), blob)).ok());
}

TEST(DistWire, EveryTruncationIsRefused) {
  const auto bytes = request_bytes(two_tensor_args());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto m = decode_message(std::span<const uint8_t>(bytes.data(), n));
    EXPECT_FALSE(m.ok()) << "a request cut to " << n << " of " << bytes.size() << " bytes decoded";
  }
}

TEST(DistWire, HeaderFieldsAreCheckedAndNamed) {
  const auto good = encode_simple(MsgKind::kAck, kSession, 0, 1, 9, 0);
  ASSERT_TRUE(decode_message(good).ok());
  struct Case {
    void (*mutate)(WireHeader&);
    const char* names;
  };
  const Case cases[] = {
      {[](WireHeader& h) { h.magic ^= 1; }, "magic"},
      {[](WireHeader& h) { h.version = kWireVersion + 1; }, "version"},
      {[](WireHeader& h) { h.kind = 0; }, "kind"},
      {[](WireHeader& h) { h.kind = kMsgKindLast + 1; }, "kind"},
      {[](WireHeader& h) { h.payload_bytes = 1; }, "payload_bytes"},
      {[](WireHeader& h) { h.tensor_count = 1; }, "tensor_count"},
      {[](WireHeader& h) { h.status_code = 3; }, "status_code"},
  };
  for (const Case& c : cases) {
    auto bad = good;
    WireHeader h = get_header(bad);
    c.mutate(h);
    set_header(bad, h);
    auto m = decode_message(bad);
    ASSERT_FALSE(m.ok()) << c.names;
    EXPECT_NE(m.status().message().find(c.names), std::string::npos) << m.status().message();
  }
}

TEST(DistWire, RequestWhoseArgsNameNoRowIsRefused) {
  TaskArgs a = two_tensor_args();
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(a, blob).ok());
  // The table lists only the first buffer: the second argument's is no row.
  const TensorRow row{0x10000, 64, 0, 64, kToNode, 0};
  const auto bytes = encode_request(kSession, 0, 1, 0, Digest{}, std::span(&row, 1), blob);
  auto m = decode_message(bytes);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("argument 1"), std::string::npos) << m.status().message();
}

TEST(DistWire, RequestRowsAreBounded) {
  const TaskArgs args = two_tensor_args();
  auto bytes = request_bytes(args);
  auto* row = reinterpret_cast<TensorRow*>(bytes.data() + sizeof(WireHeader) + kRequestFixedBytes);
  auto bad = bytes;
  reinterpret_cast<TensorRow*>(bad.data() + sizeof(WireHeader) + kRequestFixedBytes)->flags = 4;
  EXPECT_NE(decode_message(bad).status().message().find("flags"), std::string::npos);
  bad = bytes;
  reinterpret_cast<TensorRow*>(bad.data() + sizeof(WireHeader) + kRequestFixedBytes)->bytes = kWireMaxTensorBytes + 1;
  EXPECT_NE(decode_message(bad).status().message().find("bytes"), std::string::npos);
  bad = bytes;
  WireHeader h = get_header(bad);
  h.tensor_count = kMaxTaskArgs + 1;
  set_header(bad, h);
  EXPECT_NE(decode_message(bad).status().message().find("tensor_count"), std::string::npos);
  (void)row;
}

TEST(DistWire, TerminalCarriesTheKernelTextAndReturnedSizes) {
  const uint64_t sizes[] = {64, 128};
  // A Message views the bytes it was decoded from: they must outlive it.
  const auto ok_bytes = encode_terminal(kSession, 1, 3, 4, 0, Status(), sizes);
  auto ok = decode_message(ok_bytes);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->sizes, (std::vector<uint64_t>{64, 128}));
  const Status failed(StatusCode::kUserCodeFailed, "task 0 (AIV kernel, func_id 1) failed: boom");
  const auto bad_bytes = encode_terminal(kSession, 1, 3, 4, 0, failed, {});
  auto bad = decode_message(bad_bytes);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->text, failed.message());
  EXPECT_EQ(bad->h.status_code, static_cast<int32_t>(StatusCode::kUserCodeFailed));
  // A failure returns no buffers; an unknown code is refused.
  auto mixed = encode_terminal(kSession, 1, 3, 4, 0, failed, sizes);
  EXPECT_FALSE(decode_message(mixed).ok());
  auto code = encode_terminal(kSession, 1, 3, 4, 0, failed, {});
  WireHeader h = get_header(code);
  h.status_code = 999;
  set_header(code, h);
  EXPECT_NE(decode_message(code).status().message().find("status_code"), std::string::npos);
}

TEST(DistWire, MemoryReplyWithFreeAboveTotalIsRefused) {
  EXPECT_TRUE(decode_message(encode_memory_reply(kSession, 100, 40)).ok());
  EXPECT_FALSE(decode_message(encode_memory_reply(kSession, 100, 101)).ok());
}

// R7/R8/R9 at the network: a reply for the current occupant is taken, one
// for a past occupant of a valid entry is stale (dropped, nothing changes),
// one that names no possible occupant stops the endpoint.
TEST(DistWire, RepliesAreClassifiedAsR7ToR9Say) {
  std::vector<EntryIdentity> entries(2);
  entries[0] = {3, 0};  // occupied, not yet ACKed
  entries[1] = {6, 0};  // free
  auto classify = [&](MsgKind k, uint32_t entry, uint64_t gen, uint64_t epoch, uint64_t session = kSession) {
    auto m = decode_message(encode_simple(k, session, entry, gen, epoch, 0));
    EXPECT_TRUE(m.ok());
    return classify_reply(*m, kSession, entries).verdict;
  };
  EXPECT_EQ(classify(MsgKind::kAck, 0, 3, 11), Verdict::kAccept);
  EXPECT_EQ(classify(MsgKind::kAck, 0, 1, 11), Verdict::kStale);           // R8: a past occupant
  EXPECT_EQ(classify(MsgKind::kAck, 0, 5, 11), Verdict::kStale);           // R8: odd, not the current one
  EXPECT_EQ(classify(MsgKind::kAck, 2, 3, 11), Verdict::kUnattributable);  // R9: index >= M
  EXPECT_EQ(classify(MsgKind::kAck, 0, 4, 11), Verdict::kUnattributable);  // R9: even generation
  EXPECT_EQ(classify(MsgKind::kAck, 0, 3, 11, kSession + 1), Verdict::kUnattributable);
  entries[0].run_epoch = 11;
  EXPECT_EQ(classify(MsgKind::kAck, 0, 3, 11), Verdict::kUnattributable);  // a second ACK
  EXPECT_EQ(classify(MsgKind::kAccepted, 0, 3, 11), Verdict::kAccept);
  EXPECT_EQ(classify(MsgKind::kAccepted, 0, 3, 12), Verdict::kUnattributable);  // contradicts the ACK
}

// R7/R8/R9 at the node: a request for an entry that still runs, or for a
// generation not newer than the last taken there (a replay), is stale.
TEST(DistWire, RequestsAreClassifiedAsR7ToR9Say) {
  const TaskArgs args;
  std::vector<EntryIdentity> mirror(2);
  mirror[0] = {3, 0};  // generation 3 finished there
  mirror[1] = {1, 9};  // generation 1 still runs there
  auto classify = [&](uint32_t entry, uint64_t gen) {
    auto m = decode_message(request_bytes(args, entry, gen));
    EXPECT_TRUE(m.ok());
    return classify_request(*m, kSession, 2, mirror).verdict;
  };
  EXPECT_EQ(classify(0, 5), Verdict::kAccept);
  EXPECT_EQ(classify(0, 3), Verdict::kStale);
  EXPECT_EQ(classify(0, 1), Verdict::kStale);
  EXPECT_EQ(classify(1, 3), Verdict::kStale);
  EXPECT_EQ(classify(2, 1), Verdict::kUnattributable);
  EXPECT_EQ(classify(0, 6), Verdict::kUnattributable);
}

// Issue 12 through a remote node: a request carries the run's CallConfig
// bytes after its args blob, bounded by the header's value.
TEST(DistWire, RequestCarriesItsCallConfig) {
  const TaskArgs args = two_tensor_args();
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(args, blob).ok());
  auto plan = plan_tensors(args);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint8_t> config{'C', 'C', 'F', 'G', 1, 2, 3};
  const auto bytes = encode_request(kSession, 0, 1, 7, Digest{}, plan->rows, blob, config);
  auto m = decode_message(bytes);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(std::vector<uint8_t>(m->config.begin(), m->config.end()), config);
  EXPECT_TRUE(decode_args_blob(m->args_blob.data(), m->args_blob.size()).ok());
  for (uint64_t value : {uint64_t{kWireMaxConfig} + 1, uint64_t{bytes.size()}}) {
    auto bad = bytes;
    WireHeader h = get_header(bad);
    h.value = value;
    set_header(bad, h);
    auto r = decode_message(bad);
    ASSERT_FALSE(r.ok()) << value;
    EXPECT_NE(r.status().message().find("value"), std::string::npos) << r.status().message();
  }
}

std::vector<uint8_t> chunk_bytes(std::string_view name, uint64_t file_bytes = 8, uint64_t offset = 0,
                                 uint32_t index = 0, uint32_t files = 2, uint64_t total = 16, size_t data = 8) {
  const std::vector<uint8_t> d(data, 0xab);
  return encode_file_chunk(kSession, 0, 1, 9, 7, files, total, FileChunkHead{file_bytes, offset, index, 0}, name, d);
}

// A FILES chunk decodes only when its name and data lie inside its payload
// and its data inside its file; what the network then checks before writing
// (a relative name inside the run's directory, the bounds) names the field.
TEST(DistWire, FileChunksAreBoundedAndTheirNamesConfined) {
  const auto good = chunk_bytes("chip0/task0/args_dump/args.bin");  // the views point into it
  auto m = decode_message(good);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->file_name, "chip0/task0/args_dump/args.bin");
  EXPECT_EQ(m->file_data.size(), 8u);
  EXPECT_TRUE(validate_file_chunk(*m).ok());
  // Layout: the decoder refuses.
  struct Layout {
    std::vector<uint8_t> bytes;
    const char* names;
  };
  auto long_name = chunk_bytes("trace.json");
  FileChunkHead f;
  std::memcpy(&f, long_name.data() + sizeof(WireHeader), sizeof f);
  f.name_bytes = 1000;
  std::memcpy(long_name.data() + sizeof(WireHeader), &f, sizeof f);
  const Layout layouts[] = {{chunk_bytes("trace.json", 8, 4), "offset"},
                            {chunk_bytes("trace.json", 4), "offset"},
                            {long_name, "name_bytes"},
                            {chunk_bytes("t", kWireMaxFileBytes, 0, 0, 2, 16, kFileChunkBytes + 1), "chunk"}};
  for (const Layout& l : layouts) {
    auto r = decode_message(l.bytes);
    ASSERT_FALSE(r.ok()) << l.names;
    EXPECT_NE(r.status().message().find(l.names), std::string::npos) << r.status().message();
  }
  // Content: decoded, then refused by the check, naming the field.
  struct Content {
    std::vector<uint8_t> bytes;
    const char* names;
  };
  const Content contents[] = {
      {chunk_bytes("../trace.json"), "\"..\""},
      {chunk_bytes("chip0/../../x"), "\"..\""},
      {chunk_bytes("/etc/passwd"), "absolute"},
      {chunk_bytes("a//b"), "component \"\""},
      {chunk_bytes("./a"), "component \".\""},
      {chunk_bytes("a/"), "component \"\""},
      {chunk_bytes("a b"), "byte 0x20"},
      {chunk_bytes(std::string(kWireMaxFileName + 1, 'a')), "name of"},
      {chunk_bytes("", 8), "name of 0 bytes"},
      {chunk_bytes("t", kWireMaxFileBytes + 1, 0, 0, 2, kWireMaxShipmentBytes), "file_bytes"},
      {chunk_bytes("t", 8, 0, 0, 2, 4), "file_bytes"},
      {chunk_bytes("t", 8, 0, 0, 2, kWireMaxShipmentBytes + 1), "value"},
      {chunk_bytes("t", 8, 0, 2, 2), "file_index"},
      {chunk_bytes("t", 8, 0, 0, kWireMaxFiles + 1), "tensor_count"},
  };
  for (const Content& c : contents) {
    auto r = decode_message(c.bytes);
    ASSERT_TRUE(r.ok()) << c.names << ": " << r.status().to_string();
    const Status st = validate_file_chunk(*r);
    ASSERT_FALSE(st.ok()) << c.names;
    EXPECT_NE(st.message().find(c.names), std::string::npos) << st.message();
  }
}

TEST(DistWire, ChunkCount) {
  EXPECT_EQ(chunk_count(0), 0u);
  EXPECT_EQ(chunk_count(1), 1u);
  EXPECT_EQ(chunk_count(kChunkBytes), 1u);
  EXPECT_EQ(chunk_count(kChunkBytes + 1), 2u);
}

// A poller that fell asleep (here: at once, for an hour) is woken by the
// process's own thread when a run is published or a terminal handed over:
// the answer must not wait out the sleep. Both orders: the wake lands
// before the pause, or while it sleeps.
void expect_wake_ends_the_pause(bool wake_first) {
  constexpr uint64_t kHour = 3'600'000'000'000ull;
  auto backoff = std::make_shared<Backoff>(kHour, 0, kHour);
  auto entering = std::make_shared<std::atomic<bool>>(false);
  std::promise<void> returned;
  std::future<void> done = returned.get_future();
  if (wake_first) backoff->wake();
  std::thread poller([backoff, entering, r = std::move(returned)]() mutable {
    entering->store(true);
    backoff->pause();
    r.set_value();
  });
  if (!testing::eventually([&] { return entering->load(); })) {
    poller.detach();
    FAIL() << "the poller thread never started within 30 s";
  }
  if (!wake_first) backoff->wake();
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    poller.detach();  // asleep for the hour; the process ends before it
    FAIL() << "a woken Backoff::pause did not return within 30 s";
  }
  poller.join();
}

TEST(DistBackoff, AWakeBeforeThePauseEndsIt) { expect_wake_ends_the_pause(true); }

TEST(DistBackoff, AWakeDuringTheSleepEndsIt) { expect_wake_ends_the_pause(false); }

}  // namespace
}  // namespace simpler::dist
