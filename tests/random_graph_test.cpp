// The conformance suite's oracle test (issue 8): seeded random graphs (random
// tile shapes, overlapping views of shared buffers and of sub-buffers, random
// tags, AIC/AIV/mix tasks, runtime-allocated outputs, scoped intermediates,
// failing kernels and refused submits) run on every runtime and geometry
// must leave every caller buffer bit-identical to the reference runtime's,
// with the same terminal status (code and text) and the same run stats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "conformance.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

// ---- The kernel -------------------------------------------------------------------------------
//
// args[0]: each tensor argument's role, 2 bits each, in argument order;
// args[1]: salt (bits 0-31), tensor count (32-39), fail flag (40), failing part (41-42);
// args[2...]: the tensor arguments. A mix task's part k writes the rows r with
// r % 3 == k of every tensor it writes, so its three parts touch disjoint bytes.
enum Role : uint64_t { kRead = 0, kWrite = 1, kReadWrite = 2, kIgnore = 3 };

uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 31);
}

template <typename Fn>
void for_each_element(const DeviceTensor* t, Fn&& fn) {
  const int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
  const int64_t cols = t->shape[t->ndim - 1];
  const int64_t rs = t->ndim == 2 ? t->stride[0] : 0;
  const int64_t cs = t->stride[t->ndim - 1];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) fn(r, c, tensor_data<int64_t>(t)[r * rs + c * cs]);
  }
}

void random_kernel(int64_t* args, uint64_t part, uint64_t parts) {
  const auto roles = static_cast<uint64_t>(args[0]);
  const auto word = static_cast<uint64_t>(args[1]);
  const uint64_t salt = word & 0xffffffffull;
  const auto tensors = static_cast<int>((word >> 32) & 0xff);
  uint64_t h = mix64(salt, 0);  // every part of a mix task derives the same digest
  for (int i = 0; i < tensors; ++i) {
    if (((roles >> (2 * i)) & 3) != kRead) continue;
    for_each_element(tensor_arg(args, 2 + i),
                     [&](int64_t, int64_t, int64_t& v) { h = mix64(h, static_cast<uint64_t>(v)); });
  }
  for (int i = 0; i < tensors; ++i) {
    const uint64_t role = (roles >> (2 * i)) & 3;
    if (role != kWrite && role != kReadWrite) continue;
    for_each_element(tensor_arg(args, 2 + i), [&](int64_t r, int64_t c, int64_t& v) {
      if (static_cast<uint64_t>(r) % parts != part) return;
      const uint64_t old = role == kReadWrite ? static_cast<uint64_t>(v) : 0;
      v = static_cast<int64_t>(mix64(mix64(h, old), static_cast<uint64_t>(r * 1000 + c)) >> 4);
    });
  }
  if (((word >> 40) & 1) != 0 && ((word >> 41) & 3) == part) {
    const std::string m =
        "random kernel with salt " + std::to_string(salt) + " fails (part " + std::to_string(part) + ")";
    simpler_kernel_fail(m.c_str());
  }
}

extern "C" void random_kernel_single(int64_t* args) { random_kernel(args, 0, 1); }
extern "C" void random_kernel_mix0(int64_t* args) { random_kernel(args, 0, 3); }
extern "C" void random_kernel_mix1(int64_t* args) { random_kernel(args, 1, 3); }
extern "C" void random_kernel_mix2(int64_t* args) { random_kernel(args, 2, 3); }

// Holds its task until the test opens it (bounded), so that several runs hold their sets at once.
std::atomic<bool> g_hold_open{false};
extern "C" void hold_kernel(int64_t*) {
  if (!eventually([] { return g_hold_open.load(); })) simpler_kernel_fail("hold_kernel: never opened");
}

enum : uint32_t { kAicFn = 1, kAivFn, kMix0Fn, kMix1Fn, kMix2Fn, kHoldFn, kUnknownFn = 999 };

// ---- Graphs -----------------------------------------------------------------------------------

// A 2-D i64 tensor: a caller buffer (id < buffers) or an intermediate.
struct Shape2 {
  int64_t rows;
  int64_t cols;
};

// A window of tensor `id`: a 2-D tile, a 1-D piece of one row, or a tile of
// the rows [r0, r0 + nr) taken as a DeviceBuffer of their own (a sub-buffer
// of the allocation, which must still meet views of the whole buffer).
struct ViewSpec {
  int id = 0;
  int64_t r0 = 0, c0 = 0, nr = 1, nc = 1;
  enum Form { kTile, kRow, kSubBuffer } form = kTile;
};

struct ArgSpec {
  ViewSpec view;
  Tag tag = Tag::Input;
  bool unbound = false;  // a runtime-allocated output of view.nr x view.nc; becomes tensor `creates`
  int creates = -1;
};

enum class Core { kAiv, kAic, kMix };

struct Op {
  enum Kind { kTask, kScopeBegin, kScopeEnd, kAlloc, kBadSubmit } kind = kTask;
  Core core = Core::kAiv;
  std::vector<ArgSpec> args;
  uint32_t salt = 0;
  bool fail = false;
  uint32_t fail_part = 0;
  int alloc_id = -1;  // kAlloc: the intermediate it creates
  Shape2 alloc_shape{};

  static Op of(Kind k) {
    Op op;
    op.kind = k;
    return op;
  }
};

struct Graph {
  std::vector<Shape2> buffers;
  std::vector<std::vector<int64_t>> initial;
  std::vector<Shape2> tensors;  // buffers, then intermediates by id
  std::vector<Op> ops;
};

class GraphGen {
 public:
  explicit GraphGen(uint32_t seed) : rng_(seed) {}

  Graph make() {
    Graph g;
    const int nbuf = pick(1, 4);
    for (int b = 0; b < nbuf; ++b) {
      g.buffers.push_back({pick(1, 12), pick(1, 12)});
      std::vector<int64_t> init(static_cast<size_t>(g.buffers.back().rows * g.buffers.back().cols));
      for (auto& v : init) v = static_cast<int64_t>(rng_());
      g.initial.push_back(std::move(init));
    }
    g.tensors = g.buffers;
    live_.assign(g.tensors.size(), true);
    const bool failing_graph = chance(0.3);
    const int ntasks = pick(1, 60);
    std::vector<std::vector<int>> scopes;  // intermediates made in each open scope
    for (int t = 0; t < ntasks; ++t) {
      if (chance(0.08)) {
        g.ops.push_back(Op::of(Op::kScopeBegin));
        scopes.emplace_back();
      } else if (!scopes.empty() && chance(0.1)) {
        g.ops.push_back(Op::of(Op::kScopeEnd));
        for (int id : scopes.back()) live_[id] = false;  // released at scope end: never named again
        scopes.pop_back();
      }
      if (chance(0.1)) {
        // An intermediate from alloc(), written whole by its first task before any read.
        Op a = Op::of(Op::kAlloc);
        a.alloc_id = static_cast<int>(g.tensors.size());
        a.alloc_shape = {pick(1, 8), pick(1, 8)};
        g.tensors.push_back(a.alloc_shape);
        live_.push_back(true);
        if (!scopes.empty()) scopes.back().push_back(a.alloc_id);
        g.ops.push_back(a);
        Op w = Op::of(Op::kTask);
        w.core = Core::kAiv;
        w.salt = static_cast<uint32_t>(rng_());
        w.args.push_back(
            ArgSpec{ViewSpec{a.alloc_id, 0, 0, a.alloc_shape.rows, a.alloc_shape.cols}, Tag::OutputExisting});
        g.ops.push_back(w);
      }
      if (chance(0.02)) {
        g.ops.push_back(Op::of(Op::kBadSubmit));
        continue;
      }
      g.ops.push_back(task(g, failing_graph, scopes));
    }
    return g;
  }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  ViewSpec view_of(const Graph& g, int id) {
    const Shape2 s = g.tensors[id];
    ViewSpec v;
    v.id = id;
    v.r0 = pick(0, s.rows - 1);
    v.c0 = pick(0, s.cols - 1);
    const int form = static_cast<int>(pick(0, 9));
    v.form = form < 6 ? ViewSpec::kTile : form < 8 ? ViewSpec::kRow : ViewSpec::kSubBuffer;
    v.nr = v.form == ViewSpec::kRow ? 1 : pick(1, s.rows - v.r0);
    v.nc = pick(1, s.cols - v.c0);
    return v;
  }

  // Element ranges [first, last] of two views of one tensor intersect (a
  // conservative test: within one task the generator keeps every pair apart).
  static bool may_touch(const Graph& g, const ViewSpec& a, const ViewSpec& b) {
    if (a.id != b.id) return false;
    const int64_t cols = g.tensors[a.id].cols;
    const int64_t a0 = a.r0 * cols + a.c0, a1 = (a.r0 + a.nr - 1) * cols + a.c0 + a.nc - 1;
    const int64_t b0 = b.r0 * cols + b.c0, b1 = (b.r0 + b.nr - 1) * cols + b.c0 + b.nc - 1;
    return a0 <= b1 && b0 <= a1;
  }

  Op task(Graph& g, bool failing_graph, std::vector<std::vector<int>>& scopes) {
    Op op = Op::of(Op::kTask);
    const int k = static_cast<int>(pick(0, 9));
    op.core = k < 5 ? Core::kAiv : k < 8 ? Core::kAic : Core::kMix;
    op.salt = static_cast<uint32_t>(rng_());
    op.fail = failing_graph && chance(0.12);
    op.fail_part = op.core == Core::kMix ? static_cast<uint32_t>(pick(0, 2)) : 0;
    const int nargs = static_cast<int>(pick(1, 5));
    for (int tries = 0; tries < 12 && static_cast<int>(op.args.size()) < nargs; ++tries) {
      if (chance(0.08)) {
        ArgSpec out;
        out.unbound = true;
        out.tag = Tag::Output;
        out.creates = static_cast<int>(g.tensors.size());
        out.view = ViewSpec{out.creates, 0, 0, pick(1, 6), pick(1, 6)};
        g.tensors.push_back({out.view.nr, out.view.nc});
        live_.push_back(true);
        if (!scopes.empty()) scopes.back().push_back(out.creates);  // runtime outputs join the open scope
        op.args.push_back(out);
        continue;
      }
      std::vector<int> candidates;
      for (int id = 0; id < static_cast<int>(g.tensors.size()); ++id) {
        if (live_[id] && !created_by(op, id)) candidates.push_back(id);
      }
      const int id = candidates[static_cast<size_t>(pick(0, static_cast<int64_t>(candidates.size()) - 1))];
      ViewSpec v = view_of(g, id);
      bool clash = false;
      for (const ArgSpec& a : op.args) clash = clash || may_touch(g, a.view, v);
      if (clash) continue;
      static constexpr Tag kTags[] = {Tag::Input, Tag::Input, Tag::InOut, Tag::OutputExisting, Tag::NoDep};
      op.args.push_back(ArgSpec{v, kTags[pick(0, 4)]});
    }
    return op;
  }

  static bool created_by(const Op& op, int id) {
    for (const ArgSpec& a : op.args) {
      if (a.creates == id) return true;
    }
    return false;
  }

  std::mt19937_64 rng_;
  std::vector<bool> live_;
};

// ---- Running a graph --------------------------------------------------------------------------

struct Outcome {
  Status status;
  RunStats stats;
  std::vector<std::vector<int64_t>> buffers;
};

// The orchestration of every graph: interprets the ops of the graph it is handed.
Status orchestrate(ChipOrchestrator& o, const Graph& g, const std::vector<DeviceBuffer>& buffers) {
  std::map<int, TensorView> whole;  // tensor id -> a view of all of it
  for (size_t b = 0; b < buffers.size(); ++b) {
    whole[static_cast<int>(b)] = buffers[b].view({g.buffers[b].rows, g.buffers[b].cols}, DType::I64);
  }
  auto view = [&](const ViewSpec& v) -> TensorView {
    const TensorView& w = whole.at(v.id);
    const int64_t cols = g.tensors[v.id].cols;
    switch (v.form) {
      case ViewSpec::kRow:
        return TensorView(w.buffer(), {v.nc}, DType::I64, w.offset() + v.r0 * cols + v.c0);
      case ViewSpec::kSubBuffer: {
        const DeviceBuffer rows{w.buffer().addr + static_cast<uint64_t>((w.offset() + v.r0 * cols) * 8),
                                static_cast<uint64_t>(v.nr * cols * 8)};
        return *rows.view({v.nr, cols}, DType::I64).tile({0, v.c0}, {v.nr, v.nc});
      }
      case ViewSpec::kTile:
        break;
    }
    return *w.tile({v.r0, v.c0}, {v.nr, v.nc});
  };
  for (const Op& op : g.ops) {
    switch (op.kind) {
      case Op::kScopeBegin:
        o.scope_begin();
        continue;
      case Op::kScopeEnd:
        (void)o.scope_end();
        continue;
      case Op::kAlloc: {
        auto t = o.alloc({op.alloc_shape.rows, op.alloc_shape.cols}, DType::I64);
        if (!t.ok()) return t.status();
        whole[op.alloc_id] = *t;
        continue;
      }
      case Op::kBadSubmit:
        (void)o.submit_aiv(kUnknownFn, TaskArgs{});  // refused; recorded as the run's first error
        continue;
      case Op::kTask:
        break;
    }
    TaskArgs a;
    uint64_t roles = 0;
    a.add_scalar(0).add_scalar(0);
    for (size_t i = 0; i < op.args.size(); ++i) {
      const ArgSpec& s = op.args[i];
      const uint64_t role = s.tag == Tag::Input   ? kRead
                            : s.tag == Tag::InOut ? kReadWrite
                            : s.tag == Tag::NoDep ? kIgnore
                                                  : kWrite;
      roles |= role << (2 * i);
      if (s.unbound) {
        a.add_output({s.view.nr, s.view.nc}, DType::I64);
      } else {
        a.add_tensor(view(s.view), s.tag);
      }
    }
    a[0].scalar = roles;
    a[1].scalar =
        uint64_t{op.salt} | uint64_t{op.args.size()} << 32 | uint64_t{op.fail} << 40 | uint64_t{op.fail_part} << 41;
    Result<TaskRef> r = op.core == Core::kAiv   ? o.submit_aiv(kAivFn, a)
                        : op.core == Core::kAic ? o.submit_aic(kAicFn, a)
                                                : o.submit_mix({kMix0Fn, kMix1Fn, kMix2Fn}, a);
    if (!r.ok()) continue;  // recorded as the run's first error; the rest is submitted (and aborted) too
    size_t out = 0;
    for (const ArgSpec& s : op.args) {
      if (s.unbound) whole[s.creates] = r->outputs[out++];
    }
  }
  return Status();
}

// The run's graph and buffers travel in its two scalar arguments: a
// streaming runtime runs the orchestration after submit returned, so it must
// not read anything the test thread changes for the next run.
TaskArgs graph_args(const Graph& g, const std::vector<DeviceBuffer>& buffers) {
  TaskArgs a;
  a.add_scalar(reinterpret_cast<uint64_t>(&g)).add_scalar(reinterpret_cast<uint64_t>(&buffers));
  return a;
}

ChipCallable random_callable() {
  KernelLibrary k;
  EXPECT_TRUE(k.add_function(kAicFn, CoreType::AIC, "random_aic", random_kernel_single).ok());
  EXPECT_TRUE(k.add_function(kAivFn, CoreType::AIV, "random_aiv", random_kernel_single).ok());
  EXPECT_TRUE(k.add_function(kMix0Fn, CoreType::AIC, "random_mix0", random_kernel_mix0).ok());
  EXPECT_TRUE(k.add_function(kMix1Fn, CoreType::AIV, "random_mix1", random_kernel_mix1).ok());
  EXPECT_TRUE(k.add_function(kMix2Fn, CoreType::AIV, "random_mix2", random_kernel_mix2).ok());
  EXPECT_TRUE(k.add_function(kHoldFn, CoreType::AIV, "hold", hold_kernel).ok());
  return ChipCallable("random_graph",
                      [](ChipOrchestrator& o, const TaskArgs& a) {
                        return orchestrate(o, *reinterpret_cast<const Graph*>(a[0].scalar),
                                           *reinterpret_cast<const std::vector<DeviceBuffer>*>(a[1].scalar));
                      },
                      k, {Param::scalar(), Param::scalar()});
}

// One Worker for a target; runs graphs one after another, or a batch in flight together.
class GraphRunner {
 public:
  explicit GraphRunner(WorkerConfig config) : w_(Level::Chip, config) {
    auto h = w_.register_callable(random_callable());
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) h_ = *h;
    auto hold = w_.register_callable(ChipCallable(
        "hold", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(kHoldFn, TaskArgs{}).status(); },
        random_callable().kernels(), {}));
    EXPECT_TRUE(hold.ok()) << hold.status().to_string();
    if (hold.ok()) hold_ = *hold;
    Status s = w_.init();
    EXPECT_TRUE(s.ok()) << s.to_string();
  }

  // Runs `depth` runs that each hold a set at one moment, so every set has
  // set up what it keeps across runs (its graph arena): afterwards device
  // memory is in its steady state.
  void occupy_every_set(uint32_t depth) {
    g_hold_open = false;
    std::vector<RunHandle> held;
    for (uint32_t i = 0; i < depth; ++i) held.push_back(w_.submit(hold_, TaskArgs{}));
    g_hold_open = true;
    for (const RunHandle& h : held) EXPECT_TRUE(wait_run(h).ok()) << h.result().to_string();
  }

  // Submits every graph (pipelined up to the Worker's depth), then collects each outcome.
  std::vector<Outcome> run(const std::vector<Graph>& graphs) {
    std::vector<std::vector<DeviceBuffer>> bufs(graphs.size());
    std::vector<RunHandle> handles;
    for (size_t i = 0; i < graphs.size(); ++i) {
      for (const auto& init : graphs[i].initial) bufs[i].push_back(upload(w_, init));
      handles.push_back(w_.submit(h_, graph_args(graphs[i], bufs[i])));
    }
    std::vector<Outcome> out;
    for (size_t i = 0; i < graphs.size(); ++i) {
      Outcome o;
      o.status = wait_run(handles[i]);
      o.stats = handles[i].stats();
      for (size_t b = 0; b < bufs[i].size(); ++b) {
        o.buffers.push_back(download<int64_t>(w_, bufs[i][b], graphs[i].initial[b].size()));
        EXPECT_TRUE(w_.free(bufs[i][b]).ok());
      }
      out.push_back(std::move(o));
    }
    return out;
  }

  uint64_t free_bytes() { return testing::free_bytes(w_); }

 private:
  Worker w_;
  CallableHandle h_;
  CallableHandle hold_;
};

// The graph up to (not including) its first refused submit.
Graph cut_at_first_refusal(const Graph& g) {
  Graph cut = g;
  cut.ops.erase(std::find_if(cut.ops.begin(), cut.ops.end(), [](const Op& op) { return op.kind == Op::kBadSubmit; }),
                cut.ops.end());
  return cut;
}

bool is_refusal(const Status& s) { return !s.ok() && s.code() != StatusCode::kKernelFailed; }

void expect_same(const Outcome& want, const Outcome& got, uint32_t seed) {
  EXPECT_EQ(got.status, want.status) << "seed " << seed << ": reference: " << want.status.to_string()
                                     << "; this runtime: " << got.status.to_string();
  EXPECT_EQ(got.stats.tasks, want.stats.tasks) << "seed " << seed;
  EXPECT_EQ(got.stats.executed, want.stats.executed) << "seed " << seed;
  EXPECT_EQ(got.stats.released_early, want.stats.released_early) << "seed " << seed;
  ASSERT_EQ(got.buffers.size(), want.buffers.size());
  for (size_t b = 0; b < want.buffers.size(); ++b) {
    for (size_t i = 0; i < want.buffers[b].size(); ++i) {
      ASSERT_EQ(got.buffers[b][i], want.buffers[b][i]) << "seed " << seed << ": buffer " << b << " element " << i;
    }
  }
}

class RandomGraphs : public TargetTest {};

constexpr uint32_t kGraphs = 200;
constexpr uint32_t kBatch = 4;

TEST_P(RandomGraphs, BitIdenticalToTheReferenceRuntime) {
  Watchdog dog(std::chrono::seconds(240));
  GraphRunner reference(target_config(ChipTarget{"reference", "small", GetParam().backend}, kBatch));
  GraphRunner target(config(kBatch));
  target.occupy_every_set(kBatch);
  const uint64_t steady = target.free_bytes();
  uint32_t failed = 0, refused = 0;
  for (uint32_t first = 1; first <= kGraphs; first += kBatch) {
    std::vector<Graph> graphs;
    for (uint32_t seed = first; seed < first + kBatch; ++seed) graphs.push_back(GraphGen(seed).make());
    const std::vector<Outcome> want = reference.run(graphs);
    const std::vector<Outcome> got = target.run(graphs);
    // A streaming runtime has run the tasks submitted before a refusal, which
    // the reference (building first) never starts: what it must have computed
    // is the reference's outcome of the graph cut at that refusal, failing
    // with the whole graph's error.
    std::vector<Graph> cuts;
    for (uint32_t i = 0; i < kBatch; ++i) {
      if (GetParam().streaming && is_refusal(want[i].status)) cuts.push_back(cut_at_first_refusal(graphs[i]));
    }
    const std::vector<Outcome> cut_want = reference.run(cuts);
    for (uint32_t i = 0, c = 0; i < kBatch; ++i) {
      if (GetParam().streaming && is_refusal(want[i].status)) {
        Outcome expected = cut_want[c++];
        EXPECT_FALSE(is_refusal(expected.status)) << "seed " << first + i << ": the cut graph is refused too";
        expected.status = want[i].status;
        // Scopes the orchestration ended after the refusal release their
        // intermediates on a streaming runtime; the cut graph has no such ends.
        expected.stats.released_early = got[i].stats.released_early;
        expect_same(expected, got[i], first + i);
      } else {
        expect_same(want[i], got[i], first + i);
      }
      failed += want[i].status.code() == StatusCode::kKernelFailed;
      refused += !want[i].status.ok() && want[i].status.code() != StatusCode::kKernelFailed;
    }
    if (::testing::Test::HasFailure()) return;
    // Every run gave back what it allocated.
    EXPECT_EQ(target.free_bytes(), steady) << "device memory leaked by graphs " << first << "..";
  }
  // The seeds cover what they are meant to: kernel failures and refusals, not only successes.
  EXPECT_GT(failed, 0u);
  EXPECT_GT(refused, 0u);
  EXPECT_LT(failed + refused, kGraphs);
}
SIMPLER_ON_EVERY_TARGET(RandomGraphs);

}  // namespace
}  // namespace simpler
