// T13 of the reliability plan: a sticky device fault (CUDA/MPS semantics),
// raised by H3 when the middle task of a three-task DAG starts. At the chip
// level (two ChipWorkers in this process) and at the node level (a node of
// two chip children), with several runs in flight on the faulted device:
// every one of them ends with exactly one DEVICE_FAULT terminal; later
// submissions are refused naming the fault; health reports the device
// poisoned; the other device keeps completing runs bit-exact; after the
// reset (the chip: close and create again; the node: the chip child exits
// and ForkedChild::maintain replaces it) new runs succeed; the run-set
// accounting holds; the health scan is clean. Prints
// `RELIABILITY T13 runs_affected=.. refused_after=.. recovered=1 ms_to_refusal=.. ms_to_recover=..`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "chip/chip_worker.h"
#include "device/sim/sticky_fault.h"
#include "health_scan.h"
#include "node/node_worker.h"
#include "node_test_util.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

#ifdef SIMPLER_TEST_HOOKS

using Clock = std::chrono::steady_clock;

constexpr int kN = 16;
constexpr uint32_t kTrigger = 7;  // the middle task's func_id in the run H3 aims at
constexpr uint32_t kNormal = 1;   // the same kernel under another func_id

// Polls `cond` every millisecond until it holds or kWait passes (the child's
// counter rings nothing): true when it held.
bool poll_for(const std::function<bool()>& cond) {
  const auto end = Clock::now() + kWait;
  while (!cond()) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// a = x * 2 + 1 (after gate), b = a * 3 + 2 (func_id `mid`), c = b + 1, into
// three segments of the output tensor: the fault lands mid-DAG.
ChipCallable chain_callable() {
  KernelLibrary k;
  EXPECT_TRUE(k.add_function(0, CoreType::AIV, "axpb", node_axpb_kernel).ok());
  EXPECT_TRUE(k.add_function(kNormal, CoreType::AIV, "axpb_mid", node_axpb_kernel).ok());
  EXPECT_TRUE(k.add_function(kTrigger, CoreType::AIV, "axpb_trigger", node_axpb_kernel).ok());
  return ChipCallable(
      "chain",
      [](ChipOrchestrator& o, const TaskArgs& a) {
        const TensorView& x = a[0].tensor;
        const DeviceBuffer y = a[1].tensor.buffer();
        const int64_t base = a[1].tensor.offset();
        const TensorView s0(y, {kN}, DType::F32, base), s1(y, {kN}, DType::F32, base + kN),
            s2(y, {kN}, DType::F32, base + 2 * kN);
        const auto mid = static_cast<uint32_t>(a[2].scalar);
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(0, axpb_args(x, s0, 2, 1, static_cast<int64_t>(a[3].scalar))).status());
        SIMPLER_RETURN_IF_ERROR(o.submit_aiv(mid, axpb_args(s0, s1, 3, 2, -1)).status());
        return o.submit_aiv(0, axpb_args(s1, s2, 1, 1, -1)).status();
      },
      k, {Param::input(), Param::output(), Param::scalar(), Param::scalar()});
}

TaskArgs chain_args(const TensorView& x, const TensorView& y, uint32_t mid, int64_t gate) {
  TaskArgs a;
  a.add_tensor(x, Tag::Input).add_tensor(y, Tag::OutputExisting).add_scalar(mid).add_scalar(gate);
  return a;
}

std::vector<float> inputs() {
  std::vector<float> x(kN);
  for (int i = 0; i < kN; ++i) x[i] = static_cast<float>(i + 1);
  return x;
}

// What a chain run leaves in its three segments, bit for bit.
std::vector<float> expected(const std::vector<float>& x) {
  std::vector<float> e(3 * kN);
  for (int i = 0; i < kN; ++i) {
    e[i] = x[i] * 2 + 1;
    e[kN + i] = e[i] * 3 + 2;
    e[2 * kN + i] = e[kN + i] + 1;
  }
  return e;
}

bool same_bits(const std::vector<float>& a, const float* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

// The figure of one level.
struct Figure {
  uint64_t runs_affected = 0;
  uint64_t refused_after = 0;
  bool recovered = false;
  double ms_to_refusal = 0;
  double ms_to_recover = 0;
};

void print_figure(const char* level, const Figure& f) {
  std::printf(
      "RELIABILITY T13 level=%s runs_affected=%llu refused_after=%llu recovered=%d ms_to_refusal=%.1f "
      "ms_to_recover=%.1f\n",
      level, static_cast<unsigned long long>(f.runs_affected), static_cast<unsigned long long>(f.refused_after),
      f.recovered ? 1 : 0, f.ms_to_refusal, f.ms_to_recover);
}

WorkerConfig chip_config() {
  WorkerConfig c;
  c.geometry = Geometry::small();  // 4 AIV cores: 2 held by gated tasks, the others free
  c.pipeline_depth = 4;
  c.device_memory_bytes = 64ull << 20;
  c.max_tasks_per_run = 16;
  c.run_timeout = std::chrono::milliseconds(0);
  return c;
}

// One chip with its input and output buffers.
struct Chip {
  std::unique_ptr<ChipWorker> w;
  DeviceBuffer x, y;

  static Chip make(const std::vector<float>& xs) {
    Chip c;
    auto created = ChipWorker::create(chip_config(), {chain_callable()});
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (!created.ok()) return c;
    c.w = std::move(created).value();
    auto x = c.w->malloc(kN * sizeof(float));
    auto y = c.w->malloc(8 * 3 * kN * sizeof(float));  // 8 output slots
    EXPECT_TRUE(x.ok() && y.ok());
    c.x = *x;
    c.y = *y;
    EXPECT_TRUE(c.w->copy_to(c.x, xs.data(), kN * sizeof(float), 0).ok());
    return c;
  }
  TensorView xv() const { return TensorView(x, {kN}, DType::F32); }
  TensorView slot(int s) const { return TensorView(y, {3 * kN}, DType::F32, s * 3 * kN); }
  RunHandle submit(int s, uint32_t mid, int64_t gate) { return w->submit(0, chain_args(xv(), slot(s), mid, gate)); }
  // The slot's bytes equal the host's chain, bit for bit.
  bool slot_exact(int s, const std::vector<float>& want) {
    std::vector<float> got(3 * kN);
    const Status st = w->copy_from(got.data(), y, got.size() * sizeof(float), s * 3 * kN * sizeof(float));
    EXPECT_TRUE(st.ok()) << st.to_string();
    return st.ok() && same_bits(want, got.data());
  }
};

// Waits (bounded) and records the terminal in the ledger.
Status settle(const RunHandle& h, uint64_t id, TerminalLedger& ledger) {
  const Status st = h.wait_for(kWait);
  EXPECT_TRUE(h.done()) << "run " << id << " did not end in " << kWait.count() << " s";
  if (h.done()) ledger.record(id, st);
  return st;
}

// R14-style: a run with one terminal, and that terminal names the device fault.
void expect_device_fault(const Status& st, const char* what) {
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << what << ": " << st.to_string();
  EXPECT_TRUE(contains(st.message(), "sticky")) << what << ": " << st.to_string();
}

// T13, chip level: two ChipWorkers; H3 faults A's device in the middle task
// of run 3 while runs 1 and 2 hold cores (their first task waits on a gate).
TEST(DeviceFault, T13ChipStickyFaultEndsInFlightRunsRefusesThenResets) {
  Watchdog dog;
  const HealthScan health;
  TestGates* gates = make_node_gates();
  constexpr int kHold = 1;
  const std::vector<float> xs = inputs();
  const std::vector<float> want = expected(xs);
  TerminalLedger ledger;
  uint64_t next_id = 1;
  Figure fig;
  arm_device_fault_hook(kTrigger, 1);

  Chip a = Chip::make(xs), b = Chip::make(xs);
  ASSERT_NE(a.w, nullptr);
  ASSERT_NE(b.w, nullptr);
  // Both serve the trigger-free DAG before the fault.
  for (Chip* c : {&a, &b}) {
    const uint64_t id = next_id++;
    ledger.submitted(id);
    EXPECT_TRUE(settle(c->submit(0, kNormal, -1), id, ledger).ok());
    EXPECT_TRUE(c->slot_exact(0, want));
  }

  // In flight on A: two held runs and the run whose middle task faults.
  std::vector<std::pair<uint64_t, RunHandle>> in_flight;
  for (int s = 1; s <= 2; ++s) {
    ledger.submitted(next_id);
    in_flight.emplace_back(next_id++, a.submit(s, kNormal, kHold));
  }
  // Both held tasks at their gate before the fault: a held run whose first
  // task had not started would end with the fault at once.
  ASSERT_TRUE(poll_for([&] { return std::atomic_ref<uint32_t>(gates->kernels_at_gate).load() == 2; }))
      << "the held runs never reached their gate";
  const auto t_fault = Clock::now();
  ledger.submitted(next_id);
  const uint64_t trigger_id = next_id++;
  const RunHandle trigger = a.submit(3, kTrigger, -1);
  const Status tst = settle(trigger, trigger_id, ledger);
  expect_device_fault(tst, "the run whose task faulted");
  EXPECT_TRUE(contains(tst.message(), "H3")) << tst.to_string();
  ++fig.runs_affected;
  EXPECT_EQ(device_fault_hook_fired(), 1u);
  // R13: health reports the device poisoned, naming the fault.
  const Status h = a.w->health();
  EXPECT_EQ(h.code(), StatusCode::kDeviceFault) << h.to_string();
  EXPECT_TRUE(contains(h.message(), "func_id 7")) << h.to_string();
  EXPECT_TRUE(b.w->health().ok()) << b.w->health().to_string();

  // New work on A is refused, naming the fault, while runs 1 and 2 are still on it.
  {
    const uint64_t id = next_id++;
    ledger.submitted(id);
    const RunHandle r = a.submit(4, kNormal, -1);
    const Status st = settle(r, id, ledger);
    fig.ms_to_refusal = ms_since(t_fault);
    expect_device_fault(st, "a submit after the fault");
    EXPECT_TRUE(contains(st.message(), "refused")) << st.to_string();
    ++fig.refused_after;
  }
  {
    const auto m = a.w->malloc(64);
    EXPECT_EQ(m.status().code(), StatusCode::kDeviceFault) << m.status().to_string();
    if (m.status().code() == StatusCode::kDeviceFault) ++fig.refused_after;
  }
  // B keeps completing runs bit-exact meanwhile.
  for (int s = 1; s <= 6; ++s) {
    const uint64_t id = next_id++;
    ledger.submitted(id);
    EXPECT_TRUE(settle(b.submit(s, kNormal, -1), id, ledger).ok());
    EXPECT_TRUE(b.slot_exact(s, want)) << "slot " << s << " of the other chip";
  }
  for (const auto& [id, handle] : in_flight) EXPECT_FALSE(handle.done()) << "run " << id << " ended before its gate";

  // Released: each held run ends with the fault, once.
  gates->open_gate(kHold);
  for (const auto& [id, handle] : in_flight) {
    expect_device_fault(settle(handle, id, ledger), "a run in flight at the fault");
    ++fig.runs_affected;
  }
  // R12: the sets all came back; none is quarantined (no device thread still writes one).
  const ArenaCounts counts = a.w->set_counts();
  if (auto bad = check_partition("chip A run sets", counts, a.w->grant())) ADD_FAILURE() << *bad;
  EXPECT_EQ(counts.live, 0u);
  EXPECT_EQ(counts.quarantined, 0u) << "a quarantined set with no logged cause";

  // The reset: close (drains: the faulted device's threads still answer) and create again.
  const auto t_reset = Clock::now();
  EXPECT_TRUE(a.w->close(std::chrono::milliseconds(5000)).ok());
  a.w.reset();
  a = Chip::make(xs);
  ASSERT_NE(a.w, nullptr);
  EXPECT_TRUE(a.w->health().ok()) << a.w->health().to_string();
  {
    // The same DAG, trigger included (H3 fires once): the reset device runs it.
    const uint64_t id = next_id++;
    ledger.submitted(id);
    const Status st = settle(a.submit(0, kTrigger, -1), id, ledger);
    EXPECT_TRUE(st.ok()) << st.to_string();
    fig.recovered = st.ok() && a.slot_exact(0, want);
    fig.ms_to_recover = ms_since(t_reset);
  }
  EXPECT_TRUE(fig.recovered);
  EXPECT_TRUE(a.w->close(std::chrono::milliseconds(5000)).ok());
  EXPECT_TRUE(b.w->close(std::chrono::milliseconds(5000)).ok());
  a.w.reset();
  b.w.reset();
  disarm_device_fault_hook();

  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.terminals, s.submitted);
  EXPECT_EQ(s.by_code.count(StatusCode::kDeviceFault) ? s.by_code.at(StatusCode::kDeviceFault) : 0,
            fig.runs_affected + 1)
      << "the in-flight runs and the refused submit, nothing else";
  EXPECT_EQ(fig.runs_affected, 3u);
  health.expect_clean();
  print_figure("chip", fig);
}

// T13, node level: a node of two chip children; H3 faults chip 0's device
// (in its child) in the middle task of a run while two runs hold cores there.
TEST(DeviceFault, T13NodeStickyFaultEndsChipRunsChildIsReplaced) {
  Watchdog dog;
  const HealthScan health;  // before the node forks anything
  TestGates* gates = make_node_gates();
  constexpr int kHold = 2;
  constexpr uint32_t kDepth = 6;
  const std::vector<float> xs = inputs();
  const std::vector<float> want = expected(xs);
  // Armed before the fork server is forked: every chip child inherits it,
  // and only chip 0 is ever given the trigger. The child counts the firing
  // in shared memory, so this process sees when the fault was raised.
  auto sink_map = SharedMapping::create_anonymous(sizeof(std::atomic<uint64_t>));
  ASSERT_TRUE(sink_map.ok());
  auto* fired = new (abandon(new SharedMapping(std::move(sink_map).value()))->data()) std::atomic<uint64_t>(0);
  arm_device_fault_hook(kTrigger, 1, fired);

  NodeSpec spec;
  spec.config = node_config(2, 0, kDepth);
  spec.chip_callables = {chain_callable()};
  const CallableHandle chain{0, spec.chip_callables[0].digest()};
  auto created = NodeWorker::create(std::move(spec));
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<NodeWorker> w = std::move(created).value();
  constexpr int kSlots = 11;
  auto x = w->malloc_shared(kN * sizeof(float));
  ASSERT_TRUE(x.ok());
  std::memcpy(reinterpret_cast<void*>(x->addr), xs.data(), kN * sizeof(float));
  // A buffer per slot: no run's output overlaps another's, so no run waits for another.
  std::vector<DeviceBuffer> ys;
  for (int s = 0; s < kSlots; ++s) {
    auto y = w->malloc_shared(3 * kN * sizeof(float));
    ASSERT_TRUE(y.ok());
    ys.push_back(*y);
  }
  auto out_of = [&](int s) { return reinterpret_cast<float*>(ys[s].addr); };
  const TensorView xv(*x, {kN}, DType::F32);
  auto slot = [&](int s) { return TensorView(ys[s], {3 * kN}, DType::F32); };

  TerminalLedger ledger;
  uint64_t next_id = 1;
  Figure fig;
  auto submit = [&](int s, uint32_t chip, uint32_t mid, int64_t gate) {
    const uint64_t id = next_id++;
    ledger.submitted(id);
    std::fill(out_of(s), out_of(s) + 3 * kN, -1.0f);
    RunHandle h = w->submit(
        [&, s, chip, mid, gate](Orchestrator& o) {
          return o.submit_next_level(chain, chain_args(xv, slot(s), mid, gate), chip).status();
        },
        [&ledger, id](const Status& st) { ledger.record(id, st); });
    return std::make_pair(id, h);
  };
  auto wait = [&](const RunHandle& h) {
    const Status st = h.wait_for(kWait);
    EXPECT_TRUE(h.done()) << "a run did not end in " << kWait.count() << " s";
    return st;
  };
  auto exact = [&](int s) { return same_bits(want, out_of(s)); };

  for (uint32_t chip = 0; chip < 2; ++chip) {
    EXPECT_TRUE(wait(submit(static_cast<int>(chip), chip, kNormal, -1).second).ok());
    EXPECT_TRUE(exact(static_cast<int>(chip)));
  }
  ForkedChild& chip0 = w->next_child(0);
  const uint64_t incarnation0 = chip0.incarnation();
  const uint64_t incarnation1 = w->next_child(1).incarnation();

  // In flight on chip 0: two held runs, then the run whose middle task
  // faults. The child delivers terminals in launch order, so all three end
  // only once the gate opens; the shared counter says when the fault was raised.
  std::vector<RunHandle> in_flight;
  for (int s = 2; s <= 3; ++s) in_flight.push_back(submit(s, 0, kNormal, kHold).second);
  // Both held tasks at their gate before the fault: a held run whose first
  // task had not started would end with the fault at once (seen under load).
  ASSERT_TRUE(poll_for([&] { return std::atomic_ref<uint32_t>(gates->kernels_at_gate).load() == 2; }))
      << "the held runs never reached their gate";
  const auto t_fault = Clock::now();
  in_flight.push_back(submit(4, 0, kTrigger, -1).second);
  ASSERT_TRUE(poll_for([&] { return fired->load() != 0; })) << "H3 never fired in chip 0's child";
  EXPECT_EQ(fired->load(), 1u);

  // Chip 0's child refuses new work naming the fault while it still holds those runs.
  const Status refused = wait(submit(5, 0, kNormal, -1).second);
  fig.ms_to_refusal = ms_since(t_fault);
  expect_device_fault(refused, "a chip 0 task after the fault");
  EXPECT_TRUE(contains(refused.message(), "refused")) << refused.to_string();
  ++fig.refused_after;
  // Chip 1 keeps completing runs bit-exact meanwhile.
  for (int s = 6; s <= 9; ++s) {
    EXPECT_TRUE(wait(submit(s, 1, kNormal, -1).second).ok());
    EXPECT_TRUE(exact(s)) << "slot " << s << " of chip 1";
  }
  for (const RunHandle& h : in_flight) EXPECT_FALSE(h.done()) << "a held run ended before its gate";

  // Released: each held run ends with the fault; the child then exits and is replaced.
  gates->open_gate(kHold);
  for (const RunHandle& h : in_flight) {
    expect_device_fault(wait(h), "a run in flight at the fault");
    ++fig.runs_affected;
  }
  EXPECT_TRUE(contains(in_flight.back().result().message(), "H3")) << in_flight.back().result().to_string();
  const auto t_reset = Clock::now();
  const Status replaced = chip0.await_replacement(incarnation0, now_ns() + kTestWaitNs);
  EXPECT_TRUE(replaced.ok()) << replaced.to_string();
  EXPECT_NE(chip0.incarnation(), incarnation0) << "chip 0's faulted child was not replaced";
  EXPECT_FALSE(chip0.failure().has_value()) << chip0.failure().value_or(Status()).to_string();
  // Health: the replaced child died of its device's fault.
  const std::optional<Status> death = chip0.last_death();
  ASSERT_TRUE(death.has_value());
  EXPECT_EQ(death->code(), StatusCode::kDeviceFault) << death->to_string();
  EXPECT_EQ(w->next_child(1).incarnation(), incarnation1) << "chip 1 was disturbed";
  {
    const Status st = wait(submit(10, 0, kNormal, -1).second);
    EXPECT_TRUE(st.ok()) << st.to_string();
    fig.recovered = st.ok() && exact(10);
    fig.ms_to_recover = ms_since(t_reset);
  }
  EXPECT_TRUE(fig.recovered);

  const ArenaCounts counts = w->run_set_counts();
  if (auto bad = check_partition("node run sets", counts, kDepth)) ADD_FAILURE() << *bad;
  EXPECT_EQ(counts.live, 0u);
  EXPECT_EQ(counts.quarantined, 0u) << "a quarantined set with no logged cause";
  EXPECT_TRUE(w->free(*x).ok());
  for (const DeviceBuffer& y : ys) EXPECT_TRUE(w->free(y).ok());
  EXPECT_TRUE(w->close(std::chrono::seconds(30)).ok());
  w.reset();
  disarm_device_fault_hook();

  const TerminalLedger::Summary s = ledger.check();
  for (const std::string& p : s.problems) ADD_FAILURE() << "ledger: " << p;
  EXPECT_EQ(s.terminals, s.submitted);
  EXPECT_EQ(s.by_code.count(StatusCode::kDeviceFault) ? s.by_code.at(StatusCode::kDeviceFault) : 0,
            fig.runs_affected + fig.refused_after);
  EXPECT_EQ(fig.runs_affected, 3u);
  health.expect_clean();
  print_figure("node", fig);
}

#else
TEST(DeviceFault, T13NeedsTestHooks) { GTEST_SKIP() << "built without SIMPLER_TEST_HOOKS: H3 is not compiled in"; }
#endif

}  // namespace
}  // namespace simpler::testing
