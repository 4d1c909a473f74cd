// The runtime conformance cases through the public Worker, on every registered runtime and geometry
// (conformance.h): an AIC+AIV+mix DAG vs a host reference, dependency correctness, runtime-allocated
// outputs, scopes, pipelined runs, RunHandle, thread and memory invariants. The cases that prove two
// tasks ran at the same moment run on the concurrent runtimes only.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "conformance.h"
#include "kernels.h"
#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

// One fixture per suite; each runs on the targets its instantiation at the end names.
class Runtime : public TargetTest {};
class Dependencies : public TargetTest {};
class Concurrency : public TargetTest {};
class RuntimeOutputs : public TargetTest {};
class Scopes : public TargetTest {};
class Pipeline : public TargetTest {};
class RunHandleTest : public TargetTest {};
class WorkerThreads : public TargetTest {};
class WorkerMemory : public TargetTest {};
class BorrowedBuffers : public TargetTest {};
class GuardedMemory : public TargetTest {};

// ---- A matmul-like DAG: tiled GEMM (AIC) + bias/ReLU (AIV) + a mix task + an add -----------------

enum : uint32_t { kMatmul = 1, kBiasRelu, kMixAic, kMixAiv0, kMixAiv1, kAdd };

constexpr int64_t kN = 96;  // square matrices
constexpr int64_t kT = 32;  // tile edge
constexpr int64_t kTiles = kN / kT;

Status orchestrate_dag(ChipOrchestrator& o, const TaskArgs& a) {
  const TensorView &A = a[0].tensor, &B = a[1].tensor, &bias = a[2].tensor, &W = a[3].tensor, &C = a[4].tensor,
                   &P = a[5].tensor, &Q = a[6].tensor, &R = a[7].tensor;
  for (int64_t ti = 0; ti < kTiles; ++ti) {
    for (int64_t tj = 0; tj < kTiles; ++tj) {
      auto c = C.tile({ti * kT, tj * kT}, {kT, kT});
      if (!c.ok()) return c.status();
      for (int64_t kk = 0; kk < kTiles; ++kk) {
        TaskArgs t;
        t.add_tensor(*A.tile({ti * kT, kk * kT}, {kT, kT}), Tag::Input)
            .add_tensor(*B.tile({kk * kT, tj * kT}, {kT, kT}), Tag::Input)
            .add_tensor(*c, kk == 0 ? Tag::OutputExisting : Tag::InOut)
            .add_scalar(kk > 0);
        if (auto r = o.submit_aic(kMatmul, t); !r.ok()) return r.status();
      }
      TaskArgs t;
      t.add_tensor(*c, Tag::InOut).add_tensor(*bias.tile({tj * kT}, {kT}), Tag::Input);
      if (auto r = o.submit_aiv(kBiasRelu, t); !r.ok()) return r.status();
    }
  }
  TaskArgs mix;
  mix.add_tensor(C, Tag::Input)
      .add_tensor(W, Tag::Input)
      .add_tensor(P, Tag::OutputExisting)
      .add_tensor(Q, Tag::OutputExisting)
      .add_scalar_u64(a[8].scalar);
  if (auto r = o.submit_mix({kMixAic, kMixAiv0, kMixAiv1}, mix); !r.ok()) return r.status();
  TaskArgs add;
  add.add_tensor(P, Tag::Input).add_tensor(Q, Tag::Input).add_tensor(R, Tag::OutputExisting);
  return o.submit_aiv(kAdd, add).status();
}

ChipCallable dag_callable() {
  return ChipCallable("matmul_dag", orchestrate_dag,
                      make_kernels({{kMatmul, CoreType::AIC, "matmul", matmul_kernel},
                                    {kBiasRelu, CoreType::AIV, "bias_relu", bias_relu_kernel},
                                    {kMixAic, CoreType::AIC, "mix_aic", mix_aic_kernel},
                                    {kMixAiv0, CoreType::AIV, "mix_aiv0", mix_aiv0_kernel},
                                    {kMixAiv1, CoreType::AIV, "mix_aiv1", mix_aiv1_kernel},
                                    {kAdd, CoreType::AIV, "add2d", add2d_kernel}}),
                      {Param::input(), Param::input(), Param::input(), Param::input(), Param::output(), Param::output(),
                       Param::output(), Param::output(), Param::scalar()});
}

struct DagData {
  std::vector<float> A, B, bias, W;
  float s = 0.5f;
  std::vector<float> C, P, Q, R;  // host reference

  explicit DagData(uint32_t seed) {
    std::mt19937 rng(seed);
    auto small_int = [&](int lo, int hi) {
      return static_cast<float>(std::uniform_int_distribution<int>(lo, hi)(rng));
    };
    A.resize(kN * kN);
    B.resize(kN * kN);
    W.resize(kN * kN);
    bias.resize(kN);
    for (auto& v : A) v = small_int(-2, 2);
    for (auto& v : B) v = small_int(-2, 2);
    for (auto& v : W) v = small_int(-2, 2);
    for (auto& v : bias) v = small_int(-3, 3);
    // Integer-valued data keeps every sum exact, so the comparison is exact.
    C.assign(kN * kN, 0);
    P.assign(kN * kN, 0);
    Q.assign(kN * kN, 0);
    R.assign(kN * kN, 0);
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < kN; ++k) acc += A[i * kN + k] * B[k * kN + j];
        C[i * kN + j] = std::max(static_cast<float>(acc) + bias[j], 0.f);
      }
    }
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < kN; ++k) acc += C[i * kN + k] * W[k * kN + j];
        P[i * kN + j] = static_cast<float>(acc);
        Q[i * kN + j] = C[i * kN + j] * s;
        R[i * kN + j] = P[i * kN + j] + Q[i * kN + j];
      }
    }
  }
};

struct DagBuffers {
  DeviceBuffer A, B, bias, W, C, P, Q, R;
  TaskArgs args(float s) const {
    TaskArgs t;
    t.add_tensor(A.view({kN, kN}, DType::F32), Tag::Input)
        .add_tensor(B.view({kN, kN}, DType::F32), Tag::Input)
        .add_tensor(bias.view({kN}, DType::F32), Tag::Input)
        .add_tensor(W.view({kN, kN}, DType::F32), Tag::Input)
        .add_tensor(C.view({kN, kN}, DType::F32), Tag::OutputExisting)
        .add_tensor(P.view({kN, kN}, DType::F32), Tag::OutputExisting)
        .add_tensor(Q.view({kN, kN}, DType::F32), Tag::OutputExisting)
        .add_tensor(R.view({kN, kN}, DType::F32), Tag::OutputExisting)
        .add_scalar_f32(s);
    return t;
  }
};

DagBuffers upload_dag(Worker& w, const DagData& d) {
  DagBuffers b;
  b.A = upload(w, d.A);
  b.B = upload(w, d.B);
  b.bias = upload(w, d.bias);
  b.W = upload(w, d.W);
  const std::vector<float> poison(kN * kN, -12345.f);
  b.C = upload(w, poison);
  b.P = upload(w, poison);
  b.Q = upload(w, poison);
  b.R = upload(w, poison);
  return b;
}

void expect_dag_outputs(Worker& w, const DagBuffers& b, const DagData& d) {
  EXPECT_EQ(download<float>(w, b.C, kN * kN), d.C) << "C = relu(A x B + bias)";
  EXPECT_EQ(download<float>(w, b.P, kN * kN), d.P) << "P = C x W (mix, AIC subtask)";
  EXPECT_EQ(download<float>(w, b.Q, kN * kN), d.Q) << "Q = C * s (mix, both AIV subtasks)";
  EXPECT_EQ(download<float>(w, b.R, kN * kN), d.R) << "R = P + Q";
}

constexpr uint32_t kDagTasks = kTiles * kTiles * kTiles + kTiles * kTiles + 2;
constexpr uint32_t kDagSubtasks = kDagTasks + 2;  // the mix task runs three kernels

TEST_P(Runtime, MatmulDagWithAicAivAndMixMatchesHost) {
  Watchdog dog;
  Harness hw(dag_callable(), config());
  DagData d(1);
  DagBuffers b = upload_dag(hw.w, d);
  RunHandle r = hw.submit(b.args(d.s));
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  expect_dag_outputs(hw.w, b, d);
  const RunStats st = r.stats();
  EXPECT_EQ(st.tasks, kDagTasks);
  EXPECT_EQ(st.executed, kDagSubtasks);
  EXPECT_GE(st.build_us, 0.0);
  EXPECT_GE(st.device_us, 0.0);
  EXPECT_TRUE(hw.w.close().ok());
}

TEST_P(Runtime, RepeatedRunsOnOneWorkerStayCorrect) {
  Watchdog dog;
  Harness hw(dag_callable(), config());
  for (uint32_t seed = 10; seed < 14; ++seed) {
    DagData d(seed);
    DagBuffers b = upload_dag(hw.w, d);
    ASSERT_TRUE(hw.run(b.args(d.s)).ok());
    expect_dag_outputs(hw.w, b, d);
  }
}

// ---- Dependencies ------------------------------------------------------------------------------

enum : uint32_t { kAffine = 1, kFill, kCopy, kRendezvous, kProbe };

KernelLibrary dep_kernels() {
  return make_kernels({{kAffine, CoreType::AIV, "affine", affine_kernel},
                       {kFill, CoreType::AIV, "fill", fill_kernel},
                       {kCopy, CoreType::AIV, "copy", copy_kernel},
                       {kRendezvous, CoreType::AIV, "rendezvous", rendezvous_kernel},
                       {kProbe, CoreType::AIV, "probe", probe_kernel}});
}

TEST_P(Dependencies, ChainOfInOutTasksGivesTheSequentialResult) {
  Watchdog dog;
  constexpr int kSteps = 300;
  constexpr int64_t kLen = 512;
  Harness hw(ChipCallable("chain",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            for (int i = 0; i < kSteps; ++i) {
                              TaskArgs t;
                              t.add_tensor(a[0].tensor, Tag::InOut).add_scalar(i);
                              if (auto r = o.submit_aiv(kAffine, t); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          dep_kernels(), {Param::inout()}),
             config());
  std::vector<int64_t> host(kLen);
  for (int64_t i = 0; i < kLen; ++i) host[i] = i;
  DeviceBuffer x = upload(hw.w, host);
  TaskArgs args;
  args.add_tensor(x.view({kLen}, DType::I64), Tag::InOut);
  RunHandle r = hw.submit(args);
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  for (int i = 0; i < kSteps; ++i) {
    for (auto& v : host) v = (v * 3 + i) % 1000003;
  }
  EXPECT_EQ(download<int64_t>(hw.w, x, kLen), host);
  EXPECT_EQ(r.stats().tasks, static_cast<uint32_t>(kSteps));
}

TEST_P(Dependencies, ReadersAfterAWriterSeeTheWrittenValueAndTheNextWriterWaitsForThem) {
  Watchdog dog;
  constexpr int kRounds = 6, kReaders = 8;
  constexpr int64_t kLen = 256;
  Harness hw(ChipCallable("readers",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView& x = a[0].tensor;
                            const TensorView& out = a[1].tensor;  // (kRounds * kReaders) x kLen
                            for (int round = 0; round < kRounds; ++round) {
                              TaskArgs w;
                              w.add_tensor(x, Tag::OutputExisting).add_scalar(1000 + round);
                              if (auto r = o.submit_aiv(kFill, w); !r.ok()) return r.status();
                              for (int k = 0; k < kReaders; ++k) {
                                auto row = out.tile({round * kReaders + k, 0}, {1, kLen});
                                if (!row.ok()) return row.status();
                                // The copy kernel walks a 1-D view: flatten the row tile.
                                TensorView flat(row->buffer(), {kLen}, DType::I64, row->offset());
                                TaskArgs rd;
                                rd.add_tensor(x, Tag::Input).add_tensor(flat, Tag::OutputExisting);
                                if (auto r = o.submit_aiv(kCopy, rd); !r.ok()) return r.status();
                              }
                            }
                            return Status();
                          },
                          dep_kernels(), {Param::inout(), Param::output()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(kLen, -1));
  DeviceBuffer out = upload(hw.w, std::vector<int64_t>(kRounds * kReaders * kLen, -1));
  TaskArgs args;
  args.add_tensor(x.view({kLen}, DType::I64), Tag::InOut)
      .add_tensor(out.view({kRounds * kReaders, kLen}, DType::I64), Tag::OutputExisting);
  ASSERT_TRUE(hw.run(args).ok());
  std::vector<int64_t> got = download<int64_t>(hw.w, out, kRounds * kReaders * kLen);
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < kReaders; ++k) {
      for (int64_t i = 0; i < kLen; ++i) {
        ASSERT_EQ(got[(round * kReaders + k) * kLen + i], 1000 + round) << "round " << round << " reader " << k;
      }
    }
  }
  EXPECT_EQ(download<int64_t>(hw.w, x, kLen), std::vector<int64_t>(kLen, 1000 + kRounds - 1));
}

// Submits one rendezvous task per view; each must see `views.size()` tasks running at once.
Status rendezvous_all(ChipOrchestrator& o, const std::vector<TensorView>& views) {
  for (const TensorView& v : views) {
    TaskArgs t;
    t.add_tensor(v, Tag::OutputExisting).add_scalar(static_cast<int64_t>(views.size()));
    if (auto r = o.submit_aiv(kRendezvous, t); !r.ok()) return r.status();
  }
  return Status();
}

TEST_P(Concurrency, DisjointColumnHalvesOfOneBufferRunAtTheSameTime) {
  Watchdog dog;
  g_arrived = 0;
  Harness hw(ChipCallable("halves",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView& x = a[0].tensor;  // 8 x 16: halves interleave byte-wise
                            return rendezvous_all(o, {*x.tile({0, 0}, {8, 8}), *x.tile({0, 8}, {8, 8})});
                          },
                          dep_kernels(), {Param::output()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(8 * 16, 0));
  TaskArgs args;
  args.add_tensor(x.view({8, 16}, DType::I64), Tag::OutputExisting);
  Status s = hw.run(args);
  ASSERT_TRUE(s.ok()) << "disjoint tiles were ordered by an edge: " << s.to_string();
  EXPECT_EQ(download<int64_t>(hw.w, x, 8 * 16), std::vector<int64_t>(8 * 16, 1));
}

TEST_P(Concurrency, FourDisjointQuadrantsRunAtTheSameTime) {
  Watchdog dog;
  g_arrived = 0;
  Harness hw(ChipCallable("quadrants",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView& x = a[0].tensor;
                            std::vector<TensorView> q;
                            for (int i = 0; i < 2; ++i) {
                              for (int j = 0; j < 2; ++j) q.push_back(*x.tile({4 * i, 4 * j}, {4, 4}));
                            }
                            return rendezvous_all(o, q);  // the small geometry has exactly 4 AIV cores
                          },
                          dep_kernels(), {Param::output()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(64, 0));
  TaskArgs args;
  args.add_tensor(x.view({8, 8}, DType::I64), Tag::OutputExisting);
  Status s = hw.run(args);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(download<int64_t>(hw.w, x, 64), std::vector<int64_t>(64, 1));
}

TEST_P(Concurrency, NoDepArgumentCreatesNoEdge) {
  Watchdog dog;
  g_arrived = 0;
  Harness hw(ChipCallable("nodep",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView &x = a[0].tensor, &y = a[1].tensor;
                            TaskArgs writer;
                            writer.add_tensor(x, Tag::OutputExisting).add_scalar(2);
                            if (auto r = o.submit_aiv(kRendezvous, writer); !r.ok()) return r.status();
                            TaskArgs passer;  // touches x only as no_dep: must not wait for the writer
                            passer.add_tensor(y, Tag::OutputExisting).add_scalar(2).add_tensor(x, Tag::NoDep);
                            return o.submit_aiv(kRendezvous, passer).status();
                          },
                          dep_kernels(), {Param::output(), Param::output()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(16, 0));
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(16, 0));
  TaskArgs args;
  args.add_tensor(x.view({16}, DType::I64), Tag::OutputExisting)
      .add_tensor(y.view({16}, DType::I64), Tag::OutputExisting);
  Status s = hw.run(args);
  ASSERT_TRUE(s.ok()) << "a no_dep argument created an edge: " << s.to_string();
}

// Overlapping writes (and a read after a write) must be ordered: the probe never sees two at once.
TEST_P(Concurrency, OverlappingTilesAreNeverRunAtTheSameTime) {
  Watchdog dog;
  g_inside = 0;
  g_max_inside = 0;
  Harness hw(ChipCallable("overlap",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView& x = a[0].tensor;  // 8 x 8
                            const std::vector<std::pair<TensorView, Tag>> steps = {
                                {*x.tile({0, 0}, {5, 5}), Tag::OutputExisting},
                                {*x.tile({4, 4}, {4, 4}), Tag::OutputExisting},  // shares (4,4) with the first
                                {*x.tile({4, 0}, {4, 8}), Tag::Input},           // reads what the second wrote
                                {*x.tile({0, 0}, {8, 8}), Tag::InOut},           // after the reader
                            };
                            for (const auto& [view, tag] : steps) {
                              TaskArgs t;
                              t.add_tensor(view, tag);
                              if (auto r = o.submit_aiv(kProbe, t); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          dep_kernels(), {Param::inout()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(64, 0));
  TaskArgs args;
  args.add_tensor(x.view({8, 8}, DType::I64), Tag::InOut);
  ASSERT_TRUE(hw.run(args).ok());
  EXPECT_EQ(g_max_inside.load(), 1) << "two dependent tasks ran at the same time";
}

// Readers of one region have no edge between them.
TEST_P(Concurrency, ConcurrentReadersOfOneTensorRunAtTheSameTime) {
  Watchdog dog;
  g_arrived = 0;
  Harness hw(ChipCallable("readers_together",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            for (int k = 0; k < 3; ++k) {
                              TaskArgs t;
                              // The rendezvous kernel writes its args[0]; give each its own output and
                              // let all three read the same input.
                              auto out = a[1].tensor.tile({k, 0}, {1, 8});
                              TensorView flat(out->buffer(), {8}, DType::I64, out->offset());
                              t.add_tensor(flat, Tag::OutputExisting).add_scalar(3).add_tensor(a[0].tensor, Tag::Input);
                              if (auto r = o.submit_aiv(kRendezvous, t); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          dep_kernels(), {Param::input(), Param::output()}),
             config());
  DeviceBuffer in = upload(hw.w, std::vector<int64_t>(8, 5));
  DeviceBuffer out = upload(hw.w, std::vector<int64_t>(24, 0));
  TaskArgs args;
  args.add_tensor(in.view({8}, DType::I64), Tag::Input).add_tensor(out.view({3, 8}, DType::I64), Tag::OutputExisting);
  Status s = hw.run(args);
  ASSERT_TRUE(s.ok()) << "readers of one tensor were ordered: " << s.to_string();
}

// A DeviceBuffer naming part of an allocation (accepted by submit's range check)
// aliases the whole-buffer view of that allocation: a write through one and a
// read through the other must be ordered (or the alias refused).
TEST_P(Concurrency, AliasedSubBufferIsOrderedOrRefused) {
  Watchdog dog;
  g_inside = 0;
  g_max_inside = 0;
  Status submit_status;
  Harness hw(ChipCallable("alias",
                          [&submit_status](ChipOrchestrator& o, const TaskArgs& a) {
                            const TensorView& x = a[0].tensor;  // 64 x i64 = 512 bytes
                            TaskArgs w;
                            w.add_tensor(x, Tag::OutputExisting);
                            if (auto r = o.submit_aiv(kProbe, w); !r.ok()) return r.status();
                            DeviceBuffer half{x.buffer().addr + 256, 256};
                            TaskArgs rd;
                            rd.add_tensor(half.view({32}, DType::I64), Tag::Input);
                            auto r = o.submit_aiv(kProbe, rd);
                            submit_status = r.status();
                            return r.status();
                          },
                          dep_kernels(), {Param::inout()}),
             config());
  DeviceBuffer x = upload(hw.w, std::vector<int64_t>(64, 0));
  TaskArgs args;
  args.add_tensor(x.view({64}, DType::I64), Tag::InOut);
  Status s = hw.run(args);
  if (submit_status.ok()) {
    EXPECT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(g_max_inside.load(), 1)
        << "library bug: a write to a buffer and a read of a sub-buffer of the same allocation ran at the same "
           "time (dependency analysis keys accesses by DeviceBuffer::addr, not by the allocation)";
  } else {
    EXPECT_FALSE(s.ok());
  }
}

// ---- Runtime-allocated outputs and scopes -------------------------------------------------------

enum : uint32_t { kAxpb = 1 };

TaskArgs axpb(const TensorView& in, const TensorView& out, float a, float b, Tag out_tag = Tag::OutputExisting) {
  TaskArgs t;
  t.add_tensor(in, Tag::Input).add_tensor(out, out_tag).add_scalar_f32(a).add_scalar_f32(b);
  return t;
}

KernelLibrary axpb_kernels() { return make_kernels({{kAxpb, CoreType::AIV, "axpb", axpb_kernel}}); }

constexpr int64_t kLen = 1000;

TEST_P(RuntimeOutputs, AnUnboundOutputIsAllocatedAndFeedsALaterTask) {
  Watchdog dog;
  bool bound_in_ref = false;  // set by the orchestration
  uint64_t allocated_bytes = 0;
  Harness hw(ChipCallable("runtime_output",
                          [&](ChipOrchestrator& o, const TaskArgs& a) {
                            TaskArgs first;
                            first.add_tensor(a[0].tensor, Tag::Input)
                                .add_output({kLen}, DType::F32)
                                .add_scalar_f32(2.f)
                                .add_scalar_f32(0.f);
                            auto r1 = o.submit_aiv(kAxpb, first);
                            if (!r1.ok()) return r1.status();
                            if (r1->outputs.size() != 1)
                              return Status(StatusCode::kInternal, "TaskRef.outputs should hold one view");
                            const TensorView tmp = r1->outputs[0];  // bound to run-owned memory
                            bound_in_ref = tmp.buffer().bound();
                            allocated_bytes = tmp.buffer().bytes;
                            if (!tmp.buffer().bound())
                              return Status(StatusCode::kInternal, "TaskRef.outputs[0] is still unbound");
                            return o.submit_aiv(kAxpb, axpb(tmp, a[1].tensor, 1.f, 1.f)).status();
                          },
                          axpb_kernels(), {Param::input(), Param::output()}),
             config());
  std::vector<float> in(kLen);
  for (int64_t i = 0; i < kLen; ++i) in[i] = static_cast<float>(i);
  DeviceBuffer din = upload(hw.w, in);
  DeviceBuffer dout = upload(hw.w, std::vector<float>(kLen, -1.f));
  TaskArgs args;
  args.add_tensor(din.view({kLen}, DType::F32), Tag::Input)
      .add_tensor(dout.view({kLen}, DType::F32), Tag::OutputExisting);
  // The first run also sets up the graph arena its set keeps; after it, device
  // memory is in its steady state and every later run must return to it.
  uint64_t steady = 0;
  for (int round = 0; round < 3; ++round) {
    RunHandle r = hw.submit(args);
    ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
    EXPECT_TRUE(bound_in_ref);
    EXPECT_EQ(allocated_bytes, static_cast<uint64_t>(kLen * 4));
    std::vector<float> got = download<float>(hw.w, dout, kLen);
    for (int64_t i = 0; i < kLen; ++i) ASSERT_EQ(got[i], 2.f * i + 1.f) << i;
    EXPECT_EQ(r.stats().released_early, 0u);  // not in a scope: released with the run
    if (round == 0) steady = free_bytes(hw.w);
    EXPECT_EQ(free_bytes(hw.w), steady) << "the run-owned output was not freed with the run";
  }
}

TEST_P(Scopes, IntermediatesOfAnEndedScopeAreReleasedDuringTheRun) {
  Watchdog dog;
  Harness hw(
      ChipCallable(
          "scoped",
          [](ChipOrchestrator& o, const TaskArgs& a) {
            TensorView x = a[0].tensor;
            for (int stage = 0; stage < 4; ++stage) {
              Scope scope(o);
              auto t1 = o.alloc({kLen}, DType::F32);
              if (!t1.ok()) return t1.status();
              if (auto r = o.submit_aiv(kAxpb, axpb(x, *t1, 2.f, 0.f)); !r.ok()) return r.status();
              TaskArgs second;  // a runtime-allocated output inside the scope
              second.add_tensor(*t1, Tag::Input).add_output({kLen}, DType::F32).add_scalar_f32(1.f).add_scalar_f32(1.f);
              auto r2 = o.submit_aiv(kAxpb, second);
              if (!r2.ok()) return r2.status();
              if (auto r = o.submit_aiv(kAxpb, axpb(r2->outputs.at(0), a[1].tensor, 1.f, 0.f)); !r.ok()) {
                return r.status();
              }
              x = a[1].tensor;
            }
            return Status();
          },
          axpb_kernels(), {Param::input(), Param::inout()}),
      config());
  std::vector<float> in(kLen);
  for (int64_t i = 0; i < kLen; ++i) in[i] = static_cast<float>(i % 17);
  DeviceBuffer din = upload(hw.w, in);
  DeviceBuffer dout = upload(hw.w, std::vector<float>(kLen, 0.f));
  TaskArgs args;
  args.add_tensor(din.view({kLen}, DType::F32), Tag::Input).add_tensor(dout.view({kLen}, DType::F32), Tag::InOut);
  std::vector<float> expect(kLen, 0.f);
  uint64_t steady = 0;
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(hw.w.copy_to(dout, expect.data(), kLen * 4).ok());  // out starts at 0 each round
    RunHandle r = hw.submit(args);
    ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
    std::vector<float> want = in;
    for (int stage = 0; stage < 4; ++stage) {
      for (auto& v : want) v = v * 2.f + 1.f;
    }
    EXPECT_EQ(download<float>(hw.w, dout, kLen), want);
    EXPECT_EQ(r.stats().tasks, 12u);
    EXPECT_EQ(r.stats().released_early, 8u) << "each stage's two intermediates are released by their last user";
    if (round == 0) steady = free_bytes(hw.w);
    EXPECT_EQ(free_bytes(hw.w), steady) << "round " << round;
  }
}

TEST_P(Scopes, AnUnusedIntermediateIsReleasedAtScopeEnd) {
  Watchdog dog;
  if (GetParam().streaming) {
    // Intermediates are carved from heap rings: once the ring wraps, the
    // unused one's bytes are handed out again, and the ring goes back when
    // the run ends.
    uint64_t first = 0, second = 0, third = 0;
    WorkerConfig c = unguarded_config();
    c.runtime_env.heap_ring_bytes = 2u << 18;  // room for two
    Harness hw(ChipCallable("unused",
                            [&](ChipOrchestrator& o, const TaskArgs&) {
                              for (uint64_t* addr : {&first, &second, &third}) {
                                Scope scope(o);
                                auto t = o.alloc({1 << 16}, DType::F32);
                                if (!t.ok()) return t.status();
                                *addr = t->buffer().addr;
                              }
                              return Status();
                            },
                            axpb_kernels(), {}),
               c);
    ASSERT_TRUE(hw.run().ok());  // sets up the arena its set keeps
    const uint64_t steady = free_bytes(hw.w);
    first = second = third = 0;
    ASSERT_TRUE(hw.run().ok());
    EXPECT_NE(first, 0u);
    EXPECT_EQ(second, first + (1u << 18));
    EXPECT_EQ(third, first) << "the unused intermediate's ring space was not reused after its scope ended";
    EXPECT_EQ(free_bytes(hw.w), steady);
    return;
  }
  uint64_t free_inside = 0, free_after_scope = 0;  // written by the orchestration
  Worker* worker = nullptr;
  Harness hw(ChipCallable("unused",
                          [&](ChipOrchestrator& o, const TaskArgs&) {
                            const uint64_t free_before = free_bytes(*worker);  // the arena is set up by now
                            o.scope_begin();
                            auto t = o.alloc({1 << 16}, DType::F32);
                            if (!t.ok()) return t.status();
                            free_inside = free_before - free_bytes(*worker);
                            if (Status s = o.scope_end(); !s.ok()) return s;
                            free_after_scope = free_bytes(*worker);
                            return Status();
                          },
                          axpb_kernels(), {}),
             unguarded_config());
  worker = &hw.w;
  ASSERT_TRUE(hw.run().ok());
  EXPECT_EQ(free_inside, 1u << 18) << "the intermediate's bytes";
  const uint64_t steady = free_bytes(hw.w);
  EXPECT_EQ(free_after_scope, steady) << "an unused intermediate is freed at scope_end";
  ASSERT_TRUE(hw.run().ok());
  EXPECT_EQ(free_bytes(hw.w), steady);
}

TEST_P(Scopes, AllocRefusesABadShape) {
  Watchdog dog;
  Status alloc_status;
  Harness hw(ChipCallable("bad_alloc",
                          [&](ChipOrchestrator& o, const TaskArgs&) {
                            alloc_status = o.alloc({4, -4}, DType::F32).status();
                            return Status();
                          },
                          axpb_kernels(), {}),
             config());
  uint64_t steady = 0;
  for (int round = 0; round < 2; ++round) {
    Status s = hw.run();
    EXPECT_REFUSED(alloc_status, StatusCode::kInvalidArgument, "shape[1]");
    EXPECT_REFUSED(s, StatusCode::kInvalidArgument, "alloc");  // recorded as the run's error
    if (round == 0) steady = free_bytes(hw.w);
    EXPECT_EQ(free_bytes(hw.w), steady);
  }
}

TEST_P(Scopes, DeviceMemoryExhaustedByIntermediatesFailsTheRunAndLeaksNothing) {
  Watchdog dog;
  bool hog = false;
  Harness hw(ChipCallable("hog",
                          [&hog](ChipOrchestrator& o, const TaskArgs&) {
                            while (hog) {
                              auto t = o.alloc({1 << 20}, DType::F32);  // 4 MiB each
                              if (!t.ok()) return t.status();
                            }
                            return o.alloc({16}, DType::F32).status();
                          },
                          axpb_kernels(), {}),
             config(1, 64));
  ASSERT_TRUE(hw.run().ok());
  const uint64_t steady = free_bytes(hw.w);
  hog = true;
  for (int round = 0; round < 2; ++round) {
    Status s = hw.run();
    EXPECT_REFUSED(s, StatusCode::kResourceExhausted, "intermediate tensor");
    EXPECT_EQ(free_bytes(hw.w), steady);
  }
  hog = false;
  ASSERT_TRUE(hw.run().ok());  // the worker still works
  EXPECT_EQ(free_bytes(hw.w), steady);
}

// ---- Pipelining --------------------------------------------------------------------------------

TEST_P(Pipeline, SixteenRunsWithDepthFourAreAllCorrect) {
  Watchdog dog;
  WorkerConfig c = config(4);
  Harness hw(ChipCallable("vaxpb",
                          [](ChipOrchestrator& o, const TaskArgs& a) {
                            // 8 tasks on disjoint chunks, then one pass over the whole output.
                            for (int64_t k = 0; k < 8; ++k) {
                              auto in = a[0].tensor.tile({k * 125}, {125});
                              auto out = a[1].tensor.tile({k * 125}, {125});
                              if (auto r = o.submit_aiv(kAxpb, axpb(*in, *out, scalar_f32(a[2].scalar), 0.f));
                                  !r.ok()) {
                                return r.status();
                              }
                            }
                            TaskArgs t;
                            t.add_tensor(a[1].tensor, Tag::Input)
                                .add_tensor(a[1].tensor, Tag::OutputExisting)
                                .add_scalar_f32(1.f)
                                .add_scalar_f32(3.f);
                            return o.submit_aiv(kAxpb, t).status();
                          },
                          axpb_kernels(), {Param::input(), Param::output(), Param::scalar()}),
             c);
  constexpr int kRuns = 16;
  std::vector<DeviceBuffer> ins, outs;
  std::vector<RunHandle> runs;
  for (int r = 0; r < kRuns; ++r) {
    std::vector<float> in(kLen);
    for (int64_t i = 0; i < kLen; ++i) in[i] = static_cast<float>(i + r);
    ins.push_back(upload(hw.w, in));
    outs.push_back(upload(hw.w, std::vector<float>(kLen, 0.f)));
  }
  for (int r = 0; r < kRuns; ++r) {
    TaskArgs args;
    args.add_tensor(ins[r].view({kLen}, DType::F32), Tag::Input)
        .add_tensor(outs[r].view({kLen}, DType::F32), Tag::OutputExisting)
        .add_scalar_f32(static_cast<float>(r + 1));
    runs.push_back(hw.submit(args));  // blocks only while 4 runs are in flight
  }
  std::set<uint64_t> ids;
  for (int r = 0; r < kRuns; ++r) {
    Status s = wait_run(runs[r]);
    ASSERT_TRUE(s.ok()) << "run " << r << ": " << s.to_string();
    ids.insert(runs[r].run_id());
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kRuns)) << "run ids are not unique";
  for (int r = 0; r < kRuns; ++r) {
    std::vector<float> got = download<float>(hw.w, outs[r], kLen);
    for (int64_t i = 0; i < kLen; ++i) ASSERT_EQ(got[i], static_cast<float>(i + r) * (r + 1) + 3.f) << r << "/" << i;
  }
}

// One run's device result is the input of four later runs in flight together.
TEST_P(Pipeline, ADeviceResultFeedsLaterRuns) {
  Watchdog dog;
  Harness hw(
      ChipCallable("axpb_run",
                   [](ChipOrchestrator& o, const TaskArgs& a) {
                     return o.submit_aiv(kAxpb, axpb(a[0].tensor, a[1].tensor, scalar_f32(a[2].scalar), 1.f)).status();
                   },
                   axpb_kernels(), {Param::input(), Param::output(), Param::scalar()}),
      config(4, 64));
  std::vector<float> x(kLen);
  for (int64_t i = 0; i < kLen; ++i) x[i] = static_cast<float>(i);
  DeviceBuffer dx = upload(hw.w, x);
  DeviceBuffer dy = upload(hw.w, std::vector<float>(kLen, 0.f));
  auto args = [&](DeviceBuffer in, DeviceBuffer out, float a) {
    TaskArgs t;
    t.add_tensor(in.view({kLen}, DType::F32), Tag::Input)
        .add_tensor(out.view({kLen}, DType::F32), Tag::OutputExisting)
        .add_scalar_f32(a);
    return t;
  };
  ASSERT_TRUE(hw.run(args(dx, dy, 2.f)).ok());  // y = 2x + 1 stays on the device
  std::vector<DeviceBuffer> outs;
  std::vector<RunHandle> runs;
  for (int k = 0; k < 4; ++k) outs.push_back(upload(hw.w, std::vector<float>(kLen, 0.f)));
  for (int k = 0; k < 4; ++k) runs.push_back(hw.submit(args(dy, outs[k], static_cast<float>(k + 1))));
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(wait_run(runs[k]).ok()) << k;
    std::vector<float> got = download<float>(hw.w, outs[k], kLen);
    for (int64_t i = 0; i < kLen; ++i) ASSERT_EQ(got[i], (2.f * i + 1.f) * (k + 1) + 1.f) << k << "/" << i;
  }
}

// R67: pipeline_depth accepts values from 1 upward (0 is refused in the refusal tests).
TEST_P(Pipeline, DepthOneThreeAndEightAllWork) {
  Watchdog dog;
  for (uint32_t depth : {1u, 3u, 8u}) {
    Harness hw(ChipCallable("depth",
                            [](ChipOrchestrator& o, const TaskArgs& a) {
                              return o.submit_aiv(kAxpb, axpb(a[0].tensor, a[1].tensor, 2.f, 1.f)).status();
                            },
                            axpb_kernels(), {Param::input(), Param::output()}),
               config(depth, 64));
    std::vector<float> in(kLen, 1.f);
    DeviceBuffer din = upload(hw.w, in);
    std::vector<DeviceBuffer> outs;
    std::vector<RunHandle> runs;
    for (uint32_t r = 0; r < 2 * depth; ++r) outs.push_back(upload(hw.w, std::vector<float>(kLen, 0.f)));
    for (uint32_t r = 0; r < 2 * depth; ++r) {
      TaskArgs args;
      args.add_tensor(din.view({kLen}, DType::F32), Tag::Input)
          .add_tensor(outs[r].view({kLen}, DType::F32), Tag::OutputExisting);
      runs.push_back(hw.submit(args));
    }
    for (uint32_t r = 0; r < 2 * depth; ++r) {
      ASSERT_TRUE(wait_run(runs[r]).ok()) << "depth " << depth << " run " << r;
      EXPECT_EQ(download<float>(hw.w, outs[r], kLen), std::vector<float>(kLen, 3.f));
    }
  }
}

// ---- RunHandle, threads and memory --------------------------------------------------------------

enum : uint32_t { kGate = 1, kCount = 2 };

TEST_P(RunHandleTest, WaitForGivesUpAtItsDeadlineAndTheRunGoesOn) {
  Watchdog dog;
  g_gate_open = false;
  g_gate_passed = 0;
  Harness hw(
      ChipCallable("gated", [](ChipOrchestrator& o, const TaskArgs&) { return o.submit_aiv(kGate, {}).status(); },
                   make_kernels({{kGate, CoreType::AIV, "gate", gate_kernel}}), {}),
      config());
  RunHandle r = hw.submit();
  ASSERT_TRUE(r.valid());
  Status early = r.wait_for(std::chrono::milliseconds(1));
  EXPECT_REFUSED(early, StatusCode::kDeadlineExceeded, std::to_string(r.run_id()));
  EXPECT_FALSE(r.done());
  EXPECT_REFUSED(r.result(), StatusCode::kFailedPrecondition, "not finished");
  EXPECT_EQ(r.stats().tasks, 0u);
  g_gate_open = true;
  EXPECT_TRUE(wait_run(r).ok());
  EXPECT_TRUE(r.done());
  EXPECT_TRUE(r.result().ok());
  EXPECT_EQ(r.stats().tasks, 1u);
  EXPECT_EQ(g_gate_passed.load(), 1);
  // Another thread may wait on a copy of the handle.
  RunHandle copy = r;
  Status from_thread;
  std::thread t([&] { from_thread = copy.wait_for(kWait); });
  t.join();
  EXPECT_TRUE(from_thread.ok());
}

TEST(EmptyRunHandle, RefusesEverything) {
  RunHandle h;
  EXPECT_FALSE(h.valid());
  EXPECT_FALSE(h.done());
  EXPECT_EQ(h.run_id(), 0u);
  EXPECT_REFUSED(h.wait_for(kWait), StatusCode::kFailedPrecondition, "RunHandle is empty");
  EXPECT_REFUSED(h.result(), StatusCode::kFailedPrecondition, "RunHandle is empty");
  EXPECT_REFUSED(h.wait(), StatusCode::kFailedPrecondition, "RunHandle is empty");
}

TEST_P(RunHandleTest, AnEmptyGraphCompletesAtOnce) {
  Watchdog dog;
  Harness hw(ChipCallable("empty", [](ChipOrchestrator&, const TaskArgs&) { return Status(); },
                          make_kernels({{kCount, CoreType::AIV, "count", count_kernel}}), {}),
             config());
  RunHandle r = hw.submit();
  EXPECT_TRUE(wait_run(r).ok());
  EXPECT_EQ(r.stats().tasks, 0u);
  EXPECT_EQ(r.stats().executed, 0u);
}

TEST_P(WorkerThreads, InitCreatesEveryDeviceThreadOnceAndRunsCreateNone) {
  Watchdog dog;
  g_count = 0;
  const int before = thread_count();
  Worker w(Level::Chip, config(2, 64));
  auto h = w.register_callable(ChipCallable("count",
                                            [](ChipOrchestrator& o, const TaskArgs&) {
                                              for (int i = 0; i < 20; ++i) {
                                                if (auto r = o.submit_aiv(kCount, {}); !r.ok()) return r.status();
                                              }
                                              return Status();
                                            },
                                            make_kernels({{kCount, CoreType::AIV, "count", count_kernel}}), {}));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(thread_count(), before);  // nothing before init
  ASSERT_TRUE(w.init().ok());
  const Geometry g = geometry();
  // One thread per core and per AICPU, the orchestrator AICPU of a runtime
  // that runs orchestrations on the device, and the run_timeout watchdog.
  const int orchestrators = GetParam().streaming ? 1 : 0;
  EXPECT_EQ(thread_count(), before + static_cast<int>(g.cores() + g.aicpu_threads + 1) + orchestrators);
  const int after_init = thread_count();
  std::vector<RunHandle> runs;
  for (int i = 0; i < 10; ++i) runs.push_back(w.submit(*h, {}));
  for (auto& r : runs) ASSERT_TRUE(wait_run(r).ok());
  EXPECT_EQ(settled_thread_count(after_init), after_init) << "a run created (or left) a thread";
  EXPECT_EQ(g_count.load(), 200);
  ASSERT_TRUE(w.close().ok());
  EXPECT_EQ(settled_thread_count(before), before) << "close left device threads behind";
}

TEST_P(WorkerThreads, AnIdleWorkerLetsEveryThreadSleep) {
  Watchdog dog;
  WorkerConfig c = config(2, 64);
  Harness hw(ChipCallable("count",
                          [](ChipOrchestrator& o, const TaskArgs&) {
                            for (int i = 0; i < 50; ++i) {
                              if (auto r = o.submit_aiv(kCount, {}); !r.ok()) return r.status();
                            }
                            return Status();
                          },
                          make_kernels({{kCount, CoreType::AIV, "count", count_kernel}}), {}),
             c);
  ASSERT_TRUE(hw.run().ok());
  // After the run, every device thread (cores and AICPUs) parks in the
  // kernel: an idle chip spins nowhere (no CPU-time assertion, just states).
  const size_t device_threads = geometry().cores() + geometry().aicpu_threads;
  std::vector<char> states;
  const bool all_sleep = eventually([&] {
    states = other_thread_states();
    return states.size() >= device_threads &&
           std::all_of(states.begin(), states.end(), [](char st) { return st == 'S'; });
  });
  EXPECT_TRUE(all_sleep) << "thread states: " << std::string(states.begin(), states.end());
  ASSERT_TRUE(hw.run().ok());  // and wakes up for the next run
}

// ---- Buffers a live run uses (issue 9 item 1) ---------------------------------------------------

// The gated task writes `y` (an argument), `c` (a buffer the orchestration
// captured) and an output the runtime allocated; while it is held, none of
// the three can be freed (so none can be handed out again and overwritten);
// once the run ended, the caller's two can, and the run's own is gone.
TEST_P(BorrowedBuffers, NoBufferALiveRunUsesCanBeFreed) {
  Watchdog dog;
  g_gate_open = false;
  DeviceBuffer captured;
  TensorView output;
  Harness hw(ChipCallable("gated_writer",
                          [&](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                            TaskArgs t;
                            t.add_tensor(a[0].tensor, Tag::OutputExisting)
                                .add_tensor(captured.view({16}, DType::I64), Tag::OutputExisting)
                                .add_output({16}, DType::I64);
                            auto r = o.submit_aiv(kGate, t);
                            if (!r.ok()) return r.status();
                            output = r->outputs[0];
                            return Status();
                          },
                          make_kernels({{kGate, CoreType::AIV, "gate", gate_kernel}}), {Param::output()}),
             config());
  DeviceBuffer y = upload(hw.w, std::vector<int64_t>(16, 0));
  captured = upload(hw.w, std::vector<int64_t>(16, 0));
  TaskArgs args;
  args.add_tensor(y.view({16}, DType::I64), Tag::OutputExisting);
  g_gate_entered = 0;
  RunHandle r = hw.submit(args);
  // A streaming runtime runs the orchestration after submit returned: the
  // gated task running means it has borrowed what it names.
  ASSERT_TRUE(eventually([] { return g_gate_entered.load() == 1; })) << "the gated task never started";
  EXPECT_REFUSED(hw.w.free(y), StatusCode::kFailedPrecondition, "in use by a live run");
  EXPECT_REFUSED(hw.w.free(captured), StatusCode::kFailedPrecondition, "in use by a live run");
  if (GetParam().streaming) {
    // The output is carved from the run's heap ring, which the run pins: it
    // is either not an allocation of its own or the pinned ring's start.
    const Status s = hw.w.free(output.buffer());
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kFailedPrecondition)
        << s.to_string();
  } else {
    EXPECT_REFUSED(hw.w.free(output.buffer()), StatusCode::kFailedPrecondition, "in use by a live run");
  }
  auto again = hw.w.malloc(16 * 8);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->addr, y.addr);
  EXPECT_NE(again->addr, captured.addr);
  g_gate_open = true;
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_TRUE(hw.w.free(y).ok());
  EXPECT_TRUE(hw.w.free(captured).ok());
  EXPECT_REFUSED(hw.w.free(output.buffer()), StatusCode::kInvalidArgument, "not a live device allocation");
  EXPECT_TRUE(hw.w.free(*again).ok());
}

// ---- Guarded device memory (issue 9 item 2) ----------------------------------------------------

// Fills its 1-D i64 tensor args[0] with 7, then writes one more element at
// index args[1] (its length: one past the end; -1: one before the start).
void stray_write_kernel(int64_t* args) {
  const DeviceTensor* t = tensor_arg(args, 0);
  for (int64_t i = 0; i < t->shape[0]; ++i) tensor_data<int64_t>(t)[i] = 7;
  tensor_data<int64_t>(t)[args[1]] = 99;
}

enum : uint32_t { kStray = 1, kCopyI64 = 2, kFillI64 = 3 };

// A task that writes out of bounds fails with a message naming the kernel,
// the distance and the argument; its dependent is poisoned, an independent
// task runs, and the next run on the same buffers is clean (the guards were
// restored). Writes before the start and past the end of a caller buffer and
// past a runtime-allocated output are all caught.
TEST_P(GuardedMemory, AnOutOfBoundsWriteFailsItsTaskAndPoisonsItsDependents) {
  Watchdog dog;
  struct Case {
    int64_t index;        // where the stray element lands
    bool runtime_output;  // the stray task writes a runtime-allocated output instead of x
    const char* what;
  };
  for (const Case& c : {Case{16, false, "wrote 8 bytes past tensor argument 0"},
                        Case{-1, false, "wrote 8 bytes before tensor argument 0"},
                        Case{16, true, "wrote 8 bytes past tensor argument 0"}}) {
    SCOPED_TRACE(c.what);
    WorkerConfig cfg = config(2, 64);
    cfg.guard_device_memory = true;
    int64_t stray_at = c.index;
    bool to_output = c.runtime_output;
    Harness hw(ChipCallable("stray",
                            [&](ChipOrchestrator& o, const TaskArgs& a) -> Status {
                              TaskArgs bad;
                              if (to_output) {
                                bad.add_output({16}, DType::I64);
                              } else {
                                bad.add_tensor(a[0].tensor, Tag::OutputExisting);
                              }
                              bad.add_scalar(stray_at);
                              auto r = o.submit_aiv(kStray, bad);
                              if (!r.ok()) return r.status();
                              const TensorView written = to_output ? r->outputs[0] : a[0].tensor;
                              TaskArgs dependent;  // reads what the stray task wrote: poisoned
                              dependent.add_tensor(written, Tag::Input).add_tensor(a[1].tensor, Tag::OutputExisting);
                              if (auto d = o.submit_aiv(kCopyI64, dependent); !d.ok()) return d.status();
                              TaskArgs independent;
                              independent.add_tensor(a[2].tensor, Tag::OutputExisting).add_scalar(5);
                              return o.submit_aiv(kFillI64, independent).status();
                            },
                            make_kernels({{kStray, CoreType::AIV, "stray_write", stray_write_kernel},
                                          {kCopyI64, CoreType::AIV, "copy", copy_kernel},
                                          {kFillI64, CoreType::AIV, "fill", fill_kernel}}),
                            {Param::output(), Param::output(), Param::output()}),
               cfg);
    DeviceBuffer x = upload(hw.w, std::vector<int64_t>(16, 0));
    DeviceBuffer y = upload(hw.w, std::vector<int64_t>(16, 0));
    DeviceBuffer z = upload(hw.w, std::vector<int64_t>(16, 0));
    TaskArgs args;
    args.add_tensor(x.view({16}, DType::I64), Tag::OutputExisting)
        .add_tensor(y.view({16}, DType::I64), Tag::OutputExisting)
        .add_tensor(z.view({16}, DType::I64), Tag::OutputExisting);
    RunHandle r = hw.submit(args);
    const Status s = wait_run(r);
    EXPECT_EQ(s.code(), StatusCode::kKernelFailed) << s.to_string();
    EXPECT_TRUE(contains(s.message(), c.what) && contains(s.message(), "task 0") &&
                contains(s.message(), "'stray_write'"))
        << s.to_string();
    EXPECT_EQ(r.stats().executed, 2u) << "the dependent of the stray task ran";
    EXPECT_EQ(download<int64_t>(hw.w, y, 16), std::vector<int64_t>(16, 0)) << "a poisoned dependent wrote";
    EXPECT_EQ(download<int64_t>(hw.w, z, 16), std::vector<int64_t>(16, 5)) << "the independent task did not run";
    stray_at = 0;  // in bounds now: the same buffers, guards restored, run clean
    RunHandle ok = hw.submit(args);
    EXPECT_TRUE(wait_run(ok).ok()) << ok.result().to_string();
  }
}

// R72: total_bytes is exact and stable across reads; free_bytes <= total and tracks allocations exactly.
TEST_P(WorkerMemory, MemoryInfoIsExactAndFreeTracksAllocations) {
  Watchdog dog;
  WorkerConfig c = config(2, 64);
  c.device_memory_bytes = (uint64_t{5} << 32) + 64;  // above 2^32: reserved, committed on touch
  c.guard_device_memory = false;                     // exact accounting: no guard bytes around allocations
  Harness hw(ChipCallable("none", [](ChipOrchestrator&, const TaskArgs&) { return Status(); },
                          make_kernels({{kCount, CoreType::AIV, "count", count_kernel}}), {}),
             c);
  auto m1 = hw.w.memory_info();
  auto m2 = hw.w.memory_info();
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(m1->total_bytes, (uint64_t{5} << 32) + 64);
  EXPECT_EQ(m1->total_bytes, m2->total_bytes);
  EXPECT_LE(m1->free_bytes, m1->total_bytes);
  auto b = hw.w.malloc(1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->bytes, 1000u);
  EXPECT_EQ(free_bytes(hw.w), m1->free_bytes - 1024);  // 64-byte granules
  auto big = hw.w.malloc(uint64_t{1} << 32);           // an allocation above 4 GiB
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_EQ(free_bytes(hw.w), m1->free_bytes - 1024 - (uint64_t{1} << 32));
  ASSERT_TRUE(hw.w.free(*big).ok());
  ASSERT_TRUE(hw.w.free(*b).ok());
  EXPECT_EQ(free_bytes(hw.w), m1->free_bytes);
}

TEST_P(WorkerMemory, CopiesRoundTripAtOffsetsAndRefuseRangesOutsideTheBuffer) {
  Watchdog dog;
  Harness hw(ChipCallable("none", [](ChipOrchestrator&, const TaskArgs&) { return Status(); },
                          make_kernels({{kCount, CoreType::AIV, "count", count_kernel}}), {}),
             config(1, 16));
  auto b = hw.w.malloc(100);
  ASSERT_TRUE(b.ok());
  std::vector<uint8_t> src(100);
  for (int i = 0; i < 100; ++i) src[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(hw.w.copy_to(*b, src.data(), 100).ok());
  uint8_t part[10];
  ASSERT_TRUE(hw.w.copy_from(part, *b, 10, 90).ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(part[i], 90 + i);
  const uint8_t patch[3] = {200, 201, 202};
  ASSERT_TRUE(hw.w.copy_to(*b, patch, 3, 50).ok());
  std::vector<uint8_t> back(100);
  ASSERT_TRUE(hw.w.copy_from(back.data(), *b, 100).ok());
  EXPECT_EQ(back[50], 200);
  EXPECT_EQ(back[52], 202);
  EXPECT_EQ(back[53], 53);
  // Ranges outside the buffer's 100 bytes (even inside its 128-byte granule) are refused.
  EXPECT_REFUSED(hw.w.copy_to(*b, src.data(), 100, 1), StatusCode::kOutOfRange, "copy_to dst");
  EXPECT_REFUSED(hw.w.copy_from(back.data(), *b, 101), StatusCode::kOutOfRange, "copy_from src");
  EXPECT_REFUSED(hw.w.copy_from(back.data(), *b, 1, 100), StatusCode::kOutOfRange, "copy_from src");
  EXPECT_REFUSED(hw.w.copy_to(*b, src.data(), 1, ~0ull), StatusCode::kOutOfRange, "copy_to dst");
  EXPECT_REFUSED(hw.w.copy_to(*b, nullptr, 4), StatusCode::kInvalidArgument, "src");
  EXPECT_REFUSED(hw.w.copy_from(nullptr, *b, 4), StatusCode::kInvalidArgument, "dst");
  EXPECT_REFUSED(hw.w.copy_to(DeviceBuffer{b->addr, 1000}, src.data(), 4), StatusCode::kOutOfRange, "1000 bytes");
  EXPECT_REFUSED(hw.w.copy_to(DeviceBuffer{}, src.data(), 4), StatusCode::kInvalidArgument, "no device address");
  EXPECT_REFUSED(hw.w.malloc(0).status(), StatusCode::kInvalidArgument, "bytes = 0");
  EXPECT_REFUSED(hw.w.malloc(uint64_t{1} << 40).status(), StatusCode::kResourceExhausted, "bytes");
  // Nothing above changed the buffer.
  std::vector<uint8_t> again(100);
  ASSERT_TRUE(hw.w.copy_from(again.data(), *b, 100).ok());
  EXPECT_EQ(again, back);
  // Free, then every use of the freed buffer is refused.
  ASSERT_TRUE(hw.w.free(*b).ok());
  EXPECT_REFUSED(hw.w.free(*b), StatusCode::kInvalidArgument, "not a live device allocation");
  EXPECT_REFUSED(hw.w.copy_to(*b, src.data(), 4), StatusCode::kInvalidArgument, "not a live device allocation");
}

SIMPLER_ON_EVERY_TARGET(Runtime);
SIMPLER_ON_EVERY_TARGET(Dependencies);
SIMPLER_ON_CONCURRENT_TARGETS(Concurrency);
SIMPLER_ON_EVERY_TARGET(RuntimeOutputs);
SIMPLER_ON_EVERY_TARGET(Scopes);
SIMPLER_ON_EVERY_TARGET(Pipeline);
SIMPLER_ON_EVERY_TARGET(RunHandleTest);
SIMPLER_ON_EVERY_TARGET(WorkerThreads);
SIMPLER_ON_EVERY_TARGET(WorkerMemory);
SIMPLER_ON_EVERY_TARGET(BorrowedBuffers);
SIMPLER_ON_EVERY_TARGET(GuardedMemory);

}  // namespace
}  // namespace simpler
