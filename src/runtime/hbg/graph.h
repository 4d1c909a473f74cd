// The host_build_graph run graph of one run-resource slot. The host thread that
// builds a run writes every field before launch; after launch, AICPU threads
// touch only the atomics. Task records, tensor descriptors and fanout lists
// live in device memory (GM), sized once per slot to the configured capacity.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "simpler/callable.h"
#include "simpler/kernel.h"
#include "simpler/task_args.h"

namespace simpler::hbg {

enum class TaskKind : uint8_t { AIC = 0, AIV = 1, Mix = 2 };

struct alignas(64) Task {
  std::atomic<uint32_t> fanin_left;
  std::atomic<uint32_t> subtasks_left;
  std::atomic<uint32_t> poisoned;
  uint32_t fanin;
  TaskKind kind;
  uint8_t nargs;
  uint32_t func_id[3];
  simpler_kernel_fn fn[3];
  uint32_t fanout_begin;
  uint32_t fanout_count;
  uint32_t uses_begin;  // intermediates this task references, released when it ends
  uint32_t uses_count;
  int64_t args[kMaxTaskArgs];
};

// A run-owned device allocation (Worker-owned buffers are never tracked here).
struct Intermediate {
  uint64_t addr = 0;
  // Held by the enclosing scope (or the run) plus one per task using it; the
  // one who drops it to zero frees the memory.
  std::atomic<int32_t> refs{0};
};

struct Capacity {
  uint32_t tasks;
  uint32_t descriptors;
  uint32_t edges;
};

}  // namespace simpler::hbg
