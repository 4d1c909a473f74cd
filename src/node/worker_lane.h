// WorkerLane: the scheduler's hold on one child endpoint (upstream's
// WorkerThread in a WorkerManager): a fixed array of lanes, one per run-state
// entry the endpoint can hold, sized once in start() (R44). can_dispatch() is
// the ordinary lane's gate: a free lane AND a free request frame (R33).
// The staged lane holds at most one successor published PREPARE_READY and
// not yet activated; can_stage() is its gate, with the same transport term.
// EndpointPort is the endpoint as lanes see it, so a test can inject faults;
// a MailboxPort over a ForkedChild also has a dead child replaced.
// Threads: only the scheduler thread (the one publisher, R34) touches a lane
// and its port after start, but for a polled port's receive_standing_in and
// stop_standing_in, which a waiting thread calls (any thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "ipc/forked_child.h"
#include "ipc/mailbox_endpoint.h"

namespace simpler {

class EndpointPort {
 public:
  virtual ~EndpointPort() = default;
  // Free request frames; 0 once poisoned.
  virtual uint32_t available_request_transport() = 0;
  // The run-state entries: how many tasks the endpoint can hold at once.
  virtual uint64_t max_inflight_tasks() const = 0;
  // As MailboxEndpoint::publish: a refusal writes nothing; no free frame
  // poisons the endpoint, then fails.
  virtual Result<Publication> publish(const PublishSpec& spec) = 0;
  // As MailboxEndpoint::activate: ACTIVATE or CANCEL a run published staged.
  virtual Status activate(const Publication& p, bool launch) = 0;
  virtual void poll(std::vector<EndpointEvent>& out) = 0;
  // Gives every held run a terminal with `cause`, and the worker takes no
  // more work (the node is closing).
  virtual void poison(const Status& cause) = 0;
  virtual std::optional<Status> poisoned() const = 0;
  // Why the worker behind the port takes no more work, for good; nullopt
  // while it serves or its replacement is on its way (work then waits).
  virtual std::optional<Status> failure() const { return poisoned(); }
  // Which child serves the port: a task built against device buffers of
  // another one may not run here. 0 when the port never changes children.
  virtual uint64_t registration() const { return 0; }
  // A port whose news arrives only when someone asks for it (a node on
  // another MPI rank cannot ring this process's bell): a thread of the
  // port's own receives it, unless a waiter stands in. Fixed for its life.
  virtual bool needs_polling() const { return false; }
  // Any thread, for a port that needs polling: receives what has arrived as
  // the port's own thread would (a terminal rings the scheduler's bell), and
  // that thread stands down for a short grace, so a waiter that polls anyway
  // takes its run's answer without a hand-off between threads.
  virtual void receive_standing_in() {}
  // The stand-in stops receiving (it is about to park): the port's own
  // thread takes over at once. Any thread.
  virtual void stop_standing_in() {}
};

class MailboxPort final : public EndpointPort {
 public:
  explicit MailboxPort(MailboxEndpoint& ep) : ep_(ep) {}
  // A port whose child is replaced when it dies: after each poll it lets the
  // child maintain itself, and nothing is published until a replacement answers.
  explicit MailboxPort(ForkedChild& child) : ep_(child.endpoint()), child_(&child) {}
  uint32_t available_request_transport() override {
    return child_ != nullptr && !child_->serving() ? 0 : ep_.available_request_transport();
  }
  uint64_t max_inflight_tasks() const override { return ep_.view().entry_count(); }
  Result<Publication> publish(const PublishSpec& spec) override { return ep_.publish(spec); }
  Status activate(const Publication& p, bool launch) override { return ep_.activate(p, launch); }
  void poll(std::vector<EndpointEvent>& out) override {
    ep_.poll(out);
    if (child_ != nullptr) (void)child_->maintain();
  }
  void poison(const Status& cause) override {
    if (child_ != nullptr) child_->stop_replacing(cause);
    ep_.poison(cause);
  }
  std::optional<Status> poisoned() const override { return ep_.poisoned(); }
  std::optional<Status> failure() const override { return child_ != nullptr ? child_->failure() : ep_.poisoned(); }
  uint64_t registration() const override { return ep_.registration(); }

 private:
  MailboxEndpoint& ep_;
  ForkedChild* child_ = nullptr;
};

class WorkerLane {
 public:
  static constexpr uint64_t kNoTask = 0;

  // Sizes the lanes from the endpoint's capacity; the only allocation. For
  // a port that needs polling, `polled_inflight` counts its tasks in flight
  // (with every such lane's), for a waiter on another thread to read.
  void start(EndpointPort* port, std::atomic<uint32_t>* polled_inflight = nullptr);
  EndpointPort& port() const { return *port_; }

  // A lane free AND a request frame free; re-read on every call, so a second
  // publication in one round sees the frame the first one took (R34).
  bool can_dispatch();
  // The staged lane's gate: the same lane and transport terms (R33, R40).
  bool can_stage() { return can_dispatch(); }
  // No staged successor is waiting for its activation (R40).
  bool single_empty() const { return staged_ == kNoTask; }
  // Publishes one claimed task (dispatch_id = its task id, never kNoTask);
  // spec.staged publishes it PREPARE_READY into the staged lane. OK: the
  // task is live on the endpoint and holds a lane. An error: the publication
  // failed, the task is not live, and no lane or reservation is left behind;
  // the error is its one terminal, for the caller to deliver (R36, R37).
  Status submit_dispatch(const PublishSpec& spec);
  // Activates (or cancels) the staged successor: it leaves the staged lane
  // and its terminal arrives like any other. An error means the endpoint
  // already gave it a terminal of its own (poisoned) or will.
  Status activate_staged(bool launch);
  // Polls the endpoint into `out` and frees the lane of every terminal. No
  // allocation of its own (R44); `out` should have capacity reserved.
  void progress(std::vector<EndpointEvent>& out);

  uint32_t inflight() const { return inflight_; }
  uint32_t lanes() const { return static_cast<uint32_t>(lanes_.size()); }

 private:
  EndpointPort* port_ = nullptr;
  std::atomic<uint32_t>* polled_inflight_ = nullptr;  // null unless the port needs polling
  std::vector<uint64_t> lanes_;                       // dispatch id per lane, kNoTask when free
  uint32_t inflight_ = 0;
  uint64_t staged_ = kNoTask;  // the staged successor's dispatch id
  Publication staged_at_;      // where it was published
};

}  // namespace simpler
