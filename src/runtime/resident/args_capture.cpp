#include "runtime/resident/args_capture.h"

#include <algorithm>

#include "base/clock.h"
#include "base/errors.h"

namespace simpler::resident {

namespace {
constexpr uint32_t kAicpuActor = UINT32_MAX;
// A park slice: a waiter re-checks the run's fatal flag at least this often,
// since a fatal exit on another core rings nobody in particular.
constexpr uint64_t kParkSliceNs = 1'000'000;
// copy_chunk copies at least one element: a budget below the widest
// element's size is spent, so a step never overshoots max_bytes.
constexpr uint64_t kMinChunk = 8;

SlotWordId arrived_of(CapturePhase ph) {
  return ph == CapturePhase::kBefore ? SlotWordId::kArrivedBefore : SlotWordId::kArrivedAfter;
}
SlotWordId released_of(CapturePhase ph) {
  return ph == CapturePhase::kBefore ? SlotWordId::kReleasedBefore : SlotWordId::kReleasedAfter;
}
SlotWordId publisher_of(CapturePhase ph) {
  return ph == CapturePhase::kBefore ? SlotWordId::kPublisherBefore : SlotWordId::kPublisherAfter;
}
const char* phase_name(CapturePhase ph) { return ph == CapturePhase::kBefore ? "BEFORE" : "AFTER"; }

// The request and ack lines are single-writer: fields are plain atomic
// stores, the last word a release store (the sim's barrier + dcci flush),
// and readers load the last word with acquire (the sim's invalidate).
std::atomic_ref<uint64_t> line_word(const uint64_t& w) { return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(w)); }
uint64_t lload(const uint64_t& w) { return line_word(w).load(std::memory_order_acquire); }
void lstore(uint64_t& w, uint64_t v) { line_word(w).store(v, std::memory_order_release); }
}  // namespace

CaptureRun::CaptureRun(ArgsCaptureControl* control, uint32_t cores, uint32_t lanes, ArgCapture& capture,
                       uint64_t run_epoch, CaptureEnv& env, CaptureConfig config, const CaptureHooks* hooks,
                       uint32_t supervisor)
    : control_(control),
      cores_(cores),
      lanes_n_(lanes),
      capture_(capture),
      run_epoch_(run_epoch),
      env_(env),
      config_(config),
      hooks_(hooks),
      supervisor_(supervisor),
      req_state_(cores),
      lanes_(lanes) {
  for (LaneState& L : lanes_) L.queue.reserve(cores);
}

// ---- slot words (R94): every access is one of these four ----

std::atomic_ref<uint64_t> CaptureRun::word(uint32_t slot, SlotWordId w) const {
  SlotWord* words = &control_->slots[slot].claim;
  return std::atomic_ref<uint64_t>(words[static_cast<int>(w)].v_);
}

uint64_t CaptureRun::load(uint32_t core, uint32_t slot, SlotWordId w) const {
  if (hooks_ != nullptr && hooks_->slot_access) hooks_->slot_access(core, slot, w, SlotOp::kLoad);
  return word(slot, w).load(std::memory_order_seq_cst);
}

void CaptureRun::store(uint32_t core, uint32_t slot, SlotWordId w, uint64_t v) const {
  if (hooks_ != nullptr && hooks_->slot_access) hooks_->slot_access(core, slot, w, SlotOp::kStore);
  word(slot, w).store(v, std::memory_order_seq_cst);
}

bool CaptureRun::cas(uint32_t core, uint32_t slot, SlotWordId w, uint64_t& expected, uint64_t desired) const {
  if (hooks_ != nullptr && hooks_->slot_access) hooks_->slot_access(core, slot, w, SlotOp::kCas);
  return word(slot, w).compare_exchange_strong(expected, desired, std::memory_order_seq_cst);
}

uint64_t CaptureRun::fetch_or(uint32_t core, uint32_t slot, SlotWordId w, uint64_t bits) const {
  if (hooks_ != nullptr && hooks_->slot_access) hooks_->slot_access(core, slot, w, SlotOp::kFetchOr);
  return word(slot, w).fetch_or(bits, std::memory_order_seq_cst);
}

void CaptureRun::point(CapturePoint p, uint32_t core, uint32_t slot, uint64_t w) const {
  if (hooks_ != nullptr && hooks_->point) hooks_->point(p, core, slot, w);
}

// ---- request and ack lines, tensor extents (R101, R106) ----

void CaptureRun::line_store(uint32_t actor, uint64_t& field, uint64_t v) const {
  if (hooks_ != nullptr && hooks_->line) hooks_->line(LineEvent::kStore, actor, &field, sizeof(field));
  lstore(field, v);
}

void CaptureRun::flush(uint32_t actor, const void* addr, uint64_t bytes) const {
  std::atomic_thread_fence(std::memory_order_release);
  if (hooks_ != nullptr && hooks_->line) hooks_->line(LineEvent::kFlush, actor, addr, bytes);
}

void CaptureRun::invalidate(uint32_t actor, const void* addr, uint64_t bytes) const {
  if (hooks_ != nullptr && hooks_->line) hooks_->line(LineEvent::kInvalidate, actor, addr, bytes);
  std::atomic_thread_fence(std::memory_order_acquire);
}

template <typename Ready>
bool CaptureRun::wait(uint32_t core, uint64_t deadline, Ready&& ready) {
  for (;;) {
    const uint64_t t = now_ns();
    if (t >= deadline) return ready();
    if (spin_then_park(env_.core_bell(core), ready, SpinPolicy{}, std::min(deadline, t + kParkSliceNs))) return true;
  }
}

void CaptureRun::ring_cluster(uint32_t slot, uint32_t except) {
  const uint32_t first = (slot / kCapturePendingSlots) * 3;
  for (uint32_t c = first; c < first + 3 && c < cores_; ++c) {
    if (c != except) env_.core_bell(c).ring();
  }
}

// ---- claim (R95-R98) ----

bool CaptureRun::try_claim(Participant& p, uint32_t slot) {
  uint64_t w = load(p.core, slot, SlotWordId::kClaim);  // M:claim_load
  const SlotState st = claim_state(w);
  // CLAIMING and READY are never source states (R96).
  if (st != SlotState::kFree && st != SlotState::kSettled) return false;
  const uint64_t n = claim_occupancy(w) + 1;
  if (!cas(p.core, slot, SlotWordId::kClaim, w, claim_word(SlotState::kClaiming, n))) return false;  // M:claim_cas
  point(CapturePoint::kClaimWon, p.core, slot, n);
  // Inside CLAIMING the claimer is the only writer (R97).
  for (SlotWordId id :
       {SlotWordId::kArrivedBefore, SlotWordId::kArrivedAfter, SlotWordId::kReleasedBefore, SlotWordId::kReleasedAfter,
        SlotWordId::kPublisherBefore, SlotWordId::kPublisherAfter, SlotWordId::kAborted}) {
    store(p.core, slot, id, 0);  // M:init_clear
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  store(p.core, slot, SlotWordId::kClaim, claim_word(SlotState::kReady, n));  // M:ready_store
  p.slot = slot;
  p.occupancy = n;
  ring_cluster(slot, p.core);
  return true;
}

Status CaptureRun::enter_gang(Participant& p) {
  const uint32_t slot = (p.core / 3) * kCapturePendingSlots;
  p.slot = slot;
  const uint64_t deadline = now_ns() + config_.first_budget_ns;
  for (;;) {
    if (try_claim(p, slot)) return Status();
    const uint64_t w = load(p.core, slot, SlotWordId::kClaim);  // M:claim_load
    const SlotState st = claim_state(w);
    if (st == SlotState::kClaiming || st == SlotState::kReady) {
      // This cluster's gang owns the gate: the occupancy in it is the one this core joins.
      p.occupancy = claim_occupancy(w);
      break;
    }
    // FREE or SETTLED again: a lost CAS raced a re-read; claim once more.
  }
  const uint64_t ready = claim_word(SlotState::kReady, p.occupancy);
  uint64_t seen = 0;
  const bool ok = wait(p.core, deadline, [&] {
    seen = load(p.core, slot, SlotWordId::kClaim);  // M:join_load
    return seen == ready || claim_state(seen) != SlotState::kClaiming || fatal();
  });
  if (seen == ready) return Status();
  set_fatal();
  if (!ok && claim_state(seen) == SlotState::kClaiming) {
    // M:init_lost: the payload is not safely writable; write nothing.
    return make_error(
        StatusCode::kDeadlineExceeded,
        "ARGS_CAPTURE_INIT_LOST: core {} waited {} ns for capture gate {} to leave CLAIMING (occupancy {})", p.core,
        config_.first_budget_ns, slot, p.occupancy);
  }
  if (fatal() && claim_occupancy(seen) == p.occupancy) {
    return make_error(StatusCode::kAborted, "ARGS_CAPTURE: core {} left gate {}: the run's capture failed", p.core,
                      slot);
  }
  // M:join_foreign
  return make_error(StatusCode::kInternal,
                    "ARGS_CAPTURE: core {} joined occupancy {} of gate {} but reads {:#x}: another occupancy; fatal",
                    p.core, p.occupancy, slot, seen);
}

Status CaptureRun::enter_single(Participant& p, uint32_t cluster) {
  const uint32_t first = cluster * kCapturePendingSlots;
  const uint64_t deadline = now_ns() + config_.second_budget_ns;
  bool claimed = false;
  const bool ok = wait(p.core, deadline, [&] {
    for (uint32_t k = 0; k < kCapturePendingSlots && !claimed; ++k) claimed = try_claim(p, first + k);
    return claimed || fatal();
  });
  if (claimed) return Status();
  set_fatal();
  if (!ok) {
    return make_error(StatusCode::kDeadlineExceeded,
                      "ARGS_CAPTURE_TIMEOUT: core {} found no free capture gate on cluster {} within {} ns", p.core,
                      cluster, config_.second_budget_ns);
  }
  return make_error(StatusCode::kAborted, "ARGS_CAPTURE: core {} did not claim a gate: the run's capture failed",
                    p.core);
}

// ---- the barrier (R99-R105, R113-R116) ----

// Identity first (phase_seq, written last by the AICPU, with acquire), then
// the rest: a status read after a matching identity is at least that ack's.
bool peer_accepts(const ArgsCaptureAck& ack, uint64_t run_epoch, uint64_t task_id, uint64_t phase_seq) {
  if (lload(ack.phase_seq) != phase_seq) return false;  // M:peer_read_identity
  if (lload(ack.run_epoch) != run_epoch || lload(ack.task_id) != task_id) return false;
  const auto s = static_cast<AckStatus>(lload(ack.status));  // M:peer_read_status
  return s == AckStatus::kSealed || s == AckStatus::kAborted;
}

bool publisher_accepts(const ArgsCaptureAck& ack, uint64_t run_epoch, uint64_t task_id, uint64_t phase_seq,
                       uint64_t request_tick) {
  if (lload(ack.phase_seq) != phase_seq) return false;  // M:pub_read_ack
  if (lload(ack.run_epoch) != run_epoch || lload(ack.task_id) != task_id) return false;
  if (lload(ack.request_tick) != request_tick) return false;
  return static_cast<AckStatus>(lload(ack.status)) != AckStatus::kNone;
}

void CaptureRun::publish_request(const Participant& p, CapturePhase ph, uint64_t seq, uint64_t arg, uint64_t cursor,
                                 uint64_t tick) {
  ArgsCaptureRequest& r = control_->requests[p.core];
  // M:req_fields
  line_store(p.core, r.run_epoch, run_epoch_);
  line_store(p.core, r.task_id, p.task_id);
  line_store(p.core, r.phase, static_cast<uint64_t>(ph));
  line_store(p.core, r.phase_seq, seq);
  line_store(p.core, r.arg_index, arg);
  line_store(p.core, r.arg_cursor, cursor);
  line_store(p.core, r.slot, p.slot);
  line_store(p.core, r.request_tick, tick);  // M:req_tick (last; release = barrier + flush)
  flush(p.core, &r, sizeof(r));
  env_.ring_aicpu(lane_of(p.core, lanes_n_));
}

Status CaptureRun::await_departure(const Participant& p, CaptureCoreState& cs, uint64_t deadline) {
  if (cs.published_mask == 0 || cs.published_run != run_epoch_) return Status();
  const uint32_t slot = cs.published_slot;
  // The claim word first: a gate claimed again has settled, and the claim
  // cleared its released words, which must not then read as "not left".
  const auto departed = [&] {  // M:reuse_wait
    if (claim_occupancy(load(p.core, slot, SlotWordId::kClaim)) != cs.published_occupancy) return true;
    return load(p.core, slot, released_of(cs.published_phase)) == cs.published_mask;
  };
  if (!departed()) {
    // Only an AFTER phase can still have a participant inside: each BEFORE
    // participant released before it arrived for AFTER. Its last release
    // settles the gate and rings this cluster.
    point(CapturePoint::kReuseWait, p.core, p.slot, slot);
    const bool left = wait(p.core, deadline, [&] { return departed() || fatal(); });
    if (!departed()) {
      set_fatal();
      if (!left) {
        return make_error(StatusCode::kDeadlineExceeded,
                          "ARGS_CAPTURE_TIMEOUT: core {} waited {} ns for the participants of its last {} seal "
                          "(gate {}, occupancy {}) to leave before reusing its ack line",
                          p.core, config_.second_budget_ns, phase_name(cs.published_phase), slot,
                          cs.published_occupancy);
      }
      return make_error(StatusCode::kAborted,
                        "ARGS_CAPTURE: core {} did not publish for task {}: the run's capture failed", p.core,
                        p.task_id);
    }
  }
  cs.published_mask = 0;
  return Status();
}

Status CaptureRun::phase(Participant& p, CapturePhase ph, CaptureCoreState& cs) {
  const uint32_t slot = p.slot;
  // R106: the output spans this core wrote are published before it arrives
  // (the pipe barrier alone is not publication); the AICPU invalidates.
  if (ph == CapturePhase::kAfter) {
    std::atomic_thread_fence(std::memory_order_release);
    if (hooks_ != nullptr && hooks_->line) hooks_->line(LineEvent::kFlushOutputs, p.core, nullptr, p.task_id);
  }
  const uint64_t prev = fetch_or(p.core, slot, arrived_of(ph), p.bit);  // M:arrive_fetch_or
  point(CapturePoint::kArrived, p.core, slot, static_cast<uint64_t>(ph));
  const bool publisher = (prev | p.bit) == p.mask;
  const uint64_t t0 = now_ns();
  const uint64_t first_deadline = t0 + config_.first_budget_ns;
  const uint64_t second_deadline = t0 + config_.second_budget_ns;
  const auto site = static_cast<uint64_t>(ph == CapturePhase::kBefore ? AbortSite::kBefore : AbortSite::kAfter);

  uint32_t ack_core = p.core;
  uint64_t seq = 0;
  uint64_t tick = 0;
  uint64_t arg = 0;
  uint64_t cursor = 0;
  if (publisher) {
    SIMPLER_RETURN_IF_ERROR(await_departure(p, cs, second_deadline));
    seq = ++cs.phase_seq;  // the phase's one identity, never advanced again
    tick = ++cs.request_tick;
    cs.published_run = run_epoch_;
    cs.published_slot = slot;
    cs.published_occupancy = p.occupancy;
    cs.published_phase = ph;
    cs.published_mask = p.mask;
    publish_request(p, ph, seq, arg, cursor, tick);
    store(p.core, slot, publisher_of(ph), (uint64_t{p.core} + 1) << 32 | seq);  // M:publisher_store
    point(CapturePoint::kPublished, p.core, slot, seq);
    ring_cluster(slot, p.core);
  } else {
    uint64_t pub = 0;
    wait(p.core, second_deadline, [&] {
      pub = load(p.core, slot, publisher_of(ph));  // M:follow_publisher
      return pub != 0 || fatal();
    });
    if (pub == 0) {
      // M:second_budget: no request exists, so nothing can be sealed or acknowledged.
      set_fatal();
      return make_error(StatusCode::kDeadlineExceeded,
                        "ARGS_CAPTURE_TIMEOUT: core {} saw no {} publisher on gate {} (occupancy {}) for task {}",
                        p.core, phase_name(ph), slot, p.occupancy, p.task_id);
    }
    ack_core = static_cast<uint32_t>(pub >> 32) - 1;
    seq = pub & 0xffffffffu;
  }

  const ArgsCaptureAck& ack = control_->acks[ack_core];
  AckStatus accepted = AckStatus::kNone;
  Status timeout;
  for (;;) {
    // Accept: identity first, then (publisher) the tick, then the status.
    const auto matches = [&] {
      invalidate(p.core, &ack, sizeof(ack));
      return publisher ? publisher_accepts(ack, run_epoch_, p.task_id, seq, tick)
                       : peer_accepts(ack, run_epoch_, p.task_id, seq);
    };
    const uint64_t deadline = timeout.ok() ? first_deadline : second_deadline;
    // Never left on the run's fatal flag alone: the AICPU may be copying this
    // phase's bytes until it acknowledges (R115, R117).
    if (!wait(p.core, deadline, matches)) {
      if (timeout.ok()) {
        // R113: the first waiter to time out publishes the abort and keeps polling.
        uint64_t expected = 0;
        const uint64_t value = 1 | site << 8;
        if (cas(p.core, slot, SlotWordId::kAborted, expected, value)) {  // M:abort_cas
          point(CapturePoint::kAbortCas, p.core, slot, value);
        }
        env_.ring_aicpu(lane_of(ack_core, lanes_n_));
        p.self_aborted = true;
        timeout = make_error(StatusCode::kDeadlineExceeded,
                             "ARGS_CAPTURE_TIMEOUT: core {} waited {} ns for the {} seal of task {} (gate {}, "
                             "occupancy {}, phase_seq {})",
                             p.core, config_.first_budget_ns, phase_name(ph), p.task_id, slot, p.occupancy, seq);
        continue;
      }
      set_fatal();
      return timeout;  // no ack within the second budget: fatal, nothing released
    }
    const auto s = static_cast<AckStatus>(lload(ack.status));
    if (s == AckStatus::kSealed || s == AckStatus::kAborted) {
      accepted = s;
      break;
    }
    // Only the publisher gets here: progress or WouldBlock for its latest tick.
    if (s == AckStatus::kInProgress) {
      arg = lload(ack.arg_index);
      cursor = lload(ack.arg_cursor);
      if (cursor == kCursorDone) {
        ++arg;
        cursor = 0;
      }
    }
    tick = ++cs.request_tick;  // a new request, the same phase_seq
    publish_request(p, ph, seq, arg, cursor, tick);
  }
  point(CapturePoint::kSealAccepted, p.core, slot, static_cast<uint64_t>(accepted));

  if (accepted == AckStatus::kAborted || p.self_aborted) {
    // R115: no release bit, so the slot never settles; the run's shutdown path.
    set_fatal();
    if (!timeout.ok()) return timeout;
    return make_error(StatusCode::kAborted,
                      "ARGS_CAPTURE: the {} capture of task {} was aborted (gate {}, occupancy {}, phase_seq {})",
                      phase_name(ph), p.task_id, slot, p.occupancy, seq);
  }
  const uint64_t before = fetch_or(p.core, slot, released_of(ph), p.bit);  // M:release_fetch_or
  point(CapturePoint::kReleased, p.core, slot, static_cast<uint64_t>(ph));
  if (ph == CapturePhase::kAfter && (before | p.bit) == p.mask) {
    store(p.core, slot, SlotWordId::kClaim, claim_word(SlotState::kSettled, p.occupancy));  // M:settle_store
    point(CapturePoint::kSettled, p.core, slot, p.occupancy);
    ring_cluster(slot, p.core);
  }
  return Status();
}

// ---- the AICPU supervisor's service step (R107-R112, R114) ----

bool CaptureRun::lane_busy(uint32_t lane) const { return lanes_[lane].busy.load(std::memory_order_acquire); }

bool CaptureRun::service(uint32_t lane) {
  if (hooks_ != nullptr && hooks_->serve && !hooks_->serve(lane)) return false;
  LaneState& L = lanes_[lane];
  bool progress = false;
  // One scan of every core of the lane; a request is stamped on first observation (R111).
  for (uint32_t c = 0; c < cores_; ++c) {
    if (lane_of(c, lanes_n_) != lane) continue;
    CoreReq& q = req_state_[c];
    invalidate(kAicpuActor, &control_->requests[c], sizeof(ArgsCaptureRequest));
    const uint64_t tick = lload(control_->requests[c].request_tick);  // M:svc_observe
    if (tick == q.seen_tick) continue;
    q.seen_tick = tick;
    q.fresh = true;
    progress = true;
    if (!q.queued) {
      q.queued = true;
      q.observe_tick = ++L.observe_tick;
      L.queue.push_back(c);
      if (hooks_ != nullptr && hooks_->observed) hooks_->observed(lane, c, q.observe_tick);
    }
  }
  // Answer the fresh requests in observation order. The step's copy budget
  // is max_bytes in all: a request that would copy once it is spent stays
  // fresh for the next step (R110).
  uint64_t budget = config_.max_bytes;
  for (size_t i = 0; i < L.queue.size();) {
    const uint32_t c = L.queue[i];
    if (!req_state_[c].fresh) {
      ++i;
      continue;
    }
    const size_t before = L.queue.size();
    if (answer(lane, L, c, budget)) req_state_[c].fresh = false;
    if (L.queue.size() == before) ++i;
  }
  const bool busy = !L.queue.empty() || L.open || L.pending;
  if (L.busy.exchange(busy, std::memory_order_acq_rel) && !busy) env_.ring_aicpu(supervisor_);
  return progress;
}

void CaptureRun::dequeue(LaneState& L, uint32_t core) {
  L.queue.erase(std::find(L.queue.begin(), L.queue.end(), core));
  req_state_[core].queued = false;
}

void CaptureRun::write_ack(uint32_t core, const ArgsCaptureRequest& r, AckStatus s, uint64_t arg, uint64_t cursor) {
  ArgsCaptureAck& a = control_->acks[core];
  // Before the stores, so an observer's log shows the ack ahead of its acceptance.
  point(CapturePoint::kServed, core, static_cast<uint32_t>(lload(r.slot)), static_cast<uint64_t>(s));
  line_store(kAicpuActor, a.status, static_cast<uint64_t>(s));  // M:ack_progress
  line_store(kAicpuActor, a.arg_index, arg);
  line_store(kAicpuActor, a.arg_cursor, cursor);
  line_store(kAicpuActor, a.request_tick, lload(r.request_tick));
  line_store(kAicpuActor, a.run_epoch, lload(r.run_epoch));  // M:ack_identity (last: epoch, task, then phase_seq)
  line_store(kAicpuActor, a.task_id, lload(r.task_id));
  line_store(kAicpuActor, a.phase_seq, lload(r.phase_seq));
  flush(kAicpuActor, &a, sizeof(a));
  ring_cluster(static_cast<uint32_t>(lload(r.slot)), UINT32_MAX);
}

bool CaptureRun::answer(uint32_t lane, LaneState& L, uint32_t core, uint64_t& budget) {
  const ArgsCaptureRequest& r = control_->requests[core];
  const uint64_t tick = lload(r.request_tick);  // M:svc_observe: the tick, then the fields
  const uint64_t task = lload(r.task_id);
  const auto ph = static_cast<CapturePhase>(lload(r.phase));
  const uint64_t arg = lload(r.arg_index);
  const auto slot = static_cast<uint32_t>(lload(r.slot));
  (void)tick;
  DumpLane& dl = capture_.collector().lane(lane);
  const bool owner = L.open && L.owner == core;

  if (load(kAicpuActor, slot, SlotWordId::kAborted) != 0) {  // M:svc_abort
    // The chunk in flight finished inside the previous step: never abandoned mid-copy (R114).
    if (owner) {
      dl.abandon();
      L.open = false;
    } else if (L.pending && L.pending_core == core) {
      dl.withdraw_pending();  // a would-block never was a record (R109)
    }
    if (L.pending && L.pending_core == core) L.pending = false;
    dl.mark_unsettled();
    aborted_.store(true, std::memory_order_release);
    write_ack(core, r, AckStatus::kAborted, arg, lload(r.arg_cursor));
    dequeue(L, core);
    return true;
  }
  const DumpStage stage = ph == CapturePhase::kBefore ? DumpStage::kBefore : DumpStage::kAfter;
  if (!owner) {
    DumpRecord rec;
    DumpSource src;
    bool bytes = false;
    if (!capture_.stage_arg(task, stage, arg, rec, src, bytes)) {
      write_ack(core, r, AckStatus::kSealed, arg, 0);  // every wanted argument committed
      dequeue(L, core);
      return true;
    }
    // The lane's one reservation is another core's, or an earlier-observed
    // request waits for it: WouldBlock, nothing reserved or accounted (R108, R111).
    if (L.open || L.queue.front() != core || (L.pending && L.pending_core != core)) {
      write_ack(core, r, AckStatus::kWouldBlock, arg, 0);
      return true;
    }
    if (budget < kMinChunk) return false;
    if (!L.pending) L.pending_order = capture_.collector().next_order();
    rec.order = L.pending_order;
    if (dl.try_begin(rec, bytes ? &src : nullptr) == DumpStep::kWouldBlock) {  // R112: never spins
      L.pending = true;
      L.pending_core = core;
      write_ack(core, r, AckStatus::kWouldBlock, arg, 0);
      return true;
    }
    // R106: the tensor extent is read fresh, after its writers' flushes.
    if (bytes) {
      const TensorView& v = src.view;
      int64_t last = 0;  // the view's last element, relative to its first
      for (int d = 0; d < v.ndim(); ++d) last += (v.shape(d) - 1) * v.stride(d);
      const uint64_t esize = dtype_size(v.dtype());
      invalidate(kAicpuActor, src.base + static_cast<uint64_t>(v.offset()) * esize,
                 static_cast<uint64_t>(last + 1) * esize);
    }
    L.pending = false;
    L.open = true;
    L.owner = core;
    L.arg_index = arg;
  }
  if (budget < kMinChunk) return false;
  // M:svc_copy_chunk: one chunk, within the step's budget (R110).
  const uint64_t copied = dl.open_copied();
  const DumpStep step = dl.copy_chunk(budget);
  budget -= std::min(budget, dl.open_copied() - copied);
  if (step == DumpStep::kInProgress) {
    write_ack(core, r, AckStatus::kInProgress, arg, dl.open_copied());
    return true;
  }
  dl.commit();
  L.open = false;
  // Each argument is its own turn: the publisher's next request is stamped
  // anew, behind anything observed meanwhile (the seed's step 4).
  dequeue(L, core);
  DumpRecord next;
  DumpSource src;
  bool bytes = false;
  const bool more = capture_.stage_arg(task, stage, arg + 1, next, src, bytes);
  write_ack(core, r, more ? AckStatus::kInProgress : AckStatus::kSealed, arg, kCursorDone);
  return true;
}

}  // namespace simpler::resident
