#include "runtime/tmr/tmr_runtime.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "base/errors.h"
#include "device/guard_bytes.h"
#include "diag/arg_capture.h"

namespace simpler::tmr {

namespace {
constexpr uint32_t kClosed = UINT32_MAX;  // a finished task's successor list
constexpr uint64_t kRingAlign = 64;
constexpr uint64_t kRingGuardBytes = 64;
constexpr uint8_t kRingGuardPattern = 0xA5;
// Tasks the orchestrator ends itself between two of its reclaims.
constexpr uint32_t kReclaimEvery = 16;

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The orchestration runs on the device: it never holds a HostApi binding.
const HostApi kUnboundApi{};
}  // namespace

// ---- StreamBuilder -----------------------------------------------------------------------------

// The ChipOrchestrator of one streaming run, on the orchestrator thread: the
// shared checks are RunBuilder's; each checked task is placed in the window
// and released to the schedulers at once.
class StreamBuilder final : public RunBuilder {
 public:
  StreamBuilder(TmrRuntime& rt, Set& s)
      : RunBuilder(*s.callable_, kUnboundApi, rt.memory_, s, UINT32_MAX - 1), rt_(rt), s_(s) {}

 private:
  Status reserve(uint32_t task, uint32_t tensors) override;
  void place(const CheckedTask& t) override;
  // Makes the task in window slot `slot` a successor of each of preds_.
  Status link(uint32_t slot);

  TmrRuntime& rt_;
  Set& s_;
  uint64_t desc_pos_ = 0;  // where reserve() put the next task's descriptors
  std::vector<GuardCheck> guard_scratch_;
  KernelFailure failure_;         // a kernel this thread ran itself
  std::vector<ReadyItem> ready_;  // what a task this thread ended made ready
  bool yielded_ = false;          // after the run's first ready task
};

Status StreamBuilder::reserve(uint32_t task, uint32_t tensors) {
  Set& s = s_;
  if (!s.stalled_.ok()) return s.stalled_;
  const uint32_t window = s.sizes_.window;
  // A full window refills in bursts of an eighth: one wake-up per burst.
  SIMPLER_RETURN_IF_ERROR(s.wait_for_room([&] { return task - s.reclaimed_ < window; },
                                          [&] {
                                            return fmt::format(
                                                "task window: {} tasks of the run are in flight and the window "
                                                "(runtime_env.task_window = {}) is full",
                                                task - s.reclaimed_, window);
                                          },
                                          std::max<uint32_t>(1, window / 8)));
  const uint64_t cap = rt_.descriptor_capacity();
  uint64_t pos = s.desc_head_;
  if (pos % cap + tensors > cap) pos += cap - pos % cap;  // a task's descriptors never wrap
  // With none in use, the gap a wrap skipped is free too (as in Set::create).
  SIMPLER_RETURN_IF_ERROR(s.wait_for_room(
      [&] { return s.desc_tail_ == s.desc_head_ || pos + tensors - s.desc_tail_ <= cap; },
      [&] {
        return fmt::format(
            "descriptor ring: {} of its {} tensor descriptors are in use ({} per task of max_tasks_per_run = {})",
            s.desc_head_ - s.desc_tail_, cap, kDescriptorsPerTask, rt_.window_capacity_);
      }));
  if (s.desc_tail_ == s.desc_head_) s.desc_tail_ = pos;
  desc_pos_ = pos;
  return Status();
}

Status StreamBuilder::link(uint32_t slot) {
  Set& s = s_;
  GraphTask& c = s.tasks_[slot].task;
  for (const uint32_t p : s.preds_) {
    if (p == TensorMap::kTombstone) {
      c.poisoned.store(1, std::memory_order_relaxed);
      continue;
    }
    TaskSlot& ps = s.slot_of(p);
    uint32_t head = ps.fanout.load(std::memory_order_acquire);
    if (head != kClosed) {
      SIMPLER_RETURN_IF_ERROR(s.wait_for_room([&] { return s.dep_free_ != 0 || s.dep_next_ < s.deps_.size(); },
                                              [&] {
                                                return fmt::format(
                                                    "dependency pool: all {} entries "
                                                    "(runtime_env.dep_pool_entries) hold edges of tasks in flight",
                                                    s.deps_.size());
                                              }));
      uint32_t e;
      if (s.dep_free_ != 0) {
        e = s.dep_free_ - 1;
        s.dep_free_ = s.deps_[e].next;
      } else {
        e = s.dep_next_++;
      }
      s.deps_[e].succ = slot;
      // Counted before the edge is visible: its producer may finish and count down at once.
      c.fanin_left.fetch_add(1, std::memory_order_relaxed);
      head = ps.fanout.load(std::memory_order_acquire);
      for (;;) {
        if (head == kClosed) break;
        s.deps_[e].next = head;
        if (ps.fanout.compare_exchange_weak(head, e + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      if (head != kClosed) continue;
      c.fanin_left.fetch_sub(1, std::memory_order_relaxed);  // the hold keeps it above zero
      s.deps_[e].next = s.dep_free_;
      s.dep_free_ = e + 1;
    }
    // The producer finished: its outcome was final before it closed the list.
    if (ps.task.poisoned.load(std::memory_order_acquire) != 0) c.poisoned.store(1, std::memory_order_relaxed);
  }
  return Status();
}

void StreamBuilder::place(const CheckedTask& t) {
  Set& s = s_;
  const uint32_t slot = t.id % s.sizes_.window;
  TaskSlot& ts = s.tasks_[slot];
  GraphTask& task = ts.task;
  task.kind = t.kind;
  task.id = t.id;
  task.nargs = static_cast<uint8_t>(t.args->size());
  for (uint32_t i = 0; i < 3; ++i) {
    task.func_id[i] = t.func_id[i];
    task.fn[i] = t.fn[i];
    task.name[i] = t.name[i];
  }
  task.fanin_left.store(1, std::memory_order_relaxed);  // the orchestrator's hold
  task.blocks = t.blocks;
  task.next_block.store(0, std::memory_order_relaxed);
  task.subtasks_left.store(subtask_count(t.kind, t.blocks), std::memory_order_relaxed);
  task.poisoned.store(0, std::memory_order_relaxed);
  task.chained = 0;
  ts.fanout.store(0, std::memory_order_relaxed);
  ts.done.store(0, std::memory_order_relaxed);
  ts.taken = 0;

  const uint64_t cap = rt_.descriptor_capacity();
  auto next = static_cast<uint32_t>(desc_pos_ % cap);
  const uint32_t first_desc = next;
  s.preds_.clear();
  const uint64_t mark = s.run_serial_ << 32 | t.id;
  const auto add_pred = [&](uint32_t earlier) {
    if (earlier != TensorMap::kTombstone) {
      if (s.edge_mark_[earlier % s.sizes_.window] == mark) return;
      s.edge_mark_[earlier % s.sizes_.window] = mark;
      trace_edge(earlier, t.id);
    }
    s.preds_.push_back(earlier);
  };
  write_kernel_args(t, task.args, s.descriptors_, next, [&](size_t i, const TensorView& v, Tag tag) {
    if (tag == Tag::NoDep || t.local[i]) return;
    const uint64_t shift = v.buffer().addr - t.bases[i];
    s.map_.add(t.bases[i], v, shift + v.first_byte(), shift + v.end_byte(), t.id, slot, tag_writes(tag), add_pred);
  });
  for (uint32_t k = 0; k < t.dep_count; ++k) {
    const uint32_t d = t.deps[k];
    if (d >= s.reclaimed_) {
      add_pred(d);
    } else if (s.failed_reclaimed_.count(d) != 0) {
      // Reclaimed, its slot may hold another task now: what counts is that it failed.
      add_pred(TensorMap::kTombstone);
    }
  }
  ts.desc_end = desc_pos_ + (next - first_desc);
  s.desc_head_ = ts.desc_end;

  task.uses_begin = slot * kMaxTaskArgs;
  task.uses_count = t.use_count;
  std::copy(t.uses.begin(), t.uses.begin() + t.use_count, s.uses_.begin() + task.uses_begin);
  task.guards_begin = slot * kMaxTaskArgs;
  guard_scratch_.clear();
  if (memory().guarded()) collect_guard_checks(t, guard_scratch_);
  task.guards_count = static_cast<uint32_t>(guard_scratch_.size());
  std::copy(guard_scratch_.begin(), guard_scratch_.end(), s.guards_.begin() + task.guards_begin);

  s.submitted_ = t.id + 1;
  if (s.credits_ == 0) {
    s.remaining_.fetch_add(kCredits, std::memory_order_relaxed);
    s.credits_ = kCredits;
  }
  --s.credits_;
  // Edges last: waiting for dependency entries may reclaim, which edits the
  // map, so it must not happen inside the map's walk above.
  // Counted in remaining_ and holding its fanin, the task must go on to the
  // hold's release below whatever link() does: a throw (host memory, while
  // a wait reclaims) would leave the run one task short of its end forever.
  Status st;
  try {
    st = link(slot);
  } catch (const std::bad_alloc&) {
    st = Status(StatusCode::kResourceExhausted, "host memory exhausted linking a task's dependencies");
  }
  if (!st.ok()) {
    // Placed without all its edges, it must not run; the next submit is refused with the same error.
    task.poisoned.store(1, std::memory_order_relaxed);
    s.stalled_ = std::move(st);
  }
  if (task.fanin_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (task.poisoned.load(std::memory_order_acquire) != 0) {
    rt_.finish_task(s, slot, true, ready_, TmrRuntime::Ender::kOrchestrator);
    return;
  }
  const ReadyItem item{s.index_, slot};
  if (rt_.dispatcher_.run_on_orchestrator(item, task, failure_)) {
    // No capture: a dumping run never takes this path, so no AICPU thread is named.
    rt_.end_subtask_of(s, slot, 0, failure_.failed ? failure_.message : nullptr, 0, ready_,
                       TmrRuntime::Ender::kOrchestrator);
    // Retired now, not when the window fills: the map then holds only what
    // is still in flight, and its walk stays in cache however long the run.
    if (t.id % kReclaimEvery == kReclaimEvery - 1) s.reclaim();
    return;
  }
  rt_.dispatcher_.push(task, item);
  rt_.device_.ring_all_aicpu();
  // Where the orchestrator shares CPUs with the cores (the simulator on a
  // small host), the first ready task of a run must not wait for the whole
  // orchestration's time slice.
  if (!yielded_) {
    yielded_ = true;
    yield_cpu();
  }
}

// ---- Set ---------------------------------------------------------------------------------------

Set::Set(TmrRuntime& rt, uint32_t index) : rt_(rt), index_(index) {}

void Set::reset(const StreamSizes& sizes) {
  sizes_ = sizes;
  remaining_.store(1, std::memory_order_relaxed);
  credits_ = 0;
  released_early_.store(0, std::memory_order_relaxed);
  error_.reset();
  orchestration_error_ = Status();
  stalled_ = Status();
  submitted_ = 0;
  reclaimed_ = 0;
  desc_head_ = 0;
  desc_tail_ = 0;
  // Marks carry the run's serial, so the last run's never match and need no clearing.
  if (edge_mark_.size() != sizes.window) edge_mark_.assign(sizes.window, 0);
  ++run_serial_;
  preds_.reserve(64);
  if (deps_.size() != sizes.dep_pool) deps_.assign(sizes.dep_pool, DepEntry{});
  dep_next_ = 0;
  dep_free_ = 0;
  uses_.resize(size_t{sizes.window} * kMaxTaskArgs);
  guards_.resize(size_t{sizes.window} * kMaxTaskArgs);
  map_.reset(sizes.window);
  for (HeapRing& r : rings_) {
    r.base.store(0, std::memory_order_relaxed);
    r.head = 0;
    r.tail = 0;
    r.blocks.clear();
  }
  const uint32_t ims = sizes.window * 2 + 64;
  if (ims != im_capacity_) {
    ims_.reset(new RingIntermediate[ims]);
    im_capacity_ = ims;
  }
  im_next_ = 0;
  im_free_.clear();
  im_free_.reserve(ims);
  live_.clear();
  failed_reclaimed_.clear();
  scopes_.clear();
  borrowed_.clear();
}

void Set::release_all() {
  DeviceMemory& memory = rt_.memory_;
  for (HeapRing& r : rings_) {
    const uint64_t base = r.base.load(std::memory_order_relaxed);
    if (base == 0) continue;
    memory.unpin(base);
    (void)memory.free(base);
    r.base.store(0, std::memory_order_relaxed);
  }
  borrowed_.release(memory);
}

template <typename Room, typename What>
Status Set::wait_for_room(Room&& room, What&& what, uint32_t batch) {
  if (room()) return Status();
  reclaim();
  if (room()) return Status();
  uint64_t last_progress = now_ns();
  bool stuck = false;
  for (;;) {
    bool raced = false;
    const bool woke = spin_then_park(
        rt_.progress_,
        [&] {
          // Read before reclaim(): a task that finishes after this load is
          // counted toward the mark below, or seen by reclaim().
          const uint32_t left = remaining_.load(std::memory_order_seq_cst);
          if (reclaim()) last_progress = now_ns();
          if (room()) return true;
          // Every task submitted has finished and been reclaimed (a task's
          // releases are visible once its done flag is): nothing will ever
          // make room.
          stuck = reclaimed_ == submitted_;
          if (stuck) return true;
          // Finishers ring only once `batch` more tasks finished, not once
          // per task; never more than the tasks still unfinished, or no
          // finish would ever reach it (tasks that finished out of order
          // wait for reclaim behind an older one, they finish no more).
          // In remaining_ terms: the tasks in flight are what it holds
          // beyond the hold and the unused credits. Both sides write, then
          // load the other's word (seq_cst): either a finisher sees this
          // mark, or this sees the finish and looks again instead of parking.
          const uint32_t in_flight = left - 1 - credits_;
          const uint32_t mark = left - std::min(batch, in_flight);
          rt_.waiting_.store(uint64_t{index_ + 1} << 32 | mark, std::memory_order_seq_cst);
          raced = remaining_.load(std::memory_order_seq_cst) <= mark;
          return raced;
        },
        SpinPolicy{}, last_progress + sizes_.stall_ns);
    rt_.waiting_.store(0, std::memory_order_relaxed);
    if (stuck) {
      return resource_exhausted(
          "{}, and no task is in flight to free it: what holds it is held by the run or by "
          "a scope that has not ended",
          what());
    }
    if (room()) return Status();
    if (!woke && now_ns() - last_progress >= sizes_.stall_ns) {
      return make_error(StatusCode::kDeadlineExceeded, "{}, and no task retired for {} ms (runtime_env.stall_timeout)",
                        what(), sizes_.stall_ns / 1'000'000);
    }
  }
}

bool Set::reclaim() {
  bool any = false;
  while (reclaimed_ < submitted_) {
    TaskSlot& ts = slot_of(reclaimed_);
    if (ts.done.load(std::memory_order_acquire) == 0) break;
    const bool failed = ts.task.poisoned.load(std::memory_order_relaxed) != 0;
    // First, the one step that allocates: a throw here leaves this task unreclaimed, as if not done yet.
    if (failed) failed_reclaimed_.insert(reclaimed_);
    for (uint32_t e = ts.taken; e != 0 && e != kClosed;) {
      const uint32_t next = deps_[e - 1].next;
      deps_[e - 1].next = dep_free_;
      dep_free_ = e;
      e = next;
    }
    map_.retire(reclaimed_ % sizes_.window, failed);
    desc_tail_ = ts.desc_end;
    ++reclaimed_;
    any = true;
  }
  for (HeapRing& r : rings_) {
    while (!r.blocks.empty()) {
      const RingBlock& b = r.blocks.front();
      RingIntermediate& im = ims_[b.im];
      if (im.released.load(std::memory_order_acquire) == 0) break;
      map_.forget_allocation(im.addr);
      live_.erase(im.addr);
      im_free_.push_back(b.im);
      r.tail = b.end;
      r.blocks.pop_front();
      any = true;
    }
  }
  return any;
}

void Set::mark_released(RingIntermediate& im) {
  // No ring: a task's releases precede its finish, which wakes a waiting orchestrator.
  im.released.store(1, std::memory_order_release);
}

Result<uint32_t> Set::create(const HostApi&, uint64_t bytes) {
  DeviceMemory& memory = rt_.memory_;
  const auto ring = static_cast<uint32_t>(std::min<size_t>(scopes_.size(), kHeapRings - 1));
  HeapRing& r = rings_[ring];
  const uint64_t size = sizes_.heap_ring_bytes;
  const uint64_t guard = memory.guarded() ? kRingGuardBytes : 0;
  const uint64_t span = align_up(bytes, kRingAlign) + 2 * guard;
  if (span > size) {
    return resource_exhausted(
        "intermediate tensor of {} bytes can never fit heap ring {} of {} bytes (runtime_env.heap_ring_bytes)", bytes,
        ring, size);
  }
  uint64_t base = r.base.load(std::memory_order_relaxed);
  if (base == 0) {
    SIMPLER_ASSIGN_OR_RETURN(base, memory.allocate(size), "intermediate tensor: heap ring {}", ring);
    if (Status st = memory.pin(base); !st.ok()) {
      (void)memory.free(base);
      return st;
    }
    r.base.store(base, std::memory_order_relaxed);
  }
  SIMPLER_RETURN_IF_ERROR(
      wait_for_room([&] { return !im_free_.empty() || im_next_ < im_capacity_; },
                    [&] {
                      return fmt::format(
                          "intermediate tensor: all {} intermediates are live (2 x runtime_env.task_window + 64 = "
                          "2 x {} + 64)",
                          im_capacity_, sizes_.window);
                    }));
  uint64_t pos = r.head;
  if (pos % size + span > size) pos += size - pos % size;  // a block never wraps
  // An empty ring has room for any block that fits it: the gap a wrap
  // skipped before `pos` belongs to no block, so no reclaim ever frees it.
  SIMPLER_RETURN_IF_ERROR(wait_for_room([&] { return r.blocks.empty() || pos + span - r.tail <= size; },
                                        [&] {
                                          return fmt::format(
                                              "heap ring {} ({} bytes, runtime_env.heap_ring_bytes) is full: an "
                                              "intermediate tensor of {} bytes waits for {} older intermediates",
                                              ring, size, bytes, r.blocks.size());
                                        }));
  uint32_t i;
  if (!im_free_.empty()) {
    i = im_free_.back();
    im_free_.pop_back();
  } else {
    i = im_next_++;
  }
  RingIntermediate& im = ims_[i];
  im.addr = base + pos % size + guard;
  im.bytes = bytes;
  im.ring = ring;
  im.refs.store(1, std::memory_order_relaxed);  // the scope's (or the run's) reference
  im.released.store(0, std::memory_order_relaxed);
  im.scope = scopes_.empty() ? RingIntermediate::Scope::kRun : RingIntermediate::Scope::kOpen;
  im.used = false;
  if (guard != 0) {
    std::memset(reinterpret_cast<void*>(im.addr - guard), kRingGuardPattern, guard);
    std::memset(reinterpret_cast<void*>(im.addr + bytes), kRingGuardPattern,
                align_up(bytes, kRingAlign) + guard - bytes);
  }
  if (r.blocks.empty()) r.tail = pos;
  r.blocks.push_back(RingBlock{r.head, pos + span, i});
  r.head = pos + span;
  live_[im.addr] = i;
  if (!scopes_.empty()) scopes_.back().push_back(i);
  return i;
}

void Set::discard(uint32_t i) {
  RingIntermediate& im = ims_[i];
  HeapRing& r = rings_[im.ring];
  r.head = r.blocks.back().begin;
  r.blocks.pop_back();
  live_.erase(im.addr);
  if (!scopes_.empty()) scopes_.back().pop_back();
  im_free_.push_back(i);
}

void Set::scope_begin() { scopes_.emplace_back(); }

Status Set::scope_end() {
  if (scopes_.empty()) return failed_precondition("scope_end without a matching scope_begin");
  for (uint32_t i : scopes_.back()) {
    RingIntermediate& im = ims_[i];
    im.scope = RingIntermediate::Scope::kEnded;
    if (im.refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Its users finished before its scope ended.
      if (im.used) released_early_.fetch_add(1, std::memory_order_relaxed);
      mark_released(im);
    }
  }
  scopes_.pop_back();
  return Status();
}

bool Set::release_user(uint32_t i) {
  RingIntermediate& im = ims_[i];
  if (im.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  mark_released(im);
  return true;
}

Result<Intermediates::Held> Set::hold(uint64_t addr, uint64_t bytes) {
  for (uint32_t ring = 0; ring < kHeapRings; ++ring) {
    const HeapRing& r = rings_[ring];
    const uint64_t base = r.base.load(std::memory_order_relaxed);
    if (base == 0 || addr < base || addr - base >= sizes_.heap_ring_bytes) continue;
    auto it = live_.upper_bound(addr);
    if (it != live_.begin()) {
      --it;
      const RingIntermediate& im = ims_[it->second];
      if (addr - im.addr <= im.bytes && bytes <= im.bytes - (addr - im.addr)) {
        if (im.scope == RingIntermediate::Scope::kEnded) {
          return failed_precondition(
              "the intermediate at {:#x} belongs to a scope that has ended; its memory is reused once its last "
              "user finishes",
              im.addr);
        }
        return Held{DeviceMemory::Allocation{im.addr, im.bytes}, it->second};
      }
    }
    return out_of_range("[{:#x}, +{}) is in heap ring {} but in no live intermediate of this run", addr, bytes, ring);
  }
  Held held;
  SIMPLER_ASSIGN_OR_RETURN(held.allocation, rt_.memory_.containing_allocation(addr, bytes));
  SIMPLER_RETURN_IF_ERROR(borrowed_.borrow(rt_.memory_, held.allocation.addr));
  return held;
}

// ---- TmrRuntime --------------------------------------------------------------------------------

struct TmrRuntime::GrantState final : GrantOwner::Pending {
  std::vector<std::unique_ptr<Set>> sets;
  CoreDispatcher::Storage queues;
};

TmrRuntime::TmrRuntime(Device& device, uint32_t window_capacity, RunDoneFn on_done)
    : device_(device),
      memory_(device.memory()),
      window_capacity_(window_capacity),
      on_done_(std::move(on_done)),
      dispatcher_(device) {}

TmrRuntime::~TmrRuntime() = default;

Result<std::unique_ptr<ChipRuntime>> TmrRuntime::create(Device& device, const RuntimeOptions& options,
                                                        RunDoneFn on_done) {
  SIMPLER_RETURN_IF_ERROR(check_runtime_options(options, device, "tensormap_and_ringbuffer",
                                                "keeps its task window in device memory the host maps"));
  std::unique_ptr<TmrRuntime> rt(new TmrRuntime(device, options.max_tasks_per_run, std::move(on_done)));
  SIMPLER_RETURN_IF_ERROR(rt->sizes_for(options.env).status());
  return std::unique_ptr<ChipRuntime>(std::move(rt));
}

Result<StreamSizes> TmrRuntime::sizes_for(const RuntimeEnv& env) const {
  StreamSizes z;
  z.window = env.task_window == 0 ? window_capacity_ : env.task_window;
  if (z.window > window_capacity_) {
    return invalid_argument(
        "runtime_env.task_window = {} is larger than max_tasks_per_run = {}, the task slots of each set",
        env.task_window, window_capacity_);
  }
  constexpr uint32_t kMaxDepPool = 1u << 26;
  if (env.dep_pool_entries > kMaxDepPool) {
    return invalid_argument("runtime_env.dep_pool_entries = {} is larger than {}", env.dep_pool_entries, kMaxDepPool);
  }
  z.dep_pool = env.dep_pool_entries != 0 ? env.dep_pool_entries : std::min<uint32_t>(z.window * 8, kMaxDepPool);
  z.heap_ring_bytes = env.heap_ring_bytes != 0 ? env.heap_ring_bytes : kDefaultHeapRingBytes;
  if (z.heap_ring_bytes < 2 * kRingAlign + 2 * kRingGuardBytes || z.heap_ring_bytes % kRingAlign != 0) {
    return invalid_argument("runtime_env.heap_ring_bytes = {} is not a multiple of {} of at least {}",
                            env.heap_ring_bytes, kRingAlign, 2 * kRingAlign + 2 * kRingGuardBytes);
  }
  if (z.heap_ring_bytes > memory_.total_bytes()) {
    return invalid_argument("runtime_env.heap_ring_bytes = {} is more than the device's {} bytes", z.heap_ring_bytes,
                            memory_.total_bytes());
  }
  if (env.stall_timeout.count() < 0) {
    return invalid_argument("runtime_env.stall_timeout = {} ms is negative", env.stall_timeout.count());
  }
  const uint64_t stall_ms =
      env.stall_timeout.count() != 0 ? static_cast<uint64_t>(env.stall_timeout.count()) : kDefaultStallMs;
  z.stall_ns = stall_ms * 1'000'000ull;
  return z;
}

uint64_t TmrRuntime::descriptor_capacity() const {
  return std::max<uint64_t>(uint64_t{window_capacity_} * kDescriptorsPerTask, kMaxTaskArgs);
}

uint64_t TmrRuntime::arena_bytes() const {
  return align_up(sizeof(TaskSlot) * uint64_t{window_capacity_}, 64) + sizeof(DeviceTensor) * descriptor_capacity();
}

Result<std::unique_ptr<GrantOwner::Pending>> TmrRuntime::build_grant(uint32_t grant) const {
  auto g = std::make_unique<GrantState>();
  g->sets.reserve(grant);
  for (uint32_t i = 0; i < grant; ++i) g->sets.push_back(std::make_unique<Set>(const_cast<TmrRuntime&>(*this), i));
  SIMPLER_ASSIGN_OR_RETURN(g->queues, dispatcher_.make_storage(size_t{grant} * window_capacity_, grant));
  return std::unique_ptr<Pending>(std::move(g));
}

void TmrRuntime::commit_grant(Pending& pending) noexcept {
  auto& g = static_cast<GrantState&>(pending);
  sets_.swap(g.sets);
  dispatcher_.swap_storage(g.queues);
}

Status TmrRuntime::build(const HostApi& api, const ChipCallable& callable, const TaskArgs& run_args,
                         const RuntimeEnv& env, const diag::RunTrace& trace) {
  if (api.slot >= sets_.size()) {
    return invalid_argument("pipeline_slot = {} is outside the grant of {}", api.slot, sets_.size());
  }
  Set& s = *sets_[api.slot];
  SIMPLER_ASSIGN_OR_RETURN(const StreamSizes sizes, sizes_for(env));
  uint64_t bytes = 0;
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, api.arena_setup(&bytes));
  if (bytes < arena_bytes()) {
    return internal_error("arena bank {} has {} bytes, a task window needs {}", api.bank, bytes, arena_bytes());
  }
  if (s.arena_addr_ != addr) {
    auto* p = reinterpret_cast<uint8_t*>(addr);
    s.tasks_ = reinterpret_cast<TaskSlot*>(p);
    for (uint32_t t = 0; t < window_capacity_; ++t) new (&s.tasks_[t]) TaskSlot();
    s.descriptors_ = reinterpret_cast<DeviceTensor*>(p + align_up(sizeof(TaskSlot) * uint64_t{window_capacity_}, 64));
    s.arena_addr_ = addr;
  }
  s.reset(sizes);
  s.callable_ = &callable;
  s.run_args_ = &run_args;
  s.trace_ = trace;
  return Status();
}

void TmrRuntime::launch(uint32_t slot) {
  sets_[slot]->launch_ns_ = now_ns();
  turnaround_.launched(sets_[slot]->launch_ns_);
  dispatcher_.set_trace(slot, sets_[slot]->trace_);
  dispatcher_.begin_run(slot);
  {
    std::lock_guard<std::mutex> lock(launched_mu_);
    launched_.push_back(slot);
  }
  // After the push and before the ring: the orchestrator that sees the count
  // finds the slot, and one about to park sees the count or is rung.
  launches_.fetch_add(1, std::memory_order_release);
  device_.ring_aicpu(device_.geometry().aicpu_threads);
}

bool TmrRuntime::poll(uint32_t aicpu) {
  if (aicpu < device_.geometry().aicpu_threads) {
    return dispatcher_.poll(
        aicpu, [this](ReadyItem it) -> GraphTask& { return task_of(it); },
        [this](const CoreDispatcher::Inflight& f, const char* failure, std::vector<ReadyItem>& ready) {
          complete_subtask(f, failure, ready);
        },
        [this](ReadyItem after, TaskKind kind, ReadyItem& next) { return chain_after(after, kind, next); });
  }
  if (launches_.load(std::memory_order_acquire) == launches_taken_) return false;
  ++launches_taken_;
  uint32_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(launched_mu_);
    slot = launched_.front();
    launched_.pop_front();
  }
  stream(*sets_[slot]);
  return true;
}

void TmrRuntime::stream(Set& s) {
  Status st;
  {
    StreamBuilder builder(*this, s);
    builder.set_trace(s.trace_);
    st = builder.orchestrate(*s.run_args_);
  }
  // Nothing is placed any more: the map's records go now, while the tasks
  // still run, instead of on the next submit's path.
  s.map_.reset(s.sizes_.window);
  // A stall recorded while placing a task is the run's error even when the
  // orchestration returned OK after it.
  s.orchestration_error_ = st.ok() ? s.stalled_ : std::move(st);
  // Lets go of the run (its hold and the credits it did not use): once the
  // tasks in flight retire, it ends, and the set may be another run's at
  // once, so nothing of it is touched after the drop.
  const uint32_t unused = s.credits_;
  s.credits_ = 0;
  drop_remaining(s, 1 + unused);
}

void TmrRuntime::complete_subtask(const CoreDispatcher::Inflight& f, const char* failure,
                                  std::vector<ReadyItem>& ready) {
  end_subtask_of(*sets_[f.slot], f.task, f.sub, failure, f.aicpu, ready, Ender::kAicpu);
}

void TmrRuntime::end_subtask_of(Set& s, uint32_t slot, uint32_t sub, const char* failure, uint32_t aicpu,
                                std::vector<ReadyItem>& ready, Ender by) {
  GraphTask& task = s.tasks_[slot].task;
  const auto damage = [&](uint64_t addr, uint64_t bytes) {
    for (const HeapRing& ring : s.rings_) {
      const uint64_t base = ring.base.load(std::memory_order_relaxed);
      if (base != 0 && addr >= base && addr - base < s.sizes_.heap_ring_bytes) {
        return measure_and_restore_guards(addr, bytes, kRingGuardBytes, kRingAlign, kRingGuardPattern);
      }
    }
    return memory_.check_guards(addr, bytes);
  };
  if (!end_subtask(task, task.id, sub, failure, s.error_, damage, s.guards_.data(), *s.callable_)) return;
  // Its outputs as the kernels left them, before a successor may overwrite them.
  if (s.trace_.capture != nullptr) s.trace_.capture->after(aicpu, task.id);
  finish_task(s, slot, task.poisoned.load(std::memory_order_acquire) != 0, ready, by);
}

void TmrRuntime::finish_task(Set& s, uint32_t slot, bool failed, std::vector<ReadyItem>& ready, Ender by) {
  std::vector<uint32_t> poisoned_done;  // allocates only when a failure poisons a successor
  uint32_t finished = 0;
  for (;;) {
    TaskSlot& ts = s.tasks_[slot];
    GraphTask& t = ts.task;
    for (uint32_t i = 0; i < t.uses_count; ++i) {
      if (s.release_user(s.uses_[t.uses_begin + i])) s.released_early_.fetch_add(1, std::memory_order_relaxed);
    }
    const uint32_t list = ts.fanout.exchange(kClosed, std::memory_order_acq_rel);
    for (uint32_t e = list; e != 0;) {
      const DepEntry& d = s.deps_[e - 1];
      GraphTask& succ = s.tasks_[d.succ].task;
      if (failed) succ.poisoned.store(1, std::memory_order_relaxed);
      if (succ.fanin_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (succ.poisoned.load(std::memory_order_acquire) != 0) {
          poisoned_done.push_back(d.succ);
        } else if (succ.chained == 0) {  // a chain link is on its core already
          ready.push_back({s.index_, d.succ});
        }
      }
      e = d.next;
    }
    ts.taken = list;
    ts.done.store(1, std::memory_order_release);
    ++finished;
    if (poisoned_done.empty()) break;
    slot = poisoned_done.back();
    poisoned_done.pop_back();
    failed = true;
  }
  // Successors must be queued before `remaining` can reach zero and hand the set back.
  dispatcher_.publish(ready, [this](ReadyItem it) -> GraphTask& { return task_of(it); });
  if (by == Ender::kOrchestrator) {
    // Its hold keeps the run open: what it ended becomes its credits, with no shared write.
    s.credits_ += finished;
    return;
  }
  drop_remaining(s, finished);
}

bool TmrRuntime::chain_after(ReadyItem after, TaskKind kind, ReadyItem& next) const {
  Set& s = *sets_[after.slot];
  const TaskSlot& ahead = s.tasks_[after.task];
  if (ahead.task.guards_count != 0) return false;
  // `ahead` has not ended, so its list is open and its entries stay put; the
  // acquire pairs with the orchestrator's release that added each.
  for (uint32_t e = ahead.fanout.load(std::memory_order_acquire); e != 0 && e != kClosed; e = s.deps_[e - 1].next) {
    const uint32_t succ = s.deps_[e - 1].succ;
    if (!take_as_chain_link(s.tasks_[succ].task, kind)) continue;
    next = ReadyItem{after.slot, succ};
    return true;
  }
  return false;
}

void TmrRuntime::drop_remaining(Set& s, uint32_t n) {
  const uint64_t tag = uint64_t{s.index_ + 1} << 32;
  const uint32_t left = s.remaining_.fetch_sub(n, std::memory_order_seq_cst) - n;
  if (left == 0) {
    finish_run(s);
    return;
  }
  // `s` may be another run's by now (the last task ended it on another
  // thread): only the runtime's word is read, and a ring for a run whose
  // orchestrator waits for nothing is a spurious wake-up it looks past.
  const uint64_t w = waiting_.load(std::memory_order_seq_cst);
  if ((w & ~uint64_t{UINT32_MAX}) == tag && left <= static_cast<uint32_t>(w)) progress_.ring();
}

void TmrRuntime::finish_run(Set& s) {
  RunOutcome out;
  out.tasks = s.submitted_;
  out.launch_ns = s.launch_ns_;
  // The orchestration's own error outranks its tasks': it is what a
  // runtime that builds first would have reported, with nothing run.
  out.status = s.orchestration_error_.ok() ? s.error_.get() : s.orchestration_error_;
  s.release_all();
  out.released_early = s.released_early_.load(std::memory_order_relaxed);
  const CoreDispatcher::Counts counts = dispatcher_.counts(s.index_);
  out.executed = counts.executed;
  out.chained = counts.chained;
  out.taken_back = counts.taken_back;
  out.end_ns = now_ns();
  turnaround_.ended(out.end_ns);
  on_done_(s.index_, std::move(out));
  // The next run usually follows at once (a waiting host submits again, or a
  // pipelined one is already queued): the orchestrator thread, parked since it
  // finished this run's orchestration, wakes now, while the host still learns
  // of this run's end, and spins through that hand-off instead of paying a
  // futex wake after the next launch. The spin lasts as long as the host's
  // last turnaround took (turnaround_), which on a paravirtualised host is
  // longer than the device's window: the host's own wake-up is part of it.
  device_.ring_aicpu(device_.geometry().aicpu_threads);
}

SIMPLER_REGISTER_RUNTIME(tensormap_and_ringbuffer,
                         RuntimeInfo{"tensormap_and_ringbuffer",
                                     "an AICPU thread runs the orchestration on the device; tasks stream through a "
                                     "task window and heap rings while earlier ones execute",
                                     /*concurrent=*/true, /*streaming=*/true, &TmrRuntime::create,
                                     /*captures_args=*/true});

}  // namespace simpler::tmr
