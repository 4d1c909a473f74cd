// T8 (docs/reliability.md): the stateful action fuzzer. Each input is a script
// of actions on one real MailboxEndpoint served by the real child loop
// (MailboxChild) on a thread over an anonymous mapping ("thread mode"):
// publish a run (its outcome, gates and acceptance from the input), publish a
// staged run and later activate or cancel it, open a gate, poll, corrupt a
// request header (the T5 classes), kill the child, let a run hang past the
// endpoint's run deadline, replace a dead child (reregister), and at the end
// drain. After every action and after the drain the harness checks:
//   - no dispatch has two terminals, or a terminal it was never published for,
//     or an acceptance after its terminal;
//   - a terminal the child delivered (not the endpoint's stop) carries the
//     script's status, unless its frame was corrupted while it was the
//     frame's run or before it was published into it (the child's refusal
//     of a leftover header may land on the frame's next run), or it was
//     cancelled;
//   - after a poll the endpoint holds exactly the runs published and not yet
//     terminal, and never more in between;
//   - the drain gives every publication its terminal before a deadline, and
//     the child thread exits (no deadlock).
// A killed child is a thread whose stores are dropped from then on: to the
// mailbox it is as dead as a killed process.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/shared_memory.h"
#include "fuzz_check.h"
#include "ipc/mailbox_child.h"
#include "ipc/mailbox_endpoint.h"
#include "ipc/store_primitive.h"

namespace simpler {
namespace {

constexpr uint64_t kGrant = 2;
constexpr int kGates = 4;
constexpr size_t kMaxActions = 64;
constexpr uint64_t kDrainNs = 10'000'000'000ull;

uint64_t now() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Gates the scripted runs wait on; shared by every incarnation of the child.
struct Gates {
  std::mutex mu;
  std::condition_variable cv;
  std::array<bool, kGates> open{};
  bool is_open(int g) const { return g < 0 || open[static_cast<size_t>(g)]; }
};

// What a run does, from its config bytes: accepted or not, the gate before
// its launch marker and the gate before its terminal, and its result.
struct Script {
  int pre_gate = -1;
  int gate = -1;
  bool accept = true;
  StatusCode code = StatusCode::kOk;
};

std::vector<uint8_t> encode(const Script& s) {
  return {static_cast<uint8_t>(s.pre_gate + 1), static_cast<uint8_t>(s.gate + 1), static_cast<uint8_t>(s.accept),
          static_cast<uint8_t>(s.code)};
}

Status scripted_status(const Script& s, uint64_t dispatch) {
  if (s.code == StatusCode::kOk) return Status();
  return Status(s.code, "scripted failure of dispatch " + std::to_string(dispatch));
}

// Runs requests on a thread of its own as their gates open.
class ScriptHandler final : public RunHandler {
 public:
  explicit ScriptHandler(Gates& gates) : gates_(gates) {}
  ~ScriptHandler() override { stop(); }

  Status init() override {
    thread_ = std::thread([this] { loop(); });
    return Status();
  }
  void start(RunRequest request, RunTicket ticket) override {
    FUZZ_CHECK(request.config.size() == 4);
    Script s;
    s.pre_gate = request.config[0] - 1;
    s.gate = request.config[1] - 1;
    s.accept = request.config[2] != 0;
    s.code = static_cast<StatusCode>(request.config[3]);
    std::lock_guard<std::mutex> lock(gates_.mu);
    jobs_.push_back(Job{s, ticket, request.dispatch_id, false});
    gates_.cv.notify_all();
  }
  // Abandons what is still gated: the exit sweep gives those runs their terminal.
  void drain(uint64_t) override { stop(); }

 private:
  struct Job {
    Script script;
    RunTicket ticket;
    uint64_t dispatch;
    bool launched;
  };
  void stop() {
    {
      std::lock_guard<std::mutex> lock(gates_.mu);
      stopping_ = true;
      gates_.cv.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(gates_.mu);
    while (!stopping_) {
      bool any = false;
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        if (!it->launched && gates_.is_open(it->script.pre_gate)) {
          if (it->script.accept) it->ticket.accepted();
          it->launched = true;
          any = true;
        }
        if (it->launched && (!it->script.accept || gates_.is_open(it->script.gate))) {
          it->ticket.complete(scripted_status(it->script, it->dispatch),
                              it->script.accept ? kDispositionNativePrepared : kDispositionValidatedOnly);
          it = jobs_.erase(it);
          any = true;
        } else {
          ++it;
        }
      }
      if (!any) gates_.cv.wait(lock);
    }
  }

  Gates& gates_;
  std::deque<Job> jobs_;  // guarded by gates_.mu
  bool stopping_ = false;
  std::thread thread_;
};

// Plain stores until the child is "killed"; then none at all.
class KillableStores final : public StorePrimitive {
 public:
  void store32(uint32_t& w, uint32_t v) override {
    if (!dead_.load(std::memory_order_acquire)) store_release(w, v);
  }
  void store64(uint64_t& w, uint64_t v) override {
    if (!dead_.load(std::memory_order_acquire)) store_release(w, v);
  }
  void store_bytes(void* d, const void* s, size_t n) override {
    if (!dead_.load(std::memory_order_acquire)) std::memcpy(d, s, n);
  }
  void kill() { dead_.store(true, std::memory_order_release); }
  bool dead() const { return dead_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> dead_{false};
};

// One child: its stores, handler, serve loop and thread.
struct Incarnation {
  KillableStores stores;
  std::unique_ptr<ScriptHandler> handler;
  std::unique_ptr<MailboxChild> child;
  std::thread thread;
  std::atomic<bool> exited{false};
};

class Harness final : public ChildLiveness {
 public:
  Harness(uint64_t run_deadline_ns) {
    auto m = SharedMapping::create_anonymous(*mailbox_size(kGrant));
    FUZZ_CHECK(m.ok());
    map_ = std::move(m).value();
    EndpointOptions o;
    o.run_deadline_ns = run_deadline_ns;
    o.liveness_period_ns = 1'000'000;
    auto ep = MailboxEndpoint::create(map_.data(), map_.size(), kGrant, o);
    FUZZ_CHECK(ep.ok());
    ep_ = std::move(ep).value();
    ep_->set_liveness(this);
    FUZZ_CHECK(launch().ok());
    FUZZ_CHECK(ep_->wait_ready(now() + kDrainNs).ok());
  }
  ~Harness() override { end_child(); }

  // ChildLiveness: the thread "process" is dead once killed or exited.
  Status check() override {
    if (cur_->stores.dead()) return Status(StatusCode::kAborted, "killed");
    if (cur_->exited.load()) return Status(StatusCode::kAborted, "exited");
    return Status();
  }
  void kill(const std::string&) override { cur_->stores.kill(); }

  void publish(FuzzedDataProvider& in, bool staged) {
    if (ep_->poisoned() || ep_->available_request_transport() == 0) return;  // an admitter asks first
    Script s;
    s.pre_gate = in.ConsumeIntegralInRange<int>(-1, kGates - 1);
    s.gate = in.ConsumeIntegralInRange<int>(-1, kGates - 1);
    s.accept = in.ConsumeBool();
    s.code = in.ConsumeBool() ? StatusCode::kOk : StatusCode::kKernelFailed;
    const std::vector<uint8_t> cfg = encode(s);
    const uint64_t dispatch = ++next_dispatch_;
    PublishSpec spec;
    spec.run_id = dispatch;
    spec.dispatch_id = dispatch;
    spec.config = cfg;
    spec.staged = staged;
    auto p = ep_->publish(spec);
    if (!p.ok()) return;  // refused (entry table full): nothing was published
    Run& r = runs_[dispatch];
    r.script = s;
    r.pub = *p;
    r.staged_pending = staged;
    r.tainted = corrupted_frames_.erase(p->frame) != 0;
    frame_dispatch_[p->frame] = dispatch;
    ++live_;
  }
  void activate(FuzzedDataProvider& in) {
    for (auto& [d, r] : runs_) {
      if (!r.staged_pending || r.terminals != 0) continue;
      r.staged_pending = false;
      const bool launch = in.ConsumeBool();
      r.cancelled = !launch;
      (void)ep_->activate(r.pub, launch);  // an error: the endpoint ends it itself
      return;
    }
  }
  void open_gate(int g) {
    std::lock_guard<std::mutex> lock(gates_.mu);
    gates_.open[static_cast<size_t>(g)] = true;
    gates_.cv.notify_all();
  }
  // T5's classes, written into a frame's header while the child may read it.
  void corrupt(FuzzedDataProvider& in) {
    const uint32_t f = in.ConsumeIntegralInRange<uint32_t>(0, kMailboxRequestFrames - 1);
    RequestHeader& h = ep_->view().frame(f).header;
    auto it = frame_dispatch_.find(f);
    if (it != frame_dispatch_.end()) {
      auto r = runs_.find(it->second);
      if (r != runs_.end()) r->second.tainted = true;
    }
    corrupted_frames_.insert(f);
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
        store_release(h.entry_index, ep_->view().entry_count());
        break;
      case 1:
        store_release(h.entry_index, uint64_t{UINT32_MAX});
        break;
      case 2:
        store_release(h.entry_generation, load_acquire(h.entry_generation) + 1);  // even
        break;
      case 3:
        store_release(h.entry_generation, load_acquire(h.entry_generation) + 2);  // a future one
        break;
      case 4:
        store_release(h.publication, uint64_t{0});
        break;
      case 5:
        store_release(h.protocol_version, 99u);
        break;
      default:
        // A frame this side thinks free, suddenly ready: a leftover header.
        store_release(h.ready, static_cast<uint32_t>(kMailboxTaskReady));
        view_ring();
        break;
    }
  }
  void kill_child() { cur_->stores.kill(); }
  // A dead child's replacement, once the endpoint has ended every run it held.
  void respawn() {
    if (check().ok() || ep_->held_runs() != 0) return;
    end_child();
    FUZZ_CHECK(ep_->reregister([this] { return launch(); }).ok());
    (void)ep_->wait_ready(now() + kDrainNs);
  }

  void poll() {
    events_.clear();
    ep_->poll(events_);
    for (const EndpointEvent& e : events_) {
      auto it = runs_.find(e.dispatch_id);
      FUZZ_CHECK(it != runs_.end());  // an event for a dispatch never published
      Run& r = it->second;
      if (e.kind == EndpointEvent::Kind::kAccepted) {
        FUZZ_CHECK(r.terminals == 0);
        FUZZ_CHECK(!r.accepted);
        r.accepted = true;
        continue;
      }
      FUZZ_CHECK(++r.terminals == 1);
      --live_;
      if (!e.endpoint_failure && !r.tainted && !r.cancelled && e.status.code() != StatusCode::kAborted) {
        FUZZ_CHECK(e.status == scripted_status(r.script, e.dispatch_id));
      }
      if (e.endpoint_failure) FUZZ_CHECK(!e.status.ok());
    }
    FUZZ_CHECK(ep_->held_runs() == live_);
  }
  // Between polls the endpoint may already have released an entry whose
  // terminal the next poll reports (a refused frame ends its run when the
  // frame is reclaimed), never hold one it was not given.
  void check_held() const { FUZZ_CHECK(ep_->held_runs() <= live_); }

  // Every gate open, every staged run activated; each publication must end.
  void drain() {
    for (int g = 0; g < kGates; ++g) open_gate(g);
    const uint64_t deadline = now() + kDrainNs;
    while (live_ != 0) {
      for (auto& [d, r] : runs_) {
        if (r.staged_pending && r.terminals == 0) {
          r.staged_pending = false;
          (void)ep_->activate(r.pub, true);
        }
      }
      poll();
      if (live_ == 0) break;
      FUZZ_CHECK(now() < deadline);  // a run never ended: a deadlock
      (void)ep_->wait(now() + 1'000'000);
    }
    for (auto& [d, r] : runs_) FUZZ_CHECK(r.terminals == 1);
  }

 private:
  struct Run {
    Script script;
    Publication pub;
    bool staged_pending = false;
    bool cancelled = false;
    bool tainted = false;
    bool accepted = false;
    int terminals = 0;
  };

  void view_ring() { ep_->view().control().child_bell.ring(); }
  Status launch() {
    auto inc = std::make_unique<Incarnation>();
    inc->handler = std::make_unique<ScriptHandler>(gates_);
    ChildOptions co;
    co.stores = &inc->stores;
    co.drain_timeout_ns = 100'000'000;
    inc->child = std::make_unique<MailboxChild>(ep_->view(), *inc->handler, co);
    Incarnation* raw = inc.get();
    inc->thread = std::thread([raw] {
      (void)raw->child->serve();
      raw->exited.store(true);
    });
    cur_ = std::move(inc);
    return Status();
  }
  // Shuts the current child down and joins it, within the drain deadline.
  void end_child() {
    if (cur_ == nullptr) return;
    ep_->request_shutdown();
    for (int g = 0; g < kGates; ++g) open_gate(g);
    const uint64_t deadline = now() + kDrainNs;
    while (!cur_->exited.load()) {
      FUZZ_CHECK(now() < deadline);  // the child loop never exited
      view_ring();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    cur_->thread.join();
    cur_->handler.reset();
    cur_.reset();
    // A replacement starts with every gate shut again.
    std::lock_guard<std::mutex> lock(gates_.mu);
    gates_.open.fill(false);
  }

  SharedMapping map_;
  std::unique_ptr<MailboxEndpoint> ep_;
  Gates gates_;
  std::unique_ptr<Incarnation> cur_;
  std::map<uint64_t, Run> runs_;
  std::map<uint32_t, uint64_t> frame_dispatch_;  // the last dispatch published into each frame
  std::set<uint32_t> corrupted_frames_;          // corrupted since their last publication
  uint64_t next_dispatch_ = 0;
  size_t live_ = 0;
  std::vector<EndpointEvent> events_;
};

}  // namespace
}  // namespace simpler

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace simpler;
  FuzzedDataProvider in(data, size);
  // 0: no run deadline; otherwise a run gated shut for 1-4 ms makes the
  // endpoint kill the child as hung.
  const uint64_t deadline_ms = in.ConsumeIntegralInRange<uint64_t>(0, 4);
  Harness h(deadline_ms * 1'000'000);
  for (size_t i = 0; i < kMaxActions && in.remaining_bytes() > 0; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
      case 1:
        h.publish(in, false);
        break;
      case 2:
        h.publish(in, true);
        break;
      case 3:
        h.activate(in);
        break;
      case 4:
        h.open_gate(in.ConsumeIntegralInRange<int>(0, kGates - 1));
        break;
      case 5:
        h.poll();
        break;
      case 6:
        h.corrupt(in);
        break;
      case 7:
        h.kill_child();
        break;
      case 8:
        h.respawn();
        break;
      default:
        std::this_thread::sleep_for(std::chrono::microseconds(in.ConsumeIntegralInRange<int>(0, 2000)));
        break;
    }
    h.check_held();
  }
  h.drain();
  return 0;
}
