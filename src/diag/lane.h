// Swimlane recording: a Lane is one thread's fixed-size ring of events (one
// writer; readers read a traced run's window of it after the run ends); the
// Recorder holds a device's core and AICPU lanes, opens and closes each
// traced run's window, and says which level is live. Writers never allocate,
// lock or block: an event that would overwrite a window still to be read is
// counted as dropped. Buffers are allocated by Recorder::begin_run on the
// thread preparing a traced run, before any device thread can see that run.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "base/clock.h"
#include "simpler/status.h"

namespace simpler {
class ArgCapture;
}  // namespace simpler

namespace simpler::diag {

enum class EventKind : uint8_t {
  kTask = 0,      // a core ran (a subtask of) a task: name = kernel, aux = func_id
  kDispatch = 1,  // an AICPU thread wrote a task into a core's registers
  kFinish = 2,    // an AICPU thread reaped a core's FIN and released successors
  kSched = 3,     // an AICPU thread's scheduler phase: name = phase
  kSubmit = 4,    // the orchestrator checked and placed a task
  kEdge = 5,      // a dependency edge: task = consumer, aux = producer
};

// Trivial on purpose (no member initialisers): a lane's buffer is then never
// written before an event is recorded into it, so a large lane costs only
// the pages its events touch. Every writer sets all fields (aggregate init).
struct Event {
  uint64_t run;  // the run's epoch; 0 for scheduler phases, which serve every run
  uint64_t begin_ns;
  uint64_t end_ns;
  const char* name;  // static, or a kernel name living as long as its callable
  uint32_t task;
  uint32_t aux;
  EventKind kind;
};
static_assert(std::is_trivially_default_constructible_v<Event>, "a lane's buffer must cost nothing until written");

class Lane {
 public:
  // A lane whose floor stays 0 (an orchestrator's, of one run at a time)
  // keeps its first `capacity` events and drops the rest; a Recorder's
  // lanes have their floor raised as windows close, so they run as rings.
  explicit Lane(size_t capacity) : capacity_(capacity) {}
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // The writing thread only, while the buffer exists (a traced run that
  // uses the lane is in flight). The event takes index end(); it would
  // overwrite index end() - capacity, so it is dropped instead while that
  // index is at or above the floor: some open window may still read it.
  void record(const Event& e) noexcept {
    const uint64_t n = count_.load(std::memory_order_relaxed);
    if (n - floor_.load(std::memory_order_acquire) >= capacity_) {
      dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      return;
    }
    events_[n % capacity_] = e;
    count_.store(n + 1, std::memory_order_release);
  }

  // Any thread: the index the next event takes. Events [begin, end()) of a
  // window opened at `begin` are complete and stay until the window closes.
  uint64_t end() const { return count_.load(std::memory_order_acquire); }
  const Event& at(uint64_t index) const { return events_[index % capacity_]; }
  uint64_t dropped() const { return dropped_.load(std::memory_order_acquire); }
  size_t capacity() const { return capacity_; }

  // The owner, before any writer may use the lane; idempotent.
  void allocate() {
    if (!events_) events_.reset(new Event[capacity_]);
  }
  // The owner of a floor-0 lane, reusing it for another run: only while
  // nobody writes or reads it.
  void reset() {
    count_.store(0, std::memory_order_relaxed);
    dropped_.store(0, std::memory_order_relaxed);
  }
  // The Recorder: no window still open reads below `floor`. Never lowered,
  // so a writer holding an older floor only drops more, never overwrites.
  void raise_floor(uint64_t floor) { floor_.store(floor, std::memory_order_release); }
  bool allocated() const { return events_ != nullptr; }

 private:
  const size_t capacity_;
  std::unique_ptr<Event[]> events_;
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> floor_{0};
};

// Where one traced run's events begin in each lane of a Recorder, and how
// many each had dropped by then (a run's drops are those after its begin).
struct LaneWindow {
  uint64_t id = 0;  // 0: no window
  std::vector<uint64_t> core_begin;
  std::vector<uint64_t> aicpu_begin;
  std::vector<uint64_t> core_dropped;
  std::vector<uint64_t> aicpu_dropped;
};

// What a runtime needs to record one run: its level (0: nothing), its
// epoch, and its orchestrator lane (the run's own, non-null when level > 0).
struct RunTrace {
  uint32_t level = 0;
  uint64_t run = 0;
  Lane* orchestrator = nullptr;
  // The run's argument dump (null: none): tasks added at submit, captured
  // around their execution by the AICPU threads (docs/diagnostics.md).
  ArgCapture* capture = nullptr;
};

// A lane's name and thread id as the trace shows them.
struct LaneInfo {
  std::string name;  // AIC<i>, AIV<i>, AICPU<i>, Orchestrator
  uint32_t tid = 0;
};

// The core and AICPU lanes of one device. Core i of the geometry is AIC when
// i % 3 == 0 (cluster i / 3); its lane is named by its index among its type.
class Recorder {
 public:
  static constexpr size_t kDefaultLaneEvents = 1 << 15;

  Recorder(uint32_t cores, uint32_t aicpu_threads, size_t lane_events = kDefaultLaneEvents);

  Lane& core_lane(uint32_t core) { return *cores_[core]; }
  Lane& aicpu_lane(uint32_t aicpu) { return *aicpu_[aicpu]; }
  const Lane& core_lane(uint32_t core) const { return *cores_[core]; }
  const Lane& aicpu_lane(uint32_t aicpu) const { return *aicpu_[aicpu]; }
  uint32_t cores() const { return static_cast<uint32_t>(cores_.size()); }
  uint32_t aicpu_threads() const { return static_cast<uint32_t>(aicpu_.size()); }
  static LaneInfo core_info(uint32_t core);
  LaneInfo aicpu_info(uint32_t aicpu) const;
  // After every core and AICPU lane.
  uint32_t orchestrator_tid() const { return 1 + cores() + aicpu_threads(); }

  // A traced run of `level` (1-4) is about to launch: allocates the lanes
  // the first time, opens the run's window (each lane's events from now on
  // stay until it closes) and raises the scheduler level to at least
  // `level` until every traced run ended. RESOURCE_EXHAUSTED if the buffers
  // cannot be allocated.
  Result<LaneWindow> begin_run(uint32_t level);
  // The window was read (or will never be): pairs with begin_run. Lanes may
  // then reuse what no other open window reads.
  void end_run(const LaneWindow& window);
  // The highest level of the traced runs in flight: AICPU threads record
  // scheduler phases when it is >= 3. One load.
  uint32_t live_level() const { return static_cast<uint32_t>(state_.load(std::memory_order_acquire) >> 32); }

 private:
  // Each lane's floor: the lowest begin of the open windows, or its end
  // when none is open. Requires mu_.
  void raise_floors();

  std::vector<std::unique_ptr<Lane>> cores_;
  std::vector<std::unique_ptr<Lane>> aicpu_;
  // (live level << 32) | traced runs in flight: one word, so a run ending and
  // another beginning cannot leave the level wrong.
  std::atomic<uint64_t> state_{0};
  std::mutex mu_;  // allocation, and the open windows
  uint64_t next_window_ = 1;
  std::map<uint64_t, LaneWindow> open_;
};

}  // namespace simpler::diag
