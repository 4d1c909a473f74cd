#include "node/scheduler.h"

#include <algorithm>

#include "base/errors.h"
#include "base/fault_hooks.h"

namespace simpler {

namespace {
// How long the idle thread parks before it polls again for what only a poll
// notices (a child that died without ringing, a run past its deadline).
constexpr uint64_t kTickNs = 10'000'000;

RunResourceArena make_arena(uint32_t sets) {
  auto a = RunResourceArena::create(std::max<uint32_t>(sets, 1));
  return std::move(a).value();  // refuses only 0, excluded above
}

// Set while this thread is inside a round of any Scheduler: a terminal
// callback that waits for a run must not step a round from within one.
thread_local bool t_in_round = false;

class InRound {
 public:
  InRound() : outer_(t_in_round) { t_in_round = true; }
  ~InRound() { t_in_round = outer_; }
  InRound(const InRound&) = delete;
  InRound& operator=(const InRound&) = delete;

 private:
  const bool outer_;
};
}  // namespace

class Scheduler::Gate final : public detail::RunDriver {
 public:
  explicit Gate(Scheduler& s) : s_(s) {}

  std::optional<bool> wait(const detail::RunState& run, uint64_t deadline_ns) override {
    if (t_in_round) return std::nullopt;
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (closed_.load(std::memory_order_seq_cst)) {
      leave();
      return std::nullopt;
    }
    // Only a run alone in the Scheduler is carried: with others in flight
    // their hand-offs overlap anyway, and the own thread's rounds beside
    // this thread's orchestrations move more runs per second than this
    // thread doing both. The own thread must not stand by for this waiter.
    if (s_.live_.load(std::memory_order_seq_cst) > 1) {
      leave();
      if (s_.standby_.load(std::memory_order_seq_cst)) s_.takeover_.ring();
      return std::nullopt;
    }
    s_.waiters_.fetch_add(1, std::memory_order_seq_cst);
    bool closing = false;
    // A round only when one may move something: the bell rang (every child
    // and enqueue() ring it), another thread stepped a round (which may have
    // left work), or the last one moved or could not be had. With many
    // tasks in flight a round costs a look at each.
    uint32_t seen_seq = 0;
    uint64_t seen_rounds = 0;
    bool again = true;
    // A run with a task on a port that needs polling (a remote node): this
    // thread receives for that port while it spins, so the answer reaches
    // the run without a hand-off from the port's own thread, and spins even
    // on one CPU, since nothing in this process produces that answer. It
    // hands the receiving back before it parks.
    SpinPolicy policy = run.spin;
    policy.polled_producers = &s_.polled_inflight_;
    bool received = false, handed_back = false;
    // Parked on the Scheduler's bell, the waiter wakes for every event a
    // round handles (retire() rings it for a run another thread ended), so
    // it stays the driver while parked: no hand-off to the own thread.
    const bool in_time = spin_then_park(
        *s_.bell_,
        [&] {
          if (run.is_done()) return true;
          if (closed_.load(std::memory_order_acquire)) return closing = true;
          if (!handed_back && s_.polled_inflight_.load(std::memory_order_acquire) != 0) {
            for (EndpointPort* p : s_.polled_ports_) p->receive_standing_in();
            received = true;
          }
          const uint32_t seq = s_.bell_->arm();
          const bool round = again || seq != seen_seq || s_.rounds() != seen_rounds;
          const std::optional<bool> moved = s_.drive_waiting(round, &seen_rounds);
          if (round) {
            seen_seq = seq;
            again = moved.value_or(true);
          }
          return run.is_done();
        },
        policy, deadline_ns,
        [&] {
          handed_back = true;
          if (received) {
            for (EndpointPort* p : s_.polled_ports_) p->stop_standing_in();
          }
        });
    s_.waiters_.fetch_sub(1, std::memory_order_seq_cst);
    leave();
    if (closing && !run.is_done()) return std::nullopt;
    return in_time;
  }

  void poll(const detail::RunState& run) override {
    if (t_in_round || run.is_done()) return;
    inside_.fetch_add(1, std::memory_order_seq_cst);
    // Not a driver: a thread that polls now and then must not keep the own
    // thread standing by between its polls.
    if (!closed_.load(std::memory_order_seq_cst)) (void)s_.step_if_free();
    leave();
  }

  // Refuses waiters from now on and returns once those inside have left:
  // after it, nothing reaches the Scheduler through a handle. Idempotent.
  void close() {
    if (closed_.exchange(true, std::memory_order_seq_cst)) return;
    s_.bell_->ring();  // a parked waiter looks again and sees it
    spin_then_park(
        left_, [&] { return inside_.load(std::memory_order_seq_cst) == 0; }, SpinPolicy{});
  }

 private:
  void leave() {
    if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1 && closed_.load(std::memory_order_seq_cst)) left_.ring();
  }

  Scheduler& s_;
  std::atomic<uint32_t> inside_{0};
  std::atomic<bool> closed_{false};
  Doorbell left_;
};

Scheduler::Scheduler(std::vector<EndpointPort*> chips, std::vector<EndpointPort*> subs, Doorbell* bell, Hooks hooks,
                     uint32_t run_sets, uint64_t driver_grace_ns)
    : chip_lanes_(chips.size()),
      sub_lanes_(subs.size()),
      bell_(bell),
      hooks_(std::move(hooks)),
      run_resources_(make_arena(run_sets)),
      driver_grace_ns_(driver_grace_ns),
      gate_(std::make_shared<Gate>(*this)) {
  for (size_t i = 0; i < chips.size(); ++i) chip_lanes_[i].start(chips[i], &polled_inflight_);
  for (size_t i = 0; i < subs.size(); ++i) sub_lanes_[i].start(subs[i], &polled_inflight_);
  for (EndpointPort* p : chips) {
    if (p->needs_polling()) polled_ports_.push_back(p);
  }
  for (EndpointPort* p : subs) {
    if (p->needs_polling()) polled_ports_.push_back(p);
  }
  uint64_t entries = 0;
  for (auto* p : chips) entries += p->max_inflight_tasks();
  for (auto* p : subs) entries += p->max_inflight_tasks();
  events_.reserve(2 * entries + 16);
}

Scheduler::~Scheduler() {
  if (thread_.joinable()) stop(now_ns());
  gate_->close();
}

bool Scheduler::enqueue(std::unique_ptr<NodeRun>&& run) {
  live_.fetch_add(1, std::memory_order_seq_cst);
  try {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(run));  // strong guarantee: a throw leaves `run` as it was
  } catch (const std::bad_alloc&) {
    live_.fetch_sub(1, std::memory_order_seq_cst);
    return false;
  }
  bell_->ring();
  // The own thread stands by for a waiter who may not come (the caller may
  // go on with other work): the caller admits and publishes the run itself.
  // Had the own thread not stood by yet, it finds no driver and steps.
  if (standby_.load(std::memory_order_seq_cst) && !t_in_round) (void)step_if_free();
  return true;
}

void Scheduler::start() {
  thread_ = std::thread([this] { main(); });
}

void Scheduler::stop(uint64_t deadline_ns) {
  stop_deadline_ns_.store(deadline_ns);
  stop_requested_.store(true);
  release_driver();
  bell_->ring();
  if (thread_.joinable()) thread_.join();
  gate_->close();
}

bool Scheduler::drive() {
  const uint64_t t = now_ns();
  driver_ns_.store(t, std::memory_order_relaxed);
  const bool arriving = !driver_attached_.load(std::memory_order_relaxed);
  if (arriving) driver_attached_.store(true, std::memory_order_release);
  // Without a ring, a tick, or another thread's round since its last one
  // (which may have left work for the next round), nothing can have moved.
  const uint32_t seq = bell_->arm();
  if (!arriving && !driver_again_ && seq == driver_seq_ && rounds() == driver_saw_rounds_ &&
      t - driver_step_ns_ < kTickNs) {
    return false;
  }
  // Held by the own thread only while it finishes a round it began before
  // the driver came: try again on the next call.
  std::unique_lock<std::mutex> role(role_mu_, std::try_to_lock);
  if (!role.owns_lock()) {
    driver_again_ = true;
    return false;
  }
  driver_seq_ = seq;
  driver_step_ns_ = t;
  driver_again_ = step();
  driver_saw_rounds_ = rounds();
  return driver_again_;
}

std::shared_ptr<detail::RunDriver> Scheduler::waiter_driver() const { return gate_; }

std::optional<bool> Scheduler::drive_waiting(bool round, uint64_t* rounds_after) noexcept {
  driver_ns_.store(now_ns(), std::memory_order_relaxed);
  if (!round) return false;
  return step_if_free(rounds_after);
}

std::optional<bool> Scheduler::step_if_free(uint64_t* rounds_after) noexcept {
  std::unique_lock<std::mutex> role(role_mu_, std::try_to_lock);
  if (!role.owns_lock()) return std::nullopt;
  // The round is the Scheduler's, whichever thread steps it: what it
  // allocates is not its caller's, and a throw out of it ends the process
  // (noexcept) as it would on the own thread, rather than reach the caller
  // with the round half done.
  [[maybe_unused]] const hooks::AllocFaultPause scheduler_allocations{};
  const bool moved = step();
  // Read while no other round can begin: this one's count, not a later one's.
  if (rounds_after != nullptr) *rounds_after = rounds();
  return moved;
}

void Scheduler::release_driver() {
  driver_attached_.store(false, std::memory_order_release);
  takeover_.ring();
}

void Scheduler::stand_by() {
  standby_.store(true, std::memory_order_seq_cst);
  for (;;) {
    const uint32_t armed = takeover_.arm();
    if (stop_requested_.load()) break;
    const uint64_t since = driver_ns_.load(std::memory_order_relaxed);
    if (!driven()) break;
    takeover_.park(armed, since + driver_grace_ns_);
  }
  standby_.store(false, std::memory_order_seq_cst);
}

bool Scheduler::idle() {
  if (!runs_.empty()) return false;
  std::lock_guard<std::mutex> lock(inbox_mu_);
  return inbox_.empty();
}

void Scheduler::main() {
  for (;;) {
    stand_by();
    uint32_t armed = 0;
    bool progressed = false;
    {
      std::lock_guard<std::mutex> role(role_mu_);
      own_rounds_.fetch_add(1, std::memory_order_relaxed);
      armed = bell_->arm();
      progressed = step();
      if (stop_requested_.load()) {
        if (idle()) return;
        if (!aborted_ && now_ns() >= stop_deadline_ns_.load()) {
          aborted_ = true;
          const Status cause = make_error(StatusCode::kAborted, "the worker closed before this task finished");
          for (WorkerLane& l : chip_lanes_) l.port().poison(cause);
          for (WorkerLane& l : sub_lanes_) l.port().poison(cause);
          continue;
        }
      }
    }
    if (progressed) continue;
    uint64_t wake = now_ns() + kTickNs;
    if (stop_requested_.load() && !aborted_) wake = std::min(wake, stop_deadline_ns_.load());
    // A driver that arrives while this thread spins ends the spin: it stands by.
    spin_then_park(
        *bell_, [&] { return bell_->arm() != armed || driven(); }, kNodeSpin, wake);
  }
}

bool Scheduler::step() {
  [[maybe_unused]] const InRound in_round{};
  rounds_.fetch_add(1, std::memory_order_acq_rel);
  bool progressed = false;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    incoming_.swap(inbox_);
  }
  for (auto& run : incoming_) {
    admit(std::move(run));
    progressed = true;
  }
  incoming_.clear();
  progressed |= retire_finished();
  events_.clear();
  for (WorkerLane& l : chip_lanes_) l.progress(events_);
  for (WorkerLane& l : sub_lanes_) l.progress(events_);
  progressed |= handle_events();
  progressed |= dispatch_ready();  // active first: a READY task takes a frame before any successor is staged
  progressed |= stage_preparable();
  progressed |= retire_finished();
  return progressed;
}

void Scheduler::admit(std::unique_ptr<NodeRun> run) {
  NodeRun* r = run.get();
  runs_.emplace(r->id, std::move(run));
  r->remaining = static_cast<uint32_t>(r->tasks.size());
  if (auto lease = run_resources_.try_acquire()) {
    r->lease = *lease;
  } else {
    // Admission keeps live runs within the sets; reaching here is its defect.
    r->first_error = internal_error("run {} admitted with all {} node run sets live", r->id, run_resources_.grant());
    for (auto& t : r->tasks) {
      t->state = NodeTask::State::kDone;
    }
    r->remaining = 0;
    retiring_.push_back(r);
    return;
  }
  if (r->tasks.empty()) {
    retiring_.push_back(r);
    return;
  }
  for (auto& t : r->tasks) {
    wire(t.get());
    if (t->fanin == 0) {
      t->state = NodeTask::State::kReady;
      ready_.push_back(t.get());
    }
  }
}

namespace {
// Whether the write `w` touches every byte the access `a` (of the same
// buffer) may touch: w is dense row-major and a's byte span lies inside
// w's. Then any later access that overlaps a overlaps w as well.
bool covers(const TensorView& w, const TensorView& a) {
  if (w.numel() == 0 || a.first_byte() < w.first_byte() || a.end_byte() > w.end_byte()) return false;
  int64_t dense = 1;
  for (int d = w.ndim() - 1; d >= 0; --d) {
    if (w.shape(d) != 1 && w.stride(d) != dense) return false;
    dense *= w.shape(d);
  }
  return true;
}
}  // namespace

void Scheduler::wire(NodeTask* t) {
  for_each_arg(t, [&](const TaskArg& a) {
    if (a.kind != TaskArg::Kind::Tensor || a.tag == Tag::NoDep) return;
    auto it = accesses_.find(a.tensor.buffer().addr);
    if (it == accesses_.end()) return;
    const bool writes = tag_writes(a.tag);
    std::vector<Access>& prior_accesses = it->second;
    size_t keep = 0;
    for (const Access& prior : prior_accesses) {
      // Two reads never order. All of t's edges are added while t is wired,
      // so a repeat from the same predecessor is always its last successor.
      if ((writes || tag_writes(prior.tag)) && prior.view.overlaps(a.tensor) &&
          (prior.task->successors.empty() || prior.task->successors.back().task != t)) {
        prior.task->successors.push_back(SuccessorEdge{t, static_cast<uint32_t>(t->predecessors.size())});
        t->predecessors.push_back(prior.task);
        ++t->fanin;
      }
      // A write that covers an earlier access stands for it from now on: it
      // is ordered after it, and whatever would conflict with it conflicts
      // with the write. So a chain of writes keeps one access, not all.
      if (!(writes && covers(a.tensor, prior.view))) prior_accesses[keep++] = prior;
    }
    prior_accesses.resize(keep);
  });
  add_accesses(t);
}

void Scheduler::add_accesses(NodeTask* t) {
  for_each_arg(t, [&](const TaskArg& a) {
    if (a.kind == TaskArg::Kind::Tensor && a.tag != Tag::NoDep) {
      accesses_[a.tensor.buffer().addr].push_back(Access{t, a.tensor, a.tag});
    }
  });
}

void Scheduler::forget_accesses(NodeTask* t) {
  for_each_arg(t, [&](const TaskArg& a) {
    if (a.kind != TaskArg::Kind::Tensor || a.tag == Tag::NoDep) return;
    auto it = accesses_.find(a.tensor.buffer().addr);
    if (it == accesses_.end()) return;
    std::vector<Access>& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Access& x) { return x.task == t; }), list.end());
    if (list.empty()) accesses_.erase(it);
  });
}

bool Scheduler::dispatch_ready() {
  bool progressed = false;
  const size_t n = ready_.size();
  for (size_t k = 0; k < n && !ready_.empty(); ++k) {
    NodeTask* t = ready_.front();
    ready_.pop_front();
    if (!t->members.empty()) {
      progressed |= dispatch_group(t);
      continue;
    }
    WorkerLane* lane = nullptr;
    Status gone;
    if (!t->sub) {
      WorkerLane& l = chip_lanes_[t->worker];
      if (auto f = l.port().failure()) {
        gone = make_error(StatusCode::kAborted, "chip worker {} is gone: {}", t->worker, f->to_string());
      } else if (l.can_dispatch()) {
        lane = &l;
      }
    } else {
      bool alive = false;
      for (size_t j = 0; j < sub_lanes_.size() && lane == nullptr; ++j) {
        const uint32_t s = static_cast<uint32_t>((next_sub_ + j) % sub_lanes_.size());
        if (sub_lanes_[s].port().failure()) continue;
        alive = true;
        if (sub_lanes_[s].can_dispatch()) {
          lane = &sub_lanes_[s];
          t->worker = s;
          next_sub_ = (s + 1) % sub_lanes_.size();
        }
      }
      if (!alive) {
        const std::optional<Status> f = sub_lanes_.empty() ? std::nullopt : sub_lanes_[0].port().failure();
        gone = make_error(StatusCode::kAborted, "no sub worker is left to run this task{}",
                          f ? fmt::format(" (sub worker 0 is gone: {})", f->to_string()) : "");
      }
    }
    if (!gone.ok()) {
      t->state = NodeTask::State::kRunning;
      finish(t, gone);
      progressed = true;
      continue;
    }
    if (lane == nullptr) {
      ready_.push_back(t);  // stays READY: nothing is claimed without a lane and a frame (R33)
      continue;
    }
    t->state = NodeTask::State::kRunning;  // claimed: the gate just said yes on this thread
    dispatch_claimed(t, *lane);
    progressed = true;
  }
  return progressed;
}

bool Scheduler::preparable(const NodeTask* t) {
  if (t->sub || !t->members.empty() || t->state != NodeTask::State::kPending || !t->poison.ok()) return false;
  for (const NodeTask* p : t->predecessors) {
    if (p == nullptr) continue;  // finished
    // Published on the same chip: its publication precedes the successor's
    // in that endpoint's order (#2577), and its terminal activates it.
    if (p->state != NodeTask::State::kRunning || p->sub || !p->members.empty() || p->worker != t->worker) return false;
  }
  return true;
}

bool Scheduler::dispatch_group(NodeTask* t) {
  const size_t n = t->members.size();
  // Every member's gate is asked before any member is published; the
  // workers are distinct, so each "yes" holds until its publication (R34).
  Status gone;
  bool all = true;
  if (!t->sub) {
    for (const GroupMember& m : t->members) {
      WorkerLane& l = chip_lanes_[m.worker];
      if (auto f = l.port().failure()) {
        gone = make_error(StatusCode::kAborted, "chip worker {} is gone: {}", m.worker, f->to_string());
        break;
      }
      all = all && l.can_dispatch();
    }
  } else {
    size_t live = 0, taken = 0;
    for (size_t j = 0; j < sub_lanes_.size(); ++j) {
      const uint32_t s = static_cast<uint32_t>((next_sub_ + j) % sub_lanes_.size());
      if (sub_lanes_[s].port().failure()) continue;
      ++live;
      if (taken < n && sub_lanes_[s].can_dispatch()) t->members[taken++].worker = s;
    }
    if (live < n) {
      gone = make_error(StatusCode::kAborted, "a group of {} needs {} sub workers; {} are left", n, n, live);
    }
    all = taken == n;
  }
  if (!gone.ok()) {
    t->state = NodeTask::State::kRunning;
    finish(t, gone);
    return true;
  }
  if (!all) {
    ready_.push_back(t);  // stays READY: no member is claimed until every one can be
    return false;
  }
  if (t->sub) next_sub_ = static_cast<uint32_t>((t->members.back().worker + 1) % sub_lanes_.size());
  t->state = NodeTask::State::kRunning;
  t->members_left = static_cast<uint32_t>(n);
  for (size_t k = 0; k < n; ++k) {
    GroupMember& m = t->members[k];
    WorkerLane& lane = t->sub ? sub_lanes_[m.worker] : chip_lanes_[m.worker];
    running_[m.id] = t;
    PublishSpec spec;
    spec.run_id = t->run->id;
    spec.dispatch_id = m.id;
    spec.task_slot = t->index;
    spec.callable = t->callable;
    spec.config = m.config;
    spec.args_blob = m.blob;
    const bool traced = t->run->call.swimlane_level > 0;
    if (traced) m.times.publish_ns = now_ns();
    Status failed = t->sub ? Status() : check_registration(m.worker, m.registration);
    if (failed.ok()) failed = lane.submit_dispatch(spec);
    if (traced) m.times.published_ns = now_ns();
    if (!failed.ok()) {
      // Its siblings may already be out: they run on, and the group ends
      // with this failure once every member has.
      running_.erase(m.id);
      member_done(t, Status(failed.code(), fmt::format("group member {}: {}", k, failed.message())));
      continue;
    }
    ++publications_;
    if (t->run->first_publish_ns == 0) t->run->first_publish_ns = now_ns();
  }
  return true;
}

void Scheduler::member_done(NodeTask* t, const Status& st) {
  if (!st.ok() && t->group_status.ok()) t->group_status = st;
  if (--t->members_left != 0) return;
  if (t->group_status.ok()) ++t->run->executed;
  finish(t, t->group_status);
}

bool Scheduler::stage_preparable() {
  bool progressed = false;
  size_t keep = 0;
  for (size_t k = 0; k < preparable_.size(); ++k) {
    NodeTask* t = preparable_[k];
    if (!preparable(t)) continue;  // re-offered when its next predecessor is published
    WorkerLane& lane = chip_lanes_[t->worker];
    // R40's order: the lane and transport gate, then the single staged slot,
    // then the ownership guard. A refusal of either gate keeps the task for a
    // later round; a run that no longer owns its set is never staged.
    if (lane.port().failure() || !lane.can_stage() || !lane.single_empty()) {
      preparable_[keep++] = t;
      continue;
    }
    if (!can_stage_run_on_worker(t)) continue;
    t->state = NodeTask::State::kStaged;
    dispatch_claimed(t, lane, true);
    progressed = true;
  }
  preparable_.resize(keep);
  return progressed;
}

Status Scheduler::check_registration(uint32_t worker, uint64_t registration) {
  if (registration == 0 || registration == chip_lanes_[worker].port().registration()) return Status();
  return make_error(StatusCode::kAborted,
                    "chip worker {} died after this task was built and was replaced; the device buffers the task "
                    "names were lost with it",
                    worker);
}

void Scheduler::dispatch_claimed(NodeTask* t, WorkerLane& lane, bool staged) {
  if (!t->sub) {
    if (Status lost = check_registration(t->worker, t->registration); !lost.ok()) {
      finish(t, lost);  // never live: this is its one terminal
      return;
    }
  }
  running_[t->id] = t;
  PublishSpec spec;
  spec.run_id = t->run->id;
  spec.dispatch_id = t->id;
  spec.task_slot = t->index;
  spec.callable = t->callable;
  spec.config = t->config;
  spec.args_blob = t->blob;
  spec.staged = staged;
  const bool traced = t->run->call.swimlane_level > 0;
  if (traced) {
    t->times.publish_ns = now_ns();
    t->times.staged = staged;
  }
  Status failed = lane.submit_dispatch(spec);
  if (traced) t->times.published_ns = now_ns();
  if (!failed.ok()) {
    // Never live: the failure is its one terminal (R36).
    running_.erase(t->id);
    finish(t, failed);
    return;
  }
  ++publications_;
  if (staged) ++stagings_;
  if (t->run->first_publish_ns == 0) t->run->first_publish_ns = now_ns();
  if (!t->sub) {
    for (const SuccessorEdge& e : t->successors) {
      NodeTask* s = e.task;
      if (!s->sub && s->worker == t->worker && s->state == NodeTask::State::kPending) preparable_.push_back(s);
    }
  }
}

bool Scheduler::handle_events() {
  bool progressed = false;
  for (const EndpointEvent& ev : events_) {
    if (ev.kind != EndpointEvent::Kind::kTerminal) continue;
    auto it = running_.find(ev.dispatch_id);
    if (it == running_.end()) continue;
    NodeTask* t = it->second;
    running_.erase(it);
    t->run->last_terminal_ns = now_ns();
    if (!t->members.empty()) {
      size_t k = 0;
      while (k < t->members.size() && t->members[k].id != ev.dispatch_id) ++k;
      if (k < t->members.size()) t->members[k].times.end_ns = t->run->last_terminal_ns;
      member_done(t, ev.status.ok()
                         ? ev.status
                         : Status(ev.status.code(), fmt::format("group member {}: {}", k, ev.status.message())));
      progressed = true;
      continue;
    }
    t->times.end_ns = t->run->last_terminal_ns;
    if (ev.status.ok()) ++t->run->executed;
    // A staged task cancelled because a predecessor failed ends with that cause.
    finish(t, t->poison.ok() ? ev.status : t->poison);
    progressed = true;
  }
  events_.clear();
  return progressed;
}

void Scheduler::release_alloc(HeapAlloc& a) {
  if (a.freed) return;
  a.freed = true;
  hooks_.free_heap(a.addr);
}

void Scheduler::finish(NodeTask* t, const Status& st) {
  // Depth first, in the order a recursion over the poisoned successors would
  // take, on a stack of its own: one failure ends every task downstream of
  // it here, and a chain of a million must not take a million native frames.
  struct Frame {
    NodeTask* task;
    const Status* status;  // what it finished with
    size_t next;           // its next successor to release
  };
  std::vector<Frame> suspended;  // allocated only once a failure poisons a successor
  Frame f{t, &st, 0};
  end_task(t, st);
  for (;;) {
    if (f.next < f.task->successors.size()) {
      if (NodeTask* s = release(f.task, *f.status, f.task->successors[f.next++])) {
        suspended.push_back(f);
        f = Frame{s, &s->poison, 0};
        end_task(s, s->poison);
      }
      continue;
    }
    // Retired after the round's phase, never inside this loop: a poisoned
    // successor's finish may complete the run that owns an earlier task.
    NodeRun* run = f.task->run;
    if (--run->remaining == 0) retiring_.push_back(run);
    if (suspended.empty()) return;
    f = suspended.back();
    suspended.pop_back();
  }
}

void Scheduler::end_task(NodeTask* t, const Status& st) {
  t->state = NodeTask::State::kDone;
  NodeRun* run = t->run;
  forget_accesses(t);
  if (!st.ok() && run->first_error.ok()) {
    run->first_error = Status(st.code(), fmt::format("task {} of run {}: {}", t->index, run->id, st.message()));
  }
  for (uint32_t i : t->allocs) {
    HeapAlloc& a = run->allocs[i];
    if (--a.users == 0 && a.scope_ended) {
      if (!a.freed) ++run->released_early;
      release_alloc(a);
    }
  }
  if (t->fanin == 0) return;
  // Ended before its predecessors (a staged task whose child failed it
  // unlaunched). Its run may retire and free it before they end, so they
  // must no longer reach it; and the accesses its writes stood for in the
  // TensorMap are theirs again, so that later tasks still follow them.
  for (NodeTask* p : t->predecessors) {
    if (p == nullptr) continue;
    std::vector<SuccessorEdge>& out = p->successors;
    out.erase(std::remove_if(out.begin(), out.end(), [&](const SuccessorEdge& e) { return e.task == t; }), out.end());
    forget_accesses(p);
    add_accesses(p);
  }
}

NodeTask* Scheduler::release(NodeTask* t, const Status& st, const SuccessorEdge& e) {
  NodeTask* s = e.task;
  s->predecessors[e.slot] = nullptr;
  if (!st.ok() && s->poison.ok()) {
    // A task that was not run passes its own poison on, so the text names
    // the task that failed, however far down the chain.
    s->poison = t->poison.ok() ? make_error(StatusCode::kAborted, "not run: task {} of run {} failed: {}", t->index,
                                            t->run->id, st.to_string())
                               : t->poison;
  }
  if (--s->fanin != 0) return nullptr;
  if (s->state == NodeTask::State::kStaged) {
    // Its lane is the one that staged it; the terminal (launched or
    // cancelled) arrives as any other. An error here means the endpoint
    // has given, or will give, that terminal itself.
    (void)chip_lanes_[s->worker].activate_staged(s->poison.ok());
    s->state = NodeTask::State::kRunning;
    return nullptr;
  }
  if (!s->poison.ok()) return s;
  s->state = NodeTask::State::kReady;
  ready_.push_back(s);
  return nullptr;
}

bool Scheduler::retire_finished() {
  const bool any = !retiring_.empty();
  for (NodeRun* run : retiring_) retire(run);
  retiring_.clear();
  return any;
}

void Scheduler::retire(NodeRun* run) {
  for (HeapAlloc& a : run->allocs) release_alloc(a);
  (void)run_resources_.release(run->lease);  // false only when a test already took it back
  // Its tasks are about to be destroyed: no staging candidate may outlive them.
  preparable_.erase(std::remove_if(preparable_.begin(), preparable_.end(), [&](NodeTask* t) { return t->run == run; }),
                    preparable_.end());
  if (hooks_.retire) hooks_.retire(*run);
  RunStats stats;
  stats.tasks = static_cast<uint32_t>(run->tasks.size());
  stats.executed = run->executed;
  stats.released_early = run->released_early;
  stats.build_us = run->build_us;
  if (run->first_publish_ns != 0 && run->last_terminal_ns >= run->first_publish_ns) {
    stats.device_us = static_cast<double>(run->last_terminal_ns - run->first_publish_ns) / 1000.0;
  }
  std::shared_ptr<detail::RunState> handle = run->handle;
  Status result = run->first_error;
  // Every task of the run is done, and finish() cut each one out of the
  // tasks of other runs (their predecessors and successors), so no other
  // run still points into this one.
  runs_.erase(run->id);
  // Before the handle completes: its waiter's next run must not find it live.
  live_.fetch_sub(1, std::memory_order_seq_cst);
  handle->complete(std::move(result), stats);
  // Its waiter may be parked on this bell, driving (Gate::wait).
  bell_->ring_parked();
}

}  // namespace simpler
