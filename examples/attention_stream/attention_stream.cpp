// attention_stream: one run of an attention-style loop long enough that only a
// streaming runtime can hold it. Per step j and head h: s = q_h·k_jᵀ, m = its
// row max, p = an integer softmax numerator of s - m, o_h = 3·o_h + p·v_j. The
// three intermediates of a step live in the step's scope, so they stream
// through heap ring 1 and are reclaimed in order once their last reader
// finished; the tasks stream through a task window a fraction of the run.
#include <algorithm>
#include <chrono>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kScoreFunc = 0;
constexpr uint32_t kRowMaxFunc = 1;
constexpr uint32_t kWeightFunc = 2;
constexpr uint32_t kAccumulateFunc = 3;
constexpr int64_t kHeads = 4;
constexpr int64_t kTile = 8;      // query rows per head, and keys per key tile
constexpr int64_t kDim = 8;       // head dimension
constexpr int64_t kKvTiles = 61;  // key/value tiles, cycled; prime, so no step lines up with the ring's wraps
constexpr uint32_t kTasksPerStep = 4 * kHeads;
constexpr uint32_t kWindow = 4096;
constexpr uint64_t kHeapRingBytes = 512 << 10;
// What one step allocates (s and p are [t, t], m is [t, 1]), before alignment.
constexpr uint64_t kStepBytes = kHeads * (2 * kTile * kTile + kTile) * sizeof(uint32_t);
// The smallest run the example takes (one window and a step) outgrows the ring.
static_assert((kWindow / kTasksPerStep + 1) * kStepBytes > kHeapRingBytes);

using Tile = std::vector<uint32_t>;  // row-major

Status check_operand(const TensorView& v, const char* what, int64_t rows) {
  if (v.dtype() != DType::U32 || v.ndim() != 2 || v.shape(0) != rows || v.shape(1) != kDim) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("attention_stream: {} must be u32 [{}, {}]", what, rows, kDim));
  }
  return Status();
}

Status orchestrate(ChipOrchestrator& o, const TaskArgs& args) {
  const TensorView& q = args[0].tensor;
  const TensorView& k = args[1].tensor;
  const TensorView& v = args[2].tensor;
  const TensorView& out = args[3].tensor;
  const uint64_t steps = args[4].scalar;
  for (Status s : {check_operand(q, "q", kHeads * kTile), check_operand(k, "k", kKvTiles * kTile),
                   check_operand(v, "v", kKvTiles * kTile), check_operand(out, "out", kHeads * kTile)}) {
    if (!s.ok()) return s;
  }
  std::vector<TensorView> q_tiles(kHeads), out_tiles(kHeads), k_tiles(kKvTiles), v_tiles(kKvTiles);
  for (int64_t h = 0; h < kHeads; ++h) {
    if (Status s = take(q.tile({h * kTile, 0}, {kTile, kDim}), q_tiles[h]); !s.ok()) return s;
    if (Status s = take(out.tile({h * kTile, 0}, {kTile, kDim}), out_tiles[h]); !s.ok()) return s;
  }
  for (int64_t t = 0; t < kKvTiles; ++t) {
    if (Status s = take(k.tile({t * kTile, 0}, {kTile, kDim}), k_tiles[t]); !s.ok()) return s;
    if (Status s = take(v.tile({t * kTile, 0}, {kTile, kDim}), v_tiles[t]); !s.ok()) return s;
  }

  for (uint64_t step = 0; step < steps; ++step) {
    // At depth 1: this step's intermediates go to heap ring 1, each reclaimed
    // once the scope has ended and its last reader finished.
    Scope scope(o);
    const TensorView& k_tile = k_tiles[step % kKvTiles];
    const TensorView& v_tile = v_tiles[step % kKvTiles];
    const bool first = step == 0;
    for (int64_t h = 0; h < kHeads; ++h) {
      TensorView s, m, p;
      if (Status st = take(o.alloc({kTile, kTile}, DType::U32), s); !st.ok()) return st;
      if (Status st = take(o.alloc({kTile, 1}, DType::U32), m); !st.ok()) return st;
      if (Status st = take(o.alloc({kTile, kTile}, DType::U32), p); !st.ok()) return st;
      TaskArgs score;
      score.add_tensor(q_tiles[h], Tag::Input).add_tensor(k_tile, Tag::Input).add_tensor(s, Tag::OutputExisting);
      if (Status st = o.submit_aic(kScoreFunc, score).status(); !st.ok()) return st;
      TaskArgs row_max;
      row_max.add_tensor(s, Tag::Input).add_tensor(m, Tag::OutputExisting);
      if (Status st = o.submit_aiv(kRowMaxFunc, row_max).status(); !st.ok()) return st;
      TaskArgs weight;
      weight.add_tensor(s, Tag::Input).add_tensor(m, Tag::Input).add_tensor(p, Tag::OutputExisting);
      if (Status st = o.submit_aiv(kWeightFunc, weight).status(); !st.ok()) return st;
      TaskArgs accumulate;
      accumulate.add_tensor(p, Tag::Input)
          .add_tensor(v_tile, Tag::Input)
          .add_tensor(out_tiles[h], first ? Tag::OutputExisting : Tag::InOut)
          .add_scalar(first ? 1 : 0);
      if (Status st = o.submit_aic(kAccumulateFunc, accumulate).status(); !st.ok()) return st;
    }
  }
  return Status();
}

// The tile `index` ([kTile, kDim]) of a row-major [*, kDim] matrix.
Tile tile_of(const std::vector<uint32_t>& m, int64_t index) {
  return Tile(m.begin() + index * kTile * kDim, m.begin() + (index + 1) * kTile * kDim);
}

// p·v of head `q` against key/value tile (k, v), as the kernels compute it.
Tile weighted_values(const Tile& q, const Tile& k, const Tile& v) {
  Tile s(kTile * kTile), pv(kTile * kDim, 0);
  for (int64_t i = 0; i < kTile; ++i) {
    for (int64_t j = 0; j < kTile; ++j) {
      uint32_t acc = 0;
      for (int64_t x = 0; x < kDim; ++x) acc += q[i * kDim + x] * k[j * kDim + x];
      s[i * kTile + j] = acc;
    }
    const uint32_t row_max = *std::max_element(s.begin() + i * kTile, s.begin() + (i + 1) * kTile);
    for (int64_t j = 0; j < kTile; ++j) {
      const uint32_t p = 128u >> std::min<uint32_t>(7, (row_max - s[i * kTile + j]) / 128);
      for (int64_t x = 0; x < kDim; ++x) pv[i * kDim + x] += p * v[j * kDim + x];
    }
  }
  return pv;
}

// The whole run on the host: p·v depends only on (head, key/value tile), so
// it is computed once per pair; the recurrence over the steps is kept whole.
std::vector<uint32_t> reference(const std::vector<uint32_t>& q, const std::vector<uint32_t>& k,
                                const std::vector<uint32_t>& v, uint64_t steps) {
  std::vector<uint32_t> out(kHeads * kTile * kDim, 0);
  for (int64_t h = 0; h < kHeads; ++h) {
    const Tile qh = tile_of(q, h);
    std::vector<Tile> pv(kKvTiles);
    for (int64_t t = 0; t < kKvTiles; ++t) pv[t] = weighted_values(qh, tile_of(k, t), tile_of(v, t));
    uint32_t* o = &out[h * kTile * kDim];
    for (uint64_t step = 0; step < steps; ++step) {
      const Tile& add = pv[step % kKvTiles];
      for (int64_t i = 0; i < kTile * kDim; ++i) o[i] = 3u * o[i] + add[i];
    }
  }
  return out;
}

std::vector<uint32_t> random_small(size_t n, uint32_t seed) {
  std::vector<float> f = random_floats(n, seed, 0.f, 16.f);
  std::vector<uint32_t> out(n);
  std::transform(f.begin(), f.end(), out.begin(), [](float x) { return static_cast<uint32_t>(x); });
  return out;
}

}  // namespace

Result<ExampleReport> run_attention_stream(const ExampleOptions& options) {
  const std::string name = "attention_stream";
  const uint32_t tasks = options.tasks_per_run;
  if (!is_streaming_runtime(options.runtime)) {
    // The whole run would have to be one graph before launch: refuse rather
    // than show a cut-down run as this one.
    return Status(StatusCode::kFailedPrecondition,
                  fmt::format("{} needs a streaming runtime such as tensormap_and_ringbuffer: {} tasks > "
                              "max_tasks_per_run = {}, and {} builds a run's whole graph before launch",
                              name, tasks, kWindow, options.runtime));
  }
  if (tasks % kTasksPerStep != 0 || tasks <= kWindow) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("{}: tasks_per_run = {} must be a multiple of {} (tasks per step) above the {}-task "
                              "window, so that the run streams",
                              name, tasks, kTasksPerStep, kWindow));
  }
  const uint64_t steps = tasks / kTasksPerStep;

  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kScoreFunc, CoreType::AIC, "attention_stream_score"},
                                    {kRowMaxFunc, CoreType::AIV, "attention_stream_rowmax"},
                                    {kWeightFunc, CoreType::AIV, "attention_stream_weight"},
                                    {kAccumulateFunc, CoreType::AIC, "attention_stream_accumulate"}}),
                      kernels);
      !s.ok()) {
    return s;
  }
  WorkerConfig config = worker_config(options);
  config.max_tasks_per_run = kWindow;
  config.runtime_env.task_window = kWindow;
  config.runtime_env.heap_ring_bytes = kHeapRingBytes;
  OpenWorker w;
  ChipCallable callable(name, orchestrate, std::move(kernels),
                        {Param::input(), Param::input(), Param::input(), Param::output(), Param::scalar()});
  if (Status s = take(open_worker(config, std::move(callable)), w); !s.ok()) return s;
  Worker& worker = *w.worker;

  const std::vector<uint32_t> q = random_small(kHeads * kTile * kDim, 21);
  const std::vector<uint32_t> k = random_small(kKvTiles * kTile * kDim, 22);
  const std::vector<uint32_t> v = random_small(kKvTiles * kTile * kDim, 23);
  const std::vector<uint32_t> want = reference(q, k, v, steps);

  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);
  const uint64_t q_bytes = q.size() * sizeof(uint32_t), kv_bytes = k.size() * sizeof(uint32_t);
  const uint64_t out_bytes = want.size() * sizeof(uint32_t);
  DeviceBuffer dq, dk, dv;
  std::vector<DeviceBuffer> dout(slots);
  if (Status s = take(worker.malloc(q_bytes), dq); !s.ok()) return with_context(s, "malloc q");
  if (Status s = take(worker.malloc(kv_bytes), dk); !s.ok()) return with_context(s, "malloc k");
  if (Status s = take(worker.malloc(kv_bytes), dv); !s.ok()) return with_context(s, "malloc v");
  for (DeviceBuffer& o : dout) {
    if (Status s = take(worker.malloc(out_bytes), o); !s.ok()) return with_context(s, "malloc out");
  }
  if (Status s = worker.copy_to(dq, q.data(), q_bytes); !s.ok()) return with_context(s, "copy q");
  if (Status s = worker.copy_to(dk, k.data(), kv_bytes); !s.ok()) return with_context(s, "copy k");
  if (Status s = worker.copy_to(dv, v.data(), kv_bytes); !s.ok()) return with_context(s, "copy v");

  const std::vector<uint32_t> poison(want.size(), 0xDEADBEEF);
  std::vector<uint32_t> got(want.size());
  uint64_t released = 0;
  auto submit = [&](int, int slot) -> Result<RunHandle> {
    if (Status s = worker.copy_to(dout[slot], poison.data(), out_bytes); !s.ok()) return with_context(s, "clear out");
    TaskArgs args;
    args.add_tensor(dq.view({kHeads * kTile, kDim}, DType::U32), Tag::Input)
        .add_tensor(dk.view({kKvTiles * kTile, kDim}, DType::U32), Tag::Input)
        .add_tensor(dv.view({kKvTiles * kTile, kDim}, DType::U32), Tag::Input)
        .add_tensor(dout[slot].view({kHeads * kTile, kDim}, DType::U32), Tag::OutputExisting)
        .add_scalar(static_cast<int64_t>(steps));
    return worker.submit(w.callable, args);
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    if (Status s = worker.copy_from(got.data(), dout[out.slot], out_bytes); !s.ok()) {
      return with_context(s, "copy out");
    }
    released += out.stats.released_early;
    // Every intermediate lives in a step's scope, so each must be reclaimed
    // while the run goes on; one held to the run's end did not stream.
    if (const uint64_t all = 3 * kHeads * steps; out.stats.released_early != all) {
      *mismatch = fmt::format("run {}: {} of its {} intermediates were released during the run", out.run,
                              out.stats.released_early, all);
    }
    for (size_t i = 0; i < want.size() && mismatch->empty(); ++i) {
      if (got[i] != want[i]) {
        const int64_t row = static_cast<int64_t>(i) / kDim;
        *mismatch = fmt::format("run {}: head {} out[{}, {}]: got {}, want {}", out.run, row / kTile, row % kTile,
                                static_cast<int64_t>(i) % kDim, got[i], want[i]);
      }
    }
    return Status();
  };
  // The deadline is for a hang: a run a thousand times longer than the other
  // examples' gets at least a second per 5,000 tasks, on a loaded machine too.
  ExampleOptions waits = options;
  waits.run_timeout = std::max(options.run_timeout, std::chrono::seconds(tasks / 5000));
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, waits, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = worker.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail = fmt::format(
        "{} steps x {} heads, {} tasks per run through a {}-task window; {:.1f} MiB of intermediates per run "
        "through a {} KiB heap ring, {} released while their run went on; every output exact",
        steps, kHeads, tasks, kWindow, static_cast<double>(steps * kStepBytes) / (1 << 20), kHeapRingBytes >> 10,
        released);
  }
  return r;
}

}  // namespace simpler::examples
