#include "node/scheduler.h"

#include <algorithm>

#include "base/errors.h"

namespace simpler {

namespace {
// How long the idle thread parks before it polls again for what only a poll
// notices (a child that died without ringing, a run past its deadline).
constexpr uint64_t kTickNs = 10'000'000;
}  // namespace

Scheduler::Scheduler(std::vector<EndpointPort*> chips, std::vector<EndpointPort*> subs, Doorbell* bell, Hooks hooks)
    : chip_lanes_(chips.size()), sub_lanes_(subs.size()), bell_(bell), hooks_(std::move(hooks)) {
  for (size_t i = 0; i < chips.size(); ++i) chip_lanes_[i].start(chips[i]);
  for (size_t i = 0; i < subs.size(); ++i) sub_lanes_[i].start(subs[i]);
  uint64_t entries = 0;
  for (auto* p : chips) entries += p->max_inflight_tasks();
  for (auto* p : subs) entries += p->max_inflight_tasks();
  events_.reserve(2 * entries + 16);
}

Scheduler::~Scheduler() {
  if (thread_.joinable()) stop(now_ns());
}

void Scheduler::enqueue(std::unique_ptr<NodeRun> run) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(run));
  }
  bell_->ring();
}

void Scheduler::start() {
  thread_ = std::thread([this] { main(); });
}

void Scheduler::stop(uint64_t deadline_ns) {
  stop_deadline_ns_.store(deadline_ns);
  stop_requested_.store(true);
  bell_->ring();
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::idle() {
  if (!runs_.empty()) return false;
  std::lock_guard<std::mutex> lock(inbox_mu_);
  return inbox_.empty();
}

void Scheduler::main() {
  for (;;) {
    const uint32_t armed = bell_->arm();
    const bool progressed = step();
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
    if (progressed) continue;
    uint64_t wake = now_ns() + kTickNs;
    if (stop_requested_.load() && !aborted_) wake = std::min(wake, stop_deadline_ns_.load());
    spin_then_park(*bell_, [&] { return bell_->arm() != armed; }, SpinPolicy{}, wake);
  }
}

bool Scheduler::step() {
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
  progressed |= dispatch_ready();
  progressed |= handle_events();  // terminals of publications that threw
  progressed |= retire_finished();
  return progressed;
}

void Scheduler::admit(std::unique_ptr<NodeRun> run) {
  NodeRun* r = run.get();
  runs_.emplace(r->id, std::move(run));
  r->remaining = static_cast<uint32_t>(r->tasks.size());
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

void Scheduler::wire(NodeTask* t) {
  for (size_t i = 0; i < t->args.size(); ++i) {
    const TaskArg& a = t->args[i];
    if (a.kind != TaskArg::Kind::Tensor || a.tag == Tag::NoDep) continue;
    for (const Access& prior : accesses_) {
      if (prior.task == t || prior.task->state == NodeTask::State::kDone) continue;
      if (!tag_writes(a.tag) && !tag_writes(prior.tag)) continue;  // two reads never order
      if (!prior.view.overlaps(a.tensor)) continue;
      // All of t's edges are added while t is wired, so a repeat from the
      // same predecessor is always its last successor.
      if (!prior.task->successors.empty() && prior.task->successors.back() == t) continue;
      prior.task->successors.push_back(t);
      ++t->fanin;
    }
  }
  for (size_t i = 0; i < t->args.size(); ++i) {
    const TaskArg& a = t->args[i];
    if (a.kind == TaskArg::Kind::Tensor && a.tag != Tag::NoDep) accesses_.push_back(Access{t, a.tensor, a.tag});
  }
}

bool Scheduler::dispatch_ready() {
  bool progressed = false;
  const size_t n = ready_.size();
  for (size_t k = 0; k < n && !ready_.empty(); ++k) {
    NodeTask* t = ready_.front();
    ready_.pop_front();
    WorkerLane* lane = nullptr;
    Status gone;
    if (!t->sub) {
      WorkerLane& l = chip_lanes_[t->worker];
      if (auto p = l.port().poisoned()) {
        gone = make_error(StatusCode::kAborted, "chip worker {} is gone: {}", t->worker, p->to_string());
      } else if (l.can_dispatch()) {
        lane = &l;
      }
    } else {
      bool alive = false;
      for (size_t j = 0; j < sub_lanes_.size() && lane == nullptr; ++j) {
        const uint32_t s = static_cast<uint32_t>((next_sub_ + j) % sub_lanes_.size());
        if (sub_lanes_[s].port().poisoned()) continue;
        alive = true;
        if (sub_lanes_[s].can_dispatch()) {
          lane = &sub_lanes_[s];
          t->worker = s;
          next_sub_ = (s + 1) % sub_lanes_.size();
        }
      }
      if (!alive) gone = make_error(StatusCode::kAborted, "no sub worker is left to run this task");
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

void Scheduler::dispatch_claimed(NodeTask* t, WorkerLane& lane) {
  running_[t->id] = t;
  PublishSpec spec;
  spec.run_id = t->run->id;
  spec.dispatch_id = t->id;
  spec.task_slot = t->index;
  spec.callable = t->callable;
  spec.config = t->config;
  spec.args_blob = t->blob;
  Status refusal;
  switch (lane.submit_dispatch(spec, events_, refusal)) {
    case SubmitDispatchResult::kSubmitted:
      ++publications_;
      break;
    case SubmitDispatchResult::kRefused:
      running_.erase(t->id);
      finish(t, refusal);
      break;
    case SubmitDispatchResult::kPublicationReported:
      break;  // its terminal is in events_
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
    finish(t, ev.status);
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
  t->state = NodeTask::State::kDone;
  NodeRun* run = t->run;
  accesses_.erase(std::remove_if(accesses_.begin(), accesses_.end(), [&](const Access& a) { return a.task == t; }),
                  accesses_.end());
  if (!st.ok() && run->first_error.ok()) {
    run->first_error = Status(st.code(), fmt::format("task {} of run {}: {}", t->index, run->id, st.message()));
  }
  for (uint32_t i : t->allocs) {
    HeapAlloc& a = run->allocs[i];
    if (--a.users == 0 && a.scope_ended) release_alloc(a);
  }
  for (NodeTask* s : t->successors) {
    if (!st.ok() && s->poison.ok()) {
      s->poison = make_error(StatusCode::kAborted, "not run: task {} of run {} failed: {}", t->index, run->id,
                             st.to_string());
    }
    if (--s->fanin != 0) continue;
    if (!s->poison.ok()) {
      s->state = NodeTask::State::kRunning;
      finish(s, s->poison);
    } else {
      s->state = NodeTask::State::kReady;
      ready_.push_back(s);
    }
  }
  // Retired after the round's phase, never inside this recursion: a
  // poisoned successor's finish may complete the run that owns `t`.
  if (--run->remaining == 0) retiring_.push_back(run);
}

bool Scheduler::retire_finished() {
  const bool any = !retiring_.empty();
  for (NodeRun* run : retiring_) retire(run);
  retiring_.clear();
  return any;
}

void Scheduler::retire(NodeRun* run) {
  for (HeapAlloc& a : run->allocs) release_alloc(a);
  if (hooks_.retire) hooks_.retire(*run);
  RunStats stats;
  stats.tasks = static_cast<uint32_t>(run->tasks.size());
  std::shared_ptr<detail::RunState> handle = run->handle;
  Status result = run->first_error;
  // A successor is wired after its predecessor and keeps it from retiring
  // while it is live, so no other run still points into this one.
  runs_.erase(run->id);
  handle->complete(std::move(result), stats);
}

}  // namespace simpler
