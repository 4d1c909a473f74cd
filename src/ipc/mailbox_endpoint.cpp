#include "ipc/mailbox_endpoint.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <new>

#include "base/errors.h"
#include "ipc/request_header.h"
#ifdef SIMPLER_TEST_HOOKS
#include "ipc/test_hooks.h"
#endif

// `// model: <step>` marks each store or load of the hand-off that
// tests/model/mailbox.pml checks as that step; change both together.

namespace simpler {

namespace {

uint64_t bounded(uint64_t deadline_ns, uint64_t period_ns) {
  const uint64_t t = now_ns() + period_ns;
  return deadline_ns == 0 ? t : std::min(deadline_ns, t);
}

// A reply or terminal code from the child; scan_entries refuses a terminal
// whose code is none before it gets here.
Status status_from_wire(int32_t rc, const std::string& text) {
  if (rc == 0) return Status();
  if (!is_status_code(rc)) {
    return internal_error("child reported unknown rc {}: {}", rc, text);
  }
  return Status(static_cast<StatusCode>(rc), text);
}

// Zeroes `bytes` (8-aligned, a multiple of 8) word by word with atomic
// stores: at a re-registration another thread of this process (an
// observer) may be reading the words.
void clear_words(void* p, size_t bytes) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) store_relaxed(w[i], uint64_t{0});
}

// An INIT_FAILED as the child reported it: with its own code, or INTERNAL
// naming the word when it is no failure code (it crossed the mailbox).
Status init_failure(uint32_t code, const std::string& text) {
  if (code == 0 || !is_status_code(code)) {
    return internal_error("child init failed with unknown code {}: {}", code, text);
  }
  return Status(static_cast<StatusCode>(code), "child init failed: " + text);
}

}  // namespace

MailboxEndpoint::MailboxEndpoint(MailboxView view, size_t extent, EndpointOptions options)
    : view_(view), extent_(extent), options_(options) {}

Result<std::unique_ptr<MailboxEndpoint>> MailboxEndpoint::create(void* base, size_t extent, uint64_t granted_sets,
                                                                 EndpointOptions options) {
  SIMPLER_ASSIGN_OR_RETURN(const MailboxView view, MailboxView::attach(base, extent, granted_sets));
  const uint64_t m = view.entry_count();
  std::unique_ptr<MailboxEndpoint> ep(new MailboxEndpoint(view, extent, options));
  ep->entries_.reserve(m);
  ep->free_entries_.reserve(m);
  ep->held_.reserve(m);
  ep->pending_.reserve(2 * m + kMailboxRequestFrames);
  ep->register_region();
  return ep;
}

void MailboxEndpoint::register_region() {  // model: reregister
  const uint64_t m = view_.entry_count();
  ControlFrame& c = view_.control();
  clear_words(&c, kControlDataOffset);
  new (&c.child_bell) Doorbell();
  new (&c.parent_bell) Doorbell();
  c.magic = kMailboxMagic;
  c.version = kMailboxProtocolVersion;
  c.entry_stride = kMailboxEntryStride;
  c.granted_sets = view_.entry_count() - kMailboxRequestFrames;
  c.entry_count = m;
  c.mapped_bytes = extent_;
  const std::vector<WireConstant> wire = mailbox_wire_constants();
  std::memcpy(c.parent_wire, wire.data(), wire.size() * sizeof(WireConstant));
  c.parent_wire_count = static_cast<uint32_t>(wire.size());
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) clear_words(&view_.frame(f).header, sizeof(RequestHeader));
  clear_words(&view_.entry(0), m * kMailboxEntryStride);
  std::atomic_thread_fence(std::memory_order_release);
  // This side's records of the region, as cleared as the region itself.
  entries_.assign(m, EntryRecord{});
  free_entries_.clear();
  for (uint64_t i = m; i > 0; --i) free_entries_.push_back(static_cast<uint32_t>(i - 1));
  held_.clear();
  for (FrameRecord& f : frames_) f = FrameRecord{};
  next_publication_ = 0;
  next_liveness_ns_ = 0;
  poisoned_.reset();
  shutdown_ = false;
  cmd_seq_ = 0;
}

Status MailboxEndpoint::reregister(const std::function<Status()>& start_child) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (!held_.empty() || !pending_.empty()) {
    return internal_error("reregistration with {} runs held and {} events undelivered", held_.size(), pending_.size());
  }
  register_region();
  registration_.fetch_add(1, std::memory_order_acq_rel);
  return start_child();
}

std::optional<Status> MailboxEndpoint::ready_state() const {
  const ControlFrame& c = view_.control();
  const uint32_t s = load_acquire(c.init_state);
  if (s == kInitFailed) return init_failure(load_relaxed(c.init_code), read_text(c.init_error, sizeof c.init_error));
  if (s != kInitReady) return std::nullopt;
  const size_t n = std::min<size_t>(load_acquire(c.child_wire_count), kMaxWireConstants);
  if (std::string d = wire_disagreements(mailbox_wire_constants(), c.child_wire, n); !d.empty()) {
    return failed_precondition("wire constants disagree with the child:\n{}", d);
  }
  return Status();
}

Status MailboxEndpoint::wait_ready(uint64_t deadline_ns) {
  ControlFrame& c = view_.control();
  for (;;) {
    if (std::optional<Status> ready = ready_state()) return *ready;
    if (liveness_ != nullptr) {
      SIMPLER_RETURN_IF_ERROR(liveness_->check(), "child gone before INIT_READY");
    }
    if (deadline_ns != 0 && now_ns() >= deadline_ns)
      return make_error(StatusCode::kDeadlineExceeded, "child never reported INIT_READY");
    spin_then_park(
        c.parent_bell, [&] { return load_acquire(c.init_state) != kInitPending; }, options_.spin,
        bounded(deadline_ns, options_.liveness_period_ns));
  }
}

uint32_t MailboxEndpoint::available_request_transport() {
  if (poisoned_ || shutdown_) return 0;
  reclaim_frames();
  uint32_t n = 0;
  for (const FrameRecord& f : frames_) n += f.busy ? 0 : 1;
  return n;
}

Result<Publication> MailboxEndpoint::publish(const PublishSpec& spec) {
  if (poisoned_) return make_error(StatusCode::kAborted, "endpoint is poisoned: {}", poisoned_->to_string());
  if (shutdown_) return failed_precondition("endpoint is shutting down");
  if (spec.config.size() > kRequestConfigCapacity) {
    return invalid_argument("config of {} B exceeds the request frame's {} B", spec.config.size(),
                            kRequestConfigCapacity);
  }
  if (spec.args_blob.size() > kRequestArgsCapacity) {
    return invalid_argument("args blob of {} B exceeds the request frame's {} B", spec.args_blob.size(),
                            kRequestArgsCapacity);
  }
  reclaim_frames();
  size_t f = 0;
  while (f < kMailboxRequestFrames && frames_[f].busy) ++f;
  if (f == kMailboxRequestFrames) {
    // Saturation is an ordinary state the admitter must see through
    // available_request_transport() before it claims work; arriving here is
    // its defect. It poisons this endpoint (every held run gets a terminal),
    // so saturation must never take this path.
    const Status defect = internal_error(
        "publication of run {} with no free request frame: an admitter defect (it "
        "skipped available_request_transport()); the endpoint is poisoned",
        spec.run_id);
    poison(defect);
    return defect;
  }
  if (free_entries_.empty()) return resource_exhausted("all {} run-state entries are held", entries_.size());
  const uint32_t i = free_entries_.back();
  EntryRecord& r = entries_[i];
  if (r.generation >= std::numeric_limits<uint64_t>::max() - 1) {
    poison(internal_error("entry {} generation would wrap", i));
    return *poisoned_;
  }
  free_entries_.pop_back();
  r = EntryRecord{r.generation + 1, true, false, spec.run_id, spec.dispatch_id, spec.task_slot, now_ns(), spec.staged};
  held_.push_back(i);

  MailboxRunEntry& e = view_.entry(i);
  store_relaxed(e.run_id, spec.run_id);
  store_relaxed(e.dispatch_id, spec.dispatch_id);
  store_relaxed(e.task_slot, spec.task_slot);
  store_relaxed(e.set_slot, spec.set_slot);
  store_relaxed(e.lease_generation, spec.lease_generation);
  store_relaxed(e.state, static_cast<uint32_t>(kMailboxIdle));
  store_relaxed(e.disposition, static_cast<uint32_t>(kDispositionNone));
  store_relaxed(e.run_epoch, uint64_t{0});
  store_relaxed(e.rc, 0);
  store_relaxed(e.accepted, 0u);
  store_relaxed(e.consumed_ack, uint64_t{0});
  store_relaxed(e.activation, 0u);
  std::memset(e.error_text, 0, sizeof e.error_text);  // a recycled entry never shows the last occupant's text
  store_release(e.entry_generation, r.generation);    // model: occupy

  RequestFrame& fr = view_.frame(f);
  RequestHeader& h = fr.header;
  const uint64_t p = ++next_publication_;
  store_relaxed(h.publication, uint64_t{0});  // model: unpublish
  std::atomic_thread_fence(std::memory_order_release);
  store_request_fields(  // model: fill_header
      h, RequestFields{kMailboxProtocolVersion, i, r.generation, spec.run_id, spec.dispatch_id, spec.task_slot,
                       static_cast<uint32_t>(spec.config.size()), static_cast<uint32_t>(spec.args_blob.size())});
  std::memcpy(fr.callable_digest, spec.callable.data(), spec.callable.size());  // model: fill_payload
  if (!spec.config.empty()) std::memcpy(fr.config, spec.config.data(), spec.config.size());
  if (!spec.args_blob.empty()) std::memcpy(fr.args, spec.args_blob.data(), spec.args_blob.size());
#ifdef SIMPLER_TEST_HOOKS
  if (identity_fits(spec.args_blob.size())) {  // H5
    write_identity(fr.args + spec.args_blob.size(), spec.run_id, spec.dispatch_id, spec.config.data(),
                   spec.config.size(), spec.args_blob.data(), spec.args_blob.size());
  }
#endif
  // model: publish, ready. Both after the fill: the child reads nothing of a
  // frame before its ready word.
  store_relaxed(h.publication, p);
  r.publication = p;
  store_release(h.ready, static_cast<uint32_t>(spec.staged ? kMailboxPrepareReady : kMailboxTaskReady));
  frames_[f] = FrameRecord{true, i, r.generation, p};
  view_.control().child_bell.ring();
  return Publication{static_cast<uint32_t>(f), i, r.generation, p};
}

Status MailboxEndpoint::activate(const Publication& p, bool launch) {
  if (poisoned_) return make_error(StatusCode::kAborted, "endpoint is poisoned: {}", poisoned_->to_string());
  if (p.entry >= entries_.size()) return out_of_range("activate: entry {} is outside the table", p.entry);
  EntryRecord& r = entries_[p.entry];
  if (!r.held || r.generation != p.entry_generation) {
    return failed_precondition("activate: entry {} generation {} is not held (it is {})", p.entry, p.entry_generation,
                               r.generation);
  }
  if (!r.staged) return failed_precondition("activate: run {} in entry {} is not staged", r.run_id, p.entry);
  r.staged = false;
  r.published_ns = now_ns();
  // model: activate
  store_release(view_.entry(p.entry).activation, static_cast<uint32_t>(launch ? kMailboxActivate : kMailboxCancel));
  view_.control().child_bell.ring();
  return Status();
}

void MailboxEndpoint::reclaim_frames() {
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    FrameRecord& fr = frames_[f];
    if (!fr.busy) continue;
    if (load_acquire(view_.entry(fr.entry).consumed_ack) == fr.publication) {  // model: reclaim_ack
      fr.busy = false;
      ++frames_reclaimed_;
      continue;
    }
    if (load_acquire(view_.frame(f).header.ready) != kMailboxFrameRefused) continue;  // model: reclaim_refused
    fr.busy = false;
    ++frames_reclaimed_;
    EntryRecord& r = entries_[fr.entry];
    if (r.held && r.generation == fr.entry_generation) {
      // The child refused the header this side wrote for a live occupant, so
      // the run never reached it: it ends here, from this side's record.
      EndpointEvent ev;
      ev.run_id = r.run_id;
      ev.dispatch_id = r.dispatch_id;
      ev.task_slot = r.task_slot;
      ev.entry = fr.entry;
      ev.status = internal_error("the child refused run {}'s request frame as stale", r.run_id);
      pending_.push_back(ev);
      release(fr.entry);
      held_.erase(std::find(held_.begin(), held_.end(), fr.entry));
    }
  }
}

void MailboxEndpoint::release(uint32_t entry) {
  EntryRecord& r = entries_[entry];
  // The ACK precedes every terminal, so a frame still recorded for this
  // occupant was handed back (or its child is gone); its ACK word is about
  // to be cleared by the next occupant, so reclaim it now.
  for (FrameRecord& fr : frames_) {
    if (fr.busy && fr.entry == entry && fr.entry_generation == r.generation) {
      fr.busy = false;
      ++frames_reclaimed_;
    }
  }
  r.held = false;
  r.accepted_reported = false;
  ++r.generation;
  store_release(view_.entry(entry).entry_generation, r.generation);  // model: release
  free_entries_.push_back(entry);
}

std::string MailboxEndpoint::entry_violation(uint32_t i, uint32_t state, TerminalWords& terminal) const {
  const EntryRecord& r = entries_[i];
  const MailboxRunEntry& e = view_.entry(i);
  // Every word below is read after `state` (acquired): what the child stored
  // before its state word is visible with it.
  if (const uint64_t g = load_acquire(e.entry_generation); g != r.generation) {
    return fmt::format("entry {} holds generation {}, not run {}'s {}, and only the parent writes that word", i, g,
                       r.run_id, r.generation);
  }
  // The parent cleared the ACK at occupation; the child may echo only the
  // publication it was handed for this occupant.
  const uint64_t ack = load_acquire(e.consumed_ack);
  if (ack != 0 && ack != r.publication) {
    return fmt::format("the ACK in entry {} echoes publication {}, not run {}'s {}", i, ack, r.run_id, r.publication);
  }
  if (state == kMailboxIdle || state == kMailboxFrameStaged || state == kMailboxTaskLaunched) return "";
  if (!mailbox_state_is_terminal(state)) return fmt::format("entry {} holds state {}, which no entry takes", i, state);
  // The exit sweep also ends runs it never staged, so its terminal alone may
  // come without an ACK.
  if (ack == 0 && state != kMailboxEndpointFailed) {
    return fmt::format("run {}'s terminal in entry {} came before its ACK", r.run_id, i);
  }
  const int32_t rc = load_relaxed(e.rc);
  if (rc != 0 && !is_status_code(rc)) {
    return fmt::format("run {}'s terminal in entry {} carries rc {}, which is no status code", r.run_id, i, rc);
  }
  if ((rc == 0) != (state == kMailboxTaskDone)) {
    return fmt::format("run {}'s terminal state {} in entry {} carries rc {}", r.run_id, state, i, rc);
  }
  const uint32_t d = load_relaxed(e.disposition);
  if (d > kDispositionNativePrepared) {
    return fmt::format("run {}'s terminal in entry {} carries disposition {}", r.run_id, i, d);
  }
  terminal = TerminalWords{rc, d};
  return "";
}

void MailboxEndpoint::scan_entries() {
  bool released = false;
  std::string violation;
  for (uint32_t i : held_) {
    EntryRecord& r = entries_[i];
    MailboxRunEntry& e = view_.entry(i);
    const uint32_t state = load_acquire(e.state);  // model: scan_terminal
    TerminalWords terminal;
    violation = entry_violation(i, state, terminal);
    if (!violation.empty()) break;  // nothing more this child wrote is believed
    const bool accepted = load_acquire(e.accepted) != 0;
    EndpointEvent ev;
    ev.run_id = r.run_id;
    ev.dispatch_id = r.dispatch_id;
    ev.task_slot = r.task_slot;
    ev.entry = i;
    if (accepted && !r.accepted_reported) {
      r.accepted_reported = true;
      ev.kind = EndpointEvent::Kind::kAccepted;
      pending_.push_back(ev);
    }
    if (!mailbox_state_is_terminal(state)) continue;
    ev.kind = EndpointEvent::Kind::kTerminal;
    ev.accepted = accepted;
    ev.disposition = static_cast<MailboxDisposition>(terminal.disposition);
    ev.status = status_from_wire(terminal.rc, read_text(e.error_text, sizeof e.error_text));
    ev.endpoint_failure = state == kMailboxEndpointFailed;
    pending_.push_back(ev);
    release(i);
    released = true;
  }
  if (released) {
    held_.erase(std::remove_if(held_.begin(), held_.end(), [&](uint32_t i) { return !entries_[i].held; }), held_.end());
  }
  if (!violation.empty()) {
    // After the loop: poison() rewrites held_. The child is killed first, so
    // it stores nothing more into entries this side is about to release.
    const Status cause = make_error(StatusCode::kAborted, "child protocol violation: {}", violation);
    if (liveness_ != nullptr) liveness_->kill(cause.message());
    poison(cause);
  }
}

void MailboxEndpoint::poll(std::vector<EndpointEvent>& out) {
  ControlFrame& c = view_.control();
  if (!poisoned_) {
    // Read before the entries: every terminal the child stored before it
    // stopped is then reported as that run's own outcome.
    const uint32_t endpoint_state = load_acquire(c.endpoint_state);  // model: poll_endpoint_state
    reclaim_frames();
    scan_entries();
    if (endpoint_state == kEndpointStopped) {
      poison(make_error(StatusCode::kAborted, "endpoint stopped: {}", read_text(c.stop_reason, sizeof c.stop_reason)));
    } else if (endpoint_state == kEndpointExited) {
      poison(make_error(StatusCode::kAborted, "the child exited"));
    } else if (liveness_ != nullptr) {
      const uint64_t t = now_ns();
      if (t >= next_liveness_ns_) {
        next_liveness_ns_ = t + options_.liveness_period_ns;
        if (Status st = liveness_->check(); !st.ok()) {  // model: liveness
          scan_entries();  // a reaped child stores nothing more: what it finished is final
          poison(st);
        }
      }
      if (!poisoned_ && options_.run_deadline_ns != 0) {
        for (uint32_t i : held_) {
          const EntryRecord& r = entries_[i];
          if (r.staged || t - r.published_ns < options_.run_deadline_ns) continue;
          const std::string why =
              fmt::format("child hung: run {} had no terminal {} ms after publication; child killed", r.run_id,
                          options_.run_deadline_ns / 1'000'000);
          liveness_->kill(why);  // model: liveness (killed and reaped: from here on, a death)
          scan_entries();
          poison(make_error(StatusCode::kDeadlineExceeded, "{}", why));
          break;
        }
      }
    }
  }
  for (EndpointEvent& ev : pending_) out.push_back(std::move(ev));
  pending_.clear();
}

bool MailboxEndpoint::wait(uint64_t deadline_ns) {
  Doorbell& bell = view_.control().parent_bell;
  const uint32_t seen = bell.arm();
  if (!pending_.empty()) return true;
  // A scan catches what was stored before `seen`; a ring after it ends the wait.
  for (uint32_t i : held_) {
    const MailboxRunEntry& e = view_.entry(i);
    if (mailbox_state_is_terminal(load_acquire(e.state)) ||
        (load_acquire(e.accepted) != 0 && !entries_[i].accepted_reported)) {
      return true;
    }
  }
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    if (frames_[f].busy && (load_acquire(view_.entry(frames_[f].entry).consumed_ack) == frames_[f].publication ||
                            load_acquire(view_.frame(f).header.ready) == kMailboxFrameRefused)) {
      return true;
    }
  }
  if (load_acquire(view_.control().endpoint_state) >= kEndpointStopped) return true;
  return spin_then_park(
      bell, [&] { return bell.arm() != seen; }, options_.spin, bounded(deadline_ns, options_.liveness_period_ns));
}

void MailboxEndpoint::poison(const Status& cause) {
  if (poisoned_) return;
  poisoned_ = cause;
  for (uint32_t i : held_) {
    EntryRecord& r = entries_[i];
    EndpointEvent ev;
    ev.run_id = r.run_id;
    ev.dispatch_id = r.dispatch_id;
    ev.task_slot = r.task_slot;
    ev.entry = i;
    const bool accepted = load_acquire(view_.entry(i).accepted) != 0;
    if (accepted && !r.accepted_reported) {
      ev.kind = EndpointEvent::Kind::kAccepted;
      pending_.push_back(ev);
    }
    ev.kind = EndpointEvent::Kind::kTerminal;
    ev.status = cause;
    ev.accepted = accepted;
    ev.endpoint_failure = true;
    pending_.push_back(ev);
    release(i);
  }
  held_.clear();
  for (FrameRecord& fr : frames_) fr.busy = false;
}

void MailboxEndpoint::request_shutdown() {
  shutdown_ = true;
  store_release(view_.control().shutdown, 1u);  // model: request_shutdown
  view_.control().child_bell.ring();
}

Result<ControlReply> MailboxEndpoint::command(MailboxControlOp op, std::initializer_list<uint64_t> args,
                                              std::span<const uint8_t> in, std::span<uint8_t> out, uint64_t deadline_ns,
                                              uint64_t registration, uint64_t* served) {
  std::lock_guard<std::mutex> lock(control_mu_);
  const uint64_t current = registration_.load(std::memory_order_relaxed);
  if (registration != 0 && registration != current) {
    return make_error(StatusCode::kAborted,
                      "the child this address belongs to is gone: the mailbox now serves its replacement");
  }
  if (served != nullptr) *served = current;
  ControlFrame& c = view_.control();
  if (in.size() > kControlDataCapacity)
    return invalid_argument("control payload of {} B exceeds {} B", in.size(), kControlDataCapacity);
  // Waits for the child's reply to command `seq`; the child stopping, its
  // death (the liveness check) or the deadline end the wait.
  const auto await_reply = [&](uint64_t seq, const char* unanswered) -> Status {
    const auto replied = [&] { return load_acquire(c.reply_seq) == seq; };
    const auto stopped = [&] { return load_acquire(c.endpoint_state) >= kEndpointStopped; };
    for (;;) {
      spin_then_park(
          c.parent_bell, [&] { return replied() || stopped(); }, options_.spin,
          bounded(deadline_ns, options_.liveness_period_ns));
      if (replied()) return Status();
      if (stopped()) {
        return make_error(StatusCode::kAborted, "the child stopped serving: {}",
                          read_text(c.stop_reason, sizeof c.stop_reason));
      }
      if (liveness_ != nullptr) {
        SIMPLER_RETURN_IF_ERROR(liveness_->check());
      }
      if (deadline_ns != 0 && now_ns() >= deadline_ns) {
        return make_error(StatusCode::kDeadlineExceeded, "control command {} {}", static_cast<uint32_t>(op),
                          unanswered);
      }
    }
  };
  // The frame holds one command: while the child may still serve one that
  // timed out here, writing the next would mix its input with that one's
  // reply. Its reply comes first, within this deadline, or nothing is sent.
  SIMPLER_RETURN_IF_ERROR(
      await_reply(cmd_seq_, "was not sent: the child still serves the command before it, which timed out"));
  if (!in.empty()) std::memcpy(c.data, in.data(), in.size());
  store_relaxed(c.cmd_op, static_cast<uint32_t>(op));
  size_t k = 0;
  for (uint64_t a : args) store_relaxed(c.cmd_args[k++], a);
  store_relaxed(c.cmd_data_bytes, static_cast<uint32_t>(in.size()));
  const uint64_t seq = ++cmd_seq_;
  store_release(c.cmd_seq, seq);
  c.child_bell.ring();
  SIMPLER_RETURN_IF_ERROR(await_reply(seq, "got no reply"));
  const int32_t code = load_relaxed(c.reply_code);
  if (code != 0) return status_from_wire(code, read_text(c.reply_text, sizeof c.reply_text));
  ControlReply reply;
  reply.value = load_relaxed(c.reply_value);
  reply.data_bytes = std::min<uint32_t>(load_relaxed(c.reply_data_bytes), static_cast<uint32_t>(out.size()));
  if (reply.data_bytes != 0) std::memcpy(out.data(), c.data, reply.data_bytes);
  return reply;
}

Result<uint64_t> MailboxEndpoint::control_malloc(uint64_t bytes, uint64_t deadline_ns, uint64_t* served) {
  SIMPLER_ASSIGN_OR_RETURN(const ControlReply r, command(kCtrlMalloc, {bytes}, {}, {}, deadline_ns, 0, served));
  return r.value;
}

Status MailboxEndpoint::control_free(uint64_t addr, uint64_t deadline_ns, uint64_t registration) {
  return command(kCtrlFree, {addr}, {}, {}, deadline_ns, registration).status();
}

Status MailboxEndpoint::control_copy_to(uint64_t addr, uint64_t offset, std::span<const uint8_t> bytes,
                                        uint64_t deadline_ns, uint64_t registration) {
  for (size_t done = 0; done < bytes.size();) {
    const size_t n = std::min(bytes.size() - done, kControlDataCapacity);
    SIMPLER_RETURN_IF_ERROR(
        command(kCtrlCopyTo, {addr, offset + done, n}, bytes.subspan(done, n), {}, deadline_ns, registration).status());
    done += n;
  }
  return Status();
}

Status MailboxEndpoint::control_copy_from(uint64_t addr, uint64_t offset, std::span<uint8_t> out, uint64_t deadline_ns,
                                          uint64_t registration) {
  for (size_t done = 0; done < out.size();) {
    const size_t n = std::min(out.size() - done, kControlDataCapacity);
    SIMPLER_ASSIGN_OR_RETURN(const ControlReply r, command(kCtrlCopyFrom, {addr, offset + done, n}, {},
                                                           out.subspan(done, n), deadline_ns, registration));
    if (r.data_bytes != n) return internal_error("copy_from returned {} of {} bytes", r.data_bytes, n);
    done += n;
  }
  return Status();
}

Result<DeviceMemoryReport> MailboxEndpoint::control_memory_info(uint64_t deadline_ns) {
  uint8_t data[sizeof(uint64_t)];
  SIMPLER_ASSIGN_OR_RETURN(const ControlReply r, command(kCtrlMemoryInfo, {}, {}, data, deadline_ns));
  if (r.data_bytes != sizeof data) {
    return internal_error("memory info reply carries {} data bytes, expected {}", r.data_bytes, sizeof data);
  }
  DeviceMemoryReport m;
  m.total_bytes = r.value;
  std::memcpy(&m.free_bytes, data, sizeof data);
  if (m.free_bytes > m.total_bytes) {
    return internal_error("the child reports {} free of {} total device bytes", m.free_bytes, m.total_bytes);
  }
  return m;
}

}  // namespace simpler
