// Remote nodes over MPI (issue 15), under `mpirun -np 3`: rank 0 runs one
// gtest case (argv[1] names it) with a network of local and remote nodes;
// ranks 1 and 2 serve a node each, with the faults that case injects. Every
// wait has a deadline (the Watchdog, heartbeat_timeout), so a lost message
// fails the case with a message instead of hanging it.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "dist/mpi_io.h"
#include "dist/node_server.h"
#include "dist/remote_port.h"
#include "dist/wire.h"
#include "health_scan.h"
#include "node_test_util.h"
#include "task/args_blob.h"
#include "test_util.h"

namespace simpler::testing {
namespace {

std::string g_case;

// One node run: out = in * mul + add on the node's chip (args: in, out, mul, add).
NodeCallable scale_callable() {
  return NodeCallable("scale", [](Orchestrator& o, const TaskArgs& a) -> Status {
    const CallableHandle axpb{0, axpb_callable().digest()};
    return o.submit_next_level(axpb, axpb_args(a[0].tensor, a[1].tensor, a[2].scalar, a[3].scalar, -1), 0).status();
  });
}

// In place: io = io * mul + add (args: io as InOut, mul, add).
NodeCallable inplace_callable() {
  return NodeCallable("inplace", [](Orchestrator& o, const TaskArgs& a) -> Status {
    const CallableHandle axpb{0, axpb_callable().digest()};
    return o.submit_next_level(axpb, axpb_args(a[0].tensor, a[0].tensor, a[1].scalar, a[2].scalar, -1), 0).status();
  });
}

// scale, after a build that takes longer than the network's 1.5 s
// heartbeat_timeout in ASlowOrchestrationIsNotADeadRank: user code that is
// slow, not a hand-off the test orders (the duration is what is under test).
NodeCallable slow_callable() {
  return NodeCallable("slow", [](Orchestrator& o, const TaskArgs& a) -> Status {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    const CallableHandle axpb{0, axpb_callable().digest()};
    return o.submit_next_level(axpb, axpb_args(a[0].tensor, a[1].tensor, a[2].scalar, a[3].scalar, -1), 0).status();
  });
}

std::vector<NodeCallable> callables() { return {scale_callable(), inplace_callable(), slow_callable()}; }

NodeSpec node_spec(uint32_t depth) {
  NodeSpec s;
  s.level = Level::Node;
  s.config = node_config(1, 0, depth);
  s.chip_callables = {axpb_callable()};
  return s;
}

// Where a rank that stops itself leaves its pid for rank 0, which continues
// it: one file per job (every rank of a local mpirun is its child).
std::string stopped_rank_pid_file() { return fmt::format("/tmp/simpler_dist_mpi_{}_stopped.pid", getppid()); }

// Ranks 1 and 2: serve a node, with the case's faults.
int serve_rank(int rank) {
  dist::ServeHooks hooks;
  if (g_case == "StaleRepliesAreRefused" && rank == 1) {
    // Before request 2's terminal: an ACK and a TERMINAL (with garbage output
    // bytes on the entry's data tag) for an odd generation that is not the
    // occupant's, as a past occupant would send (R8).
    hooks.before_terminal = [](uint64_t n, const dist::WireHeader& t, const dist::RawSend& send) {
      if (n != 2) return;
      send(dist::encode_simple(dist::MsgKind::kAck, t.session, t.entry, t.generation + 2, 77, 0), dist::kTagControl);
      const uint64_t bytes = 4096 * sizeof(float);
      send(dist::encode_terminal(t.session, t.entry, t.generation + 2, 77, 0, Status(), std::span(&bytes, 1)),
           dist::kTagControl);
      send(std::vector<uint8_t>(bytes, 0xff), dist::kTagDataBase + static_cast<int>(t.entry));
    };
  }
  if (g_case == "UnattributableReplyStopsOnlyThatNode" && rank == 2) {
    hooks.before_terminal = [](uint64_t n, const dist::WireHeader& t, const dist::RawSend& send) {
      if (n == 1) send(dist::encode_simple(dist::MsgKind::kAccepted, t.session, 999, 1, 1, 0), dist::kTagControl);
    };
  }
  if (g_case == "AnOutputOfTheWrongSizeStopsOnlyThatNode" && rank == 2) {
    // Its first TERMINAL, ahead of the real one: the occupant's identity,
    // its one output 64 bytes short.
    hooks.before_terminal = [](uint64_t n, const dist::WireHeader& t, const dist::RawSend& send) {
      if (n != 1) return;
      const uint64_t short_bytes = 256 * sizeof(float) - 64;
      send(dist::encode_terminal(t.session, t.entry, t.generation, t.run_epoch, t.dispatch_id, Status(),
                                 std::span(&short_bytes, 1)),
           dist::kTagControl);
    };
  }
  if (g_case == "MalformedReplyStopsOnlyThatNode" && rank == 2) {
    hooks.before_terminal = [](uint64_t n, const dist::WireHeader& t, const dist::RawSend& send) {
      if (n != 1) return;
      auto bad = dist::encode_simple(dist::MsgKind::kHeartbeat, t.session, 0, 0, 0, 0);
      bad[0] ^= 0xff;  // the magic
      send(std::move(bad), dist::kTagControl);
    };
  }
  if ((g_case == "ARunPastRunTimeoutEndsNamingTheRank" || g_case == "AWaiterThatParksHandsTheReceivingBack") &&
      rank == 1) {
    // Hangs in its first request (SIGSTOP) until rank 0 continues it (once
    // that run ended, or once its waiter parked); then serves on.
    hooks.on_request = [](uint64_t n) {
      if (n != 1) return;
      std::ofstream(stopped_rank_pid_file()) << getpid() << "\n";
      raise(SIGSTOP);
    };
  }
  if (g_case == "AnOutputAbandonedMidTransferLandsOnlyInItsHeldBlock" && rank == 1) {
    // Stops (SIGSTOP, every thread) with its first run's TERMINAL and output
    // chunks posted: over TCP only each chunk's first fragment has left, so
    // the network matches the chunks and cannot cancel them. Rank 0
    // continues it once that run failed.
    hooks.after_terminal = [](uint64_t n) {
      if (n != 1) return;
      std::ofstream(stopped_rank_pid_file()) << getpid() << "\n";
      raise(SIGSTOP);
    };
  }
  if (g_case == "KilledRankEndsEveryRunItHeld" && rank == 2) {
    // Dies holding runs: after taking its second request, before any terminal of it.
    hooks.on_request = [](uint64_t n) {
      if (n == 2) raise(SIGKILL);
    };
  }
  ServeOptions o;
  o.tensor_heap_bytes = 256ull << 20;
  o.heartbeat_period = std::chrono::milliseconds(50);
  const Status st = dist::serve(node_spec(4), callables(), o, std::move(hooks));
  if (!st.ok()) std::fprintf(stderr, "rank %d: serve_node: %s\n", rank, st.to_string().c_str());
  return st.ok() ? 0 : 1;
}

DeviceBuffer shared_floats(Worker& w, size_t n, float base) {
  auto b = w.malloc_shared(n * sizeof(float));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return {};
  auto* p = reinterpret_cast<float*>(b->addr);
  for (size_t i = 0; i < n; ++i) p[i] = base + static_cast<float>(i % 1000) * 0.25f;
  return *b;
}

const float* floats(const DeviceBuffer& b) { return reinterpret_cast<const float*>(b.addr); }

TaskArgs scale_args(const DeviceBuffer& in, const DeviceBuffer& out, size_t n, int64_t mul, int64_t add) {
  TaskArgs a;
  a.add_tensor(in.view({static_cast<int64_t>(n)}, DType::F32), Tag::Input)
      .add_tensor(out.view({static_cast<int64_t>(n)}, DType::F32), Tag::OutputExisting)
      .add_scalar(mul)
      .add_scalar(add);
  return a;
}

// Bit-exact: the same float operations as the kernel's, compared as bytes.
void expect_scaled(const DeviceBuffer& in, const DeviceBuffer& out, size_t n, int64_t mul, int64_t add,
                   const std::string& what) {
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = floats(in)[i] * static_cast<float>(mul) + static_cast<float>(add);
  EXPECT_EQ(std::memcmp(want.data(), floats(out), n * sizeof(float)), 0) << what << ": output differs";
}

struct Network {
  std::unique_ptr<Worker> w;
  CallableHandle scale, inplace, slow;
  uint32_t local = 0, rank1 = 0, rank2 = 0;
};

Network make_network(uint32_t depth, std::chrono::milliseconds heartbeat = std::chrono::seconds(5),
                     std::chrono::milliseconds run_timeout = WorkerConfig{}.run_timeout) {
  Network n;
  WorkerConfig c = network_config(0, depth);
  c.shared_heap_bytes = 256ull << 20;
  c.run_timeout = run_timeout;
  n.w = std::make_unique<Worker>(Level::Network, c);
  Worker node(Level::Node, node_config(1, 0, depth));
  EXPECT_TRUE(node.register_callable(axpb_callable()).ok());
  RemoteNodeOptions ro;
  ro.heartbeat_timeout = heartbeat;
  ro.ready_timeout = std::chrono::seconds(30);
  auto local = n.w->add_next_level_worker(std::move(node));
  auto r1 = n.w->add_remote_worker(1, ro);
  auto r2 = n.w->add_remote_worker(2, ro);
  EXPECT_TRUE(local.ok() && r1.ok() && r2.ok());
  n.local = *local;
  n.rank1 = *r1;
  n.rank2 = *r2;
  auto s = n.w->register_callable(scale_callable());
  auto i = n.w->register_callable(inplace_callable());
  auto sl = n.w->register_callable(slow_callable());
  EXPECT_TRUE(s.ok() && i.ok() && sl.ok());
  n.scale = *s;
  n.inplace = *i;
  n.slow = *sl;
  const Status st = n.w->init();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return n;
}

RunHandle submit_scale(Network& n, uint32_t worker, const DeviceBuffer& in, const DeviceBuffer& out, size_t len,
                       int64_t mul, int64_t add) {
  return n.w->submit([&n, worker, in, out, len, mul, add](Orchestrator& o) {
    return o.submit_next_level(n.scale, scale_args(in, out, len, mul, add), worker).status();
  });
}

// Each of `workers` still serves: a run on it succeeds, its output bit-exact.
void expect_serving(Network& n, const DeviceBuffer& x, size_t len, std::initializer_list<uint32_t> workers) {
  for (uint32_t w : workers) {
    const DeviceBuffer o = shared_floats(*n.w, len, 0);
    ASSERT_TRUE(wait_run(submit_scale(n, w, x, o, len, 6, 1)).ok()) << "worker " << w;
    expect_scaled(x, o, len, 6, 1, "worker " + std::to_string(w) + ", a node that kept serving");
  }
}

// One local and two remote nodes in one network, one run across all three:
// small tensors, one tensor larger than a chunk (sent and returned in
// pieces), and an InOut tensor that goes both ways; every output bit-exact.
TEST(DistMpi, LocalAndRemoteNodesAreBitExact) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t small = 4096, large = dist::kChunkBytes / sizeof(float) + 12345;
  const DeviceBuffer x = shared_floats(*n.w, small, 1.0f);
  const DeviceBuffer big = shared_floats(*n.w, large, 3.0f);
  const DeviceBuffer z0 = shared_floats(*n.w, small, 0), z1 = shared_floats(*n.w, small, 0);
  const DeviceBuffer zbig = shared_floats(*n.w, large, 0);
  const DeviceBuffer io = shared_floats(*n.w, small, 5.0f);
  std::vector<float> io_before(floats(io), floats(io) + small);
  RunHandle h = n.w->submit([&](Orchestrator& o) -> Status {
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(x, z0, small, 3, 1), n.local).status());
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(x, z1, small, 7, 2), n.rank1).status());
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, scale_args(big, zbig, large, 5, 3), n.rank2).status());
    TaskArgs a;
    a.add_tensor(io.view({static_cast<int64_t>(small)}, DType::F32), Tag::InOut).add_scalar(2).add_scalar(1);
    return o.submit_next_level(n.inplace, a, n.rank1).status();
  });
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  expect_scaled(x, z0, small, 3, 1, "local node");
  expect_scaled(x, z1, small, 7, 2, "rank 1");
  expect_scaled(big, zbig, large, 5, 3, "rank 2, chunked");
  std::vector<float> want(small);
  for (size_t i = 0; i < small; ++i) want[i] = io_before[i] * 2.0f + 1.0f;
  EXPECT_EQ(std::memcmp(want.data(), floats(io), small * sizeof(float)), 0) << "InOut on rank 1";
  auto m = n.w->memory_info_on(n.rank2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_GT(m->total_bytes, 0u);
  EXPECT_TRUE(n.w->close().ok());
}

// A remote node returns exactly the elements its run wrote, as a local node
// does: two runs writing the even and the odd elements of one buffer on two
// ranks at once both keep theirs (neither's copy of the other's elements
// comes back over them), and elements an output's kernel leaves unwritten
// keep the caller's values instead of coming back zeroed.
TEST(DistMpi, RemoteOutputsReturnExactlyTheirElements) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const int64_t len = 2048;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer y = shared_floats(*n.w, 2 * len, 0);
  const DeviceBuffer z = shared_floats(*n.w, 2 * len, 0);
  for (int64_t i = 0; i < 2 * len; ++i) {
    const_cast<float*>(floats(y))[i] = -7.0f;
    const_cast<float*>(floats(z))[i] = -9.0f;
  }
  const int64_t one[] = {len}, two[] = {2};
  const TensorView xs = x.view({len}, DType::F32);
  const TensorView even = TensorView::from_parts(y, DType::F32, 1, one, two, 0);
  const TensorView odd = TensorView::from_parts(y, DType::F32, 1, one, two, 1);
  // The kernel writes as many elements as its input has: half of z's view.
  const TensorView half_in = xs.tile({0}, {len / 2}).value();
  const TensorView z_view = z.view({2 * len}, DType::F32);
  const auto task = [&](const TensorView& in, const TensorView& out, int64_t mul, int64_t add) {
    TaskArgs a;
    a.add_tensor(in, Tag::Input).add_tensor(out, Tag::OutputExisting).add_scalar(mul).add_scalar(add);
    return a;
  };
  RunHandle h = n.w->submit([&](Orchestrator& o) -> Status {
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, task(xs, even, 3, 1), n.rank1).status());
    SIMPLER_RETURN_IF_ERROR(o.submit_next_level(n.scale, task(xs, odd, 5, 2), n.rank2).status());
    return o.submit_next_level(n.scale, task(half_in, z_view, 2, 0), n.rank1).status();
  });
  ASSERT_TRUE(wait_run(h).ok()) << h.result().to_string();
  for (int64_t i = 0; i < len; ++i) {
    ASSERT_EQ(floats(y)[2 * i], floats(x)[i] * 3.0f + 1.0f) << "even element " << 2 * i << " (rank 1)";
    ASSERT_EQ(floats(y)[2 * i + 1], floats(x)[i] * 5.0f + 2.0f) << "odd element " << 2 * i + 1 << " (rank 2)";
  }
  for (int64_t i = 0; i < 2 * len; ++i) {
    const float want = i < len / 2 ? floats(x)[i] * 2.0f : -9.0f;
    ASSERT_EQ(floats(z)[i], want) << "element " << i << (i < len / 2 ? ", written" : ", which no kernel wrote");
  }
  EXPECT_TRUE(n.w->close().ok());
}

// pipeline_depth runs in flight per remote node, across both ranks and the
// local node; each run's outputs are its own.
TEST(DistMpi, PipelinedRunsAcrossRanks) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(4);
  const size_t len = 1024;
  const int runs = 24;
  const DeviceBuffer x = shared_floats(*n.w, len, 2.0f);
  std::vector<DeviceBuffer> out;
  std::vector<RunHandle> hs;
  const uint32_t workers[] = {n.rank1, n.rank2, n.local};
  for (int r = 0; r < runs; ++r) {
    out.push_back(shared_floats(*n.w, len, 0));
    hs.push_back(submit_scale(n, workers[r % 3], x, out.back(), len, r + 1, r));
  }
  for (int r = 0; r < runs; ++r) {
    ASSERT_TRUE(wait_run(hs[r]).ok()) << "run " << r << ": " << hs[r].result().to_string();
    expect_scaled(x, out[r], len, r + 1, r, "run " + std::to_string(r));
  }
  EXPECT_TRUE(n.w->close().ok());
}

// A kernel that fails on a remote node fails only its own run, with the
// kernel's own text; the runs around it on the same rank succeed.
TEST(DistMpi, RemoteKernelFailureFailsOnlyItsRun) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  std::vector<DeviceBuffer> out;
  std::vector<RunHandle> hs;
  for (int r = 0; r < 3; ++r) {
    out.push_back(shared_floats(*n.w, len, 0));
    hs.push_back(submit_scale(n, n.rank1, x, out.back(), len, r == 1 ? kAxpbFail : 4, 0));
  }
  EXPECT_TRUE(wait_run(hs[0]).ok()) << hs[0].result().to_string();
  const Status failed = wait_run(hs[1]);
  EXPECT_FALSE(failed.ok());
  EXPECT_TRUE(contains(failed.message(), "node_axpb_kernel: asked to fail")) << failed.to_string();
  EXPECT_TRUE(contains(failed.message(), "MPI rank 1")) << failed.to_string();
  EXPECT_TRUE(wait_run(hs[2]).ok()) << hs[2].result().to_string();
  expect_scaled(x, out[2], len, 4, 0, "the run after the failure");
  EXPECT_TRUE(n.w->close().ok());
}

// R8 over MPI: rank 1 sends an ACK and a TERMINAL (with output bytes of
// 0xff) for a generation that is not its entry's occupant. They are
// dropped, their bytes drained: the occupant completes with its own,
// bit-exact outputs and the endpoint keeps serving.
TEST(DistMpi, StaleRepliesAreRefused) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(1);
  const size_t len = 4096;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  for (int r = 0; r < 4; ++r) {
    const DeviceBuffer out = shared_floats(*n.w, len, 0);
    RunHandle h = submit_scale(n, n.rank1, x, out, len, 3 + r, 1);
    ASSERT_TRUE(wait_run(h).ok()) << "run " << r << ": " << h.result().to_string();
    expect_scaled(x, out, len, 3 + r, 1, "run " + std::to_string(r));
  }
  // Counted as it was read, before run 2's own terminal: one ACK, one TERMINAL.
  EXPECT_EQ(dist::RemotePort::stale_replies(), 2u) << "rank 1's forged replies were not taken for stale";
  EXPECT_TRUE(n.w->close().ok());
}

// R9 over MPI: rank 2 sends a reply naming entry 999. Its endpoint stops:
// the run it held ends with the reason, later work for it is refused naming
// it, and the other nodes keep serving.
TEST(DistMpi, UnattributableReplyStopsOnlyThatNode) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  const Status st = wait_run(submit_scale(n, n.rank2, x, out, len, 2, 0));
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "MPI rank 2") && contains(st.message(), "entry 999")) << st.to_string();
  const Status later = wait_run(submit_scale(n, n.rank2, x, out, len, 2, 0));
  EXPECT_TRUE(contains(later.message(), "MPI rank 2")) << later.to_string();
  expect_serving(n, x, len, {n.rank1, n.local});
  EXPECT_TRUE(n.w->close().ok());
}

// A message with a wrong magic from rank 2 stops that endpoint, naming the field.
TEST(DistMpi, MalformedReplyStopsOnlyThatNode) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  const Status st = wait_run(submit_scale(n, n.rank2, x, out, len, 2, 0));
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "MPI rank 2") && contains(st.message(), "magic")) << st.to_string();
  expect_serving(n, x, len, {n.rank1});
  EXPECT_TRUE(n.w->close().ok());
}

// A TERMINAL whose output size is not the one the request gave stops that
// node's endpoint, naming the output and both sizes; the others serve on.
TEST(DistMpi, AnOutputOfTheWrongSizeStopsOnlyThatNode) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  const Status st = wait_run(submit_scale(n, n.rank2, x, out, len, 2, 0));
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "MPI rank 2")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "returns 960 bytes for output 0, the request expects 1024")) << st.to_string();
  expect_serving(n, x, len, {n.rank1, n.local});
  EXPECT_TRUE(n.w->close().ok());
}

// R9 at the node: a REQUEST that names no possible occupant (another
// session, entry 999) reaches rank 1 from rank 0 outside the network's
// endpoint. The node runs nothing, sends STOPPED with its reason, and the
// network ends that node's work with it; rank 2 and the local node serve on.
TEST(DistMpi, UnattributableRequestStopsTheNodeEndpoint) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  ASSERT_TRUE(wait_run(submit_scale(n, n.rank1, x, out, len, 2, 0)).ok());
  std::vector<uint8_t> blob;
  ASSERT_TRUE(encode_args_blob(TaskArgs(), blob).ok());
  const auto forged = dist::encode_request(/*session=*/42, 999, 1, 0, Digest{}, {}, blob);
  ASSERT_EQ(MPI_Send(forged.data(), static_cast<int>(forged.size()), MPI_BYTE, 1, dist::kTagControl, MPI_COMM_WORLD),
            MPI_SUCCESS);
  // The STOPPED reply reaches the network asynchronously: a later run on
  // rank 1 fails with the node's reason once it has (or is refused after).
  Status st;
  const uint64_t deadline = now_ns() + 20'000'000'000ull;
  while (now_ns() < deadline) {
    st = wait_run(submit_scale(n, n.rank1, x, out, len, 2, 0));
    if (!st.ok()) break;
  }
  EXPECT_TRUE(contains(st.message(), "MPI rank 1") && contains(st.message(), "stopped its endpoint") &&
              contains(st.message(), "session"))
      << st.to_string();
  expect_serving(n, x, len, {n.rank2, n.local});
  EXPECT_TRUE(n.w->close().ok());
}

// Rank 2 is killed while it holds runs (mpirun --enable-recovery keeps the
// job alive). Every run it held gets exactly one terminal, an error naming
// the rank, once the heartbeat deadline passes; later work for it is
// refused; rank 1 and the local node keep serving.
TEST(DistMpi, KilledRankEndsEveryRunItHeld) {
  Watchdog dog(std::chrono::seconds(50));
  Network n = make_network(2, std::chrono::milliseconds(1500));
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  std::vector<RunHandle> hs;
  for (int r = 0; r < 4; ++r) {
    const DeviceBuffer o = shared_floats(*n.w, len, 0);
    hs.push_back(n.w->submit([&n, x, o, len](Orchestrator& op) {
      return op.submit_next_level(n.scale, scale_args(x, o, len, 2, 0), n.rank2).status();
    }));
  }
  int failed = 0;
  for (int r = 0; r < 4; ++r) {
    const Status st = wait_run(hs[r]);
    if (st.ok()) continue;
    ++failed;
    EXPECT_TRUE(contains(st.message(), "MPI rank 2")) << "run " << r << ": " << st.to_string();
  }
  // The first request may finish before the second kills the rank; the rest cannot.
  EXPECT_GE(failed, 3);
  expect_serving(n, x, len, {n.rank1, n.local});
  const Status later = wait_run(submit_scale(n, n.rank2, x, x, len, 1, 0));
  EXPECT_TRUE(contains(later.message(), "MPI rank 2")) << later.to_string();
  EXPECT_TRUE(n.w->close().ok());
}

// The rank that stops itself (SIGSTOP) in a case's hook. resume() waits,
// bounded, until it has stopped (a SIGCONT sent before that would be lost)
// and continues it; the destructor does too, so a failing case never leaves
// a rank stopped.
class StoppedRank {
 public:
  ~StoppedRank() { resume(); }
  pid_t pid() {
    if (pid_ <= 0) std::ifstream(stopped_rank_pid_file()) >> pid_;
    return pid_;
  }
  void resume() {
    if (resumed_) return;
    resumed_ = true;
    const bool stopped = eventually([&] { return pid() > 0 && process_state(pid_) == 'T'; }, std::chrono::seconds(20));
    if (pid_ > 0) kill(pid_, SIGCONT);
    std::remove(stopped_rank_pid_file().c_str());
    EXPECT_TRUE(stopped) << "the rank never stopped itself (pid file " << stopped_rank_pid_file() << ", pid " << pid_
                         << ")";
  }

 private:
  pid_t pid_ = 0;
  bool resumed_ = false;
};

// A rank stops mid-transfer of an output (issue 15): the run fails naming
// the rank, but the receives MPI had already matched cannot be cancelled
// and write on once the rank resumes. Until they complete, the output's
// block is held: a new run may not use it, and its free does not hand it
// out again, so the late bytes land only in it. Over TCP (a ctest ENV of
// its own): shared memory copies a matched message whole even from a
// stopped rank.
TEST(DistMpi, AnOutputAbandonedMidTransferLandsOnlyInItsHeldBlock) {
  Watchdog dog(std::chrono::seconds(60));
  StoppedRank stopped;
  Network n = make_network(2, std::chrono::milliseconds(1500));
  const size_t len = 4u << 20;  // 16 MiB of floats: two chunks, each far past TCP's eager limit
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  const Status failed = wait_run(submit_scale(n, n.rank1, x, out, len, 2, 0));
  ASSERT_FALSE(failed.ok()) << "the run on the stopped rank succeeded";
  EXPECT_TRUE(contains(failed.message(), "MPI rank 1")) << failed.to_string();
  ASSERT_GT(stopped.pid(), 0) << "rank 1 left no pid in " << stopped_rank_pid_file();
  EXPECT_GE(dist::Graveyard::instance().size(), 1u)
      << "every receive was cancelled: the case never reached a matched receive (" << failed.to_string() << ")";

  const Status reuse = wait_run(submit_scale(n, n.rank2, x, out, len, 1, 0));
  EXPECT_EQ(reuse.code(), StatusCode::kFailedPrecondition) << "a run took the held block: " << reuse.to_string();
  EXPECT_TRUE(contains(reuse.message(), "is held")) << reuse.to_string();
  ASSERT_TRUE(n.w->free(out).ok());
  auto next = n.w->malloc_shared(out.bytes);
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_TRUE(next->addr + next->bytes <= out.addr || out.addr + out.bytes <= next->addr)
      << "the held block was handed out again";
  std::memset(reinterpret_cast<void*>(next->addr), 0x11, next->bytes);

  stopped.resume();
  ASSERT_TRUE(eventually([] { return dist::Graveyard::instance().size() == 0; }, std::chrono::seconds(20)))
      << dist::Graveyard::instance().size() << " abandoned requests never completed after rank 1 resumed";
  const auto* bytes = reinterpret_cast<const unsigned char*>(next->addr);
  EXPECT_EQ(std::count(bytes, bytes + next->bytes, 0x11), static_cast<std::ptrdiff_t>(next->bytes))
      << "late bytes landed outside the held block";
  auto again = n.w->malloc_shared(out.bytes);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->addr, out.addr) << "the block did not come back once its receives completed";
  expect_serving(n, x, 256, {n.rank2, n.local});
  EXPECT_TRUE(n.w->close().ok());
}

// A remote node that holds a run past the network's run_timeout is presumed
// hung: that run ends DEADLINE_EXCEEDED naming the rank, the node takes no
// more work (memory_info_on it fails too), and the other nodes keep serving.
TEST(DistMpi, ARunPastRunTimeoutEndsNamingTheRank) {
  Watchdog dog(std::chrono::seconds(50));
  StoppedRank stopped;
  // Every ordinary run here must end well inside run_timeout, also under
  // TSan on two cores, where 300 ms was too short for a healthy rank's run.
  Network n = make_network(2, std::chrono::seconds(10), std::chrono::milliseconds(kSanitized ? 3000 : 1000));
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer hung = shared_floats(*n.w, len, 0);
  RunHandle h = submit_scale(n, n.rank1, x, hung, len, 2, 0);
  ASSERT_TRUE(eventually([&] { return h.done(); })) << "the run on the hung rank never ended";
  stopped.resume();  // its late terminal must change nothing
  const Status st = h.result();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "MPI rank 1")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "run_timeout")) << st.to_string();
  expect_serving(n, x, len, {n.rank2, n.local});
  const DeviceBuffer o = shared_floats(*n.w, len, 0);
  const Status later = wait_run(submit_scale(n, n.rank1, x, o, len, 1, 0));
  EXPECT_TRUE(contains(later.message(), "MPI rank 1")) << "the hung node took more work: " << later.to_string();
  const auto m = n.w->memory_info_on(n.rank1);
  ASSERT_FALSE(m.ok()) << "memory_info_on answered for a node presumed hung";
  EXPECT_TRUE(contains(m.status().message(), "MPI rank 1")) << m.status().to_string();
  EXPECT_TRUE(n.w->close().ok());
}

// A thread waiting for a lone remote run receives for its port while it
// spins, and the port's receiver thread stands down meanwhile; a waiter that
// parks hands the receiving back at once. With the stand-down made an hour
// long (hooks::force_stand_in_grace), a run that rank 1 holds (stopped)
// past the waiter's spin still ends, bit-exact, once the rank resumes: the
// hand-back resumed the receiver, not the end of the stand-down (else rank
// 1 would read as dead after heartbeat_timeout).
TEST(DistMpi, AWaiterThatParksHandsTheReceivingBack) {
  Watchdog dog(std::chrono::seconds(60));
  StoppedRank stopped;
  struct HourLongStandDown {
    HourLongStandDown() { dist::hooks::force_stand_in_grace(3'600'000'000'000ull); }
    ~HourLongStandDown() { dist::hooks::force_stand_in_grace(0); }
  } stand_down;
  Network n = make_network(2);
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  const DeviceBuffer out = shared_floats(*n.w, len, 0);
  const uint64_t handbacks = dist::RemotePort::stand_in_handbacks();
  RunHandle h = submit_scale(n, n.rank1, x, out, len, 2, 3);
  // Rank 1 stops on taking the request: the task is out on its port before
  // the waiter comes, so the waiter stands in from its first look.
  ASSERT_TRUE(eventually([&] { return stopped.pid() > 0 && process_state(stopped.pid()) == 'T'; }))
      << "rank 1 never stopped on its request";
  Status result = internal_error("the waiter did not return");
  std::thread waiter([&] { result = h.wait_for(std::chrono::seconds(30)); });
  EXPECT_TRUE(eventually([&] { return dist::RemotePort::stand_in_handbacks() > handbacks; }))
      << "the waiter never handed the receiving back";
  stopped.resume();
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.to_string();
  expect_scaled(x, out, len, 2, 3, "a run answered after its waiter parked");
  EXPECT_TRUE(n.w->close().ok());
}

// A node server whose serve loop is busy longer than the network's
// heartbeat_timeout (building a slow orchestration) still heartbeats: its
// run succeeds, bit-exact, as on a forked node, and the rank keeps serving.
TEST(DistMpi, ASlowOrchestrationIsNotADeadRank) {
  Watchdog dog(std::chrono::seconds(60));
  Network n = make_network(2, std::chrono::milliseconds(1500));
  const size_t len = 256;
  const DeviceBuffer x = shared_floats(*n.w, len, 1.0f);
  for (uint32_t w : {n.local, n.rank1}) {
    const DeviceBuffer out = shared_floats(*n.w, len, 0);
    RunHandle h = n.w->submit(
        [&](Orchestrator& o) { return o.submit_next_level(n.slow, scale_args(x, out, len, 2, 3), w).status(); });
    const Status st = wait_run(h);
    ASSERT_TRUE(st.ok()) << "worker " << w << ": " << st.to_string();
    expect_scaled(x, out, len, 2, 3, "worker " + std::to_string(w) + " after a slow build");
  }
  expect_serving(n, x, len, {n.rank1});
  EXPECT_TRUE(n.w->close().ok());
}

}  // namespace
}  // namespace simpler::testing

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np 3 %s <case>\n", argv[0]);
    return 2;
  }
  simpler::testing::g_case = argv[1];
  const int rank = simpler::mpi_rank();
  if (simpler::mpi_size() != 3) {
    std::fprintf(stderr, "run under mpirun -np 3 (this is rank %d of %d)\n", rank, simpler::mpi_size());
    return 2;
  }
  if (rank != 0) return simpler::testing::serve_rank(rank);
  const std::string filter = "--gtest_filter=DistMpi." + simpler::testing::g_case;
  std::vector<char*> args = {argv[0], const_cast<char*>(filter.c_str()), nullptr};  // argv[argc] is null
  int n = static_cast<int>(args.size()) - 1;
  ::testing::InitGoogleTest(&n, args.data());
  return RUN_ALL_TESTS();
}
