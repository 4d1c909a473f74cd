// T12 of the reliability plan: bad input and exhaustion. A table-driven
// sweep whose point is, for every case: refused with its specific error (the
// code, and a message naming the field) before any side effect; run-resource
// accounting and device / shared-heap memory unchanged; the runtime then
// serves the next valid submit. The refusals themselves have focused tests
// (refusal_test, args_blob_test, ipc_test); this sweep checks what follows
// each. Parts, each printing `RELIABILITY T12 part=<p> cases=.. correct_refusals=.. alloc_points=..`:
//   grants:  grants 0, MAX + 1, SIZE_MAX (uint32 max where the field is
//            uint32) and a grant whose mailbox size overflows (R67, R69, R70),
//            at the chip (create, regrant), the mailbox layer and the node;
//   args:    malformed tensor arguments (R2) at the chip and the node;
//   alloc:   H2, the SQLite loop: fail the N-th run-resource or host
//            allocation of a submit (chip, node) and of a node init, N = 1,
//            2, ... until a pass completes without meeting the fault;
//   spawn:   node init with the fork server's fork or a child's fork failing,
//            or a shared mapping failing: refused naming what failed, no
//            child left, and a later init works.
// Every part ends with the health scan.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "alloc_hook.h"
#include "base/fault_hooks.h"
#include "base/load_sense.h"
#include "chip/chip_worker.h"
#include "health_scan.h"
#include "ipc/forked_child.h"
#include "ipc/mailbox_endpoint.h"
#include "ipc/mailbox_layout.h"
#include "kernels.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

constexpr uint64_t kMax = kMailboxMaxGrantedSets;
constexpr int64_t kN = 64;  // elements of the test tensors

// The cases of one part and how each went; a wrong one is a test failure
// naming the case.
struct Tally {
  int cases = 0;
  int correct = 0;
  long alloc_points = 0;

  // `got` must carry `code` and name `field`; `clean` is what the caller
  // found of side effects afterwards ("" when none).
  void refusal(const std::string& name, const Status& got, StatusCode code, const std::string& field,
               const std::string& clean) {
    ++cases;
    std::string wrong;
    if (got.code() != code) {
      wrong = fmt::format("code {} (want {})", status_code_name(got.code()), status_code_name(code));
    } else if (got.message().find(field) == std::string::npos) {
      wrong = fmt::format("the message does not name '{}'", field);
    } else if (!clean.empty()) {
      wrong = "side effect: " + clean;
    }
    if (wrong.empty()) {
      ++correct;
    } else {
      ADD_FAILURE() << "case " << name << ": " << wrong << "; got " << got.to_string();
    }
  }
  void print(const char* part) const {
    std::printf("RELIABILITY T12 part=%s cases=%d correct_refusals=%d alloc_points=%ld\n", part, cases, correct,
                alloc_points);
    std::fflush(stdout);
  }
};

// ---- a chip and a node under test ----------------------------------------------------------------

enum : uint32_t { kFill = 1, kCopy };

KernelLibrary chip_kernels() {
  return make_kernels({{kFill, CoreType::AIV, "fill", fill_kernel}, {kCopy, CoreType::AIV, "copy", copy_kernel}});
}

// "copy_via_tmp" (in: input, out: output, v: scalar): fills an intermediate
// with v (a device block of its own, so each run allocates one), then copies
// `in` to `out`.
ChipCallable copy_callable() {
  return ChipCallable("copy_via_tmp",
                      [](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                        auto tmp = o.alloc({kN}, DType::I64);
                        if (!tmp.ok()) return tmp.status();
                        TaskArgs fill;
                        fill.add_tensor(*tmp, Tag::OutputExisting).add_scalar_u64(a[2].scalar);
                        if (auto r = o.submit_aiv(kFill, fill); !r.ok()) return r.status();
                        TaskArgs copy;
                        copy.add_tensor(a[0].tensor, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                        return o.submit_aiv(kCopy, copy).status();
                      },
                      chip_kernels(), {Param::input(), Param::output(), Param::scalar()});
}

WorkerConfig chip_config(uint32_t depth = 2) {
  WorkerConfig c = small_config(depth, 64);
  c.device_memory_bytes = 64ull << 20;
  return c;
}

struct Chip {
  Chip() {
    std::vector<ChipCallable> cs;
    cs.push_back(copy_callable());
    auto w = ChipWorker::create(chip_config(), std::move(cs));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    if (!w.ok()) return;
    worker = std::move(*w);
    auto a = worker->malloc(kN * 8), b = worker->malloc(kN * 8);
    EXPECT_TRUE(a.ok() && b.ok());
    in = *a;
    out = *b;
    std::vector<int64_t> host(kN);
    for (int64_t i = 0; i < kN; ++i) host[i] = 1000 + i;
    EXPECT_TRUE(worker->copy_to(in, host.data(), kN * 8, 0).ok());
    // Warm every set (its retained args buffer and graph arena are kept
    // across runs), so the baseline is the steady state.
    for (uint32_t i = 0; i < worker->grant() + 1; ++i) EXPECT_TRUE(valid_run().empty());
    baseline = worker->memory_info().free_bytes;
  }

  TaskArgs args(const TensorView& x) const {
    TaskArgs a;
    a.add_tensor(x, Tag::Input).add_tensor(out.view({kN}, DType::I64), Tag::OutputExisting).add_scalar(7);
    return a;
  }
  TaskArgs good() const { return args(in.view({kN}, DType::I64)); }

  // "" when a valid run works and copies its input.
  std::string valid_run() {
    std::vector<int64_t> zero(kN, 0), got(kN);
    if (!worker->copy_to(out, zero.data(), kN * 8, 0).ok()) return "copy_to refused";
    const Status st = worker->submit(0, good()).wait_for(kWait);
    if (!st.ok()) return "the next valid run failed: " + st.to_string();
    if (!worker->copy_from(got.data(), out, kN * 8, 0).ok()) return "copy_from refused";
    for (int64_t i = 0; i < kN; ++i) {
      if (got[i] != 1000 + i) return fmt::format("the next valid run copied {} at {}", got[i], i);
    }
    return "";
  }

  // "" when nothing changed: the grant, every set free, no run registered,
  // device memory at its baseline, and the next valid run works.
  std::string unchanged(uint32_t grant = 2) {
    if (worker->grant() != grant) return fmt::format("grant {} (want {})", worker->grant(), grant);
    for (const auto& [name, width] : worker->owner_widths()) {
      if (width != grant) return fmt::format("{} is {} wide", name, width);
    }
    const ArenaCounts c = worker->set_counts();
    if (auto p = check_partition("chip", c, grant)) return *p;
    if (c.free != grant) return fmt::format("{} sets free of {}", c.free, grant);
    if (worker->registered_runs() != 0) return fmt::format("{} runs registered", worker->registered_runs());
    if (worker->memory_info().free_bytes != baseline) {
      return fmt::format("device free bytes {} (baseline {})", worker->memory_info().free_bytes, baseline);
    }
    if (std::string v = valid_run(); !v.empty()) return v;
    if (worker->memory_info().free_bytes != baseline) return "device memory changed after the valid run";
    return "";
  }

  std::unique_ptr<ChipWorker> worker;
  DeviceBuffer in, out;
  uint64_t baseline = 0;
};

struct Node {
  explicit Node(uint32_t chips = 1, uint32_t subs = 0) {
    NodeSpec spec;
    spec.config = node_config(chips, subs, 2);
    spec.chip_callables.push_back(copy_callable());
    auto w = NodeWorker::create(std::move(spec));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    if (!w.ok()) return;
    worker = std::move(*w);
    auto a = worker->malloc_on(0, kN * 8), b = worker->malloc_on(0, kN * 8);
    EXPECT_TRUE(a.ok() && b.ok());
    in = *a;
    out = *b;
    std::vector<int64_t> host(kN);
    for (int64_t i = 0; i < kN; ++i) host[i] = 2000 + i;
    EXPECT_TRUE(worker->copy_to(in, host.data(), kN * 8, 0).ok());
    EXPECT_TRUE(valid_run().empty());
    heap_blocks = worker->heap().live_blocks();
  }

  TaskArgs args(const TensorView& x) const {
    TaskArgs a;
    a.add_tensor(x, Tag::Input).add_tensor(out.view({kN}, DType::I64), Tag::OutputExisting).add_scalar(7);
    return a;
  }
  TaskArgs good() const { return args(in.view({kN}, DType::I64)); }
  CallableHandle copy() const { return CallableHandle{0, copy_callable().digest()}; }

  std::string valid_run() {
    std::vector<int64_t> zero(kN, 0), got(kN);
    if (!worker->copy_to(out, zero.data(), kN * 8, 0).ok()) return "copy_to refused";
    const TaskArgs a = good();
    const Status st =
        worker->submit([&](Orchestrator& o) { return o.submit_next_level(copy(), a, 0).status(); }).wait_for(kWait);
    if (!st.ok()) return "the next valid run failed: " + st.to_string();
    if (!worker->copy_from(got.data(), out, kN * 8, 0).ok()) return "copy_from refused";
    for (int64_t i = 0; i < kN; ++i) {
      if (got[i] != 2000 + i) return fmt::format("the next valid run copied {} at {}", got[i], i);
    }
    return "";
  }

  std::string unchanged() {
    if (worker->admitted_runs() != 0) return fmt::format("{} runs still admitted", worker->admitted_runs());
    const ArenaCounts c = worker->run_set_counts();
    if (auto p = check_partition("node", c, 2)) return *p;
    if (c.free != 2) return fmt::format("{} node sets free of 2", c.free);
    if (worker->heap().live_blocks() != heap_blocks) {
      return fmt::format("{} shared-heap blocks live (baseline {})", worker->heap().live_blocks(), heap_blocks);
    }
    return valid_run();
  }

  std::unique_ptr<NodeWorker> worker;
  DeviceBuffer in, out;
  uint64_t heap_blocks = 0;
};

// The result of `fn`, with any exception that escapes it as an error of its
// own (an escaping exception is never a correct refusal).
template <typename F>
Status no_throw(F&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("an exception escaped: ") + e.what());
  }
}

// ---- part: grants ----------------------------------------------------------------------------------

// R67, R69, R70: grants 0, MAX + 1, SIZE_MAX and one whose mailbox size
// overflows, wherever a grant is taken.
TEST(BadInput, T12Grants) {
  Watchdog dog;
  HealthScan scan;
  Tally t;
  {
    Chip chip;
    ASSERT_NE(chip.worker, nullptr);
    // A live chip regranted (R25's two-phase regrant): refused before it
    // builds anything, so a huge grant never reaches a host allocation.
    for (const uint64_t g : {uint64_t{0}, kMax + 1, uint64_t{UINT32_MAX}}) {
      const Status st = no_throw([&] { return chip.worker->set_run_resource_grant(static_cast<uint32_t>(g)); });
      t.refusal(fmt::format("chip regrant {}", g), st,
                g == 0 ? StatusCode::kInvalidArgument : StatusCode::kResourceExhausted, "pipeline_depth",
                chip.unchanged());
    }
    // A chip created at those depths, and at a depth whose graph arenas
    // overflow 64 bits (the largest graph, 2^24 tasks).
    const int threads = thread_count();
    struct Create {
      uint32_t depth;
      uint32_t max_tasks;
      StatusCode code;
      const char* field;
    };
    for (const Create& c :
         {Create{0, 64, StatusCode::kInvalidArgument, "pipeline_depth"},
          Create{static_cast<uint32_t>(kMax + 1), 64, StatusCode::kResourceExhausted, "pipeline_depth"},
          Create{UINT32_MAX, 64, StatusCode::kResourceExhausted, "pipeline_depth"},
          Create{UINT32_MAX, 1u << 24, StatusCode::kResourceExhausted, "pipeline_depth"}}) {
      WorkerConfig cfg = chip_config(c.depth);
      cfg.max_tasks_per_run = c.max_tasks;
      std::vector<ChipCallable> cs;
      cs.push_back(copy_callable());
      const Status st = no_throw([&] { return ChipWorker::create(cfg, std::move(cs)).status(); });
      std::string clean = settled_thread_count(threads) == threads ? "" : "a refused create left threads behind";
      if (clean.empty()) clean = chip.unchanged();
      t.refusal(fmt::format("chip create depth {} max_tasks {}", c.depth, c.max_tasks), st, c.code, c.field, clean);
    }
  }
  // The mailbox layer: the size function, attaching a view and registering
  // an endpoint over a canary-filled region, which must stay untouched.
  {
    const size_t region = mailbox_size(2).value();
    std::vector<uint8_t> canary(region + 64, 0xa5);
    void* base = canary.data() + (64 - reinterpret_cast<uintptr_t>(canary.data()) % 64) % 64;
    const std::vector<uint8_t> before = canary;
    const uint64_t overflowing = SIZE_MAX / kMailboxEntryStride;  // (G + K) x S overflows size_t
    for (const uint64_t g : {uint64_t{0}, kMax + 1, uint64_t{SIZE_MAX}, overflowing}) {
      const std::string touched = canary == before ? "" : "the region was written";
      t.refusal(fmt::format("mailbox_size {}", g), mailbox_size(g).status(), StatusCode::kOutOfRange,
                fmt::format("grant {}", g), "");
      t.refusal(fmt::format("attach {}", g), MailboxView::attach(base, SIZE_MAX, g).status(), StatusCode::kOutOfRange,
                fmt::format("grant {}", g), "");
      const Status ep = no_throw([&] { return MailboxEndpoint::create(base, SIZE_MAX, g).status(); });
      t.refusal(fmt::format("endpoint {}", g), ep, StatusCode::kOutOfRange, fmt::format("grant {}", g),
                canary == before ? "" : "the canary-filled region was written");
      const Status mapped = no_throw([&] { return ForkedChild::map_mailbox(g).status(); });
      t.refusal(fmt::format("map_mailbox {}", g), mapped, StatusCode::kOutOfRange, fmt::format("grant {}", g), touched);
    }
    // The cap itself is representable and computed without overflow.
    EXPECT_EQ(mailbox_size(kMax).value(), kMailboxEntriesOffset + (kMax + kMailboxRequestFrames) * kMailboxEntryStride);
  }
  // A node: refused at validation, before it maps or forks anything (the
  // health scan below finds no child; each is checked against one that works).
  {
    const int threads = thread_count();
    for (const uint64_t g : {uint64_t{0}, kMax, kMax + 1, uint64_t{UINT32_MAX}}) {
      NodeSpec spec;
      spec.config = node_config(1, 1, static_cast<uint32_t>(g));
      spec.chip_callables.push_back(copy_callable());
      HealthScan node_scan;
      const Status st = no_throw([&] { return NodeWorker::create(std::move(spec)).status(); });
      std::string clean;
      for (const std::string& p : node_scan.problems()) clean += p + "; ";
      if (settled_thread_count(threads) != threads) clean += "threads left behind";
      t.refusal(fmt::format("node depth {}", g), st,
                g == 0 ? StatusCode::kInvalidArgument
                       : (g == kMax ? StatusCode::kResourceExhausted : StatusCode::kOutOfRange),
                "pipeline_depth", clean);
    }
    Node node;
    ASSERT_NE(node.worker, nullptr);
    EXPECT_EQ(node.unchanged(), "");
  }
  t.print("grants");
  EXPECT_EQ(t.correct, t.cases);
  scan.expect_clean();
}

// ---- part: args --------------------------------------------------------------------------------------

// One malformed argument list: built from the valid input tensor `x` of the
// chip or node under test, with the code and field its refusal must carry.
struct ArgsCase {
  const char* name;
  std::function<TaskArgs(const DeviceBuffer& in, const std::function<TaskArgs(const TensorView&)>& with)> build;
  StatusCode code;
  const char* field;
};

TensorView parts(DeviceBuffer b, DType dt, std::vector<int64_t> shape, std::vector<int64_t> stride,
                 int64_t offset = 0) {
  return TensorView::from_parts(b, dt, static_cast<int>(shape.size()), shape.data(), stride.data(), offset);
}

std::vector<ArgsCase> args_cases() {
  using W = std::function<TaskArgs(const TensorView&)>;
  return {
      {"negative shape", [](const DeviceBuffer& b, const W& w) { return w(b.view({-1}, DType::I64)); },
       StatusCode::kInvalidArgument, "shape[0]"},
      {"shape whose element count overflows",
       [](const DeviceBuffer& b, const W& w) {
         return w(parts(b, DType::I64, {int64_t{1} << 32, int64_t{1} << 32}, {int64_t{1} << 32, 1}));
       },
       StatusCode::kInvalidArgument, "element count"},
      {"shape past int64", [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::I64, {INT64_MAX}, {1})); },
       StatusCode::kInvalidArgument, "shape[0]"},
      {"stride past the buffer", [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::I64, {kN}, {2})); },
       StatusCode::kOutOfRange, "buffer has 512 bytes"},
      {"stride whose reach overflows",
       [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::I64, {2}, {INT64_MAX})); },
       StatusCode::kInvalidArgument, "stride[0]"},
      {"negative stride before the buffer",
       [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::I64, {kN}, {-1})); }, StatusCode::kOutOfRange,
       "before its buffer"},
      {"negative offset", [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::I64, {kN}, {1}, -1)); },
       StatusCode::kInvalidArgument, "offset -1"},
      {"offset past the buffer",
       [](const DeviceBuffer& b, const W& w) { return w(TensorView(b, {kN}, DType::I64, 1)); }, StatusCode::kOutOfRange,
       "buffer has 512 bytes"},
      {"null pointer with size > 0",
       [](const DeviceBuffer&, const W& w) {
         return w(DeviceBuffer{0, kN * 8}.view({kN}, DType::I64));
       },
       StatusCode::kInvalidArgument, "needs a device buffer"},
      {"buffer that wraps the address space",
       [](const DeviceBuffer&, const W& w) {
         return w(DeviceBuffer{UINT64_MAX - 64, kN * 8}.view({kN}, DType::I64));
       },
       StatusCode::kOutOfRange, "wraps the address space"},
      {"buffer larger than its allocation",
       [](const DeviceBuffer& b, const W& w) {
         return w(DeviceBuffer{b.addr, 1 << 20}.view({kN}, DType::I64));
       },
       StatusCode::kOutOfRange, "args[0]"},
      {"unknown dtype",
       [](const DeviceBuffer& b, const W& w) { return w(parts(b, static_cast<DType>(200), {kN}, {1})); },
       StatusCode::kInvalidArgument, "dtype 200"},
      {"dtype kCount", [](const DeviceBuffer& b, const W& w) { return w(parts(b, DType::kCount, {kN}, {1})); },
       StatusCode::kInvalidArgument, "not a valid DType"},
      {"unknown tag",
       [](const DeviceBuffer& b, const W& w) {
         TaskArgs a = w(b.view({kN}, DType::I64));
         a[0].tag = static_cast<Tag>(77);
         return a;
       },
       StatusCode::kInvalidArgument, "tag 77"},
      {"unknown kind",
       [](const DeviceBuffer& b, const W& w) {
         TaskArgs a = w(b.view({kN}, DType::I64));
         a[0].kind = static_cast<TaskArg::Kind>(9);
         return a;
       },
       StatusCode::kInvalidArgument, "unknown argument kind"},
      {"arg count over capacity (blob over capacity)",
       [](const DeviceBuffer& b, const W& w) {
         TaskArgs a = w(b.view({kN}, DType::I64));
         while (a.size() <= kMaxTaskArgs) a.add_scalar(1);
         return a;
       },
       StatusCode::kInvalidArgument, "exceed the limit of 32"},
  };
}

// R2: every malformed argument is refused at the chip (ChipWorker::submit,
// the path of Worker::submit) and at the node (a next-level task), and the
// runtime goes on serving.
TEST(BadInput, T12Args) {
  Watchdog dog;
  HealthScan scan;
  Tally t;
  {
    Chip chip;
    ASSERT_NE(chip.worker, nullptr);
    for (const ArgsCase& c : args_cases()) {
      const TaskArgs a = c.build(chip.in, [&](const TensorView& x) { return chip.args(x); });
      const Status st = no_throw([&] { return chip.worker->submit(0, a).wait_for(kWait); });
      t.refusal(fmt::format("chip: {}", c.name), st, c.code, c.field, chip.unchanged());
    }
    // The decoder's side of the blob capacity (the form in which arguments
    // cross a mailbox): a header claiming more records than fit is refused
    // before anything is read past it.
    std::vector<uint8_t> blob;
    ASSERT_TRUE(encode_args_blob(chip.good(), blob).ok());
    ArgsBlobHeader h;
    std::memcpy(&h, blob.data(), sizeof h);
    h.count = kMaxTaskArgs + 1;
    h.total_bytes = static_cast<uint32_t>(args_blob_size(kMaxTaskArgs + 1));
    std::memcpy(blob.data(), &h, sizeof h);
    blob.resize(h.total_bytes);
    t.refusal("decode: blob over capacity", decode_args_blob(blob.data(), blob.size()).status(),
              StatusCode::kInvalidArgument, "count", "");
  }
  {
    Node node;
    ASSERT_NE(node.worker, nullptr);
    for (const ArgsCase& c : args_cases()) {
      const TaskArgs a = c.build(node.in, [&](const TensorView& x) { return node.args(x); });
      Status inner;
      const Status st = no_throw([&] {
        return node.worker
            ->submit([&](Orchestrator& o) {
              inner = o.submit_next_level(node.copy(), a, 0).status();
              return inner;
            })
            .wait_for(kWait);
      });
      std::string clean = node.unchanged();
      if (clean.empty() && !(inner == st)) clean = "the run's error is not the refusal's: " + inner.to_string();
      // At the node a device buffer is named by its node address, so a
      // buffer outside any allocation is refused as such.
      const bool foreign = std::string(c.name) == "buffer larger than its allocation";
      t.refusal(fmt::format("node: {}", c.name), st, foreign ? StatusCode::kInvalidArgument : c.code,
                foreign ? "argument 0" : c.field, clean);
    }
  }
  t.print("args");
  EXPECT_EQ(t.correct, t.cases);
  scan.expect_clean();
}

// ---- part: alloc (H2) --------------------------------------------------------------------------------

// The SQLite loop over one operation: for N = 1, 2, ... the N-th allocation
// point of this thread fails; `op` must then return RESOURCE_EXHAUSTED or,
// when the fault met a run-resource set (the submit waits for a set), succeed;
// `after` checks that nothing changed. Ends at the first N the operation
// passes without meeting the fault. Returns the points covered.
long sqlite_loop(const char* what, Tally& t, const std::function<Status()>& op,
                 const std::function<std::string()>& after, long max_n = 5000) {
  long n = 1;
  for (;; ++n) {
    hooks::arm_alloc_fault(n);
    const Status st = no_throw(op);
    const char* site = hooks::alloc_fault_site();
    (void)hooks::disarm_alloc_fault();
    if (site == nullptr) {
      EXPECT_TRUE(st.ok()) << what << ": with no fault met the operation failed: " << st.to_string();
      break;
    }
    const std::string clean = after();
    const std::string name = fmt::format("{}: point {} ({})", what, n, site);
    if (st.ok() && std::string(site) == "run-resource set" && clean.empty()) {
      ++t.cases;  // documented: a submit waits for a set, so a missing one is waited for
      ++t.correct;
    } else {
      t.refusal(name, st, StatusCode::kResourceExhausted, "", clean);
    }
    if (n >= max_n) {
      ADD_FAILURE() << what << ": still meeting the fault at point " << n;
      break;
    }
  }
  t.alloc_points += n - 1;
  std::printf("%s: %ld allocation points\n", what, n - 1);
  return n - 1;
}

TEST(BadInput, T12AllocationFaults) {
  Watchdog dog(std::chrono::seconds(120));
  HealthScan scan;
  Tally t;
  {
    Chip chip;
    ASSERT_NE(chip.worker, nullptr);
    const TaskArgs good = chip.good();
    const long points = sqlite_loop(
        "chip submit", t, [&] { return chip.worker->submit(0, good).wait_for(kWait); },
        [&] { return chip.unchanged(); });
    EXPECT_GT(points, 10) << "a chip submit should meet several allocation points";
  }
  {
    Node node;
    ASSERT_NE(node.worker, nullptr);
    const TaskArgs good = node.good();
    const long points = sqlite_loop(
        "node submit", t,
        [&] {
          return node.worker
              ->submit([&](Orchestrator& o) -> Status {
                auto tmp = o.alloc({kN}, DType::I64);  // a shared-heap block
                if (!tmp.ok()) return tmp.status();
                return o.submit_next_level(node.copy(), good, 0).status();
              })
              .wait_for(kWait);
        },
        [&] { return node.unchanged(); });
    EXPECT_GT(points, 10) << "a node submit should meet several allocation points";
  }
  t.print("alloc");
  EXPECT_EQ(t.correct, t.cases);
  scan.expect_clean();
}

// A wait asks who else is runnable (LoadSense::others_runnable) from inside
// whatever operation it waits in. Those allocations are not the operation's:
// a fault armed for the operation is not met there, and nothing the ask
// opened stays open. (Before: met there, the ask threw out of the wait and
// left /proc open, and an init refused at that point leaked a descriptor.)
TEST(BadInput, T12ALoadCheckInsideAWaitIsNotTheWaitersAllocation) {
  Watchdog dog;
  const size_t fds = open_fd_count();
  LoadSense sense;
  sense.note_fork_server(static_cast<int32_t>(getppid()), static_cast<int32_t>(getpid()));
  for (long n = 1; n <= 3; ++n) {
    hooks::arm_alloc_fault(n);
    (void)sense.others_runnable();
    const char* site = hooks::alloc_fault_site();
    (void)hooks::disarm_alloc_fault();
    EXPECT_EQ(site, nullptr) << "allocation " << n << " of the ask met the caller's fault at " << site;
  }
  EXPECT_EQ(open_fd_count(), fds);
}

// H2 over a whole init, through the public Worker: a chip, and a node of two
// chips (shared heap, mailboxes, fork server, children). Every point must
// refuse with RESOURCE_EXHAUSTED, never throw; dropping the refused Worker
// must leave no process behind; the last pass, meeting no fault, starts it.
TEST(BadInput, T12InitAllocationFaults) {
  Watchdog dog(std::chrono::seconds(240));
  HealthScan scan;
  Tally t;
  for (const Level level : {Level::Chip, Level::Node}) {
    std::unique_ptr<Worker> w;
    // Built before the loop arms H2: only init() meets the fault.
    auto fresh = [&] {
      w = std::make_unique<Worker>(level, level == Level::Chip ? chip_config() : node_config(2, 0, 2));
      (void)w->register_callable(copy_callable());
    };
    fresh();
    const char* what = level == Level::Chip ? "chip init" : "node init";
    const long points = sqlite_loop(
        what, t, [&] { return w->init(); },
        [&] {
          w.reset();
          std::string left;
          if (!eventually([] { return descendants_of(getpid()).empty(); })) {
            for (const pid_t pid : descendants_of(getpid())) left += fmt::format("{} ({}) ", comm_of(pid), pid);
            left += "outlived the refused init";
          }
          fresh();
          return left;
        });
    EXPECT_GT(points, 10) << what << " should meet several allocation points";
    EXPECT_TRUE(w->close().ok());
  }
  t.print("init");
  EXPECT_EQ(t.correct, t.cases);
  scan.expect_clean();
}

// ---- part: spawn ------------------------------------------------------------------------------------

// A node of two chips whose init meets a failing fork: the fork server's own
// (fork 1), the first chip's (2), the second's (3, with the first chip up).
// Init is refused naming what failed, no child is left, and a later init works.
TEST(BadInput, T12ForkFailures) {
  Watchdog dog;
  HealthScan scan;
  Tally t;
  const char* named[] = {"fork server: fork failed", "chip worker 0: the fork server could not fork",
                         "chip worker 1: the fork server could not fork"};
  for (long n = 1; n <= 3; ++n) {
    NodeSpec spec;
    spec.config = node_config(2, 0, 2);
    spec.chip_callables.push_back(copy_callable());
    HealthScan init_scan;
    hooks::arm_fork_fault(n);
    const Status st = no_throw([&] { return NodeWorker::create(std::move(spec)).status(); });
    hooks::arm_fork_fault(0);
    std::string clean;
    for (const std::string& p : init_scan.problems()) clean += p + "; ";
    if (clean.empty()) {
      Node node;
      clean = node.worker == nullptr ? "a later init failed" : node.unchanged();
    }
    t.refusal(fmt::format("node init, fork {} fails", n), st, StatusCode::kResourceExhausted, named[n - 1], clean);
  }
  t.print("spawn");
  EXPECT_EQ(t.correct, t.cases);
  scan.expect_clean();
}

}  // namespace
}  // namespace simpler::testing
