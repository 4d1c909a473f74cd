// The argument-dump lane (metadata buffers, payload arena, back-pressure,
// the resumable producer) and the dump's files: manifest + args.bin written,
// loaded with validation, summarised and diffed.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/errors.h"
#include "diag/arg_capture.h"
#include "diag/args_dump_collector.h"
#include "diag/args_dump_file.h"
#include "diag/args_dump_lane.h"
#include "kernels.h"
#include "scratch_dir.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

DumpRecord meta_for(uint64_t task, uint16_t arg, DumpRole role, DumpStage stage, const TensorView& v, uint64_t order) {
  DumpRecord r;
  r.run_epoch = 7;
  r.task_id = task;
  r.order = order;
  r.func_id = 3;
  r.arg_index = arg;
  r.role = static_cast<uint8_t>(role);
  r.stage = static_cast<uint8_t>(stage);
  r.dtype = static_cast<uint8_t>(v.dtype());
  r.ndim = static_cast<uint8_t>(v.ndim());
  r.offset = v.offset();
  for (int d = 0; d < v.ndim(); ++d) {
    r.shape[d] = v.shape(d);
    r.stride[d] = v.stride(d);
  }
  r.logical_bytes = static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype());
  return r;
}

// A host buffer standing in for device memory, with a DeviceBuffer naming it.
struct HostTensor {
  std::vector<float> data;
  DeviceBuffer buffer;
  explicit HostTensor(size_t n) : data(n) { buffer = {0x1000, n * sizeof(float)}; }
  DumpSource source(const TensorView& v) const { return {reinterpret_cast<const uint8_t*>(data.data()), v}; }
};

// Drains `lane` into `writer` on its own thread until stopped.
class HostDrainer {
 public:
  HostDrainer(DumpLane& lane, ArgsDumpWriter& writer)
      : lane_(lane), sink_(writer.sink_for(0)), thread_([this] { loop(); }) {}
  ~HostDrainer() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    lane_.host_bell().ring();
    thread_.join();
  }

 private:
  void loop() {
    while (!stop_.load()) {
      const uint32_t armed = lane_.host_bell().arm();
      if (lane_.drain(sink_) == 0 && !stop_.load()) lane_.host_bell().park(armed, now_ns() + 50'000'000);
    }
  }
  DumpLane& lane_;
  DumpLane::Sink sink_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result<ArgsDump> finish_and_load(ArgsDumpWriter& writer, DumpLane& lane, const std::string& dir) {
  ArgsDumpWriter::Summary s;
  s.run_epoch = 7;
  s.complete = lane.drain_final(writer.sink_for(0)).ok();
  s.lanes = {lane.counts()};
  s.kernel_name = [](uint32_t f) { return "kernel" + std::to_string(f); };
  SIMPLER_RETURN_IF_ERROR(writer.finish(s));
  return load_args_dump(dir);
}

TEST(ArgsDumpLane, RecordsEveryArgumentWithItsBytesInRowMajorOrder) {
  Watchdog dog;
  const std::string dir = scratch_dir("dump", "a");
  auto writer = ArgsDumpWriter::open(dir).value();
  DumpLaneConfig cfg;
  cfg.buffers = 2;
  cfg.records_per_buffer = 3;  // buffers cycle many times
  cfg.arena_bytes = 8192;      // and the arena wraps
  auto lane = DumpLane::create(cfg).value();
  HostTensor t(64 * 16);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i);
  const TensorView whole(t.buffer, {64, 16}, DType::F32);
  const int64_t shape[] = {64, 8}, stride[] = {16, 2};
  const TensorView column = TensorView::from_parts(t.buffer, DType::F32, 2, shape, stride, 1);  // odd columns
  ASSERT_TRUE(column.validate().ok());
  const TensorView block = whole.tile({10, 4}, {7, 9}).value();
  {
    HostDrainer host(*lane, *writer);
    for (uint64_t k = 0; k < 40; ++k) {
      const TensorView& v = k % 3 == 0 ? column : (k % 3 == 1 ? block : whole);
      const DumpSource src = t.source(v);
      ASSERT_TRUE(lane->record(meta_for(k, k % 4, DumpRole::kInput, DumpStage::kBefore, v, k), &src)) << k;
    }
  }
  auto dump = finish_and_load(*writer, *lane, dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  ASSERT_EQ(dump->args.size(), 40u);
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->counts.total, 40u);
  EXPECT_EQ(dump->counts.collected, 40u);
  EXPECT_EQ(dump->counts.dropped, 0u);
  for (const DumpedArg& a : dump->args) {
    const TensorView& v = a.task % 3 == 0 ? column : (a.task % 3 == 1 ? block : whole);
    ASSERT_EQ(dumped_elements(a), static_cast<uint64_t>(v.numel())) << a.task;
    ASSERT_EQ(a.kernel, "kernel3");
    // Element i of the dump is element (r, c) of the view, read through its strides.
    const int64_t cols = v.shape(1);
    for (int64_t i = 0; i < v.numel(); ++i) {
      const int64_t at = v.offset() + (i / cols) * v.stride(0) + (i % cols) * v.stride(1);
      ASSERT_EQ(dumped_element(*dump, a, static_cast<uint64_t>(i)), t.data[static_cast<size_t>(at)])
          << "task " << a.task << " element " << i;
    }
  }
}

TEST(ArgsDumpLane, APayloadLargerThanHalfTheArenaIsMarkedTruncatedNeverShort) {
  Watchdog dog;
  const std::string dir = scratch_dir("dump", "a");
  auto writer = ArgsDumpWriter::open(dir).value();
  DumpLaneConfig cfg;
  cfg.arena_bytes = 4096;
  auto lane = DumpLane::create(cfg).value();
  HostTensor t(4096);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i) * 0.5f;
  const TensorView v(t.buffer, {4096}, DType::F32);
  const DumpSource src = t.source(v);
  {
    HostDrainer host(*lane, *writer);
    ASSERT_TRUE(lane->record(meta_for(1, 0, DumpRole::kOutput, DumpStage::kAfter, v, 0), &src));
  }
  auto dump = finish_and_load(*writer, *lane, dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  ASSERT_EQ(dump->args.size(), 1u);
  const DumpedArg& a = dump->args[0];
  EXPECT_TRUE(a.truncated);
  EXPECT_EQ(a.bytes, 2048u);  // arena_bytes / 2
  EXPECT_EQ(a.logical_bytes, 4096u * 4);
  EXPECT_EQ(dump->counts.truncated, 1u);
  for (uint64_t i = 0; i < dumped_elements(a); ++i) ASSERT_EQ(dumped_element(*dump, a, i), t.data[i]);
}

// The producer's wait must not depend on records it holds itself: with the
// arena full of bytes that only its unpublished buffer names, try_begin
// hands that buffer over so the host can acknowledge them.
TEST(ArgsDumpLane, AFullArenaPublishesTheRecordsThatHoldItInsteadOfWaitingOnThem) {
  Watchdog dog;
  const std::string dir = scratch_dir("dump", "a");
  auto writer = ArgsDumpWriter::open(dir).value();
  DumpLaneConfig cfg;
  cfg.arena_bytes = 4096;
  cfg.records_per_buffer = 256;  // never fills by count in this test
  cfg.wait_ns = 20'000'000'000;  // a drop here would be the defect, not a slow machine
  auto lane = DumpLane::create(cfg).value();
  HostTensor t(256);
  const TensorView v(t.buffer, {256}, DType::F32);  // 1 KiB: four fill the arena
  const DumpSource src = t.source(v);
  {
    HostDrainer host(*lane, *writer);
    for (uint64_t k = 0; k < 64; ++k) {
      ASSERT_TRUE(lane->record(meta_for(k, 0, DumpRole::kInput, DumpStage::kBefore, v, k), &src)) << k;
    }
  }
  auto dump = finish_and_load(*writer, *lane, dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_EQ(dump->counts.collected, 64u);
  EXPECT_EQ(dump->counts.dropped, 0u);
}

// Back-pressure: a host that stops acknowledging makes the producer wait
// out its deadline and record a drop: never a hang, never a short record,
// and total == collected + dropped throughout. Once the host drains again,
// capture resumes.
TEST(ArgsDumpLane, AHostThatStopsAcknowledgingCostsDropsNotAHang) {
  Watchdog dog;
  const std::string dir = scratch_dir("dump", "a");
  auto writer = ArgsDumpWriter::open(dir).value();
  DumpLaneConfig cfg;
  cfg.arena_bytes = 4096;
  cfg.wait_ns = 5'000'000;
  auto lane = DumpLane::create(cfg).value();
  HostTensor t(256);
  const TensorView v(t.buffer, {256}, DType::F32);
  const DumpSource src = t.source(v);
  uint64_t ok = 0;
  for (uint64_t k = 0; k < 10; ++k) {
    ok += lane->record(meta_for(k, 0, DumpRole::kInput, DumpStage::kBefore, v, k), &src) ? 1 : 0;
    const DumpCounts c = lane->counts();
    ASSERT_EQ(c.total, c.collected + c.dropped) << k;
  }
  EXPECT_EQ(ok, 4u);  // the arena holds four; nobody acknowledges them
  EXPECT_EQ(lane->counts().dropped, 6u);
  lane->drain(writer->sink_for(0));
  EXPECT_TRUE(lane->record(meta_for(10, 0, DumpRole::kInput, DumpStage::kBefore, v, 10), &src));
  auto dump = finish_and_load(*writer, *lane, dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_EQ(dump->counts.total, 11u);
  EXPECT_EQ(dump->counts.collected, 5u);
  EXPECT_EQ(dump->counts.dropped, 6u);
  EXPECT_EQ(dump->args.size(), 5u);
}

// R107: the resumable producer: a would-block retry is not counted again; an
// abandon rolls the arena back to where the reservation began; a lane left
// with a reservation open refuses its final drain (accounting unknown).
TEST(ArgsDumpLane, TheResumableProducerCountsOnceAndAbandonRollsTheArenaBack) {
  DumpLaneConfig cfg;
  cfg.arena_bytes = 4096;
  auto lane = DumpLane::create(cfg).value();
  HostTensor t(512);
  const TensorView big(t.buffer, {512}, DType::F32);  // 2 KiB, the clamp
  const DumpSource src = t.source(big);
  std::vector<DumpRecord> seen;
  const DumpLane::Sink sink = [&](const DumpRecord& r, const uint8_t*, size_t, const uint8_t*, size_t) {
    seen.push_back(r);
  };

  ASSERT_EQ(lane->try_begin(meta_for(1, 0, DumpRole::kInput, DumpStage::kBefore, big, 0), &src), DumpStep::kDone);
  while (lane->copy_chunk(100) == DumpStep::kInProgress) {
  }
  lane->commit();
  ASSERT_EQ(lane->try_begin(meta_for(2, 0, DumpRole::kInput, DumpStage::kBefore, big, 1), &src), DumpStep::kDone);
  EXPECT_EQ(lane->copy_chunk(1000), DumpStep::kInProgress);
  lane->abandon();  // rolls back 2 KiB
  EXPECT_EQ(lane->counts().dropped, 1u);
  ASSERT_EQ(lane->try_begin(meta_for(3, 0, DumpRole::kInput, DumpStage::kBefore, big, 2), &src), DumpStep::kDone);
  lane->copy_chunk(1 << 20);
  lane->commit();
  // The arena is now full (two committed 2 KiB payloads, nothing acknowledged).
  const DumpRecord fourth = meta_for(4, 0, DumpRole::kInput, DumpStage::kBefore, big, 3);
  EXPECT_EQ(lane->try_begin(fourth, &src), DumpStep::kWouldBlock);
  EXPECT_EQ(lane->try_begin(fourth, &src), DumpStep::kWouldBlock);
  EXPECT_EQ(lane->counts().total, 4u);  // tasks 1, 2, 3 and 4 once, however often 4 retried
  EXPECT_EQ(lane->drain(sink), 2u);     // the would-block published them
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].task_id, 3u);
  EXPECT_EQ(seen[1].arena_pos, 2048u);  // where task 2's abandoned reservation began
  ASSERT_EQ(lane->try_begin(fourth, &src), DumpStep::kDone);
  lane->copy_chunk(1);
  EXPECT_FALSE(lane->drain_final(sink).ok());  // mid-copy: the accounting is unknown
}

TEST(ArgsDumpLane, RefusesAConfigItCannotRunNamingTheField) {
  DumpLaneConfig c;
  c.buffers = 1;
  EXPECT_REFUSED(DumpLane::create(c).status(), StatusCode::kInvalidArgument, "buffers");
  c = {};
  c.records_per_buffer = 0;
  EXPECT_REFUSED(DumpLane::create(c).status(), StatusCode::kInvalidArgument, "records_per_buffer");
  c = {};
  c.arena_bytes = 100;
  EXPECT_REFUSED(DumpLane::create(c).status(), StatusCode::kInvalidArgument, "arena_bytes");
}

// A dump of one task per element vector, written through a real lane.
std::string write_chain_dump(const std::string& dir, uint64_t tasks, uint64_t perturbed_task, int64_t perturbed_elem) {
  auto writer = ArgsDumpWriter::open(dir).value();
  auto lane = DumpLane::create({}).value();
  HostTensor t(32);
  const TensorView v(t.buffer, {4, 8}, DType::F32);
  const DumpSource src = t.source(v);
  {
    HostDrainer host(*lane, *writer);
    for (uint64_t k = 0; k < tasks; ++k) {
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(k) + static_cast<float>(i) / 64;
      if (k == perturbed_task) t.data[static_cast<size_t>(perturbed_elem)] += 0.25f;
      EXPECT_TRUE(lane->record(meta_for(k, 1, DumpRole::kOutput, DumpStage::kAfter, v, k), &src));
    }
  }
  EXPECT_TRUE(finish_and_load(*writer, *lane, dir).ok());
  return dir;
}

TEST(ArgsDumpDiff, NamesTheFirstPerturbedTaskOfAThousandTaskChain) {
  Watchdog dog;
  const std::string a = write_chain_dump(scratch_dir("dump", "a"), 1000, UINT64_MAX, 0);
  const std::string b = write_chain_dump(scratch_dir("dump", "b"), 1000, 637, 13);
  auto da = load_args_dump(a);
  auto db = load_args_dump(b);
  ASSERT_TRUE(da.ok() && db.ok());
  const DumpDifference d = diff_args_dumps(*da, *db, 0, 0);
  ASSERT_TRUE(d.differs) << d.what;
  EXPECT_EQ(d.task, 637u);
  EXPECT_EQ(d.arg, 1u);
  EXPECT_EQ(d.index, (std::vector<int64_t>{1, 5}));  // element 13 of a 4x8 tensor
  EXPECT_FLOAT_EQ(d.a, 637.f + 13.f / 64);
  EXPECT_FLOAT_EQ(d.b, 637.f + 13.f / 64 + 0.25f);
  EXPECT_TRUE(contains(d.what, "task 637")) << d.what;
  // Within tolerance, nothing differs; a run against itself never differs.
  EXPECT_FALSE(diff_args_dumps(*da, *db, 0, 0.3).differs);
  EXPECT_FALSE(diff_args_dumps(*da, *da, 0, 0).differs);
}

TEST(ArgsDumpFile, SummarisesATensorCountingNanAndInf) {
  const std::string dir = scratch_dir("dump", "a");
  auto writer = ArgsDumpWriter::open(dir).value();
  auto lane = DumpLane::create({}).value();
  HostTensor t(6);
  t.data = {1.f, -2.f, std::numeric_limits<float>::quiet_NaN(), 4.f, std::numeric_limits<float>::infinity(), 3.f};
  const TensorView v(t.buffer, {6}, DType::F32);
  const DumpSource src = t.source(v);
  ASSERT_TRUE(lane->record(meta_for(0, 0, DumpRole::kInOut, DumpStage::kAfter, v, 0), &src));
  auto dump = finish_and_load(*writer, *lane, dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  const TensorSummary s = summarize(*dump, dump->args[0]);
  EXPECT_EQ(s.elements, 6u);
  EXPECT_EQ(s.nan, 1u);
  EXPECT_EQ(s.inf, 1u);
  EXPECT_EQ(s.min, -2);
  EXPECT_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.mean, 1.5);
}

// The loader trusts nothing: each corruption is refused naming what is wrong.
TEST(ArgsDumpFile, RefusesAManifestThatDisagreesWithItselfOrItsBin) {
  const std::string dir = write_chain_dump(scratch_dir("dump", "a"), 3, UINT64_MAX, 0);
  const std::string path = dir + "/manifest.json";
  nlohmann::json good;
  std::ifstream(path) >> good;
  const auto refused_after = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& why) {
    nlohmann::json m = good;
    edit(m);
    std::ofstream(path) << m.dump();
    auto d = load_args_dump(dir);
    ASSERT_FALSE(d.ok()) << why;
    EXPECT_TRUE(contains(d.status().message(), why)) << d.status().to_string();
  };
  refused_after([](auto& m) { m["records"][1].erase("dtype"); }, "record 1 has no \"dtype\"");
  refused_after([](auto& m) { m["records"][2]["bin_offset"] = 1u << 20; }, "record 2 names bytes");
  refused_after([](auto& m) { m["records"][0]["dtype"] = "f99"; }, "unknown dtype");
  refused_after([](auto& m) { m["records"][0]["shape"] = {4, 9}; }, "logical_bytes");
  refused_after([](auto& m) { m["records"][0]["truncated"] = true; }, "do not allow");
  refused_after([](auto& m) { m["dropped"] = 1; }, "total");
  refused_after([](auto& m) { m["collected"] = 2; }, "lists 3 records");
  refused_after([](auto& m) { m["simpler_args_dump_version"] = 2; }, "version");
  std::ofstream(path) << good.dump();
  EXPECT_TRUE(load_args_dump(dir).ok());
}

// Two AICPU threads capture at once through one collector: every record
// arrives once, in one capture order, with the lanes' accounting summed.
TEST(ArgsDumpCollector, TwoLanesDrainedByOneHostThreadLoseNothing) {
  Watchdog dog;
  const std::string dir = scratch_dir("dump", "a");
  ArgsDumpCollector::Options o;
  o.dir = dir;
  o.lanes = 2;
  o.lane.arena_bytes = 8192;  // 8 payloads: the producers wait on the host throughout
  o.lane.records_per_buffer = 4;
  o.lane.wait_ns = 20'000'000'000;
  o.run_epoch = 9;
  o.kernel_name = [](uint32_t f) { return "k" + std::to_string(f); };
  auto c = ArgsDumpCollector::start(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  HostTensor t(256);
  const TensorView v(t.buffer, {256}, DType::F32);
  std::vector<std::thread> producers;
  for (uint32_t lane = 0; lane < 2; ++lane) {
    producers.emplace_back([&, lane] {
      HostTensor mine(256);
      for (uint64_t k = 0; k < 500; ++k) {
        std::fill(mine.data.begin(), mine.data.end(), static_cast<float>(lane * 1000 + k));
        const DumpSource src = mine.source(v);
        EXPECT_TRUE((*c)->lane(lane).record(
            meta_for(lane * 1000 + k, 0, DumpRole::kOutput, DumpStage::kAfter, v, (*c)->next_order()), &src));
      }
    });
  }
  for (std::thread& p : producers) p.join();
  ASSERT_TRUE((*c)->finish(true).ok());
  auto dump = load_args_dump(dir);
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  ASSERT_EQ(dump->args.size(), 1000u);
  EXPECT_EQ(dump->counts.total, 1000u);
  EXPECT_EQ(dump->counts.dropped, 0u);
  for (size_t i = 0; i < dump->args.size(); ++i) {
    const DumpedArg& a = dump->args[i];
    ASSERT_EQ(a.order, i);  // one capture order, no gaps, no repeats
    ASSERT_EQ(a.lane, a.task >= 1000 ? 1u : 0u);
    const TensorSummary s = summarize(*dump, a);
    ASSERT_EQ(s.min, static_cast<double>(a.task)) << "task " << a.task << " holds another task's bytes";
    ASSERT_EQ(s.max, static_cast<double>(a.task));
  }
}

// What each selection captures of one task (input a, output c marked with
// dump(), inout b, a scalar), and at which stage: inputs and inouts before,
// outputs and inouts after; Hybrid keeps metadata for the unmarked.
TEST(ArgCapture, EachSelectionCapturesWhatItSays) {
  Watchdog dog;
  HostTensor a(8), b(8), c(8);
  for (int i = 0; i < 8; ++i) a.data[i] = static_cast<float>(i);
  a.buffer.addr = reinterpret_cast<uint64_t>(a.data.data());
  b.buffer.addr = reinterpret_cast<uint64_t>(b.data.data());
  c.buffer.addr = reinterpret_cast<uint64_t>(c.data.data());
  TaskArgs args;
  args.add_tensor(a.buffer.view({8}, DType::F32), Tag::Input)
      .add_tensor(b.buffer.view({8}, DType::F32), Tag::InOut)
      .add_scalar(3)
      .add_tensor(c.buffer.view({8}, DType::F32), Tag::OutputExisting)
      .dump();
  ASSERT_TRUE(args.validate().ok());
  struct Want {
    DumpSelection sel;
    std::vector<std::tuple<uint32_t, DumpStage, bool>> records;  // arg, stage, metadata only
  };
  const std::vector<Want> wants = {
      {DumpSelection::kFull,
       {{0, DumpStage::kBefore, false},
        {1, DumpStage::kBefore, false},
        {1, DumpStage::kAfter, false},
        {3, DumpStage::kAfter, false}}},
      {DumpSelection::kPartial, {{3, DumpStage::kAfter, false}}},
      {DumpSelection::kHybrid,
       {{0, DumpStage::kBefore, true},
        {1, DumpStage::kBefore, true},
        {1, DumpStage::kAfter, true},
        {3, DumpStage::kAfter, false}}},
  };
  for (const Want& w : wants) {
    const std::string dir = scratch_dir("dump", dump_selection_name(w.sel));
    ArgsDumpCollector::Options o;
    o.dir = dir;
    o.selection = w.sel;
    o.run_epoch = 5;
    auto col = ArgsDumpCollector::start(o);
    ASSERT_TRUE(col.ok());
    ArgCapture cap(**col, 4, 5);
    std::array<TensorView, kMaxTaskArgs> views;
    for (size_t i = 0; i < args.size(); ++i) views[i] = args[i].tensor;
    cap.add_task(77, 9, args, views.data());
    cap.before(0, 77);
    for (float& x : c.data) x = 42;  // the "kernel"
    cap.after(0, 77);
    ASSERT_TRUE((*col)->finish(true).ok());
    auto dump = load_args_dump(dir);
    ASSERT_TRUE(dump.ok()) << dump.status().to_string();
    ASSERT_EQ(dump->args.size(), w.records.size()) << dump_selection_name(w.sel);
    for (size_t i = 0; i < w.records.size(); ++i) {
      const DumpedArg& got = dump->args[i];
      EXPECT_EQ(got.task, 77u);
      EXPECT_EQ(got.func_id, 9u);
      EXPECT_EQ(got.arg, std::get<0>(w.records[i])) << dump_selection_name(w.sel) << " record " << i;
      EXPECT_EQ(got.stage, std::get<1>(w.records[i])) << dump_selection_name(w.sel) << " record " << i;
      EXPECT_EQ(got.metadata_only, std::get<2>(w.records[i])) << dump_selection_name(w.sel) << " record " << i;
      if (got.arg == 3) {
        EXPECT_EQ(summarize(*dump, got).min, 42);  // after the kernel wrote it
      }
    }
  }
}

TEST(ArgCapture, DumpMarksOnlyATensorArgument) {
  TaskArgs none;
  none.dump();
  EXPECT_REFUSED(none.validate(), StatusCode::kInvalidArgument, "before any argument");
  TaskArgs scalar;
  scalar.add_scalar(1).dump();
  EXPECT_REFUSED(scalar.validate(), StatusCode::kInvalidArgument, "args[0]");
}

// A dumping chip run, end to end, on each runtime whose AICPU sees task
// boundaries: c = a * 2 + 1, then d = c * 3 + 2. Each stage holds the bytes
// of its own moment, and the second task's input c is, byte for byte, what
// the first task's output c was when it finished (the hand-off of R126 on
// these routes).
class ArgsDumpRun : public ::testing::TestWithParam<std::string> {};

ChipCallable two_axpb(bool mark_only_d) {
  return ChipCallable("two_axpb",
                      [mark_only_d](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        TaskArgs t0;
                        t0.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                        t0.add_scalar_f32(2).add_scalar_f32(1);
                        if (auto r = o.submit_aiv(1, t0); !r.ok()) return r.status();
                        TaskArgs t1;
                        t1.add_tensor(a[1].tensor, Tag::Input).add_tensor(a[2].tensor, Tag::OutputExisting);
                        if (mark_only_d) t1.dump();
                        t1.add_scalar_f32(3).add_scalar_f32(2);
                        return o.submit_aiv(1, t1).status();
                      },
                      make_kernels({{1, CoreType::AIV, "axpb", axpb_kernel}}),
                      {Param::input(), Param::output(), Param::output()});
}

TEST_P(ArgsDumpRun, EachStageHoldsTheBytesOfItsMomentAndTheHandOffIsExact) {
  Watchdog dog;
  WorkerConfig config = small_config();
  config.runtime = GetParam();
  Harness hw(two_axpb(false), config);
  constexpr int64_t n = 1000;
  std::vector<float> a(n);
  for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i) * 0.5f;
  const DeviceBuffer da = upload(hw.w, a), dc = upload(hw.w, std::vector<float>(n, -1)),
                     dd = upload(hw.w, std::vector<float>(n, -1));
  TaskArgs args;
  args.add_tensor(da.view({n}, DType::F32), Tag::Input)
      .add_tensor(dc.view({n}, DType::F32), Tag::OutputExisting)
      .add_tensor(dd.view({n}, DType::F32), Tag::OutputExisting);
  const std::string dir = scratch_dir("dump", GetParam());
  CallConfig call;
  call.trace_dir = dir;
  call.dump_args = DumpArgs::Full;
  RunHandle h = hw.w.submit(hw.h, args, call);
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  auto dump = load_args_dump(dir + "/args_dump");
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  ASSERT_EQ(dump->args.size(), 4u);  // t0: a before, c after; t1: c before, d after
  const auto find = [&](uint64_t task, DumpStage stage) -> const DumpedArg& {
    for (const DumpedArg& x : dump->args) {
      if (x.task == task && x.stage == stage) return x;
    }
    ADD_FAILURE() << "no record of task " << task << " " << dump_stage_name(stage);
    return dump->args[0];
  };
  const DumpedArg& a_in = find(0, DumpStage::kBefore);
  const DumpedArg& c_out = find(0, DumpStage::kAfter);
  const DumpedArg& c_in = find(1, DumpStage::kBefore);
  const DumpedArg& d_out = find(1, DumpStage::kAfter);
  EXPECT_EQ(a_in.kernel, "axpb");
  EXPECT_EQ(c_out.role, DumpRole::kOutput);
  EXPECT_LT(c_out.order, c_in.order);
  for (int64_t i = 0; i < n; ++i) {
    const float c = a[i] * 2 + 1;
    ASSERT_EQ(dumped_element(*dump, a_in, i), a[i]) << i;
    ASSERT_EQ(dumped_element(*dump, c_out, i), c) << i;
    ASSERT_EQ(dumped_element(*dump, c_in, i), c) << i;  // the hand-off: what t0 left is what t1 read
    ASSERT_EQ(dumped_element(*dump, d_out, i), c * 3 + 2) << i;
  }
  // Partial: only the marked argument, at its stage.
  Harness marked(two_axpb(true), config);
  const DeviceBuffer ma = upload(marked.w, a), mc = upload(marked.w, std::vector<float>(n, -1)),
                     md = upload(marked.w, std::vector<float>(n, -1));
  TaskArgs margs;
  margs.add_tensor(ma.view({n}, DType::F32), Tag::Input)
      .add_tensor(mc.view({n}, DType::F32), Tag::OutputExisting)
      .add_tensor(md.view({n}, DType::F32), Tag::OutputExisting);
  call.trace_dir = scratch_dir("dump", GetParam() + "_partial");
  call.dump_args = DumpArgs::Partial;
  RunHandle p = marked.w.submit(marked.h, margs, call);
  ASSERT_TRUE(wait_run(p).ok()) << p.result().to_string();
  auto partial = load_args_dump(call.trace_dir + "/args_dump");
  ASSERT_TRUE(partial.ok()) << partial.status().to_string();
  ASSERT_EQ(partial->args.size(), 1u);
  EXPECT_EQ(partial->args[0].task, 1u);
  EXPECT_EQ(partial->args[0].arg, 1u);
  EXPECT_EQ(partial->args[0].stage, DumpStage::kAfter);
}

// R126 (A7): the resident route passes the same exact hand-off, through Mechanism R.
INSTANTIATE_TEST_SUITE_P(Runtimes, ArgsDumpRun,
                         ::testing::Values("host_build_graph", "tensormap_and_ringbuffer", "resident"));

// A 1,000-task chain x <- x + b over two ping-pong buffers; task
// args[2] (none when out of range) adds b = 1.25 instead of 1.
ChipCallable axpb_chain(uint32_t tasks) {
  return ChipCallable("axpb_chain",
                      [tasks](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        const int64_t perturbed = static_cast<int64_t>(a[2].scalar);
                        for (uint32_t k = 0; k < tasks; ++k) {
                          TaskArgs t;
                          t.add_tensor(a[k % 2].tensor, Tag::Input)
                              .add_tensor(a[(k + 1) % 2].tensor, Tag::OutputExisting)
                              .add_scalar_f32(1)
                              .add_scalar_f32(k == perturbed ? 1.25f : 1.f);
                          if (auto r = o.submit_aiv(1, t); !r.ok()) return r.status();
                        }
                        return Status();
                      },
                      make_kernels({{1, CoreType::AIV, "axpb", axpb_kernel}}),
                      {Param::inout(), Param::inout(), Param::scalar()});
}

// The diff on real runs: two FULL dumps of the same 1,000-task chain, the
// second with one task's input perturbed, and dump diff names that task.
TEST(ArgsDumpRun, DiffNamesThePerturbedTaskOfARealThousandTaskChain) {
  Watchdog dog;
  constexpr uint32_t kTasks = 1000;
  constexpr int64_t kPerturbed = 637;
  Harness hw(axpb_chain(kTasks), small_config(2, 2048));
  constexpr int64_t n = 16;
  std::vector<std::string> dirs;
  for (int64_t perturbed : {int64_t{-1}, kPerturbed}) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
    const DeviceBuffer b0 = upload(hw.w, x), b1 = upload(hw.w, std::vector<float>(n, -1));
    TaskArgs args;
    args.add_tensor(b0.view({n}, DType::F32), Tag::InOut)
        .add_tensor(b1.view({n}, DType::F32), Tag::InOut)
        .add_scalar(perturbed);
    CallConfig call;
    call.trace_dir = scratch_dir("dump", perturbed < 0 ? "a" : "b");
    call.dump_args = DumpArgs::Full;
    RunHandle h = hw.w.submit(hw.h, args, call);
    ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
    // The run really computed the chain: 1,000 additions of 1 (and 0.25 more).
    const std::vector<float> out = download<float>(hw.w, kTasks % 2 == 0 ? b0 : b1, n);
    EXPECT_EQ(out[3], 3.f + kTasks + (perturbed < 0 ? 0.f : 0.25f));
    dirs.push_back(call.trace_dir + "/args_dump");
  }
  auto da = load_args_dump(dirs[0]);
  auto db = load_args_dump(dirs[1]);
  ASSERT_TRUE(da.ok()) << da.status().to_string();
  ASSERT_TRUE(db.ok()) << db.status().to_string();
  for (const ArgsDump* d : {&*da, &*db}) {
    EXPECT_TRUE(d->complete);
    EXPECT_EQ(d->counts.dropped, 0u);
    EXPECT_EQ(d->args.size(), size_t{2} * kTasks);  // each task's input before, output after
  }
  const DumpDifference d = diff_args_dumps(*da, *db, 0, 0);
  ASSERT_TRUE(d.differs) << d.what;
  EXPECT_EQ(d.task, static_cast<uint64_t>(kPerturbed));
  EXPECT_EQ(d.arg, 1u);
  EXPECT_EQ(d.index, (std::vector<int64_t>{0}));
  EXPECT_FLOAT_EQ(d.a, 0.f + kPerturbed + 1);
  EXPECT_FLOAT_EQ(d.b, 0.f + kPerturbed + 1.25f);
  EXPECT_TRUE(contains(d.what, "task 637")) << d.what;
  EXPECT_FALSE(diff_args_dumps(*da, *da, 0, 0).differs);
}

// tensormap_and_ringbuffer streams a run with more tasks than its window
// (max_tasks_per_run slots): the capture table, keyed by task id modulo the
// same size, wraps as the window does, and every task of a 100-task chain
// through a 16-slot window is captured once per stage with its own bytes.
TEST(ArgsDumpRun, ACaptureTableWrapsWithTheRingOfAStreamingRun) {
  Watchdog dog;
  constexpr uint32_t kTasks = 100;
  WorkerConfig config = small_config(2, 16);
  config.runtime = "tensormap_and_ringbuffer";
  Harness hw(axpb_chain(kTasks), config);
  constexpr int64_t n = 8;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  const DeviceBuffer b0 = upload(hw.w, x), b1 = upload(hw.w, std::vector<float>(n, -1));
  TaskArgs args;
  args.add_tensor(b0.view({n}, DType::F32), Tag::InOut)
      .add_tensor(b1.view({n}, DType::F32), Tag::InOut)
      .add_scalar(int64_t{-1});
  CallConfig call;
  call.trace_dir = scratch_dir("dump", "ring");
  call.dump_args = DumpArgs::Full;
  RunHandle h = hw.w.submit(hw.h, args, call);
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  auto dump = load_args_dump(call.trace_dir + "/args_dump");
  ASSERT_TRUE(dump.ok()) << dump.status().to_string();
  EXPECT_TRUE(dump->complete);
  EXPECT_EQ(dump->counts.dropped, 0u);
  ASSERT_EQ(dump->args.size(), size_t{2} * kTasks);
  std::vector<int> seen(size_t{2} * kTasks, 0);
  for (const DumpedArg& a : dump->args) {
    ASSERT_LT(a.task, kTasks);
    const bool after = a.stage == DumpStage::kAfter;
    ++seen[a.task * 2 + (after ? 1 : 0)];
    // Task k reads x + k and writes x + k + 1.
    const float expect = static_cast<float>(a.task) + (after ? 1.f : 0.f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dumped_element(*dump, a, i), expect + i) << "task " << a.task;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()));
}

// A chain of mix tasks (1 AIC + 2 AIV each) and AIV tasks: X -> mix -> (P, Q)
// -> add -> X', repeated, so every stage reads what the one before wrote.
ChipCallable mix_chain(uint32_t rounds) {
  return ChipCallable("mix_chain",
                      [rounds](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        for (uint32_t r = 0; r < rounds; ++r) {
                          TaskArgs m;
                          m.add_tensor(a[0].tensor, Tag::Input)
                              .add_tensor(a[1].tensor, Tag::Input)
                              .add_tensor(a[2].tensor, Tag::OutputExisting)
                              .add_tensor(a[3].tensor, Tag::OutputExisting)
                              .add_scalar_f32(0.5f);
                          SIMPLER_RETURN_IF_ERROR(o.submit_mix({1, 2, 3}, m).status());
                          TaskArgs add;
                          add.add_tensor(a[2].tensor, Tag::Input)
                              .add_tensor(a[3].tensor, Tag::Input)
                              .add_tensor(a[0].tensor, Tag::OutputExisting);
                          SIMPLER_RETURN_IF_ERROR(o.submit_aiv(4, add).status());
                        }
                        return Status();
                      },
                      make_kernels({{1, CoreType::AIC, "mix_aic", mix_aic_kernel},
                                    {2, CoreType::AIV, "mix_aiv0", mix_aiv0_kernel},
                                    {3, CoreType::AIV, "mix_aiv1", mix_aiv1_kernel},
                                    {4, CoreType::AIV, "add2d", add2d_kernel}}),
                      {Param::inout(), Param::inout(), Param::inout(), Param::inout()});
}

// One FULL dump of `callable` over `host` inputs on `runtime`.
Result<ArgsDump> dump_on(const std::string& runtime, ChipCallable callable,
                         const std::vector<std::pair<std::vector<float>, std::vector<int64_t>>>& host,
                         DumpArgs mode = DumpArgs::Full, std::optional<int64_t> scalar = std::nullopt) {
  WorkerConfig config = small_config(2, 1024);
  config.runtime = runtime;
  Harness hw(std::move(callable), config);
  TaskArgs args;
  for (const auto& [data, shape] : host) {
    const DeviceBuffer b = upload(hw.w, data);
    args.add_tensor(b.view(shape, DType::F32), Tag::InOut);
  }
  if (scalar) args.add_scalar(*scalar);
  CallConfig call;
  call.trace_dir = scratch_dir("dump", runtime + std::to_string(static_cast<int>(mode)));
  call.dump_args = mode;
  RunHandle h = hw.w.submit(hw.h, args, call);
  SIMPLER_RETURN_IF_ERROR(wait_run(h));
  return load_args_dump(call.trace_dir + "/args_dump");
}

// Two dumps hold the same records with the same bytes, per (task, arg, stage).
void expect_same_dump(const ArgsDump& a, const ArgsDump& b, const std::string& what) {
  EXPECT_EQ(a.complete, b.complete) << what;
  EXPECT_EQ(a.counts.total, b.counts.total) << what;
  EXPECT_EQ(a.counts.collected, b.counts.collected) << what;
  EXPECT_EQ(a.counts.dropped, b.counts.dropped) << what;
  ASSERT_EQ(a.args.size(), b.args.size()) << what;
  const auto key = [](const DumpedArg& x) { return std::make_tuple(x.task, static_cast<int>(x.stage), x.arg); };
  std::vector<const DumpedArg*> xa, xb;
  for (const DumpedArg& x : a.args) xa.push_back(&x);
  for (const DumpedArg& x : b.args) xb.push_back(&x);
  const auto by_key = [&](const DumpedArg* l, const DumpedArg* r) { return key(*l) < key(*r); };
  std::sort(xa.begin(), xa.end(), by_key);
  std::sort(xb.begin(), xb.end(), by_key);
  for (size_t i = 0; i < xa.size(); ++i) {
    const DumpedArg &p = *xa[i], &q = *xb[i];
    ASSERT_EQ(key(p), key(q)) << what << " record " << i;
    EXPECT_EQ(p.func_id, q.func_id) << what;
    EXPECT_EQ(p.kernel, q.kernel) << what;
    EXPECT_EQ(p.role, q.role) << what;
    EXPECT_EQ(p.shape, q.shape) << what;
    EXPECT_EQ(p.strides, q.strides) << what;
    EXPECT_EQ(p.bytes, q.bytes) << what;
    EXPECT_EQ(p.metadata_only, q.metadata_only) << what;
    EXPECT_EQ(p.truncated, q.truncated) << what;
    if (p.bytes == 0) continue;  // metadata only: no bytes in args.bin (which may then be empty)
    ASSERT_LE(p.bin_offset + p.bytes, a.bin.size()) << what;
    ASSERT_LE(q.bin_offset + q.bytes, b.bin.size()) << what;
    ASSERT_EQ(0, std::memcmp(a.bin.data() + p.bin_offset, b.bin.data() + q.bin_offset, p.bytes))
        << what << ": task " << p.task << " arg " << p.arg << " " << dump_stage_name(p.stage) << " differs";
  }
}

// The resident route's dump of a run equals host_build_graph's dump of the
// same run: the same records with the same bytes per task, argument and
// stage, under FULL and HYBRID (R119: the selection did not move),
// for a 200-task chain (whose capture order is forced, so `order` matches
// too) and a chain of mix tasks (one record set per mix task: R120).
TEST(ArgsDumpRun, TheResidentRoutesDumpEqualsHostBuildGraphs) {
  Watchdog dog(std::chrono::seconds(120));
  constexpr uint32_t kTasks = 200;
  constexpr int64_t n = 16;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  const std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> chain_in = {{x, {n}},
                                                                                     {std::vector<float>(n, -1), {n}}};
  auto hbg = dump_on("host_build_graph", axpb_chain(kTasks), chain_in, DumpArgs::Full, int64_t{-1});
  auto res = dump_on("resident", axpb_chain(kTasks), chain_in, DumpArgs::Full, int64_t{-1});
  ASSERT_TRUE(hbg.ok()) << hbg.status().to_string();
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_TRUE(res->complete);
  EXPECT_EQ(res->args.size(), size_t{2} * kTasks);
  expect_same_dump(*hbg, *res, "axpb chain FULL");
  // A chain orders its captures: the run's capture sequence matches too.
  for (size_t i = 0; i < res->args.size(); ++i) {
    EXPECT_EQ(res->args[i].task, hbg->args[i].task) << "capture order, record " << i;
    EXPECT_EQ(res->args[i].stage, hbg->args[i].stage) << "capture order, record " << i;
  }
  // Mix tasks, under FULL and HYBRID (HYBRID: every record metadata only, no marks).
  constexpr int64_t m = 8;
  std::vector<float> xm(m * m), w(m * m);
  for (int64_t i = 0; i < m * m; ++i) {
    xm[i] = static_cast<float>(i % 7) * 0.25f;
    w[i] = static_cast<float>(i % 5) * 0.5f;
  }
  const std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> mix_in = {
      {xm, {m, m}}, {w, {m, m}}, {std::vector<float>(m * m, 0), {m, m}}, {std::vector<float>(m * m, 0), {m, m}}};
  for (DumpArgs mode : {DumpArgs::Full, DumpArgs::Hybrid}) {
    auto a = dump_on("host_build_graph", mix_chain(6), mix_in, mode);
    auto b = dump_on("resident", mix_chain(6), mix_in, mode);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    // Per round: mix X, W before, P, Q after (one set, not three); add P, Q before, X after.
    EXPECT_EQ(b->args.size(), size_t{6} * 7);
    expect_same_dump(*a, *b, mode == DumpArgs::Full ? "mix chain FULL" : "mix chain HYBRID");
  }
}

TEST(ArgsDumpRun, ARuntimeThatCannotCaptureRefusesTheDumpNamingTheField) {
  WorkerConfig config = small_config();
  config.runtime = "reference";
  Harness hw(two_axpb(false), config);
  constexpr int64_t n = 8;
  const DeviceBuffer b = upload(hw.w, std::vector<float>(n, 1));
  TaskArgs args;
  args.add_tensor(b.view({n}, DType::F32), Tag::Input)
      .add_tensor(b.view({n}, DType::F32), Tag::OutputExisting)
      .add_tensor(b.view({n}, DType::F32), Tag::OutputExisting);
  CallConfig call;
  call.trace_dir = scratch_dir("dump", "reference");
  call.dump_args = DumpArgs::Full;
  RunHandle h = hw.w.submit(hw.h, args, call);
  EXPECT_REFUSED(h.result(), StatusCode::kUnimplemented, "dump_args");
  call.trace_dir.clear();
  EXPECT_REFUSED(hw.w.submit(hw.h, args, call).result(), StatusCode::kInvalidArgument, "trace_dir");
}

}  // namespace
}  // namespace simpler::testing
