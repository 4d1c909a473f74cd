// matmul_chain: C = relu(A·B + bias) as a tiled graph. Per output tile, a chain
// of AIC matmul tasks accumulates over K into a run-owned intermediate (InOut),
// then AIV tasks add the bias in place and write the ReLU into C. Tiles of one
// buffer are disjoint, so only the tasks of one output tile depend on each other.
#include <algorithm>
#include <vector>

#include "../common.h"

namespace simpler::examples {
namespace {

constexpr uint32_t kMatmulFunc = 0;
constexpr uint32_t kBiasAddFunc = 1;
constexpr uint32_t kReluFunc = 2;
constexpr int64_t kM = 256, kN = 256, kK = 128, kTile = 32;

Status check_operand(const TensorView& v, const char* what, int64_t rows, int64_t cols) {
  if (v.dtype() != DType::F32 || v.ndim() != 2 || v.shape(0) != rows || v.shape(1) != cols) {
    return Status(StatusCode::kInvalidArgument, fmt::format("matmul_chain: {} must be f32 [{}, {}]", what, rows, cols));
  }
  return Status();
}

Status build_graph(ChipOrchestrator& o, const TaskArgs& args) {
  const TensorView& a = args[0].tensor;
  const TensorView& b = args[1].tensor;
  const TensorView& bias = args[2].tensor;
  const TensorView& c = args[3].tensor;
  const int64_t t = static_cast<int64_t>(args[4].scalar);
  const int64_t m = a.shape(0), k = a.shape(1), n = b.shape(1);
  if (t <= 0 || m % t != 0 || n % t != 0 || k % t != 0) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("matmul_chain: tile {} must divide M={}, N={} and K={}", t, m, n, k));
  }
  for (Status s : {check_operand(a, "a", m, k), check_operand(b, "b", k, n), check_operand(bias, "bias", 1, n),
                   check_operand(c, "c", m, n)}) {
    if (!s.ok()) return s;
  }

  TensorView acc;
  if (Status s = take(o.alloc({m, n}, DType::F32), acc); !s.ok()) return s;
  for (int64_t i = 0; i < m; i += t) {
    for (int64_t j = 0; j < n; j += t) {
      TensorView acc_tile, bias_tile, c_tile;
      if (Status s = take(acc.tile({i, j}, {t, t}), acc_tile); !s.ok()) return s;
      if (Status s = take(bias.tile({0, j}, {1, t}), bias_tile); !s.ok()) return s;
      if (Status s = take(c.tile({i, j}, {t, t}), c_tile); !s.ok()) return s;
      for (int64_t kk = 0; kk < k; kk += t) {
        TensorView a_tile, b_tile;
        if (Status s = take(a.tile({i, kk}, {t, t}), a_tile); !s.ok()) return s;
        if (Status s = take(b.tile({kk, j}, {t, t}), b_tile); !s.ok()) return s;
        const bool first = kk == 0;
        TaskArgs mm;
        mm.add_tensor(a_tile, Tag::Input)
            .add_tensor(b_tile, Tag::Input)
            .add_tensor(acc_tile, first ? Tag::OutputExisting : Tag::InOut)
            .add_scalar(first ? 0 : 1);
        if (Status s = o.submit_aic(kMatmulFunc, mm).status(); !s.ok()) return s;
      }
      TaskArgs add_bias;
      add_bias.add_tensor(acc_tile, Tag::InOut).add_tensor(bias_tile, Tag::Input);
      if (Status s = o.submit_aiv(kBiasAddFunc, add_bias).status(); !s.ok()) return s;
      TaskArgs relu;
      relu.add_tensor(acc_tile, Tag::Input).add_tensor(c_tile, Tag::OutputExisting);
      if (Status s = o.submit_aiv(kReluFunc, relu).status(); !s.ok()) return s;
    }
  }
  return Status();
}

Status orchestrate(ChipOrchestrator& o, const TaskArgs& args) {
  // The intermediate lives in a scope so its memory goes back once the last
  // ReLU has read it.
  o.scope_begin();
  Status built = build_graph(o, args);
  Status ended = o.scope_end();
  return built.ok() ? ended : built;
}

std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& bias) {
  std::vector<float> c(kM * kN, 0.f);
  // Same summation order as the kernels: k ascending, tile after tile.
  for (int64_t i = 0; i < kM; ++i) {
    float* row = &c[i * kN];
    for (int64_t k = 0; k < kK; ++k) {
      const float av = a[i * kK + k];
      for (int64_t j = 0; j < kN; ++j) row[j] += av * b[k * kN + j];
    }
    for (int64_t j = 0; j < kN; ++j) row[j] = std::max(row[j] + bias[j], 0.f);
  }
  return c;
}

}  // namespace

Result<ExampleReport> run_matmul_chain(const ExampleOptions& options) {
  const std::string name = "matmul_chain";
  KernelLibrary kernels;
  if (Status s = take(load_kernels({{kMatmulFunc, CoreType::AIC, "matmul_chain_matmul"},
                                    {kBiasAddFunc, CoreType::AIV, "matmul_chain_bias_add"},
                                    {kReluFunc, CoreType::AIV, "matmul_chain_relu"}}),
                      kernels);
      !s.ok()) {
    return s;
  }
  OpenWorker w;
  ChipCallable callable(name, orchestrate, std::move(kernels),
                        {Param::input(), Param::input(), Param::input(), Param::output(), Param::scalar()});
  if (Status s = take(open_worker(options, std::move(callable)), w); !s.ok()) return s;
  Worker& worker = *w.worker;

  const std::vector<float> a = random_floats(kM * kK, 11, -1.f, 1.f);
  const std::vector<float> b = random_floats(kK * kN, 12, -1.f, 1.f);
  const std::vector<float> bias = random_floats(kN, 13, -0.5f, 0.5f);
  const std::vector<float> want = reference(a, b, bias);

  const int runs = options.runs;
  const int slots = pipeline_slots(options, runs);
  const uint64_t a_bytes = a.size() * sizeof(float), b_bytes = b.size() * sizeof(float);
  const uint64_t bias_bytes = bias.size() * sizeof(float), c_bytes = want.size() * sizeof(float);
  DeviceBuffer da, db, dbias;
  std::vector<DeviceBuffer> dc(slots);
  if (Status s = take(worker.malloc(a_bytes), da); !s.ok()) return with_context(s, "malloc a");
  if (Status s = take(worker.malloc(b_bytes), db); !s.ok()) return with_context(s, "malloc b");
  if (Status s = take(worker.malloc(bias_bytes), dbias); !s.ok()) return with_context(s, "malloc bias");
  for (DeviceBuffer& c : dc) {
    if (Status s = take(worker.malloc(c_bytes), c); !s.ok()) return with_context(s, "malloc c");
  }
  if (Status s = worker.copy_to(da, a.data(), a_bytes); !s.ok()) return with_context(s, "copy a");
  if (Status s = worker.copy_to(db, b.data(), b_bytes); !s.ok()) return with_context(s, "copy b");
  if (Status s = worker.copy_to(dbias, bias.data(), bias_bytes); !s.ok()) return with_context(s, "copy bias");

  const std::vector<float> poison(want.size(), -12345.f);
  std::vector<float> got(want.size());
  auto submit = [&](int, int slot) -> Result<RunHandle> {
    if (Status s = worker.copy_to(dc[slot], poison.data(), c_bytes); !s.ok()) return with_context(s, "clear c");
    TaskArgs args;
    args.add_tensor(da.view({kM, kK}, DType::F32), Tag::Input)
        .add_tensor(db.view({kK, kN}, DType::F32), Tag::Input)
        .add_tensor(dbias.view({1, kN}, DType::F32), Tag::Input)
        .add_tensor(dc[slot].view({kM, kN}, DType::F32), Tag::OutputExisting)
        .add_scalar(kTile);
    return worker.submit(w.callable, args);
  };
  auto check = [&](const RunOutcome& out, std::string* mismatch) -> Status {
    if (!out.status.ok()) return with_context(out.status, fmt::format("run {}", out.run));
    if (Status s = worker.copy_from(got.data(), dc[out.slot], c_bytes); !s.ok()) return with_context(s, "copy c");
    if (std::string m = compare_floats(got, want, kN, 1e-4f, 1e-4f); !m.empty()) {
      *mismatch = fmt::format("run {}: {}", out.run, m);
    }
    return Status();
  };
  PipelineTotals totals;
  if (Status s = take(run_pipelined(name, options, runs, slots, submit, check), totals); !s.ok()) return s;
  if (Status s = worker.close(); !s.ok()) return with_context(s, "Worker::close");

  ExampleReport r{name, runs, totals.tasks, totals.wall_s, totals.mismatch.empty(), totals.mismatch};
  if (r.verified) {
    r.detail = fmt::format("relu(A[{0}x{2}]·B[{2}x{1}] + bias) in {3}x{3} tiles, {4} tasks per run", kM, kN, kK, kTile,
                           (kM / kTile) * (kN / kTile) * (kK / kTile + 2));
  }
  return r;
}

}  // namespace simpler::examples
