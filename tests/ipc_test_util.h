// Test doubles of the mailbox tests: a recording store primitive, a scripted
// RunHandler (works in a thread or in a forked child), an in-process mock
// child that follows the protocol on its own (R17), and bounded waits.
// Test-thread use only, except where a type says otherwise.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/errors.h"
#include "ipc/mailbox_child.h"
#include "ipc/mailbox_endpoint.h"
#include "ipc/mailbox_layout.h"
#include "ipc/store_primitive.h"

namespace simpler::testing {

inline constexpr uint64_t kTestWaitNs = 30'000'000'000ull;

// One store the child made, in the order the child made them (any thread).
struct RecordedStore {
  uintptr_t addr;
  size_t bytes;
  uint64_t value;  // for word stores
};

class RecordingStores final : public StorePrimitive {
 public:
  void store32(uint32_t& w, uint32_t v) override {
    record(&w, 4, v, [&] { store_release(w, v); });
  }
  void store64(uint64_t& w, uint64_t v) override {
    record(&w, 8, v, [&] { store_release(w, v); });
  }
  void store_bytes(void* dst, const void* src, size_t n) override {
    record(dst, n, 0, [&] { std::memcpy(dst, src, n); });
  }
  std::vector<RecordedStore> snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_.size();
  }

 private:
  template <typename F>
  void record(void* p, size_t n, uint64_t v, F&& store) {
    // Logged and stored under one lock, so the log order is the store order.
    std::lock_guard<std::mutex> lock(mu_);
    store();
    log_.push_back({reinterpret_cast<uintptr_t>(p), n, v});
  }
  std::mutex mu_;
  std::vector<RecordedStore> log_;
};

// Which part of the mailbox a store hit: -1 control, frames [0, K), entries
// kEntryBase + i.
inline constexpr int kEntryBase = 1000;
inline int region_of(const MailboxView& v, uintptr_t addr) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(v.base());
  const uintptr_t off = addr - base;
  if (off < kMailboxFramesOffset) return -1;
  if (off < kMailboxEntriesOffset) return static_cast<int>((off - kMailboxFramesOffset) / kMailboxFrameSize);
  return kEntryBase + static_cast<int>((off - kMailboxEntriesOffset) / kMailboxEntryStride);
}

// R6 over a recorded store log: per entry, the store after a terminal opens
// a new occupant (its run_epoch at staging), never a late rc, text or ACK,
// and every entry stored into ends on its terminal. Returns the number of
// terminal stores in the log.
inline size_t expect_terminal_last_per_entry(const std::vector<RecordedStore>& log, const MailboxView& view) {
  std::map<int, bool> after_terminal;
  size_t terminal_stores = 0;
  for (const auto& s : log) {
    const int r = region_of(view, s.addr);
    if (r < kEntryBase) continue;
    const uintptr_t off = s.addr - reinterpret_cast<uintptr_t>(&view.entry(r - kEntryBase));
    if (after_terminal[r] && off != kEntryOffRunEpoch) {
      ADD_FAILURE() << "store at offset " << off << " after the terminal to entry " << r - kEntryBase;
      return terminal_stores;
    }
    after_terminal[r] = off == kEntryOffState && mailbox_state_is_terminal(static_cast<uint32_t>(s.value));
    terminal_stores += after_terminal[r];
  }
  for (const auto& [r, t] : after_terminal) EXPECT_TRUE(t) << "entry " << r - kEntryBase << " ends on its terminal";
  return terminal_stores;
}

// Gates a test opens to let scripted runs advance. Lives in shared memory so
// forked children see it.
struct TestGates {
  Doorbell bell;
  uint32_t open[64];
  uint32_t handler_calls;
  uint32_t kernels_at_gate;  // node_axpb_kernel calls that reached their gate
  void open_gate(int n) {
    store_release(open[n], 1u);
    bell.ring();
  }
  bool is_open(int n) const { return n < 0 || load_acquire(open[n]) != 0; }
};

// What a scripted run does, from its config bytes:
// "pre=N;gate=N;noaccept;fail=CODE;text=..." (text last; every part optional).
struct Script {
  int pre_gate = -1;  // before the launch marker
  int gate = -1;      // before the terminal
  bool accept = true;
  StatusCode code = StatusCode::kOk;
  std::string text;
};

inline Script parse_script(const uint8_t* p, size_t n) {
  Script s;
  std::string cfg(reinterpret_cast<const char*>(p), n);
  size_t pos = 0;
  while (pos < cfg.size()) {
    if (cfg.compare(pos, 5, "text=") == 0) {
      s.text = cfg.substr(pos + 5);
      break;
    }
    size_t end = cfg.find(';', pos);
    if (end == std::string::npos) end = cfg.size();
    const std::string part = cfg.substr(pos, end - pos);
    if (part.rfind("pre=", 0) == 0) s.pre_gate = std::stoi(part.substr(4));
    if (part.rfind("gate=", 0) == 0) s.gate = std::stoi(part.substr(5));
    if (part == "noaccept") s.accept = false;
    if (part.rfind("fail=", 0) == 0) s.code = static_cast<StatusCode>(std::stoi(part.substr(5)));
    pos = end + 1;
  }
  return s;
}

// Host bytes standing in for device memory behind the control frame.
class HostMemory {
 public:
  Result<ControlReply> serve(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes, uint32_t capacity) {
    ControlReply r;
    switch (cmd.op) {
      case kCtrlMalloc:
        next_ += 0x1000;
        mem_[next_].assign(cmd.args[0], 0);
        r.value = next_;
        return r;
      case kCtrlFree:
        if (mem_.erase(cmd.args[0]) == 0) return not_found("no allocation at {}", cmd.args[0]);
        return r;
      case kCtrlCopyTo: {
        auto it = mem_.find(cmd.args[0]);
        if (it == mem_.end() || cmd.args[1] + in_bytes > it->second.size()) return out_of_range("bad copy_to");
        std::memcpy(it->second.data() + cmd.args[1], data, in_bytes);
        return r;
      }
      case kCtrlCopyFrom: {
        auto it = mem_.find(cmd.args[0]);
        if (it == mem_.end() || cmd.args[1] + cmd.args[2] > it->second.size() || cmd.args[2] > capacity) {
          return out_of_range("bad copy_from");
        }
        std::memcpy(data, it->second.data() + cmd.args[1], cmd.args[2]);
        r.data_bytes = static_cast<uint32_t>(cmd.args[2]);
        return r;
      }
      default:
        return invalid_argument("op {}", static_cast<uint32_t>(cmd.op));
    }
  }

 private:
  uint64_t next_ = 0x10000;
  std::map<uint64_t, std::vector<uint8_t>> mem_;
};

// The scripted RunHandler: one thread of its own (started in init, so after
// fork in a forked child) accepts and completes runs as their gates open.
class TestHandler final : public RunHandler {
 public:
  explicit TestHandler(TestGates* gates) : gates_(gates) {}
  ~TestHandler() override { drain(now_ns() + kTestWaitNs); }

  Status init() override {
    thread_ = std::thread([this] { loop(); });
    return Status();
  }
  void start(RunRequest request, RunTicket ticket) override {
    std::atomic_ref<uint32_t>(gates_->handler_calls).fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(Job{parse_script(request.config.data(), request.config.size()), ticket, false});
    }
    gates_->bell.ring();
  }
  Result<ControlReply> control(const ControlCommand& cmd, uint8_t* data, uint32_t in_bytes,
                               uint32_t capacity) override {
    return memory_.serve(cmd, data, in_bytes, capacity);
  }
  void drain(uint64_t deadline_ns) override {
    if (!thread_.joinable()) return;
    spin_then_park(
        gates_->bell,
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          return jobs_.empty();
        },
        SpinPolicy{}, deadline_ns);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    gates_->bell.ring();
    thread_.join();
  }

 private:
  struct Job {
    Script script;
    RunTicket ticket;
    bool launched;
  };
  bool advance() {  // requires mu_
    bool any = false;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (!it->launched && gates_->is_open(it->script.pre_gate)) {
        if (it->script.accept) it->ticket.accepted();
        it->launched = true;
        any = true;
      }
      if (it->launched && it->script.accept && gates_->is_open(it->script.gate)) {
        it->ticket.complete(Status(it->script.code, it->script.text), kDispositionNativePrepared);
        it = jobs_.erase(it);
        any = true;
      } else if (it->launched && !it->script.accept) {
        it->ticket.complete(Status(it->script.code, it->script.text), kDispositionValidatedOnly);
        it = jobs_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }
  void loop() {
    for (;;) {
      spin_then_park(
          gates_->bell,
          [&] {
            std::lock_guard<std::mutex> lock(mu_);
            return stopping_ || advance();
          },
          SpinPolicy{});
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      gates_->bell.ring();  // completions may unblock a drain waiting on the same bell
    }
  }

  TestGates* gates_;
  HostMemory memory_;
  std::mutex mu_;
  std::vector<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

// R17: an in-process stand-in for the forked child, written independently of
// MailboxChild: one thread scans every frame, resolves entry and generation
// from the header, refuses a header naming no live occupant, copies the
// payload out, hands the frame back before the run completes, and publishes
// rc, text and the terminal into the entry.
class MockMailboxWorker {
 public:
  MockMailboxWorker(MailboxView view, TestGates* gates) : view_(view), gates_(gates) {}

  void run() {
    ControlFrame& c = view_.control();
    auto wire = mailbox_wire_constants();
    std::memcpy(c.child_wire, wire.data(), wire.size() * sizeof(WireConstant));
    store_release(c.child_wire_count, static_cast<uint32_t>(wire.size()));
    uint64_t handled = load_acquire(c.reply_seq);
    store_release(c.endpoint_state, static_cast<uint32_t>(kEndpointServing));
    store_release(c.init_state, static_cast<uint32_t>(kInitReady));
    c.parent_bell.ring();
    for (;;) {
      // Gate openings ring the gates' bell and the test also rings ours.
      spin_then_park(
          c.child_bell, [&] { return pending(handled); }, SpinPolicy{});
      if (load_acquire(c.shutdown) != 0) return sweep();
      if (const uint64_t seq = load_acquire(c.cmd_seq); seq != handled) {
        auto r = memory_.serve(ControlCommand{static_cast<MailboxControlOp>(c.cmd_op),
                                              {c.cmd_args[0], c.cmd_args[1], c.cmd_args[2], c.cmd_args[3]}},
                               c.data, c.cmd_data_bytes, kControlDataCapacity);
        c.reply_code = r.ok() ? 0 : static_cast<int32_t>(r.status().code());
        c.reply_value = r.ok() ? r->value : 0;
        c.reply_data_bytes = r.ok() ? r->data_bytes : 0;
        copy_text(c.reply_text, sizeof c.reply_text, r.status().message());
        store_release(c.reply_seq, seq);
        handled = seq;
        c.parent_bell.ring();
      }
      for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
        RequestFrame& fr = view_.frame(f);
        const uint32_t ready = load_acquire(fr.header.ready);
        if (ready != kMailboxTaskReady && ready != kMailboxPrepareReady) continue;
        const uint64_t idx = fr.header.entry_index;
        const uint64_t gen = fr.header.entry_generation;
        if (idx >= view_.entry_count() || gen % 2 == 0) {
          copy_text(c.stop_reason, sizeof c.stop_reason, fmt::format("mock: unattributable header {}/{}", idx, gen));
          store_release(c.endpoint_state, static_cast<uint32_t>(kEndpointStopped));
          c.parent_bell.ring();
          return;
        }
        MailboxRunEntry& e = view_.entry(idx);
        if (load_acquire(e.entry_generation) != gen) {
          store_release(fr.header.ready, static_cast<uint32_t>(kMailboxFrameRefused));
          c.parent_bell.ring();
          continue;
        }
        const bool staged = ready == kMailboxPrepareReady;
        Job job{parse_script(fr.config, fr.header.config_bytes), static_cast<uint32_t>(idx), gen, false, staged};
        const uint64_t p = fr.header.publication;
        // A staged run reaches its "handler" only at ACTIVATE, as in MailboxChild.
        if (!staged) std::atomic_ref<uint32_t>(gates_->handler_calls).fetch_add(1);
        store_release(e.state, static_cast<uint32_t>(kMailboxFrameStaged));
        store_release(fr.header.ready, static_cast<uint32_t>(kMailboxIdle));
        store_release(e.consumed_ack, p);
        c.parent_bell.ring();
        jobs_.push_back(job);
      }
      advance();
    }
  }

 private:
  struct Job {
    Script script;
    uint32_t entry;
    uint64_t generation;
    bool launched;
    bool awaiting_activation;
  };
  bool pending(uint64_t handled) {
    const ControlFrame& c = view_.control();
    if (load_acquire(c.shutdown) != 0 || load_acquire(c.cmd_seq) != handled) return true;
    for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
      const uint32_t ready = load_acquire(view_.frame(f).header.ready);
      if (ready == kMailboxTaskReady || ready == kMailboxPrepareReady) return true;
    }
    for (const Job& j : jobs_) {
      if (j.awaiting_activation) {
        if (load_acquire(view_.entry(j.entry).activation) != 0) return true;
        continue;
      }
      if (!j.launched ? gates_->is_open(j.script.pre_gate) : gates_->is_open(j.script.gate)) return true;
    }
    return false;
  }
  void finish(const Job& j, uint32_t state) {
    MailboxRunEntry& e = view_.entry(j.entry);
    e.rc = static_cast<int32_t>(j.script.code);
    copy_text(e.error_text, sizeof e.error_text, j.script.text);
    store_release(e.state, state);
    view_.control().parent_bell.ring();
  }
  void advance() {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->awaiting_activation) {
        const uint32_t word = load_acquire(view_.entry(it->entry).activation);
        if (word == 0) {
          ++it;
          continue;
        }
        if (word != kMailboxActivate) {
          it->script.code = StatusCode::kAborted;
          it->script.text = "mock: cancelled before activation";
          finish(*it, kMailboxTaskFailed);
          it = jobs_.erase(it);
          continue;
        }
        it->awaiting_activation = false;
        std::atomic_ref<uint32_t>(gates_->handler_calls).fetch_add(1);
      }
      if (!it->launched && gates_->is_open(it->script.pre_gate)) {
        it->launched = true;
        if (it->script.accept) {
          store_release(view_.entry(it->entry).accepted, 1u);
          store_release(view_.entry(it->entry).state, static_cast<uint32_t>(kMailboxTaskLaunched));
          view_.control().parent_bell.ring();
        }
      }
      const bool done = it->launched && (!it->script.accept || gates_->is_open(it->script.gate));
      if (done) {
        finish(*it, it->script.code == StatusCode::kOk ? kMailboxTaskDone : kMailboxTaskFailed);
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void sweep() {
    for (uint64_t i = 0; i < view_.entry_count(); ++i) {
      MailboxRunEntry& e = view_.entry(i);
      if (load_acquire(e.entry_generation) % 2 == 1 && !mailbox_state_is_terminal(load_acquire(e.state))) {
        e.rc = static_cast<int32_t>(StatusCode::kAborted);
        copy_text(e.error_text, sizeof e.error_text, "mock: shut down before the terminal");
        store_release(e.state, static_cast<uint32_t>(kMailboxEndpointFailed));
      }
    }
    store_release(view_.control().endpoint_state, static_cast<uint32_t>(kEndpointExited));
    view_.control().parent_bell.ring();
  }

  MailboxView view_;
  TestGates* gates_;
  HostMemory memory_;
  std::vector<Job> jobs_;
};

// Shared by the mailbox tests (ipc_test, the reliability tests): bytes of a
// script, a publication of a run whose config is that script, the event of a
// run, and a bounded poll that fails the test at its deadline.
inline std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

inline Publication publish_run(MailboxEndpoint& ep, uint64_t run, const std::string& script) {
  const std::vector<uint8_t> cfg = bytes_of(script);
  PublishSpec s;
  s.run_id = run;
  s.dispatch_id = run;
  s.config = cfg;
  auto p = ep.publish(s);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : Publication{};
}

inline const EndpointEvent* find_event(const std::vector<EndpointEvent>& events, uint64_t run,
                                       EndpointEvent::Kind kind) {
  for (const auto& e : events) {
    if (e.run_id == run && e.kind == kind) return &e;
  }
  return nullptr;
}

// Polls until `done()` holds, parking between polls; fails the test at the deadline.
inline bool poll_until(MailboxEndpoint& ep, std::vector<EndpointEvent>& events, const std::function<bool()>& done,
                       const std::string& what) {
  const uint64_t deadline = now_ns() + kTestWaitNs;
  for (;;) {
    ep.poll(events);
    if (done()) return true;
    if (now_ns() >= deadline) {
      ADD_FAILURE() << "timed out waiting for " << what;
      return false;
    }
    ep.wait(deadline);
  }
}

}  // namespace simpler::testing
