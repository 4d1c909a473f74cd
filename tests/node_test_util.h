// Helpers of the node-level tests: gates in shared memory that kernels in
// forked chip children wait on, a gated chip callable, and bounded waits.
// Test-thread use only; the kernel runs on simulated cores of a child.
#pragma once

#include <dirent.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/doorbell.h"
#include "base/leak.h"
#include "base/shared_memory.h"
#include "ipc_test_util.h"
#include "simpler/simpler.h"

namespace simpler::testing {

inline constexpr int64_t kAxpbFail = -999;

// Set before the node forks, so every child inherits the pointer.
inline TestGates* g_node_gates = nullptr;

// out[i] = in[i] * args[2] + args[3] over 1-D f32 views, after gate args[4]
// (-1: none) opens; a gate that stays shut fails the task after 30 s, and a
// multiplier of kAxpbFail fails it once the gate opened.
extern "C" inline void node_axpb_kernel(int64_t* args) {
  const int gate = static_cast<int>(args[4]);
  if (gate >= 0) std::atomic_ref<uint32_t>(g_node_gates->kernels_at_gate).fetch_add(1);
  if (gate >= 0 &&
      !spin_then_park(
          g_node_gates->bell, [&] { return g_node_gates->is_open(gate); }, SpinPolicy{}, now_ns() + kTestWaitNs)) {
    simpler_kernel_fail("node_axpb_kernel: gate never opened");
    return;
  }
  if (args[2] == kAxpbFail) {
    simpler_kernel_fail("node_axpb_kernel: asked to fail");
    return;
  }
  const DeviceTensor *in = tensor_arg(args, 0), *out = tensor_arg(args, 1);
  for (int64_t i = 0; i < in->shape[0]; ++i) {
    tensor_data<float>(out)[i * out->stride[0]] =
        tensor_data<float>(in)[i * in->stride[0]] * static_cast<float>(args[2]) + static_cast<float>(args[3]);
  }
}

inline ChipCallable axpb_callable() {
  KernelLibrary k;
  EXPECT_TRUE(k.add_function(0, CoreType::AIV, "node_axpb_kernel", node_axpb_kernel).ok());
  return ChipCallable("axpb", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
                      {Param::input(), Param::output(), Param::scalar(), Param::scalar(), Param::scalar()});
}

inline TaskArgs axpb_args(const TensorView& in, const TensorView& out, int64_t mul, int64_t add, int64_t gate) {
  TaskArgs a;
  a.add_tensor(in, Tag::Input).add_tensor(out, Tag::OutputExisting).add_scalar(mul).add_scalar(add).add_scalar(gate);
  return a;
}

// n f32 in `w`'s shared heap holding base, base + 1, ...; a refused
// allocation fails the test and returns an empty buffer.
inline DeviceBuffer shared_iota(Worker& w, size_t n, float base) {
  auto b = w.malloc_shared(n * sizeof(float));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return {};
  auto* p = reinterpret_cast<float*>(b->addr);
  for (size_t i = 0; i < n; ++i) p[i] = base + static_cast<float>(i);
  return *b;
}

// Maps the gates; they stay mapped for the test process's life (children
// that outlive a failed test may still read them).
inline TestGates* make_node_gates() {
  auto m = SharedMapping::create_anonymous(sizeof(TestGates));
  EXPECT_TRUE(m.ok());
  auto* keep = abandon(new SharedMapping(std::move(m).value()));
  g_node_gates = new (keep->data()) TestGates();
  return g_node_gates;
}

inline WorkerConfig node_config(uint32_t chips, uint32_t subs, uint32_t depth, uint32_t launch = 0) {
  WorkerConfig c;
  c.geometry = Geometry::small();
  c.chips = chips;
  c.sub_workers = subs;
  c.pipeline_depth = depth;
  c.launch_depth = launch;
  c.shared_heap_bytes = 16ull << 20;
  if (chips == 0 && subs != 0) return c;  // a chip's fields are refused on a node without one
  c.device_memory_bytes = 64ull << 20;
  c.max_tasks_per_run = 16;
  return c;
}

// A Level::Network config: the fields of a chip (geometry, device memory,
// graph capacity) belong to the nodes it adds, so they keep their defaults.
inline WorkerConfig network_config(uint32_t subs, uint32_t depth, uint32_t launch = 0) {
  WorkerConfig c;
  c.sub_workers = subs;
  c.pipeline_depth = depth;
  c.launch_depth = launch;
  c.shared_heap_bytes = 16ull << 20;
  return c;
}

// Every process below `root` (children, their children, ...), from /proc.
inline std::vector<pid_t> descendants_of(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // parent -> child
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
      std::string line;
      std::getline(in, line);
      const size_t p = line.rfind(')');
      char state = 0;
      int ppid = 0;
      if (p != std::string::npos && std::sscanf(line.c_str() + p + 1, " %c %d", &state, &ppid) == 2) {
        children.emplace(ppid, pid);
      }
    }
    closedir(d);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto [first, last] = children.equal_range(p);
    for (auto it = first; it != last; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

// The process name the kernel shows for `pid` (ps, /proc/<pid>/comm).
inline std::string comm_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// A pidfd for `pid`, or -1 when it is already gone.
inline int open_pidfd(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// True once the process behind `pidfd` has ended (a pidfd turns readable at
// its exit), false at the deadline. Closes the pidfd; -1 counts as ended.
inline bool exits_within(int pidfd, int timeout_ms) {
  if (pidfd < 0) return true;
  pollfd p{pidfd, POLLIN, 0};
  const int r = poll(&p, 1, timeout_ms);
  close(pidfd);
  return r == 1;
}

}  // namespace simpler::testing
