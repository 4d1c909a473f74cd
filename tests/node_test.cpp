// The node level (L3) over real forked children: the user's example through
// the public Worker, and one case per requirement (R41-R43, R45-R47, R54,
// R67, R68, R72, R73, R77) plus a child killed with SIGKILL. Kernels wait on
// gates in shared memory so the instants under test exist without sleeps.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "conformance.h"
#include "ipc/sub_worker_handler.h"
#include "node/node_worker.h"
#include "node/observer.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

std::vector<float> iota_floats(int n, float base) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = base + i;
  return v;
}

// Sums two f32 tensors into a third: the sub function of the examples.
Status add_sub(const TaskArgsView& a) {
  const int64_t n = a[0].tensor.shape(0);
  const float* x = a.data<float>(0);
  const float* y = a.data<float>(1);
  float* z = a.data<float>(2);
  for (int64_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
  return Status();
}

Status failing_sub(const TaskArgsView&) { return Status(StatusCode::kKernelFailed, "failing_sub says no"); }

// Adds 1 to the first f32 of its tensor.
Status bump_sub(const TaskArgsView& a) {
  *a.data<float>(0) += 1.0f;
  return Status();
}

NodeSpec node_spec(const WorkerConfig& c) {
  NodeSpec s;
  s.config = c;
  return s;
}

std::unique_ptr<NodeWorker> make_node(const WorkerConfig& c, std::vector<SubFunction> fns = {}) {
  std::vector<ChipCallable> callables{axpb_callable()};
  NodeSpec spec = node_spec(c);
  spec.chip_callables = callables;
  spec.functions = std::move(fns);
  auto w = NodeWorker::create(std::move(spec));
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  return w.ok() ? std::move(w).value() : nullptr;
}

std::vector<Observer::Target> targets_of(NodeWorker& w) {
  std::vector<Observer::Target> t;
  for (size_t i = 0; i < w.next_level_workers(); ++i) {
    t.push_back({w.next_child(i).mapping(), w.next_child(i).endpoint().view()});
  }
  return t;
}

// A null host pointer is refused naming it, on a chip's memory and on the
// shared heap alike, as Level::Chip does; nothing is copied.
TEST(NodeWorker, CopiesWithANullHostPointerAreRefused) {
  Watchdog dog;
  Worker w(Level::Node, node_config(1, 0, 2));
  ASSERT_TRUE(w.register_callable(axpb_callable()).ok());
  ASSERT_TRUE(w.init().ok());
  auto device = w.malloc_on(0, 64);
  auto shared = w.malloc_shared(64);
  ASSERT_TRUE(device.ok() && shared.ok());
  for (const DeviceBuffer& b : {*device, *shared}) {
    EXPECT_REFUSED(w.copy_to(b, nullptr, 4), StatusCode::kInvalidArgument, "src is null");
    EXPECT_REFUSED(w.copy_from(nullptr, b, 4), StatusCode::kInvalidArgument, "dst is null");
  }
  EXPECT_TRUE(w.close().ok());
}

// A node's orchestration calling back into its own worker is refused, each
// call naming itself, and the run and the worker go on: a nested submit at
// pipeline_depth 1 waited forever for its own admission, and close() took
// the scheduler from under the run building on it.
TEST(NodeWorker, CallsFromTheWorkersOwnOrchestrationAreRefused) {
  Watchdog dog;
  Worker w(Level::Node, node_config(1, 0, 1));
  auto chip = w.register_callable(axpb_callable());
  ASSERT_TRUE(chip.ok());
  ASSERT_TRUE(w.init().ok());
  const int n = 16;
  const DeviceBuffer x = shared_iota(w, n, 0);
  auto y = w.malloc_shared(n * 4);
  ASSERT_TRUE(y.ok());
  std::vector<Status> inside;
  auto orchestration = [&](Orchestrator& o) -> Status {
    float host = 0;
    inside = {w.malloc_shared(64).status(),
              w.malloc_on(0, 64).status(),
              w.free(*y),
              w.copy_to(*y, &host, 4),
              w.copy_from(&host, *y, 4),
              w.submit([](Orchestrator&) { return Status(); }).result(),
              w.close(),
              w.memory_info().status(),
              w.memory_info_on(0).status()};
    return o.submit_next_level(*chip, axpb_args(x.view({n}, DType::F32), y->view({n}, DType::F32), 2, 1, -1), 0)
        .status();
  };
  ASSERT_TRUE(wait_run(w.submit(orchestration)).ok());
  // The last two only read, and are served.
  const char* const names[] = {"malloc_shared", "malloc_on", "free", "copy_to", "copy_from", "submit", "close"};
  ASSERT_EQ(inside.size(), std::size(names) + 2);
  EXPECT_TRUE(inside[std::size(names)].ok()) << inside[std::size(names)].to_string();
  EXPECT_TRUE(inside[std::size(names) + 1].ok()) << inside[std::size(names) + 1].to_string();
  for (size_t i = 0; i < std::size(names); ++i) {
    EXPECT_REFUSED(inside[i], StatusCode::kFailedPrecondition,
                   std::string(names[i]) + ": called from inside this worker's own orchestration or kernel");
  }
  const auto* out = reinterpret_cast<const float*>(y->addr);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + 1) << i;
  ASSERT_TRUE(
      wait_run(w.submit([&](Orchestrator& o) {
        return o.submit_next_level(*chip, axpb_args(y->view({n}, DType::F32), y->view({n}, DType::F32), 1, 1, -1), 0)
            .status();
      })).ok());
  EXPECT_EQ(out[0], 2.0f) << "a run after the refusals did not run";
  EXPECT_TRUE(w.free(*y).ok());
  EXPECT_TRUE(w.close().ok());
}

// The issue's example through the public API: two chips and a sub worker;
// each run's sub task waits on both chip outputs through their tensor tags.
TEST(NodeWorker, TwoChipsAndASubWorkerThroughThePublicApi) {
  Watchdog dog;
  make_node_gates();
  Worker w(Level::Node, node_config(2, 1, 8, 4));
  auto chip = w.register_callable(axpb_callable());
  ASSERT_TRUE(chip.ok());
  auto post = w.register_function(add_sub);
  ASSERT_TRUE(post.ok());
  ASSERT_TRUE(w.init().ok());
  const int n = 256, runs = 16;
  auto x0 = w.malloc_on(0, n * 4), x1 = w.malloc_on(1, n * 4);
  ASSERT_TRUE(x0.ok() && x1.ok());
  ASSERT_TRUE(w.copy_to(*x0, iota_floats(n, 0).data(), n * 4).ok());
  ASSERT_TRUE(w.copy_to(*x1, iota_floats(n, 1000).data(), n * 4).ok());
  std::vector<DeviceBuffer> z(runs);
  std::vector<RunHandle> handles;
  for (int r = 0; r < runs; ++r) {
    auto zb = w.malloc_shared(n * 4);
    ASSERT_TRUE(zb.ok());
    z[r] = *zb;
    handles.push_back(w.submit([&, r](Orchestrator& o) -> Status {
      Scope scope(o);
      auto y0 = o.alloc({n}, DType::F32), y1 = o.alloc({n}, DType::F32);
      if (!y0.ok() || !y1.ok()) return internal_error("alloc failed");
      (void)o.submit_next_level(*chip, axpb_args(x0->view({n}, DType::F32), *y0, 2, r, -1), 0);
      (void)o.submit_next_level(*chip, axpb_args(x1->view({n}, DType::F32), *y1, 3, 0, -1), 1);
      TaskArgs s;
      s.add_tensor(*y0, Tag::Input)
          .add_tensor(*y1, Tag::Input)
          .add_tensor(z[r].view({n}, DType::F32), Tag::OutputExisting);
      return o.submit_sub(*post, s).status();
    }));
  }
  for (int r = 0; r < runs; ++r) {
    ASSERT_TRUE(wait_run(handles[r]).ok()) << handles[r].result().to_string();
    const auto* out = reinterpret_cast<const float*>(z[r].addr);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + r + 3.0f * (1000 + i)) << "run " << r << " i " << i;
    // Node RunStats: three tasks, all run to success; both scoped
    // intermediates were freed when the sub task (their last user) finished.
    const RunStats s = handles[r].stats();
    EXPECT_EQ(s.tasks, 3u);
    EXPECT_EQ(s.executed, 3u);
    EXPECT_EQ(s.released_early, 2u);
    EXPECT_GE(s.device_us, 0.0);
  }
  for (auto& b : z) EXPECT_TRUE(w.free(b).ok());
  EXPECT_TRUE(w.free(*x0).ok());
  EXPECT_TRUE(w.free(*x1).ok());
  EXPECT_TRUE(w.close().ok());
}

// R46: an allocation live on worker 0 submitted to worker 1 is refused with
// the canonical text, through submit_next_level, and nothing is published.
TEST(NodeWorker, R46ArgumentForTheWrongWorkerIsRefused) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(2, 0, 2));
  ASSERT_NE(w, nullptr);
  auto x = w->malloc_on(0, 64 * 4), y = w->malloc_on(1, 64 * 4);
  ASSERT_TRUE(x.ok() && y.ok());
  Status refused;
  RunHandle r = w->submit([&](Orchestrator& o) {
    refused = o.submit_next_level(CallableHandle{0, axpb_callable().digest()},
                                  axpb_args(x->view({64}, DType::F32), y->view({64}, DType::F32), 1, 0, -1), 1)
                  .status();
    return Status();
  });
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.message(), "not a live allocation on target worker 1")) << refused.to_string();
  EXPECT_EQ(wait_run(r), refused) << "the refusal is the run's first error";
  // Nothing reached native: no entry of worker 1's mailbox was ever occupied.
  const MailboxView v1 = w->next_child(1).endpoint().view();
  for (size_t e = 0; e < v1.entry_count(); ++e) EXPECT_EQ(load_acquire(v1.entry(e).entry_generation), 0u) << e;
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R47: one device result is the input of 4 later runs; free is refused while
// any of them is live and succeeds after.
TEST(NodeWorker, R47DeviceResultFeedsLaterRuns) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 0, 8));
  ASSERT_NE(w, nullptr);
  const int n = 64;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x = w->malloc_on(0, n * 4), d = w->malloc_on(0, n * 4);
  ASSERT_TRUE(x.ok() && d.ok());
  ASSERT_TRUE(w->copy_to(*x, iota_floats(n, 1).data(), n * 4, 0).ok());
  RunHandle producer = w->submit([&](Orchestrator& o) {
    return o.submit_next_level(h, axpb_args(x->view({n}, DType::F32), d->view({n}, DType::F32), 10, 0, -1), 0).status();
  });
  std::vector<DeviceBuffer> outs;
  std::vector<RunHandle> borrowers;
  for (int k = 0; k < 4; ++k) {
    auto out = w->malloc_shared(n * 4);
    ASSERT_TRUE(out.ok());
    outs.push_back(*out);
    borrowers.push_back(w->submit([&, k](Orchestrator& o) {
      return o.submit_next_level(h, axpb_args(d->view({n}, DType::F32), outs[k].view({n}, DType::F32), 1, k, 0), 0)
          .status();
    }));
  }
  ASSERT_TRUE(wait_run(producer).ok()) << producer.result().to_string();
  Status refused = w->free(*d);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(refused.message(), "borrowed by 4 live run")) << refused.to_string();
  gates->open_gate(0);
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(wait_run(borrowers[k]).ok()) << borrowers[k].result().to_string();
    const auto* o = reinterpret_cast<const float*>(outs[k].addr);
    for (int i = 0; i < n; ++i) ASSERT_EQ(o[i], 10.0f * (1 + i) + k);
  }
  EXPECT_TRUE(w->free(*d).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// Two tasks beside each other on one chip write disjoint parts of one shared
// buffer, and read a third part of it. The chip child stages the buffer on its
// device for each; the first to finish must not have its output overwritten
// by the second's copy back of bytes the second never wrote (the chaos test
// T3 found it: outputs of a run that ended OK were never written).
TEST(NodeWorker, TasksWritingDisjointPartsOfOneSharedBufferKeepEachOthersOutput) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 0, 8));
  ASSERT_NE(w, nullptr);
  constexpr int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto b = w->malloc_shared(3 * n * 4);
  ASSERT_TRUE(b.ok());
  auto* f = reinterpret_cast<float*>(b->addr);
  for (int i = 0; i < n; ++i) f[i] = static_cast<float>(i + 1);
  std::fill(f + n, f + 3 * n, -1.0f);
  const TensorView seg0(*b, {n}, DType::F32, 0), seg1(*b, {n}, DType::F32, n), seg2(*b, {n}, DType::F32, 2 * n);
  RunHandle run = w->submit([&](Orchestrator& o) {
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(h, axpb_args(seg0, seg1, 2, 0, 0), 0).status());
    return o.submit_next_level(h, axpb_args(seg0, seg2, 3, 0, 1), 0).status();
  });
  // Both on the device, each with its copy of the buffer, before either ends.
  ASSERT_TRUE(eventually([&] { return std::atomic_ref<uint32_t>(gates->kernels_at_gate).load() == 2; }))
      << "the two tasks never ran side by side";
  gates->open_gate(0);
  ASSERT_TRUE(eventually([&] { return std::atomic_ref<float>(f[n + n - 1]).load() == 2.0f * n; }))
      << "the first task's output never reached the shared buffer";
  gates->open_gate(1);
  ASSERT_TRUE(wait_run(run).ok()) << run.result().to_string();
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(f[n + i], 2.0f * (i + 1)) << "element " << i << " of the first task's output";
    ASSERT_EQ(f[2 * n + i], 3.0f * (i + 1)) << "element " << i << " of the second task's output";
  }
  EXPECT_TRUE(w->free(*b).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A strided output staged on a chip's device goes back element by element
// (as rows of a 2-D view, and as single elements of a 1-D one): the bytes
// between its elements keep what the host had there.
TEST(NodeWorker, StridedOutputsOfAChipTaskLeaveTheBytesBetweenThemAlone) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(1, 0, 2));
  ASSERT_NE(w, nullptr);
  constexpr int n = 8;
  const CallableHandle h{0, axpb_callable().digest()};
  auto b = w->malloc_shared(5 * n * 4);
  ASSERT_TRUE(b.ok());
  auto* f = reinterpret_cast<float*>(b->addr);
  for (int i = 0; i < n; ++i) f[i] = static_cast<float>(i + 1);
  std::fill(f + n, f + 5 * n, -1.0f);
  const TensorView in(*b, {n}, DType::F32, 0);
  const int64_t rows_shape[] = {n, 1}, rows_stride[] = {2, 1}, elems_shape[] = {n}, elems_stride[] = {2};
  const TensorView rows = TensorView::from_parts(*b, DType::F32, 2, rows_shape, rows_stride, n);
  const TensorView elems = TensorView::from_parts(*b, DType::F32, 1, elems_shape, elems_stride, 3 * n);
  RunHandle run = w->submit([&](Orchestrator& o) {
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(h, axpb_args(in, rows, 2, 0, -1), 0).status());
    return o.submit_next_level(h, axpb_args(in, elems, 3, 0, -1), 0).status();
  });
  ASSERT_TRUE(wait_run(run).ok()) << run.result().to_string();
  for (int i = 0; i < 2 * n; ++i) {
    EXPECT_EQ(f[n + i], i % 2 == 0 ? 2.0f * (i / 2 + 1) : -1.0f) << "element " << i << " of the 2-D strided view";
    EXPECT_EQ(f[3 * n + i], i % 2 == 0 ? 3.0f * (i / 2 + 1) : -1.0f) << "element " << i << " of the 1-D strided view";
  }
  EXPECT_TRUE(w->free(*b).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// Intermediates allocated in a scope return to the shared heap once the scope
// ended and their last user finished; the rest when the run is terminal.
TEST(NodeWorker, IntermediatesReturnToTheHeap) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 1, 2), {add_sub});
  ASSERT_NE(w, nullptr);
  const int n = 32;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x = w->malloc_on(0, n * 4);
  auto z = w->malloc_shared(n * 4);
  ASSERT_TRUE(x.ok() && z.ok());
  ASSERT_TRUE(w->copy_to(*x, iota_floats(n, 0).data(), n * 4, 0).ok());
  const uint64_t baseline = w->heap().live_blocks();
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    auto kept = o.alloc({n}, DType::F32);  // outside any scope: freed at the run's terminal
    if (!kept.ok()) return kept.status();
    Scope scope(o);
    auto y = o.alloc({n}, DType::F32);
    if (!y.ok()) return y.status();
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(h, axpb_args(x->view({n}, DType::F32), *y, 2, 0, 0), 0).status());
    TaskArgs s;
    s.add_tensor(*y, Tag::Input).add_tensor(*y, Tag::Input).add_tensor(z->view({n}, DType::F32), Tag::OutputExisting);
    return o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, s).status();
  });
  EXPECT_EQ(w->heap().live_blocks(), baseline + 2);  // the gate holds the chip task: both still live
  gates->open_gate(0);
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(w->heap().live_blocks(), baseline);
  const auto* out = reinterpret_cast<const float*>(z->addr);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 4.0f * i);
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A copy through a freed shared buffer is refused, whether or not the buffer
// touched the live block before it, and writes nothing.
TEST(NodeWorker, CopiesThroughAFreedSharedBufferAreRefused) {
  Watchdog dog;
  Worker w(Level::Node, node_config(0, 1, 2));
  ASSERT_TRUE(w.init().ok());
  auto a = w.malloc_shared(64), b = w.malloc_shared(64), c = w.malloc_shared(64);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(w.free(*b).ok());
  ASSERT_TRUE(w.free(*c).ok());
  const uint32_t word = 0xdeadbeef;
  const char* refusal = "not inside a live shared-heap block";
  for (const DeviceBuffer& gone : {*b, *c}) {
    EXPECT_REFUSED(w.copy_to(gone, &word, sizeof word), StatusCode::kOutOfRange, refusal);
    uint32_t back = 0;
    EXPECT_REFUSED(w.copy_from(&back, gone, sizeof back), StatusCode::kOutOfRange, refusal);
    EXPECT_EQ(*reinterpret_cast<const uint32_t*>(gone.addr), 0u) << "the refused copy wrote the freed block";
  }
  EXPECT_TRUE(w.copy_to(*a, &word, sizeof word).ok());
  EXPECT_TRUE(w.close().ok());
}

// Submits `count` one-task runs of gate 0 from a thread of its own.
struct GatedSubmitter {
  GatedSubmitter(NodeWorker& w, int count, int n, uint32_t chips) : outs(count), handles(count) {
    const CallableHandle h{0, axpb_callable().digest()};
    for (uint32_t c = 0; c < chips; ++c) {
      auto x = w.malloc_on(c, n * 4);
      EXPECT_TRUE(x.ok());
      EXPECT_TRUE(w.copy_to(*x, iota_floats(n, 0).data(), n * 4, 0).ok());
      xs.push_back(*x);
    }
    for (auto& o : outs) o = *w.malloc_shared(static_cast<uint64_t>(n) * 4 * chips);
    thread = std::thread([&w, this, count, n, chips, h] {
      first_submit_ns = now_ns();
      for (int r = 0; r < count; ++r) {
        handles[r] = w.submit([&, r](Orchestrator& o) {
          for (uint32_t c = 0; c < chips; ++c) {
            const TensorView out = TensorView(outs[r], {n}, DType::F32, static_cast<int64_t>(c) * n);
            SIMPLER_RETURN_IF_ERROR(
                o.submit_next_level(h, axpb_args(xs[c].view({n}, DType::F32), out, 1, r, 0), c).status());
          }
          return Status();
        });
      }
    });
  }
  ~GatedSubmitter() {
    if (thread.joinable()) thread.join();
  }
  void verify(int n, uint32_t chips) {
    thread.join();
    for (size_t r = 0; r < handles.size(); ++r) {
      ASSERT_TRUE(wait_run(handles[r]).ok()) << handles[r].result().to_string();
      const auto* o = reinterpret_cast<const float*>(outs[r].addr);
      for (int i = 0; i < n * static_cast<int>(chips); ++i) ASSERT_EQ(o[i], static_cast<float>(i % n + r));
    }
  }
  std::vector<DeviceBuffer> xs;
  std::vector<DeviceBuffer> outs;
  std::vector<RunHandle> handles;
  uint64_t first_submit_ns = 0;
  std::thread thread;
};

// R42 (with R76, R77): pipeline_depth 8, launch_depth 4, 64 submissions:
// (a) all 8 sets held at one coherent instant, (b) every set carries a run,
// (c) the widest launched instant is exactly 4, (d) every result is right.
// The evidence comes only from snapshots; observing starts before the first
// submit, after the device allocations.
// The width cases run on every chip runtime and geometry: the chip children
// take the node's runtime and geometry.
class NodeWidthOnEveryTarget : public TargetTest {
 protected:
  WorkerConfig node_config_for(uint32_t chips, uint32_t depth, uint32_t launch) const {
    WorkerConfig c = node_config(chips, 0, depth, launch);
    c.runtime = GetParam().runtime;
    c.backend = GetParam().backend;
    c.geometry = geometry();
    return c;
  }
};

TEST_P(NodeWidthOnEveryTarget, R42GrantVersusLaunchBudget) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config_for(1, 8, 4));
  ASSERT_NE(w, nullptr);
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  const uint64_t observing_since = obs.evidence(0).first_sample_ns;
  const int n = 32;
  GatedSubmitter sub(*w, 64, n, 1);
  ASSERT_TRUE(eventually([&] {
    const Evidence e = obs.evidence(0);
    return e.widest_held == 8 && e.widest == 4;
  })) << "held "
      << obs.evidence(0).widest_held << ", launched " << obs.evidence(0).widest;
  gates->open_gate(0);
  sub.verify(n, 1);
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  const Evidence e = obs.evidence(0);
  EXPECT_EQ(e.widest_held, 8u);                                          // (a)
  EXPECT_EQ(e.held_sets, (std::set<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));  // (b)
  EXPECT_EQ(e.widest, 4u);                                               // (c)
  EXPECT_LE(observing_since, sub.first_submit_ns);                       // R77
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R43: pipeline_depth 5, launch_depth 5: five runs launched and accepted at
// one coherent instant, results intact.
TEST_P(NodeWidthOnEveryTarget, R43FiveLaunchedAtOnce) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config_for(1, 5, 5));
  ASSERT_NE(w, nullptr);
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  const uint64_t observing_since = obs.evidence(0).first_sample_ns;
  const int n = 32;
  GatedSubmitter sub(*w, 10, n, 1);
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest == 5; })) << obs.evidence(0).widest;
  gates->open_gate(0);
  sub.verify(n, 1);
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  EXPECT_EQ(obs.evidence(0).widest, 5u);
  // R43: the observer's first sample completed before the first submit.
  EXPECT_NE(observing_since, 0u);
  EXPECT_LE(observing_since, sub.first_submit_ns);
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

SIMPLER_ON_EVERY_TARGET(NodeWidthOnEveryTarget);

// R45: each of two chip endpoints independently reaches its full grant (4).
TEST(NodeWidth, R45EachEndpointCarriesItsGrant) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(2, 0, 4, 4));
  ASSERT_NE(w, nullptr);
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  const int n = 16;
  GatedSubmitter sub(*w, 12, n, 2);
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest_held == 4 && obs.evidence(1).widest_held == 4; }));
  gates->open_gate(0);
  sub.verify(n, 2);
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  EXPECT_EQ(obs.evidence(0).widest_held, 4u);
  EXPECT_EQ(obs.evidence(1).widest_held, 4u);
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R41: with the FIFO full, the next begin_run parks, and the parked caller
// holds no set: admitted runs and held sets stay at the grant.
TEST(NodeAdmission, R41BeginRunIsFifoBoundedAndTakesNoLease) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 0, 2));
  ASSERT_NE(w, nullptr);
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  const int n = 16;
  std::atomic<pid_t> tid{0};
  std::atomic<bool> third_returned{false};
  GatedSubmitter sub(*w, 2, n, 1);
  sub.thread.join();
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest_held == 2; }));
  const ArenaCounts before = w->run_set_counts();
  EXPECT_EQ(before.live, 2u);
  RunHandle third;
  std::thread blocked([&] {
    tid = gettid();
    third = w->submit([](Orchestrator&) { return Status(); });
    third_returned = true;
  });
  ASSERT_TRUE(eventually([&] { return tid.load() != 0 && thread_state(tid.load()) == 'S'; }));
  EXPECT_FALSE(third_returned.load());
  EXPECT_EQ(w->admitted_runs(), 2u);
  EXPECT_EQ(obs.evidence(0).widest_held, 2u);
  // The node scheduler's arena, read while the third caller is parked: it
  // took no set.
  const ArenaCounts during = w->run_set_counts();
  EXPECT_EQ(during.live, before.live);
  EXPECT_EQ(during.free, before.free);
  gates->open_gate(0);
  blocked.join();
  EXPECT_TRUE(wait_run(third).ok());
  for (auto& h : sub.handles) EXPECT_TRUE(wait_run(h).ok());
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R54: a node with 5 unwaited runs (one failing) is closed: no run is live,
// every handle is terminal, and the failed run returns the same error on
// every read.
TEST(NodeClose, R54CloseDrainsWide) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 1, 5), {failing_sub});
  ASSERT_NE(w, nullptr);
  const int n = 16;
  GatedSubmitter sub(*w, 4, n, 1);
  sub.thread.join();
  auto heap_in = w->malloc_shared(64);
  ASSERT_TRUE(heap_in.ok());
  RunHandle failing = w->submit([&](Orchestrator& o) {
    TaskArgs a;
    a.add_tensor(heap_in->view({16}, DType::F32), Tag::Input);
    return o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, a).status();
  });
  // The gated runs are still in flight when close() starts: it drains them.
  Status closed = internal_error("close() never returned");
  std::atomic<pid_t> closer_tid{0};
  std::thread closer([&] {
    closer_tid = gettid();
    closed = w->close(std::chrono::seconds(30));
  });
  ASSERT_TRUE(eventually([&] { return closer_tid.load() != 0 && thread_state(closer_tid.load()) == 'S'; }));
  for (auto& h : sub.handles) EXPECT_FALSE(h.done()) << "a gated run ended before its gate opened";
  gates->open_gate(0);
  closer.join();
  EXPECT_TRUE(closed.ok()) << closed.to_string();
  EXPECT_EQ(w->admitted_runs(), 0u);
  for (auto& h : sub.handles) {
    ASSERT_TRUE(h.done());
    EXPECT_TRUE(h.result().ok()) << h.result().to_string();
  }
  ASSERT_TRUE(failing.done());
  const Status first = failing.result();
  EXPECT_EQ(first.code(), StatusCode::kKernelFailed);
  EXPECT_TRUE(contains(first.message(), "failing_sub says no")) << first.to_string();
  EXPECT_EQ(failing.result(), first);
  EXPECT_EQ(failing.stats().tasks, 1u);
  EXPECT_EQ(failing.stats().executed, 0u) << "a failed task is not counted as executed";
  EXPECT_EQ(failing.wait(), first);
}

// A failure at the head of a long chain: the first task fails and 1,000,000
// tasks follow it, each after the one before through an InOut tag on one
// shared-heap tensor. The run ends with the first task's error and every
// task is accounted, the poisoned ones unrun. Poisoning walks the chain on
// the heap, not the stack, and neither wiring nor finishing a task passes
// over every access the node holds, or this would not end. The node then
// runs the same tensor again.
TEST(NodeFailure, FailureAtTheHeadOfAMillionTaskChainPoisonsEveryTask) {
  Watchdog dog;
  constexpr uint32_t kChain = 1'000'000;
  auto w = make_node(node_config(0, 1, 2), {failing_sub, bump_sub});
  ASSERT_NE(w, nullptr);
  auto x = w->malloc_shared(sizeof(float));
  ASSERT_TRUE(x.ok());
  const float zero = 0.0f;
  ASSERT_TRUE(w->copy_to(*x, &zero, sizeof zero, 0).ok());
  const FunctionHandle fail{0, sub_function_digest(0)}, bump{1, sub_function_digest(1)};
  TaskArgs a;
  a.add_tensor(x->view({1}, DType::F32), Tag::InOut);
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    SIMPLER_RETURN_IF_ERROR(o.submit_sub(fail, a).status());
    for (uint32_t i = 0; i < kChain; ++i) SIMPLER_RETURN_IF_ERROR(o.submit_sub(bump, a).status());
    return Status();
  });
  const Status st = wait_run(r);
  EXPECT_EQ(st.code(), StatusCode::kKernelFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "task 0 of run")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "failing_sub says no")) << st.to_string();
  EXPECT_EQ(r.stats().tasks, kChain + 1);
  EXPECT_EQ(r.stats().executed, 0u) << "no poisoned task ran, nor the failed one";
  float value = -1.0f;
  ASSERT_TRUE(w->copy_from(&value, *x, sizeof value, 0).ok());
  EXPECT_EQ(value, 0.0f) << "a poisoned task ran";

  RunHandle again = w->submit([&](Orchestrator& o) { return o.submit_sub(bump, a).status(); });
  EXPECT_TRUE(wait_run(again).ok()) << again.result().to_string();
  ASSERT_TRUE(w->copy_from(&value, *x, sizeof value, 0).ok());
  EXPECT_EQ(value, 1.0f);
  EXPECT_TRUE(w->free(*x).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A chip child killed with SIGKILL: every run it held gets a terminal error,
// the other chip keeps serving, and later work naming the dead chip's device
// buffer is refused at once: the buffer died with it (issue 9 item 5).
TEST(NodeFailure, KilledChildFailsOnlyItsOwnRuns) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(2, 0, 4));
  ASSERT_NE(w, nullptr);
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto y = w->malloc_shared(n * 4 * 4);
  ASSERT_TRUE(x0.ok() && x1.ok() && y.ok());
  std::vector<RunHandle> on0, on1;
  for (int r = 0; r < 2; ++r) {
    on0.push_back(w->submit([&, r](Orchestrator& o) {
      return o
          .submit_next_level(h, axpb_args(x0->view({n}, DType::F32), TensorView(*y, {n}, DType::F32, r * n), 1, 0, 0),
                             0)
          .status();
    }));
    on1.push_back(w->submit([&, r](Orchestrator& o) {
      return o
          .submit_next_level(
              h, axpb_args(x1->view({n}, DType::F32), TensorView(*y, {n}, DType::F32, (2 + r) * n), 1, 0, 0), 1)
          .status();
    }));
  }
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest_held == 2 && obs.evidence(1).widest_held == 2; }));
  // Stopped first: the dead chip's mailbox is registered afresh for its
  // replacement, under the observer's reads.
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  ASSERT_EQ(::kill(w->next_child(0).pid(), SIGKILL), 0);
  for (auto& r : on0) {
    Status st = wait_run(r);
    EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "signal 9")) << st.to_string();
  }
  gates->open_gate(0);
  for (auto& r : on1) EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  RunHandle later = w->submit([&](Orchestrator& o) {
    return o
        .submit_next_level(h, axpb_args(x1->view({n}, DType::F32), TensorView(*y, {n}, DType::F32, 2 * n), 1, 0, -1), 1)
        .status();
  });
  EXPECT_TRUE(wait_run(later).ok());
  RunHandle dead = w->submit([&](Orchestrator& o) {
    return o.submit_next_level(h, axpb_args(x0->view({n}, DType::F32), TensorView(*y, {n}, DType::F32, 0), 1, 0, -1), 0)
        .status();
  });
  EXPECT_TRUE(contains(wait_run(dead).message(), fmt::format("buffer {:#x} was lost with chip worker 0", x0->addr)))
      << dead.result().to_string();
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok()) << "the dead chip's replacement closes cleanly";
}

// A chip child whose kernel blocks on a gate that never opens: past the
// node's run_timeout the child is killed and its run ends DEADLINE_EXCEEDED,
// the other chip keeps serving, later work naming the hung chip's device
// buffer is refused at once (it died with the chip, issue 9 item 5), and
// close() returns.
TEST(NodeFailure, HungChildIsKilledAtItsRunDeadline) {
  Watchdog dog;
  make_node_gates();
  WorkerConfig c = node_config(2, 0, 2);
  // Long enough for every ordinary run here, also under sanitizers; the hung
  // run never ends on its own (gate 7 stays shut until the kernel's own 30 s).
  c.run_timeout = std::chrono::milliseconds(2000);
  auto w = make_node(c);
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto y = w->malloc_shared(n * 4 * 4);
  ASSERT_TRUE(x0.ok() && x1.ok() && y.ok());
  auto on = [&](uint32_t chip, int slot, int gate) {
    const DeviceBuffer& x = chip == 0 ? *x0 : *x1;
    return w->submit([&, chip, slot, gate](Orchestrator& o) {
      return o
          .submit_next_level(
              h, axpb_args(x.view({n}, DType::F32), TensorView(*y, {n}, DType::F32, slot * n), 1, 0, gate), chip)
          .status();
    });
  };
  RunHandle hung = on(0, 0, 7);
  RunHandle other = on(1, 1, -1);
  EXPECT_TRUE(wait_run(other).ok()) << other.result().to_string();
  // The run's own result is DEADLINE_EXCEEDED, so wait on done() rather
  // than through wait_for, whose timeout has the same code.
  (void)hung.wait_for(std::chrono::nanoseconds(kTestWaitNs));
  ASSERT_TRUE(hung.done());
  const Status st = hung.result();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "child hung")) << st.to_string();
  RunHandle after = on(1, 2, -1);
  EXPECT_TRUE(wait_run(after).ok()) << after.result().to_string();
  RunHandle dead = on(0, 3, -1);
  EXPECT_TRUE(contains(wait_run(dead).message(), fmt::format("buffer {:#x} was lost with chip worker 0", x0->addr)))
      << dead.result().to_string();
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok()) << "the hung chip's replacement closes cleanly";
}

// A sub function that waits for gate kGate (its own bound: kTestWaitNs).
// The hang tests use gate 7, which they never open: kTestWaitNs is far past
// any run_timeout there.
template <int kGate>
Status gated_sub(const TaskArgsView&) {
  if (!spin_then_park(
          g_node_gates->bell, [] { return g_node_gates->is_open(kGate); }, SpinPolicy{}, now_ns() + kTestWaitNs)) {
    return Status(StatusCode::kKernelFailed, fmt::format("gated_sub: gate {} never opened", kGate));
  }
  return Status();
}

// Issue 9 item 4: a sub task carries the node's run_timeout like a chip task.
// A sub function that never returns: past the deadline its sub worker is
// killed and the run ends DEADLINE_EXCEEDED, while the other sub worker keeps
// serving, and later sub runs still succeed.
TEST(NodeFailure, Issue9HungSubFunctionIsKilledAtItsRunDeadline) {
  Watchdog dog;
  make_node_gates();
  WorkerConfig c = node_config(0, 2, 2);
  c.run_timeout = std::chrono::milliseconds(2000);  // as HungChildIsKilledAtItsRunDeadline
  auto w = make_node(c, {gated_sub<7>, bump_sub});
  ASSERT_NE(w, nullptr);
  auto x = w->malloc_shared(sizeof(float)), y = w->malloc_shared(sizeof(float));
  ASSERT_TRUE(x.ok() && y.ok());
  auto sub_on = [&](uint32_t fn, const DeviceBuffer& b) {
    TaskArgs a;
    a.add_tensor(b.view({1}, DType::F32), Tag::InOut);
    return w->submit([a, fn](Orchestrator& o) {
      return o.submit_sub(FunctionHandle{fn, sub_function_digest(fn)}, a).status();
    });
  };
  // Sub tasks go round-robin over idle sub workers: the hung one to sub
  // worker 0, the next to sub worker 1.
  RunHandle hung = sub_on(0, *x);
  RunHandle other = sub_on(1, *y);
  EXPECT_TRUE(wait_run(other).ok()) << other.result().to_string();
  // The run's own result is DEADLINE_EXCEEDED: wait on done(), not wait_for's code.
  (void)hung.wait_for(std::chrono::nanoseconds(kTestWaitNs));
  ASSERT_TRUE(hung.done()) << "the hung sub run never ended";
  const Status st = hung.result();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "child hung")) << st.to_string();
  RunHandle after = sub_on(1, *y);
  EXPECT_TRUE(wait_run(after).ok()) << after.result().to_string();
  float v = 0;
  ASSERT_TRUE(w->copy_from(&v, *y, sizeof v, 0).ok());
  EXPECT_EQ(v, 2.0f);
  (void)w->close(std::chrono::seconds(30));
}

// Runs init() on a helper thread that then exits (issue 9 item 6), except
// under ThreadSanitizer: a fork while another thread exists is a
// multi-threaded fork, which its die_after_fork refuses.
Status init_on_a_thread_that_exits(Worker& w) {
#if defined(__SANITIZE_THREAD__)
  return w.init();
#else
  Status st;
  std::thread([&] { st = w.init(); }).join();
  return st;
#endif
}

// One run through a node of one chip and one sub worker: y = 2 * x on the
// chip, then y[0] += 1 on the sub worker. OK when y came out right.
Status chip_then_sub(Worker& w, CallableHandle chip, FunctionHandle bump) {
  constexpr int n = 16;
  SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer x, w.malloc_on(0, n * 4));
  SIMPLER_ASSIGN_OR_RETURN(const DeviceBuffer y, w.malloc_shared(n * 4));
  SIMPLER_RETURN_IF_ERROR(w.copy_to(x, iota_floats(n, 1).data(), n * 4));
  RunHandle r = w.submit([&](Orchestrator& o) -> Status {
    SIMPLER_RETURN_IF_ERROR(
        o.submit_next_level(chip, axpb_args(x.view({n}, DType::F32), y.view({n}, DType::F32), 2, 0, -1), 0).status());
    TaskArgs a;
    a.add_tensor(y.view({1}, DType::F32), Tag::InOut);
    return o.submit_sub(bump, a).status();
  });
  SIMPLER_RETURN_IF_ERROR(r.wait_for(kWait));
  const auto* out = reinterpret_cast<const float*>(y.addr);
  if (out[0] != 3.0f || out[5] != 12.0f) return internal_error("y[0] = {}, y[5] = {}", out[0], out[5]);
  SIMPLER_RETURN_IF_ERROR(w.free(x));
  return w.free(y);
}

// Issue 9 item 6: init() on a helper thread that then exits. The children
// are tied to this process, not to the thread that forked them: once that
// thread is gone, a chip task and a sub task submitted from this thread run.
TEST(NodeLifetime, Issue9InitOnAThreadThatExitsLeavesEveryChildServing) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "init on a helper thread forks a multi-threaded process, which die_after_fork refuses";
#endif
  Watchdog dog;
  make_node_gates();
  Worker w(Level::Node, node_config(1, 1, 2));
  auto chip = w.register_callable(axpb_callable());
  auto bump = w.register_function(bump_sub);
  ASSERT_TRUE(chip.ok() && bump.ok());
  const Status init = init_on_a_thread_that_exits(w);
  ASSERT_TRUE(init.ok()) << init.to_string();
  const Status st = chip_then_sub(w, *chip, *bump);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(w.close().ok());
}

// Issue 9 item 6: the children are still tied to their parent process. A
// harness process, forked here so that this test process is not the one
// killed, inits a node (on a helper thread that exits), runs on it, forks a
// bystander that holds every descriptor it had (as a user's fork would), and
// is killed with SIGKILL: its fork server and both children end with it,
// though the bystander lives on.
TEST(NodeLifetime, Issue9KillingTheParentProcessTakesEveryChildDown) {
  Watchdog dog;
  make_node_gates();
  int report[2], hold[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(hold), 0);
  const pid_t harness = fork();
  ASSERT_GE(harness, 0);
  if (harness == 0) {
    close(report[0]);
    close(hold[1]);
    // Never closed: the harness is killed with the node up.
    auto* w = new Worker(Level::Node, node_config(1, 1, 2));
    auto chip = w->register_callable(axpb_callable());
    auto bump = w->register_function(bump_sub);
    const bool ok =
        chip.ok() && bump.ok() && init_on_a_thread_that_exits(*w).ok() && chip_then_sub(*w, *chip, *bump).ok();
    // It waits, like the harness, until the test closes its end or is gone.
    const pid_t bystander = fork();
    char c;
    if (bystander == 0) {
      (void)!read(hold[0], &c, 1);
      _exit(0);
    }
    char message[1 + sizeof(pid_t)] = {ok && bystander > 0 ? '1' : '0'};
    std::memcpy(message + 1, &bystander, sizeof bystander);
    (void)!write(report[1], message, sizeof message);
    (void)!read(hold[0], &c, 1);
    _exit(0);
  }
  close(report[1]);
  close(hold[0]);
  // Whatever happens below, the harness ends with this test.
  struct Reaper {
    pid_t pid;
    int fds[2];
    ~Reaper() {
      ::kill(pid, SIGKILL);
      (void)waitpid(pid, nullptr, 0);
      close(fds[0]);
      close(fds[1]);
    }
  } reaper{harness, {report[0], hold[1]}};
  pollfd p{report[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, static_cast<int>(kTestWaitNs / 1'000'000)), 1) << "the harness never reported";
  char message[1 + sizeof(pid_t)] = {};
  ASSERT_EQ(read(report[0], message, sizeof message), static_cast<ssize_t>(sizeof message));
  ASSERT_EQ(message[0], '1') << "the harness's node failed its run";
  pid_t bystander = 0;
  std::memcpy(&bystander, message + 1, sizeof bystander);
  std::vector<pid_t> below = descendants_of(harness);
  below.erase(std::remove(below.begin(), below.end(), bystander), below.end());
  EXPECT_EQ(below.size(), 3u) << "the harness forks a fork server, which forks a chip and a sub worker";
  std::vector<int> pidfds;  // opened while they run, so a reused pid cannot fool the check
  for (pid_t d : below) pidfds.push_back(open_pidfd(d));
  ASSERT_EQ(::kill(harness, SIGKILL), 0);
  const uint64_t deadline = now_ns() + kTestWaitNs;
  for (size_t k = 0; k < pidfds.size(); ++k) {
    const int left_ms = static_cast<int>((deadline - std::min(deadline, now_ns())) / 1'000'000);
    EXPECT_TRUE(exits_within(pidfds[k], left_ms)) << "process " << below[k] << " outlived its parent process";
  }
}

// Issue 9 item 15: children carry their role and index in ps, not the
// parent's name: simpler-chip0, simpler-sub1, and simpler-fork for the
// server that forks them.
TEST(NodeLifetime, Issue9ChildrenAreNamedByRoleAndIndex) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(2, 2, 2), {bump_sub});
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(comm_of(w->next_child(0).pid()), "simpler-chip0");
  EXPECT_EQ(comm_of(w->next_child(1).pid()), "simpler-chip1");
  EXPECT_EQ(comm_of(w->sub_child(0).pid()), "simpler-sub0");
  EXPECT_EQ(comm_of(w->sub_child(1).pid()), "simpler-sub1");
  const std::vector<pid_t> below = descendants_of(getpid());
  const bool server_named =
      std::any_of(below.begin(), below.end(), [](pid_t p) { return comm_of(p) == "simpler-fork"; });
  EXPECT_TRUE(server_named) << "no process below this one is named simpler-fork";
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// Kills the current child of `c` and waits until its replacement is forked.
void kill_and_await_replacement(ForkedChild& c) {
  const uint64_t before = c.incarnation();
  ASSERT_EQ(::kill(c.pid(), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return c.incarnation() != before; })) << "no replacement was forked";
}

// Issue 9 item 5: a killed chip child is replaced. The run it held ends
// ABORTED; the replacement's device memory starts empty (exactly what a
// fresh chip reports) and serves later runs correctly; a buffer the user held
// on the dead chip is reported lost on each later use, naming its address
// and the chip; the other chip never notices.
TEST(NodeRecovery, Issue9AKilledChipIsReplacedWithEmptyMemory) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(2, 0, 2));
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  const auto fresh = w->memory_info_on(0);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto y = w->malloc_shared(n * 4 * 4);
  ASSERT_TRUE(x0.ok() && x1.ok() && y.ok());
  ASSERT_TRUE(w->copy_to(*x0, iota_floats(n, 0).data(), n * 4, 0).ok());
  ASSERT_TRUE(w->copy_to(*x1, iota_floats(n, 100).data(), n * 4, 0).ok());
  ASSERT_LT(w->memory_info_on(0)->free_bytes, fresh->free_bytes);
  const float* out = reinterpret_cast<const float*>(y->addr);
  auto axpb_on = [&](uint32_t chip, const DeviceBuffer& x, int slot, int64_t mul, int64_t gate) {
    return w->submit([&, chip, slot, mul, gate](Orchestrator& o) {
      return o
          .submit_next_level(
              h, axpb_args(x.view({n}, DType::F32), TensorView(*y, {n}, DType::F32, slot * n), mul, 1, gate), chip)
          .status();
    });
  };
  Observer obs;
  ASSERT_TRUE(obs.start(targets_of(*w), now_ns() + kTestWaitNs).ok());
  RunHandle held = axpb_on(0, *x0, 0, 2, 0);  // gate 0 stays shut until the chip is dead
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest_held == 1; })) << "the run never reached chip 0";
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());  // before the mailbox is registered afresh
  const pid_t dead = w->next_child(0).pid();
  kill_and_await_replacement(w->next_child(0));
  const Status ended = wait_run(held);
  EXPECT_EQ(ended.code(), StatusCode::kAborted) << ended.to_string();
  EXPECT_TRUE(contains(ended.message(), "signal 9")) << ended.to_string();
  gates->open_gate(0);

  // The replacement: another process, the same name, and a device that starts empty.
  const auto replaced = w->memory_info_on(0);
  ASSERT_TRUE(replaced.ok()) << replaced.status().to_string();
  EXPECT_EQ(replaced->total_bytes, fresh->total_bytes);
  EXPECT_EQ(replaced->free_bytes, fresh->free_bytes) << "the dead chip's allocations are not the replacement's";
  EXPECT_NE(w->next_child(0).pid(), dead);
  EXPECT_EQ(comm_of(w->next_child(0).pid()), "simpler-chip0");
  auto x0b = w->malloc_on(0, n * 4);
  ASSERT_TRUE(x0b.ok()) << x0b.status().to_string();
  ASSERT_TRUE(w->copy_to(*x0b, iota_floats(n, 0).data(), n * 4, 0).ok());
  RunHandle again = axpb_on(0, *x0b, 1, 3, -1);
  ASSERT_TRUE(wait_run(again).ok()) << again.result().to_string();
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[n + i], 3.0f * i + 1) << i;

  // Every later use of the dead chip's buffer reports it lost, by address and chip.
  const std::string lost = fmt::format("buffer {:#x} was lost with chip worker 0", x0->addr);
  std::vector<float> host(n);
  EXPECT_REFUSED(w->copy_from(host.data(), *x0, n * 4, 0), StatusCode::kFailedPrecondition, lost);
  EXPECT_REFUSED(w->copy_to(*x0, host.data(), n * 4, 0), StatusCode::kFailedPrecondition, lost);
  RunHandle naming_it = axpb_on(0, *x0, 2, 1, -1);
  EXPECT_REFUSED(wait_run(naming_it), StatusCode::kFailedPrecondition, lost);
  EXPECT_REFUSED(w->free(*x0), StatusCode::kFailedPrecondition, lost);
  EXPECT_EQ(w->free(*x0).code(), StatusCode::kNotFound) << "a lost buffer's record goes with its free";

  // Chip 1 never noticed.
  RunHandle other = axpb_on(1, *x1, 3, 2, -1);
  ASSERT_TRUE(wait_run(other).ok()) << other.result().to_string();
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[3 * n + i], 2.0f * (100 + i) + 1) << i;
  EXPECT_TRUE(w->free(*x0b).ok());
  EXPECT_TRUE(w->free(*x1).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok()) << "the replacement closes cleanly";
}

// Issue 9 item 5: a chip task built before its chip died, naming a device
// buffer of the dead child, is not sent to the replacement (where that
// address means nothing, or another buffer): it ends ABORTED saying so.
TEST(NodeRecovery, Issue9ATaskBuiltBeforeItsChipDiedDoesNotRunOnTheReplacement) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 1, 2), {gated_sub<3>});
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4);
  auto y = w->malloc_shared(n * 4);
  ASSERT_TRUE(x0.ok() && y.ok());
  // The chip task writes y after the sub task, which waits for gate 3.
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    TaskArgs a;
    a.add_tensor(y->view({n}, DType::F32), Tag::InOut);
    SIMPLER_RETURN_IF_ERROR(o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, a).status());
    return o.submit_next_level(h, axpb_args(x0->view({n}, DType::F32), y->view({n}, DType::F32), 2, 0, -1), 0).status();
  });
  kill_and_await_replacement(w->next_child(0));
  gates->open_gate(3);
  const Status st = wait_run(r);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "task 1 of run")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "chip worker 0 died after this task was built and was replaced"))
      << st.to_string();
  EXPECT_EQ(r.stats().executed, 1u) << "the sub task ran; the chip task did not";
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// Issue 9 item 5: a chip that keeps dying is replaced kRespawnBudget times
// within the window, and the next death fails it for good. A run for it is
// then refused naming it, and so are malloc_on and memory_info_on;
// memory_info names it and reports the living chip; the other chip serves on.
TEST(NodeRecovery, Issue9AChipThatKeepsDyingIsFailedAndNamed) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(2, 0, 2));
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x = w->malloc_shared(n * 4), y = w->malloc_shared(n * 4);
  ASSERT_TRUE(x.ok() && y.ok());
  // Shared-heap tensors only: no device buffer to lose, so each run shows the chip serves.
  auto run_on = [&](uint32_t chip) {
    return wait_run(w->submit([&, chip](Orchestrator& o) {
      return o.submit_next_level(h, axpb_args(x->view({n}, DType::F32), y->view({n}, DType::F32), 2, 0, -1), chip)
          .status();
    }));
  };
  ForkedChild& chip0 = w->next_child(0);
  for (size_t k = 0; k < kRespawnBudget; ++k) {
    kill_and_await_replacement(chip0);
    const Status st = run_on(0);
    ASSERT_TRUE(st.ok()) << "replacement " << k + 1 << ": " << st.to_string();
  }
  ASSERT_EQ(::kill(chip0.pid(), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return chip0.failure().has_value(); })) << "the spent budget never failed chip 0";
  const std::string gone = "chip worker 0 is gone: ABORTED: it died again after 3 replacements within 60 s";
  EXPECT_REFUSED(run_on(0), StatusCode::kAborted, gone);
  EXPECT_REFUSED(w->malloc_on(0, 64).status(), StatusCode::kAborted, gone);
  EXPECT_REFUSED(w->memory_info_on(0).status(), StatusCode::kAborted, gone);
  const auto living = w->memory_info_on(1);
  ASSERT_TRUE(living.ok()) << living.status().to_string();
  const Status sum = w->memory_info().status();
  EXPECT_REFUSED(sum, StatusCode::kAborted, gone);
  EXPECT_TRUE(contains(sum.message(), "signal 9")) << sum.to_string();
  EXPECT_TRUE(contains(sum.message(), fmt::format("the 1 living chip worker(s) report {} free of {} total bytes",
                                                  living->free_bytes, living->total_bytes)))
      << sum.to_string();
  EXPECT_TRUE(run_on(1).ok());
  EXPECT_FALSE(w->close(std::chrono::seconds(30)).ok()) << "close reports how the failed chip last died";
}

// Issue 9 item 5, for a sub worker: a killed one is replaced (the run it held
// ends ABORTED, later sub runs succeed on the replacement) until its budget
// is spent; then sub runs end naming it.
TEST(NodeRecovery, Issue9AKilledSubWorkerIsReplacedUntilItsBudgetIsSpent) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(0, 1, 2), {bump_sub, gated_sub<7>});
  ASSERT_NE(w, nullptr);
  auto x = w->malloc_shared(sizeof(float));
  ASSERT_TRUE(x.ok());
  auto sub_run = [&](uint32_t fn) {
    TaskArgs a;
    a.add_tensor(x->view({1}, DType::F32), Tag::InOut);
    return w->submit([a, fn](Orchestrator& o) {
      return o.submit_sub(FunctionHandle{fn, sub_function_digest(fn)}, a).status();
    });
  };
  ForkedChild& sub = w->sub_child(0);
  Observer obs;
  ASSERT_TRUE(obs.start({{sub.mapping(), sub.endpoint().view()}}, now_ns() + kTestWaitNs).ok());
  RunHandle held = sub_run(1);  // waits on gate 7, which never opens
  ASSERT_TRUE(eventually([&] { return obs.evidence(0).widest == 1; })) << "the sub run never started";
  ASSERT_TRUE(obs.stop(now_ns() + kTestWaitNs).ok());
  for (size_t k = 0; k < kRespawnBudget; ++k) {
    kill_and_await_replacement(sub);
    if (k == 0) {
      const Status ended = wait_run(held);
      EXPECT_EQ(ended.code(), StatusCode::kAborted) << ended.to_string();
      EXPECT_TRUE(contains(ended.message(), "signal 9")) << ended.to_string();
    }
    RunHandle r = sub_run(0);
    ASSERT_TRUE(wait_run(r).ok()) << "replacement " << k + 1 << ": " << r.result().to_string();
    EXPECT_EQ(*reinterpret_cast<const float*>(x->addr), static_cast<float>(k + 1));
  }
  ASSERT_EQ(::kill(sub.pid(), SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return sub.failure().has_value(); })) << "the spent budget never failed the sub worker";
  EXPECT_REFUSED(wait_run(sub_run(0)), StatusCode::kAborted,
                 "no sub worker is left to run this task (sub worker 0 is gone: ABORTED: it died again");
  EXPECT_FALSE(w->close(std::chrono::seconds(30)).ok()) << "close reports how the failed sub worker last died";
}

// run_timeout below 0 is refused, naming the field; 0 (no deadline) is accepted.
TEST(NodeConfig, RunTimeoutIsValidated) {
  WorkerConfig c = node_config(1, 0, 2);
  c.run_timeout = std::chrono::milliseconds(-1);
  EXPECT_REFUSED(NodeWorker::validate(node_spec(c)), StatusCode::kInvalidArgument, "run_timeout");
  c.run_timeout = std::chrono::milliseconds(0);
  EXPECT_TRUE(NodeWorker::validate(node_spec(c)).ok());
}

// R72 at the node level: each chip's total is forwarded exactly (5 * 2^32 + 7,
// above 2^32) and is stable across reads, free <= total and moves by exactly
// what malloc_on took on that chip only; the node's memory_info is the sum.
TEST(NodeMemory, R72MemoryInfoIsForwardedExactly) {
  Watchdog dog;
  make_node_gates();
  constexpr uint64_t kTotal = 5 * (uint64_t{1} << 32) + 7;
  WorkerConfig c = node_config(2, 0, 2);
  c.device_memory_bytes = kTotal;
  c.guard_device_memory = false;  // exact accounting: no guard bytes around allocations
  auto w = make_node(c);
  ASSERT_NE(w, nullptr);
  auto a0 = w->memory_info_on(0), a1 = w->memory_info_on(1);
  ASSERT_TRUE(a0.ok() && a1.ok()) << a0.status().to_string() << a1.status().to_string();
  EXPECT_EQ(a0->total_bytes, kTotal);
  EXPECT_EQ(a1->total_bytes, kTotal);
  EXPECT_LE(a0->free_bytes, a0->total_bytes);
  auto big = w->malloc_on(0, uint64_t{1} << 33);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  auto b0 = w->memory_info_on(0), b1 = w->memory_info_on(1);
  ASSERT_TRUE(b0.ok() && b1.ok());
  EXPECT_EQ(b0->total_bytes, a0->total_bytes);
  EXPECT_EQ(a0->free_bytes - b0->free_bytes, uint64_t{1} << 33);
  EXPECT_EQ(b1->free_bytes, a1->free_bytes);
  auto sum = w->memory_info();
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->total_bytes, 2 * kTotal);
  EXPECT_EQ(sum->free_bytes, b0->free_bytes + b1->free_bytes);
  EXPECT_REFUSED(w->memory_info_on(2).status(), StatusCode::kInvalidArgument, "worker = 2");
  EXPECT_TRUE(w->free(*big).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R72 through the public facade: Worker::memory_info at Level::Node is the
// chips' sum, exact above 2^32.
TEST(NodeMemory, R72WorkerFacadeSumsItsChips) {
  Watchdog dog;
  WorkerConfig c = node_config(2, 0, 1);
  c.device_memory_bytes = 5 * (uint64_t{1} << 32) + 7;
  Worker w(Level::Node, c);
  ASSERT_TRUE(w.init().ok());
  auto m = w.memory_info();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->total_bytes, 2 * (5 * (uint64_t{1} << 32) + 7));
  EXPECT_LE(m->free_bytes, m->total_bytes);
  EXPECT_TRUE(w.close().ok());
}

// Worker::memory_info_on at Level::Node reads one chip through its control
// frame. R72: each chip's total is forwarded exactly (5 * 2^32 + 7), and free
// moves by exactly what malloc_on took on that chip only. Refused before init
// and after close (FAILED_PRECONDITION) and for a chip the node does not have
// (INVALID_ARGUMENT naming `worker`).
TEST(NodeMemory, R72WorkerFacadeReadsOneChipExactly) {
  Watchdog dog;
  constexpr uint64_t kTotal = 5 * (uint64_t{1} << 32) + 7;
  constexpr uint64_t kTaken = (uint64_t{1} << 33) + 4096;
  WorkerConfig c = node_config(2, 0, 1);
  c.device_memory_bytes = kTotal;
  c.guard_device_memory = false;  // exact accounting: no guard bytes around allocations
  Worker w(Level::Node, c);
  EXPECT_REFUSED(w.memory_info_on(0).status(), StatusCode::kFailedPrecondition, "init()");
  ASSERT_TRUE(w.init().ok());
  auto a0 = w.memory_info_on(0), a1 = w.memory_info_on(1);
  ASSERT_TRUE(a0.ok() && a1.ok()) << a0.status().to_string() << a1.status().to_string();
  EXPECT_EQ(a0->total_bytes, kTotal);  // R72: exact above 2^32
  EXPECT_EQ(a1->total_bytes, kTotal);
  EXPECT_LE(a0->free_bytes, a0->total_bytes);
  EXPECT_LE(a1->free_bytes, a1->total_bytes);
  auto big = w.malloc_on(1, kTaken);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  auto b0 = w.memory_info_on(0), b1 = w.memory_info_on(1);
  ASSERT_TRUE(b0.ok() && b1.ok()) << b0.status().to_string() << b1.status().to_string();
  EXPECT_EQ(b1->total_bytes, a1->total_bytes);
  EXPECT_EQ(a1->free_bytes - b1->free_bytes, kTaken);  // R72: the free value forwarded exactly
  EXPECT_EQ(b0->free_bytes, a0->free_bytes) << "chip 0 was not touched";
  auto sum = w.memory_info();
  ASSERT_TRUE(sum.ok()) << sum.status().to_string();
  EXPECT_EQ(sum->total_bytes, b0->total_bytes + b1->total_bytes);
  EXPECT_EQ(sum->free_bytes, b0->free_bytes + b1->free_bytes);
  EXPECT_REFUSED(w.memory_info_on(2).status(), StatusCode::kInvalidArgument, "worker = 2");
  EXPECT_REFUSED(w.memory_info_on(UINT32_MAX).status(), StatusCode::kInvalidArgument, "worker = 4294967295");
  EXPECT_TRUE(w.free(*big).ok());
  auto c1 = w.memory_info_on(1);
  ASSERT_TRUE(c1.ok()) << c1.status().to_string();
  EXPECT_EQ(c1->free_bytes, a1->free_bytes);
  EXPECT_TRUE(w.close().ok());
  EXPECT_REFUSED(w.memory_info_on(0).status(), StatusCode::kFailedPrecondition, "closed");
}

// At Level::Chip memory_info_on is refused as malloc_on is, naming the level;
// the chip's memory is memory_info().
TEST(NodeMemory, MemoryInfoOnIsRefusedAtChipLevel) {
  WorkerConfig c = node_config(0, 0, 2);
  c.shared_heap_bytes = WorkerConfig().shared_heap_bytes;  // a chip has no shared heap
  Worker w(Level::Chip, c);
  EXPECT_REFUSED(w.memory_info_on(0).status(), StatusCode::kFailedPrecondition, "Level::Node");
  ASSERT_TRUE(w.init().ok());
  EXPECT_REFUSED(w.memory_info_on(0).status(), StatusCode::kFailedPrecondition, "Level::Node");
  EXPECT_REFUSED(w.malloc_on(0, 64).status(), StatusCode::kFailedPrecondition, "Level::Node");
  EXPECT_TRUE(w.memory_info().ok());
  EXPECT_TRUE(w.close().ok());
}

// The state of the held entry of chip `chip` carrying task_slot `slot` and
// the set it took (kMailboxIdle / kMailboxNoSet when no held entry does).
std::pair<uint32_t, uint32_t> chip_entry(NodeWorker& w, size_t chip, uint32_t slot) {
  const MailboxView v = w.next_child(chip).endpoint().view();
  for (uint64_t i = 0; i < v.entry_count(); ++i) {
    const MailboxRunEntry& e = v.entry(i);
    if (load_acquire(e.entry_generation) % 2 == 1 && load_acquire(e.task_slot) == slot) {
      return {load_acquire(e.state), load_acquire(e.set_slot)};
    }
  }
  return {kMailboxIdle, kMailboxNoSet};
}

// The staged lane over a real chip child: C reads (through the shared heap)
// what A writes on the same chip. While A is held on a gate, C is published
// PREPARE_READY, taken by the child and natively prepared (it holds a set)
// but not launched; once A succeeds C is activated, copies its input in only
// then, and computes from A's result. When A fails, the staged C is
// cancelled unrun, its set comes back, and the chip serves two runs at once.
TEST(NodeStaging, StagedSuccessorIsPreparedWhileItsPredecessorRuns) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(1, 0, 2));
  ASSERT_NE(w, nullptr);
  const int n = 64;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x = w->malloc_on(0, n * 4);
  auto heap = w->malloc_shared(n * 4 * 4);
  ASSERT_TRUE(x.ok() && heap.ok());
  ASSERT_TRUE(w->copy_to(*x, iota_floats(n, 1).data(), n * 4, 0).ok());
  const TensorView y(*heap, {n}, DType::F32, 0), z(*heap, {n}, DType::F32, n);
  auto chain = [&](int64_t mul_a, int gate) {
    return w->submit([&, mul_a, gate](Orchestrator& o) {
      (void)o.submit_next_level(h, axpb_args(x->view({n}, DType::F32), y, mul_a, 0, gate), 0);
      return o.submit_next_level(h, axpb_args(y, z, 3, 1, -1), 0).status();
    });
  };
  RunHandle ok = chain(2, 3);
  ASSERT_TRUE(eventually([&] {
    const auto [state, set] = chip_entry(*w, 0, 1);
    return state == kMailboxFrameStaged && set != kMailboxNoSet;
  })) << "C was not staged and natively prepared: A state "
      << chip_entry(*w, 0, 0).first << " set " << chip_entry(*w, 0, 0).second << ", C state "
      << chip_entry(*w, 0, 1).first << " set " << chip_entry(*w, 0, 1).second;
  ASSERT_TRUE(eventually([&] { return chip_entry(*w, 0, 0).first == kMailboxTaskLaunched; })) << "A never launched";
  EXPECT_EQ(chip_entry(*w, 0, 1).first, static_cast<uint32_t>(kMailboxFrameStaged))
      << "C launched before its activation";
  gates->open_gate(3);
  ASSERT_TRUE(wait_run(ok).ok()) << ok.result().to_string();
  const auto* zf = reinterpret_cast<const float*>(heap->addr) + n;
  for (int i = 0; i < n; ++i) ASSERT_EQ(zf[i], 3.0f * (2.0f * (1 + i)) + 1.0f) << i;

  RunHandle bad = chain(kAxpbFail, 4);
  ASSERT_TRUE(eventually([&] { return chip_entry(*w, 0, 1).first == kMailboxFrameStaged; }));
  gates->open_gate(4);
  const Status st = wait_run(bad);
  EXPECT_EQ(st.code(), StatusCode::kKernelFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "asked to fail")) << st.to_string();
  // Both sets are free again: two runs are launched at once.
  std::vector<RunHandle> pair;
  for (int r = 0; r < 2; ++r) {
    pair.push_back(w->submit([&, r](Orchestrator& o) {
      return o
          .submit_next_level(
              h, axpb_args(x->view({n}, DType::F32), TensorView(*heap, {n}, DType::F32, (2 + r) * n), 1, 0, 5), 0)
          .status();
    }));
  }
  const MailboxView v = w->next_child(0).endpoint().view();
  ASSERT_TRUE(eventually([&] {
    int launched = 0;
    for (uint64_t i = 0; i < v.entry_count(); ++i) {
      launched +=
          load_acquire(v.entry(i).entry_generation) % 2 == 1 && load_acquire(v.entry(i).state) == kMailboxTaskLaunched;
    }
    return launched == 2;
  })) << "the cancelled staged run kept its set";
  gates->open_gate(5);
  for (auto& r : pair) EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A chip child killed with SIGKILL while it holds a running A and its staged
// successor C: the run gets one terminal with the child's cause, and nothing
// waits on the activation that can no longer come.
TEST(NodeStaging, KilledChildEndsTheStagedSuccessorToo) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(1, 0, 2));
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x = w->malloc_on(0, n * 4);
  auto heap = w->malloc_shared(n * 4 * 2);
  ASSERT_TRUE(x.ok() && heap.ok());
  const TensorView y(*heap, {n}, DType::F32, 0), z(*heap, {n}, DType::F32, n);
  RunHandle r = w->submit([&](Orchestrator& o) {
    (void)o.submit_next_level(h, axpb_args(x->view({n}, DType::F32), y, 2, 0, 8), 0);
    return o.submit_next_level(h, axpb_args(y, z, 3, 1, -1), 0).status();
  });
  ASSERT_TRUE(eventually([&] { return chip_entry(*w, 0, 1).first == kMailboxFrameStaged; }));
  ASSERT_EQ(::kill(w->next_child(0).pid(), SIGKILL), 0);
  const Status st = wait_run(r);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "signal 9")) << st.to_string();
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok()) << "the killed chip's replacement closes cleanly";
}

// Doubles a f32 tensor into another: a sub function for groups.
Status double_sub(const TaskArgsView& a) {
  const int64_t n = a[0].tensor.shape(0);
  const float* x = a.data<float>(0);
  float* y = a.data<float>(1);
  for (int64_t i = 0; i < n; ++i) y[i] = 2 * x[i];
  return Status();
}

// A next-level group over both chips, and a sub task that reads both
// members' outputs: the group is one task, done when both members are.
TEST(NodeGroup, NextLevelGroupIsOneTaskOverSeveralChips) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(2, 1, 2), {add_sub});
  ASSERT_NE(w, nullptr);
  const int n = 32;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto heap = w->malloc_shared(n * 4 * 3);
  ASSERT_TRUE(x0.ok() && x1.ok() && heap.ok());
  ASSERT_TRUE(w->copy_to(*x0, iota_floats(n, 0).data(), n * 4, 0).ok());
  ASSERT_TRUE(w->copy_to(*x1, iota_floats(n, 100).data(), n * 4, 0).ok());
  const TensorView y0(*heap, {n}, DType::F32, 0), y1(*heap, {n}, DType::F32, n), z(*heap, {n}, DType::F32, 2 * n);
  uint32_t group_id = 99, count = 0;
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    auto g = o.submit_next_level_group(
        h, {axpb_args(x0->view({n}, DType::F32), y0, 2, 0, -1), axpb_args(x1->view({n}, DType::F32), y1, 3, 0, -1)},
        {0, 1});
    if (!g.ok()) return g.status();
    group_id = *g;
    TaskArgs s;
    s.add_tensor(y0, Tag::Input).add_tensor(y1, Tag::Input).add_tensor(z, Tag::OutputExisting);
    SIMPLER_RETURN_IF_ERROR(o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, s).status());
    count = o.task_count();
    return Status();
  });
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_EQ(group_id, 0u);
  EXPECT_EQ(count, 2u) << "the group is one task";
  EXPECT_EQ(r.stats().tasks, 2u);
  EXPECT_EQ(r.stats().executed, 2u);
  const auto* zf = reinterpret_cast<const float*>(heap->addr) + 2 * n;
  for (int i = 0; i < n; ++i) ASSERT_EQ(zf[i], 2.0f * i + 3.0f * (100 + i)) << i;
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A member failure fails the group (naming the member) and poisons its
// successors; the other member still ran. A group refused at build adds
// nothing: duplicate workers, a member's bad argument, a sub group larger
// than the sub workers.
TEST(NodeGroup, MemberFailureFailsTheGroupAndRefusalAddsNothing) {
  Watchdog dog;
  make_node_gates();
  auto w = make_node(node_config(2, 1, 2), {add_sub});
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto heap = w->malloc_shared(n * 4 * 3);
  ASSERT_TRUE(x0.ok() && x1.ok() && heap.ok());
  ASSERT_TRUE(w->copy_to(*x0, iota_floats(n, 1).data(), n * 4, 0).ok());
  const TensorView y0(*heap, {n}, DType::F32, 0), y1(*heap, {n}, DType::F32, n), z(*heap, {n}, DType::F32, 2 * n);
  std::memset(reinterpret_cast<void*>(heap->addr), 0, n * 4 * 3);
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    (void)o.submit_next_level_group(h,
                                    {axpb_args(x0->view({n}, DType::F32), y0, 1, 0, -1),
                                     axpb_args(x1->view({n}, DType::F32), y1, kAxpbFail, 0, -1)},
                                    {0, 1});
    TaskArgs s;
    s.add_tensor(y0, Tag::Input).add_tensor(y1, Tag::Input).add_tensor(z, Tag::OutputExisting);
    return o.submit_sub(FunctionHandle{0, sub_function_digest(0)}, s).status();
  });
  const Status st = wait_run(r);
  EXPECT_EQ(st.code(), StatusCode::kKernelFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "group member 1")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "asked to fail")) << st.to_string();
  EXPECT_EQ(reinterpret_cast<const float*>(heap->addr)[3], 4.0f) << "member 0 ran";
  EXPECT_EQ(reinterpret_cast<const float*>(heap->addr)[2 * n], 0.0f) << "the successor was poisoned, not run";
  EXPECT_EQ(r.stats().executed, 0u);

  uint32_t tasks_after = 99;
  RunHandle dup = w->submit([&](Orchestrator& o) -> Status {
    auto g = o.submit_next_level_group(
        h, {axpb_args(x0->view({n}, DType::F32), y0, 1, 0, -1), axpb_args(x0->view({n}, DType::F32), y1, 1, 0, -1)},
        {0, 0});
    auto bad = o.submit_next_level_group(
        h, {axpb_args(x0->view({n}, DType::F32), y0, 1, 0, -1), axpb_args(x0->view({n}, DType::F32), y1, 1, 0, -1)},
        {0, 1});
    auto big = o.submit_sub_group(FunctionHandle{0, sub_function_digest(0)}, {TaskArgs{}, TaskArgs{}});
    tasks_after = o.task_count();
    EXPECT_TRUE(contains(g.status().message(), "distinct workers")) << g.status().to_string();
    EXPECT_TRUE(contains(bad.status().message(), "group member 1")) << bad.status().to_string();
    EXPECT_TRUE(contains(bad.status().message(), "target worker 1")) << bad.status().to_string();
    EXPECT_TRUE(contains(big.status().message(), "sub_workers = 1")) << big.status().to_string();
    return Status();
  });
  EXPECT_EQ(wait_run(dup).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tasks_after, 0u) << "a refused group adds nothing";
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// No member is published unless every member can be: chip 1's lanes are all
// held by gated tasks, so the group over chips 0 and 1 stays READY and its
// chip-0 member is not published, while a later task of the same run goes
// out on chip 0. Once chip 1 drains, the group runs.
TEST(NodeGroup, NothingIsPublishedUnlessEveryMemberCanBe) {
  Watchdog dog;
  TestGates* gates = make_node_gates();
  auto w = make_node(node_config(2, 0, 2));
  ASSERT_NE(w, nullptr);
  const int n = 16;
  const CallableHandle h{0, axpb_callable().digest()};
  auto x0 = w->malloc_on(0, n * 4), x1 = w->malloc_on(1, n * 4);
  auto heap = w->malloc_shared(n * 4 * 8);
  ASSERT_TRUE(x0.ok() && x1.ok() && heap.ok());
  const uint64_t lanes = w->next_child(1).endpoint().view().entry_count();  // G + K
  RunHandle fill = w->submit([&](Orchestrator& o) -> Status {
    for (uint64_t k = 0; k < lanes; ++k) {
      SIMPLER_RETURN_IF_ERROR(
          o.submit_next_level(
               h, axpb_args(x1->view({n}, DType::F32), TensorView(*heap, {n}, DType::F32, k * n), 1, 0, 6), 1)
              .status());
    }
    return Status();
  });
  RunHandle r = w->submit([&](Orchestrator& o) -> Status {
    SIMPLER_RETURN_IF_ERROR(
        o.submit_next_level_group(
             h,
             {axpb_args(x0->view({n}, DType::F32), TensorView(*heap, {n}, DType::F32, 5 * n), 1, 0, -1),
              axpb_args(x1->view({n}, DType::F32), TensorView(*heap, {n}, DType::F32, 6 * n), 1, 0, -1)},
             {0, 1})
            .status());
    return o
        .submit_next_level(h, axpb_args(x0->view({n}, DType::F32), TensorView(*heap, {n}, DType::F32, 7 * n), 1, 0, 6),
                           0)
        .status();
  });
  // The later task (slot 1) is on chip 0: the round that published it had
  // the group, ahead of it in READY order, refused by chip 1's gate.
  ASSERT_TRUE(eventually([&] { return chip_entry(*w, 0, 1).first != kMailboxIdle; }));
  EXPECT_EQ(chip_entry(*w, 0, 0).first, static_cast<uint32_t>(kMailboxIdle))
      << "the group's chip-0 member went out alone";
  gates->open_gate(6);
  EXPECT_TRUE(wait_run(fill).ok()) << fill.result().to_string();
  EXPECT_TRUE(wait_run(r).ok()) << r.result().to_string();
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// A sub group: each member on its own sub worker, all-or-nothing.
TEST(NodeGroup, SubGroupRunsEachMemberOnItsOwnSubWorker) {
  Watchdog dog;
  auto w = make_node(node_config(0, 2, 2), {double_sub});
  ASSERT_NE(w, nullptr);
  const int n = 8;
  auto heap = w->malloc_shared(n * 4 * 4);
  ASSERT_TRUE(heap.ok());
  auto* f = reinterpret_cast<float*>(heap->addr);
  for (int i = 0; i < 2 * n; ++i) f[i] = static_cast<float>(i);
  std::vector<TaskArgs> members(2);
  for (int m = 0; m < 2; ++m) {
    members[m]
        .add_tensor(TensorView(*heap, {n}, DType::F32, m * n), Tag::Input)
        .add_tensor(TensorView(*heap, {n}, DType::F32, (2 + m) * n), Tag::OutputExisting);
  }
  RunHandle r = w->submit([&](Orchestrator& o) {
    return o.submit_sub_group(FunctionHandle{0, sub_function_digest(0)}, members).status();
  });
  ASSERT_TRUE(wait_run(r).ok()) << r.result().to_string();
  for (int i = 0; i < 2 * n; ++i) ASSERT_EQ(f[2 * n + i], 2.0f * i) << i;
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// R67, R73: pipeline_depth accepts [1, 2^32 - 1] at the facade (the program
// contract has no upper depth: 9 and 1024 validate); 0 is refused
// naming the field. 2^32 is not representable in the field's type, and
// 2^32 - 1 passes the facade only to fail the mailbox cap (R69), again
// naming pipeline_depth, before anything is mapped or forked.
TEST(NodeConfig, R67DepthRange) {
  static_assert(std::numeric_limits<decltype(WorkerConfig::pipeline_depth)>::max() == 4294967295u,
                "2^32 must be unrepresentable: the facade's type is the upper bound");
  for (uint32_t d : {1u, 3u, 8u, 9u, 1024u})
    EXPECT_TRUE(NodeWorker::validate(node_spec(node_config(1, 0, d))).ok()) << d;
  EXPECT_REFUSED(NodeWorker::validate(node_spec(node_config(1, 0, 0))), StatusCode::kInvalidArgument,
                 "pipeline_depth = 0");
  const Status top = NodeWorker::validate(node_spec(node_config(1, 0, 4294967295u)));
  EXPECT_FALSE(top.ok());
  EXPECT_TRUE(contains(top.message(), "pipeline_depth = 4294967295")) << top.to_string();
  Worker w(Level::Node, node_config(1, 0, 0));
  EXPECT_REFUSED(w.init(), StatusCode::kInvalidArgument, "pipeline_depth");
}

// A child handler that resolves fewer sets than asked for.
class UnderGrantingHandler final : public RunHandler {
 public:
  uint64_t granted_sets() const override { return 1; }
  void start(RunRequest, RunTicket ticket) override { ticket.complete(Status()); }
};

// R68: a child that grants 1 for a request of 4 fails startup.
TEST(NodeConfig, R68UnderGrantFailsStartup) {
  Watchdog dog;
  SpawnOptions o;
  o.granted_sets = 4;
  auto c =
      require_grant(ForkedChild::spawn([] { return std::make_unique<UnderGrantingHandler>(); }, o), 4, "chip worker 0");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "granted 1 run-resource sets of the pipeline_depth = 4"))
      << c.status().to_string();
}

// A child handler that reports no sets at all.
class ZeroGrantingHandler final : public RunHandler {
 public:
  uint64_t granted_sets() const override { return 0; }
  void start(RunRequest, RunTicket ticket) override { ticket.complete(Status()); }
};

// Bug (issue 10), R68: a next-level child that reports 0 granted sets is an
// under-grant like any other, not a child exempt from the check.
TEST(NodeConfig, R68ZeroGrantFailsStartup) {
  Watchdog dog;
  SpawnOptions o;
  o.granted_sets = 4;
  auto c =
      require_grant(ForkedChild::spawn([] { return std::make_unique<ZeroGrantingHandler>(); }, o), 4, "chip worker 0");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "granted 0 run-resource sets of the pipeline_depth = 4"))
      << c.status().to_string();
}

// Issue 9 item 8: a sub function or an orchestration that throws is the
// user's code failing: the run ends USER_CODE_FAILED (not INTERNAL, a defect
// inside simpler) with the exception's text; the node serves on.
TEST(NodeFailure, Issue9ThrowsAreReportedAsTheUsersCodeFailing) {
  Watchdog dog;
  auto w =
      make_node(node_config(0, 1, 2), {[](const TaskArgsView&) -> Status { throw std::runtime_error("sub blew up"); },
                                       [](const TaskArgsView&) -> Status { throw 42; }, bump_sub});
  ASSERT_NE(w, nullptr);
  auto x = w->malloc_shared(sizeof(float));
  ASSERT_TRUE(x.ok());
  TaskArgs a;
  a.add_tensor(x->view({1}, DType::F32), Tag::InOut);
  auto sub_run = [&](uint32_t fn) {
    return wait_run(w->submit([&, fn](Orchestrator& o) {
      return o.submit_sub(FunctionHandle{fn, sub_function_digest(fn)}, a).status();
    }));
  };
  Status st = sub_run(0);
  EXPECT_EQ(st.code(), StatusCode::kUserCodeFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "sub function 0 threw: sub blew up")) << st.to_string();
  st = sub_run(1);
  EXPECT_EQ(st.code(), StatusCode::kUserCodeFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "sub function 1 threw a non-standard exception")) << st.to_string();
  st = wait_run(w->submit([](Orchestrator&) -> Status { throw std::runtime_error("orchestration blew up"); }));
  EXPECT_EQ(st.code(), StatusCode::kUserCodeFailed) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "the orchestration threw: orchestration blew up")) << st.to_string();
  EXPECT_TRUE(sub_run(2).ok());
  EXPECT_TRUE(w->free(*x).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
}

// Issue 9 item 8: a chip child whose device cannot hold its graph arenas
// refuses init with RESOURCE_EXHAUSTED, and Worker::init reports exactly that
// code (not FAILED_PRECONDITION around it), naming the chip and the field.
TEST(NodeConfig, Issue9RefusedChildInitSurfacesItsOwnCode) {
  Watchdog dog;
  make_node_gates();
  WorkerConfig c = node_config(1, 0, 2);
  c.device_memory_bytes = 4096;
  Worker w(Level::Node, c);
  ASSERT_TRUE(w.register_callable(axpb_callable()).ok());
  const Status st = w.init();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "chip worker 0: child init failed: ")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "device_memory_bytes is 4096")) << st.to_string();
}

}  // namespace
}  // namespace simpler::testing
