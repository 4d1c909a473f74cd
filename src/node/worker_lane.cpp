#include "node/worker_lane.h"

#include "base/errors.h"

namespace simpler {

void WorkerLane::start(EndpointPort* port, std::atomic<uint32_t>* polled_inflight) {
  port_ = port;
  polled_inflight_ = port->needs_polling() ? polled_inflight : nullptr;
  lanes_.assign(port->max_inflight_tasks(), kNoTask);
  inflight_ = 0;
}

bool WorkerLane::can_dispatch() { return inflight_ < lanes_.size() && port_->available_request_transport() > 0; }

Status WorkerLane::submit_dispatch(const PublishSpec& spec) {
  size_t lane = 0;
  while (lane < lanes_.size() && lanes_[lane] != kNoTask) ++lane;
  if (lane == lanes_.size()) {
    return internal_error("task {} was claimed for an endpoint with no free lane", spec.dispatch_id);
  }
  if (spec.staged && staged_ != kNoTask) {
    return internal_error("task {} was staged while task {} holds the staged lane", spec.dispatch_id, staged_);
  }
  // Nothing is reserved between the gate and here, so a failed publication
  // leaves nothing to give back.
  SIMPLER_ASSIGN_OR_RETURN(const Publication p, port_->publish(spec));
  if (spec.staged) {
    staged_ = spec.dispatch_id;
    staged_at_ = p;
  }
  lanes_[lane] = spec.dispatch_id;
  ++inflight_;
  if (polled_inflight_ != nullptr) polled_inflight_->fetch_add(1, std::memory_order_release);
  return Status();
}

Status WorkerLane::activate_staged(bool launch) {
  if (staged_ == kNoTask) return failed_precondition("no staged task to activate");
  staged_ = kNoTask;
  return port_->activate(staged_at_, launch);
}

void WorkerLane::progress(std::vector<EndpointEvent>& out) {
  const size_t first = out.size();
  port_->poll(out);
  for (size_t i = first; i < out.size(); ++i) {
    if (out[i].kind != EndpointEvent::Kind::kTerminal) continue;
    for (uint64_t& l : lanes_) {
      if (l == out[i].dispatch_id) {
        l = kNoTask;
        if (staged_ == out[i].dispatch_id) staged_ = kNoTask;  // ended before its activation
        --inflight_;
        if (polled_inflight_ != nullptr) polled_inflight_->fetch_sub(1, std::memory_order_release);
        break;
      }
    }
  }
}

}  // namespace simpler
