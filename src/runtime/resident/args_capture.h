// Mechanism R (seed 002, R93-R118): per-task argument capture on the resident
// route. The cores stop at each task's BEFORE and AFTER boundaries and hand
// the capture to the AICPU supervisor of their dump lane through a control
// block in (simulated) GM: a gate slot per (cluster, pending slot), a request
// line per core and an ack line per core. Core-side calls run on the core
// threads of the run's participants; service() runs on AICPU thread `lane`
// only. A CaptureRun belongs to one dumping run; it owns the AICPU-side
// request state, never the GM block (the runtime allocates and frees that).
// Each modelled store or load cites its label in tests/model/args_capture.pml.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/doorbell.h"
#include "diag/arg_capture.h"
#include "simpler/status.h"

namespace simpler::resident {

// The seed's capacities (A5): 36 clusters x 2 pending slots, 108 cores.
inline constexpr uint32_t kCaptureClusterCapacity = 36;
inline constexpr uint32_t kCapturePendingSlots = 2;
inline constexpr uint32_t kCaptureWorkerCapacity = 108;

// A gate word. It has no copy, no assignment and no conversion: only
// CaptureRun's four primitives (each a single 64-bit atomic) reach its
// value, so a plain load, store or whole-line copy of a slot does not
// compile (R94). Zeroed at run init, with the rest of the block.
class SlotWord {
 public:
  SlotWord() = default;
  SlotWord(const SlotWord&) = delete;
  SlotWord& operator=(const SlotWord&) = delete;

 private:
  friend class CaptureRun;
  uint64_t v_ = 0;
};
static_assert(sizeof(SlotWord) == 8 && alignof(SlotWord) == 8);

// One gate per (cluster, pending slot).
struct ArgsCaptureSlot {
  SlotWord claim;             // (state << 62) | occupancy
  SlotWord arrived_before;    // participant bitmask
  SlotWord arrived_after;     // participant bitmask
  SlotWord released_before;   // participant bitmask
  SlotWord released_after;    // participant bitmask
  SlotWord publisher_before;  // (core + 1) << 32 | phase_seq
  SlotWord publisher_after;   // (core + 1) << 32 | phase_seq
  SlotWord aborted;           // 0, or 1 | (site << 8)
};
static_assert(sizeof(ArgsCaptureSlot) == 64, "R93: ArgsCaptureSlot is exactly 8 x u64");

// Written only by its core, read by the AICPU; request_tick last.
struct ArgsCaptureRequest {
  uint64_t run_epoch;
  uint64_t task_id;
  uint64_t phase;  // CapturePhase
  uint64_t phase_seq;
  uint64_t arg_index;
  uint64_t arg_cursor;
  uint64_t slot;  // the gate, so the AICPU can read its `aborted`
  uint64_t request_tick;
};
static_assert(sizeof(ArgsCaptureRequest) == 64 && offsetof(ArgsCaptureRequest, request_tick) == 56,
              "R93: a request line is 64 B, its tick last");

// Written only by the AICPU, read by the publisher and its phase's peers;
// the identity (run_epoch, task_id, phase_seq) last, phase_seq the very last.
struct ArgsCaptureAck {
  uint64_t status;  // AckStatus
  uint64_t arg_index;
  uint64_t arg_cursor;
  uint64_t request_tick;
  uint64_t run_epoch;
  uint64_t task_id;
  uint64_t reserved;
  uint64_t phase_seq;
};
static_assert(sizeof(ArgsCaptureAck) == 64 && offsetof(ArgsCaptureAck, phase_seq) == 56,
              "R93: an ack line is 64 B, phase_seq last");

struct ArgsCaptureControl {
  ArgsCaptureSlot slots[kCaptureClusterCapacity * kCapturePendingSlots];
  ArgsCaptureRequest requests[kCaptureWorkerCapacity];
  ArgsCaptureAck acks[kCaptureWorkerCapacity];
};
static_assert(sizeof(ArgsCaptureControl) == 18 * 1024, "R93: 18 KiB of GM per dumping run");
inline constexpr uint64_t kCaptureControlBytes = sizeof(ArgsCaptureControl);

enum class CapturePhase : uint64_t { kBefore = 1, kAfter = 2 };
enum class AckStatus : uint64_t { kNone = 0, kInProgress = 1, kWouldBlock = 2, kSealed = 3, kAborted = 4 };
enum class SlotState : uint64_t { kFree = 0, kClaiming = 1, kReady = 2, kSettled = 3 };
inline constexpr uint64_t kOccupancyMask = (uint64_t{1} << 62) - 1;
constexpr uint64_t claim_word(SlotState s, uint64_t occupancy) {
  return (static_cast<uint64_t>(s) << 62) | (occupancy & kOccupancyMask);
}
constexpr SlotState claim_state(uint64_t w) { return static_cast<SlotState>(w >> 62); }
constexpr uint64_t claim_occupancy(uint64_t w) { return w & kOccupancyMask; }
// An ack cursor meaning "this argument is committed": the publisher moves to the next.
inline constexpr uint64_t kCursorDone = UINT64_MAX;
// Abort sites (`aborted` = 1 | site << 8).
enum class AbortSite : uint64_t { kBefore = 1, kAfter = 2 };

// Which slot word an access touched, and how (the R94 checker's vocabulary).
enum class SlotWordId : uint8_t {
  kClaim,
  kArrivedBefore,
  kArrivedAfter,
  kReleasedBefore,
  kReleasedAfter,
  kPublisherBefore,
  kPublisherAfter,
  kAborted
};
enum class SlotOp : uint8_t { kLoad, kStore, kCas, kFetchOr };

// What a thread did to a request or ack line (R101, R106). A store is one
// field's single-writer store; a flush is the writer's barrier + line
// write-back, modelled as a release fence; an invalidate is the reader's
// line invalidate, modelled as an acquire fence. kFlushOutputs is a core's
// flush of the output spans it wrote, before it arrives at AFTER.
enum class LineEvent : uint8_t { kStore, kFlush, kInvalidate, kFlushOutputs };

// Where a core is in the protocol, for tests (timestamps, forced interleavings).
enum class CapturePoint : uint8_t {
  kClaimWon,      // the claim CAS succeeded; the core is inside CLAIMING, before initialization
  kArrived,       // fetch_or into arrived_p done (word: the phase)
  kPublished,     // publisher_p stored (word: phase_seq)
  kSealAccepted,  // a terminal ack accepted (word: AckStatus)
  kReleased,      // fetch_or into released_p done (word: the phase)
  kSettled,       // SETTLED | n stored (word: n)
  kAbortCas,      // this core's abort CAS won (word: the aborted value)
  kServed,        // AICPU: an ack about to be written (word: AckStatus); `core` is the publisher
  kReuseWait,     // a publisher waits for its last phase's participants to leave (R104; word: that phase's gate)
};

struct CaptureHooks {
  // Any capture thread; may block to force an interleaving.
  std::function<void(CapturePoint point, uint32_t core, uint32_t slot, uint64_t word)> point;
  // Every slot-word access, on the accessing thread (core id; UINT32_MAX for the AICPU).
  std::function<void(uint32_t core, uint32_t slot, SlotWordId word, SlotOp op)> slot_access;
  // The AICPU asks before each service step of `lane`; false: skip it (stop acknowledging).
  std::function<bool(uint32_t lane)> serve;
  // An AICPU service step observed a request (core, its observe_tick) for the first time.
  std::function<void(uint32_t lane, uint32_t core, uint64_t observe_tick)> observed;
  // Every line event (the R94 checker and R101/R106's order checks): `actor`
  // is a core or UINT32_MAX for the AICPU; `addr`/`bytes` the line, field or
  // tensor extent (kFlushOutputs: null, bytes = the task id).
  std::function<void(LineEvent ev, uint32_t actor, const void* addr, uint64_t bytes)> line;
};

struct CaptureConfig {
  uint64_t first_budget_ns = 10'000'000'000;   // a waiter then aborts (READY) or leaves (CLAIMING)
  uint64_t second_budget_ns = 30'000'000'000;  // no ack at all: the fatal path
  uint64_t max_bytes = 64 * 1024;              // one service step copies at most this (R110)
};

// How the protocol reaches the device: a core's doorbell, and the AICPU's.
class CaptureEnv {
 public:
  virtual ~CaptureEnv() = default;
  virtual Doorbell& core_bell(uint32_t core) = 0;
  virtual void ring_aicpu(uint32_t lane) = 0;
};

// A core's own counters, written only by that core's thread.
struct CaptureCoreState {
  uint64_t phase_seq = 0;     // the next phase identity it allocates
  uint64_t request_tick = 0;  // per request it publishes
  // The last phase it published (R104): its ack line holds that phase's
  // seal for the peers still to read it, until each of them left the phase.
  // None while published_mask is 0. Another run's publication holds nothing
  // back: each run has ack lines of its own.
  uint64_t published_run = 0;
  uint32_t published_slot = 0;
  uint64_t published_occupancy = 0;
  CapturePhase published_phase = CapturePhase::kBefore;
  uint64_t published_mask = 0;
};

// R102: what each reader accepts on an ack line. A peer: the phase's full
// identity and a terminal status, nothing else. The publisher: the identity
// and the tick of its latest request, with any status the AICPU wrote.
bool peer_accepts(const ArgsCaptureAck& ack, uint64_t run_epoch, uint64_t task_id, uint64_t phase_seq);
bool publisher_accepts(const ArgsCaptureAck& ack, uint64_t run_epoch, uint64_t task_id, uint64_t phase_seq,
                       uint64_t request_tick);

// One participant's view of the occupancy it is in.
struct Participant {
  uint32_t core = 0;
  uint32_t slot = 0;
  uint64_t bit = 0;
  uint64_t mask = 0;  // the task's active mask within its cluster
  uint64_t task_id = 0;
  uint64_t occupancy = 0;
  bool self_aborted = false;  // this core's abort CAS won, or it recorded a timeout
};

class CaptureRun {
 public:
  // `control`: the run's zeroed 18 KiB block; `lanes`: AICPU threads (one
  // dump lane each); `capture`: the run's selection and tables;
  // `supervisor`: the AICPU thread that retires the run, rung when a lane
  // goes idle.
  CaptureRun(ArgsCaptureControl* control, uint32_t cores, uint32_t lanes, ArgCapture& capture, uint64_t run_epoch,
             CaptureEnv& env, CaptureConfig config = {}, const CaptureHooks* hooks = nullptr, uint32_t supervisor = 0);

  static uint32_t lane_of(uint32_t core, uint32_t lanes) { return (core / 3) % lanes; }

  // ---- core threads ----
  // A gang (mix task, all 3 cores of `cluster`): claims or joins gate
  // 2 * cluster. A single: claims whichever of the cluster's two gates is
  // empty, waiting while both are busy. Non-OK: the run's fatal path (the
  // status is the run's error; nothing was released).
  Status enter_gang(Participant& p);
  Status enter_single(Participant& p, uint32_t cluster);
  // The phase's barrier: arrive, publish or follow, wait for the seal,
  // leave. OK: sealed and released (after AFTER the slot may be SETTLED).
  // Non-OK: aborted or fatal; the participant must not execute or complete.
  Status phase(Participant& p, CapturePhase ph, CaptureCoreState& cs);

  // ---- AICPU thread `lane` ----
  // One bounded service step: scans every core of the lane once, answers
  // each fresh request, copies at most max_bytes. True when it did anything.
  bool service(uint32_t lane);
  // True once an abort was acknowledged: the run's lane terminals stay unclosed.
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // A fatal exit happened on some core: the others leave their waits too.
  bool fatal() const { return fatal_.load(std::memory_order_acquire); }
  void set_fatal() { fatal_.store(true, std::memory_order_release); }
  // Requests still queued, a reservation open or an argument pending on
  // `lane` as of its last service step (any thread): a run retires only
  // once every lane reads idle (R117).
  bool lane_busy(uint32_t lane) const;
  ArgsCaptureControl& control() { return *control_; }

 private:
  struct CoreReq {  // AICPU memory, per core
    uint64_t seen_tick = 0;
    uint64_t observe_tick = 0;
    bool queued = false;
    bool fresh = false;
  };
  struct LaneState {              // AICPU memory, per lane: its queue and its one reservation
    std::vector<uint32_t> queue;  // cores in observe_tick order
    uint64_t observe_tick = 0;
    bool open = false;
    uint32_t owner = 0;
    uint64_t arg_index = 0;
    bool pending = false;  // a try_begin answered WouldBlock for `owner`'s argument: total counted it
    uint32_t pending_core = 0;
    uint64_t pending_order = 0;     // the record's capture sequence, kept across WouldBlock
    std::atomic<bool> busy{false};  // queue, reservation or pending argument: read by the retiring supervisor
  };

  // Slot word access (R94): each a single 64-bit atomic.
  std::atomic_ref<uint64_t> word(uint32_t slot, SlotWordId w) const;
  uint64_t load(uint32_t core, uint32_t slot, SlotWordId w) const;
  void store(uint32_t core, uint32_t slot, SlotWordId w, uint64_t v) const;
  bool cas(uint32_t core, uint32_t slot, SlotWordId w, uint64_t& expected, uint64_t desired) const;
  uint64_t fetch_or(uint32_t core, uint32_t slot, SlotWordId w, uint64_t bits) const;
  void point(CapturePoint p, uint32_t core, uint32_t slot, uint64_t w) const;
  // Line ops on request and ack lines and tensor extents, never on a slot (R94).
  void line_store(uint32_t actor, uint64_t& field, uint64_t v) const;
  void flush(uint32_t actor, const void* addr, uint64_t bytes) const;
  void invalidate(uint32_t actor, const void* addr, uint64_t bytes) const;

  bool try_claim(Participant& p, uint32_t slot);
  // Waits on the core's bell until ready() or `deadline`; false on the deadline.
  template <typename Ready>
  bool wait(uint32_t core, uint64_t deadline, Ready&& ready);
  void ring_cluster(uint32_t slot, uint32_t except);
  void publish_request(const Participant& p, CapturePhase ph, uint64_t seq, uint64_t arg, uint64_t cursor,
                       uint64_t tick);
  // R104: before `p.core` publishes again, every participant of the last
  // phase it published has released it (or its gate was claimed again,
  // which only a settled gate allows), so no peer still reading that seal
  // finds the line rewritten. Non-OK: the run is fatal.
  Status await_departure(const Participant& p, CaptureCoreState& cs, uint64_t deadline);
  // Answers `core`'s fresh request; false when it needs bytes and the step's
  // `budget` is spent (it stays fresh for the next step).
  bool answer(uint32_t lane, LaneState& L, uint32_t core, uint64_t& budget);
  void write_ack(uint32_t core, const ArgsCaptureRequest& r, AckStatus s, uint64_t arg, uint64_t cursor);
  void dequeue(LaneState& L, uint32_t core);

  ArgsCaptureControl* const control_;
  const uint32_t cores_;
  const uint32_t lanes_n_;
  ArgCapture& capture_;
  const uint64_t run_epoch_;
  CaptureEnv& env_;
  const CaptureConfig config_;
  const CaptureHooks* const hooks_;
  const uint32_t supervisor_;
  std::vector<CoreReq> req_state_;
  std::vector<LaneState> lanes_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> fatal_{false};
};

}  // namespace simpler::resident
