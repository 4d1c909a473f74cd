#include "ipc/mailbox_child.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/errors.h"
#include "ipc/request_header.h"

// `// model: <step>` marks each store or load of the hand-off that
// tests/model/mailbox.pml checks as that step; change both together.

namespace simpler {

namespace {
// A request frame's ready word says the parent published a run in it.
bool request_ready(uint32_t word) { return word == kMailboxTaskReady || word == kMailboxPrepareReady; }
}  // namespace

void RunTicket::accepted() const { child_->accept(entry_, generation_); }

void RunTicket::complete(const Status& result, MailboxDisposition disposition) const {
  child_->complete(entry_, generation_, result, disposition);
}

void RunTicket::hold_set(uint32_t slot) const { child_->hold_set(entry_, generation_, slot); }

Result<ControlReply> RunHandler::control(const ControlCommand& cmd, uint8_t*, uint32_t, uint32_t) {
  return make_error(StatusCode::kUnimplemented, "control command {} is not served by this child", cmd.op);
}

Result<ControlReply> memory_info_reply(uint64_t total_bytes, uint64_t free_bytes, uint8_t* data, uint32_t capacity) {
  if (capacity < sizeof free_bytes) return internal_error("no room for the memory info reply");
  std::memcpy(data, &free_bytes, sizeof free_bytes);
  ControlReply reply;
  reply.value = total_bytes;
  reply.data_bytes = sizeof free_bytes;
  return reply;
}

MailboxChild::MailboxChild(MailboxView view, RunHandler& handler, ChildOptions options)
    : view_(view),
      handler_(handler),
      options_(std::move(options)),
#ifdef SIMPLER_TEST_HOOKS
      checked_(view, /*fatal=*/true),
      stores_(options_.stores != nullptr ? options_.stores : &checked_),
#else
      stores_(options_.stores != nullptr ? options_.stores : &plain_),
#endif
      command_data_(new uint8_t[kControlDataCapacity]) {
}

int MailboxChild::fail_init(const Status& why) {
  ControlFrame& c = view_.control();
  char text[sizeof c.init_error];
  copy_text(text, sizeof text, why.message());
  stores_->store_bytes(c.init_error, text, sizeof text);
  // The code travels beside the text, so the parent reports the failure as
  // what it is (a RESOURCE_EXHAUSTED device stays one), not as its own wrapper.
  stores_->store32(c.init_code, static_cast<uint32_t>(why.code()));
  stores_->store32(c.init_state, kInitFailed);
  ring_parent();
  return kChildExitInitFailed;
}

int MailboxChild::serve() {
  loop_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  ControlFrame& c = view_.control();
  if (load_acquire(c.magic) != kMailboxMagic || load_acquire(c.version) != kMailboxProtocolVersion) {
    return fail_init(failed_precondition("mailbox magic {:#x} version {} is not {:#x} version {}",
                                         load_acquire(c.magic), load_acquire(c.version), kMailboxMagic,
                                         kMailboxProtocolVersion));
  }
  if (load_acquire(c.entry_count) != view_.entry_count()) {
    return fail_init(failed_precondition("mailbox has {} entries, this child expects {}", load_acquire(c.entry_count),
                                         view_.entry_count()));
  }
  const size_t theirs = std::min<size_t>(load_acquire(c.parent_wire_count), kMaxWireConstants);
  std::vector<WireConstant> wire = mailbox_wire_constants();
  if (std::string d = wire_disagreements(wire, c.parent_wire, theirs); !d.empty()) {
    return fail_init(failed_precondition("wire constants disagree with the parent:\n{}", d));
  }
  const bool loop_rung = handler_.attach_loop_bell(c.child_bell);
  if (Status st = handler_.init(); !st.ok()) return fail_init(st);
  const uint64_t grant = handler_.granted_sets();
  stores_->store32(c.child_grant, grant > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(grant));

  if (options_.perturb_wire) options_.perturb_wire(wire);
  const size_t n = std::min(wire.size(), kMaxWireConstants);
  stores_->store_bytes(c.child_wire, wire.data(), n * sizeof(WireConstant));
  stores_->store32(c.child_wire_count, static_cast<uint32_t>(n));
  // Read before INIT_READY: a command the parent posts the instant it sees
  // INIT_READY must not be mistaken for one already answered.
  handled_cmd_ = load_acquire(c.reply_seq);
  stores_->store32(c.endpoint_state, kEndpointServing);  // model: init_ready
  stores_->store32(c.init_state, kInitReady);
  ring_parent();

  std::string stop_reason;
  // The handler's own work is polled while the loop spins, and handed back
  // to it before the loop parks or ends, unless the handler rings the loop
  // for it: then it stays the loop's, parked or not.
  bool polling = false;
  const auto ready = [&] { return work_pending() || (polling && handler_.poll()); };
  const auto stop_polling = [&] {
    if (loop_rung) return;
    if (polling) handler_.stop_polling();
    polling = false;
  };
  for (;;) {
    polling = true;
    spin_then_park(c.child_bell, ready, options_.spin, 0, stop_polling);
    if (load_acquire(c.shutdown) != 0) break;  // model: see_shutdown
    if (const uint64_t seq = load_acquire(c.cmd_seq); seq != handled_cmd_) handled_cmd_ = serve_command(seq);
    // At most one take per frame between two looks at shutdown and commands.
    for (size_t n = 0; n < kMailboxRequestFrames; ++n) {
      const std::optional<ReadyFrame> r = oldest_ready_frame();
      if (!r) break;
      if (!take(r->frame, r->staged, stop_reason)) {
        stop_polling();
        return stop(stop_reason);
      }
    }
    serve_activations();
  }
  stop_polling();
  // After shutdown nothing activates a staged run: each ends unlaunched.
  while (!awaiting_.empty()) {
    end_staged(awaiting_.size() - 1, false,
               make_error(StatusCode::kAborted, "the child shut down before this staged run was activated"));
  }
  return exit_sweep();
}

bool MailboxChild::work_pending() const {
  const ControlFrame& c = view_.control();
  if (load_acquire(c.shutdown) != 0 || load_acquire(c.cmd_seq) != handled_cmd_) return true;
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    const uint32_t ready = load_acquire(view_.frame(f).header.ready);
    if (request_ready(ready)) return true;
  }
  for (const Awaiting& a : awaiting_) {
    const MailboxRunEntry& e = view_.entry(a.entry);
    if (load_acquire(e.activation) != 0 || load_acquire(e.entry_generation) != a.generation) return true;
  }
  return false;
}

// The parent fills whichever frame is free, so frame order is not
// publication order, and runs must reach the handler in the order they were
// published (a serial handler runs them in that order). The first scan only
// learns that some frame is ready; the second runs after that acquire, so it
// sees every frame published before the one seen (the parent published them
// earlier, one release after another): nothing older than its oldest is hidden.
std::optional<MailboxChild::ReadyFrame> MailboxChild::oldest_ready_frame() const {
  bool any = false;
  for (size_t f = 0; f < kMailboxRequestFrames && !any; ++f)
    any = request_ready(load_acquire(view_.frame(f).header.ready));
  if (!any) return std::nullopt;
  std::optional<ReadyFrame> oldest;
  uint64_t oldest_publication = 0;
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    const RequestHeader& h = view_.frame(f).header;
    const uint32_t ready = load_acquire(h.ready);  // model: take_ready
    if (!request_ready(ready)) continue;
    const uint64_t publication = load_relaxed(h.publication);
    if (!oldest || publication < oldest_publication) {
      oldest = ReadyFrame{f, ready == kMailboxPrepareReady};
      oldest_publication = publication;
    }
  }
  return oldest;
}

bool MailboxChild::quiet() const {
  const ControlFrame& c = view_.control();
  if (!awaiting_.empty() || load_acquire(c.shutdown) != 0 || load_acquire(c.cmd_seq) != handled_cmd_) return false;
  for (size_t f = 0; f < kMailboxRequestFrames; ++f) {
    const uint32_t ready = load_acquire(view_.frame(f).header.ready);
    if (request_ready(ready)) return false;
  }
  return true;
}

void MailboxChild::end_staged(size_t k, bool launch, const Status& why) {
  Awaiting a = std::move(awaiting_[k]);
  awaiting_.erase(awaiting_.begin() + static_cast<std::ptrdiff_t>(k));
  RunTicket ticket(this, a.entry, a.generation);
  if (!a.held) {
    handler_.activate(a.entry, a.generation, launch);  // the native stager ends a cancelled run through its ticket
  } else if (launch) {
    a.held->staged = false;
    handler_.start(std::move(*a.held), ticket);
  } else {
    ticket.complete(why);
  }
}

void MailboxChild::serve_activations() {
  for (size_t k = 0; k < awaiting_.size();) {
    const MailboxRunEntry& e = view_.entry(awaiting_[k].entry);
    const uint32_t word = load_acquire(e.activation);  // model: serve_activation
    if (load_acquire(e.entry_generation) != awaiting_[k].generation) {
      // The parent released the entry without a terminal (it gave the run
      // one of its own): nothing will activate it.
      end_staged(k, false, make_error(StatusCode::kAborted, "the parent released this staged run"));
    } else if (word == kMailboxActivate) {
      end_staged(k, true, Status());
    } else if (word == kMailboxCancel) {
      end_staged(k, false, make_error(StatusCode::kAborted, "cancelled before activation"));
    } else if (word != 0) {
      end_staged(k, false, invalid_argument("unknown activation word {} for a staged run", word));
    } else {
      ++k;
    }
  }
}

uint64_t MailboxChild::serve_command(uint64_t seq) {
  ControlFrame& c = view_.control();
  ControlCommand cmd;
  cmd.op = static_cast<MailboxControlOp>(load_relaxed(c.cmd_op));
  for (size_t i = 0; i < 4; ++i) cmd.args[i] = load_relaxed(c.cmd_args[i]);
  const uint32_t in_bytes = std::min<uint32_t>(load_relaxed(c.cmd_data_bytes), kControlDataCapacity);
  // The handler works on a private copy so that every store to the frame
  // still goes through the store primitive.
  uint8_t* data = command_data_.get();
  std::memcpy(data, c.data, in_bytes);
  auto r = handler_.control(cmd, data, in_bytes, kControlDataCapacity);
  char text[kMailboxErrorTextSize];
  if (r.ok()) {
    const uint32_t out = std::min<uint32_t>(r->data_bytes, kControlDataCapacity);
    stores_->store_bytes(c.data, data, out);
    stores_->store64(c.reply_value, r->value);
    stores_->store32(c.reply_data_bytes, out);
    copy_text(text, sizeof text, "");
    stores_->store32(reinterpret_cast<uint32_t&>(c.reply_code), 0);
  } else {
    stores_->store64(c.reply_value, 0);
    stores_->store32(c.reply_data_bytes, 0);
    copy_text(text, sizeof text, r.status().message());
    stores_->store32(reinterpret_cast<uint32_t&>(c.reply_code), static_cast<uint32_t>(r.status().code()));
  }
  stores_->store_bytes(c.reply_text, text, sizeof text);
  stores_->store64(c.reply_seq, seq);
  ring_parent();
  return seq;
}

bool MailboxChild::take(size_t f, bool staged, std::string& stop_reason) {
  RequestFrame& fr = view_.frame(f);
  RequestHeader& h = fr.header;
  // model: take_publication, take_header, check_generation (decode_request_header).
  const DecodedHeader d = decode_request_header(load_request_header(h), view_);
  switch (d.verdict) {
    case HeaderVerdict::kUnattributable:
      stop_reason = fmt::format("unattributable request header in frame {}: {}", f, d.why.message());
      return false;
    case HeaderVerdict::kRefused:
      // The entry belongs to someone else, or already got its request: the
      // frame word is the only store, and the parent resolves the run.
      stores_->store32(h.ready, kMailboxFrameRefused);  // model: refuse_stale
      ring_parent();
      return true;
    case HeaderVerdict::kMalformed:
    case HeaderVerdict::kAccepted:
      break;
  }
  const uint64_t publication = d.publication;
  const uint64_t generation = d.fields.entry_generation;
  MailboxRunEntry& e = view_.entry(d.fields.entry_index);
  RunRequest req;
  req.entry_index = static_cast<uint32_t>(d.fields.entry_index);
  req.entry_generation = generation;
  req.publication = publication;
  req.run_id = d.fields.run_id;
  req.dispatch_id = d.fields.dispatch_id;
  req.task_slot = d.fields.task_slot;
  req.staged = staged;
  const Status& malformed = d.why;
  if (d.verdict == HeaderVerdict::kAccepted) {
    std::memcpy(req.callable.data(), fr.callable_digest, req.callable.size());  // model: copy
    req.config.assign(fr.config, fr.config + d.fields.config_bytes);
    req.args_blob.assign(fr.args, fr.args + d.fields.args_bytes);
  }
#ifdef SIMPLER_TEST_HOOKS
  // H5: read with the copy, counted only once the recheck proves the copy ours.
  const bool identity_checked = d.verdict == HeaderVerdict::kAccepted && identity_fits(d.fields.args_bytes);
  const bool identity_ok = identity_checked && identity_matches(fr.args + d.fields.args_bytes, req.run_id,
                                                                req.dispatch_id, req.config.data(), req.config.size(),
                                                                req.args_blob.data(), req.args_blob.size());
#endif
  std::atomic_thread_fence(std::memory_order_acquire);
  // model: recheck
  if (load_relaxed(h.publication) != publication) return true;  // rewritten under the copy: not ours to ACK
#ifdef SIMPLER_TEST_HOOKS
  if (identity_checked) count_identity(identity_ok);
#endif

  req.run_epoch = next_epoch_++;
  {
    std::lock_guard<std::mutex> lock(mu_);
    owed_[req.entry_index] = Owed{generation, false, false};
  }
  stores_->store64(e.run_epoch, req.run_epoch);  // model: stage
  stores_->store32(e.state, kMailboxFrameStaged);
  stores_->store32(h.ready, kMailboxIdle);        // model: frame_idle
  stores_->store64(e.consumed_ack, publication);  // model: ack. The last store of this frame's hand-off
  const bool try_inline = malformed.ok() && !staged;
  // A run tried on the loop rings for its ACCEPTED (or its terminal) within
  // the inline budget, and one wake shows a parked parent both stores: its
  // ACK rings only if nothing rang by the time the loop is back.
  const uint64_t rings = loop_rings_;
  if (!try_inline) ring_parent();

  RunTicket ticket(this, req.entry_index, generation);
  if (!malformed.ok()) {
    ticket.complete(malformed);
  } else if (!staged) {
    // Asked after the ACK: a frame the parent fills during an inline run is
    // taken by the next pass, only later.
    if (handler_.try_run_inline(req, ticket, quiet())) {
      if (loop_rings_ == rings) ring_parent();
    } else {
      ring_parent();
      handler_.start(std::move(req), ticket);
    }
  } else if (handler_.stages_natively()) {
    awaiting_.push_back(Awaiting{req.entry_index, generation, std::nullopt});
    handler_.start(std::move(req), ticket);
  } else {
    const uint32_t entry = req.entry_index;
    awaiting_.push_back(Awaiting{entry, generation, std::move(req)});
  }
  // An ACTIVATE written before this take is served on the same pass.
  return true;
}

void MailboxChild::accept(uint32_t entry, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owed_.find(entry);
  if (sealed_ || it == owed_.end() || it->second.generation != generation || it->second.accepted) return;
  it->second.accepted = true;
  MailboxRunEntry& e = view_.entry(entry);
  stores_->store32(e.accepted, 1);
  stores_->store32(e.state, kMailboxTaskLaunched);
  ring_parent();
}

void MailboxChild::hold_set(uint32_t entry, uint64_t generation, uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owed_.find(entry);
  if (sealed_ || it == owed_.end() || it->second.generation != generation) return;
  stores_->store32(view_.entry(entry).set_slot, slot);
}

void MailboxChild::complete(uint32_t entry, uint64_t generation, const Status& result, MailboxDisposition disposition) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owed_.find(entry);
  if (sealed_ || it == owed_.end() || it->second.generation != generation) return;
  owed_.erase(it);
  MailboxRunEntry& e = view_.entry(entry);
  // The parent released the entry without waiting (it poisoned the endpoint
  // and gave the run a terminal of its own): the entry is no longer this run's.
  if (load_acquire(e.entry_generation) != generation) return;  // model: complete_generation
  char text[kMailboxErrorTextSize];
  copy_text(text, sizeof text, result.message());
  stores_->store32(reinterpret_cast<uint32_t&>(e.rc), static_cast<uint32_t>(result.code()));  // model: complete_rc
  stores_->store_bytes(e.error_text, text, sizeof text);
  stores_->store32(e.disposition, disposition);
  stores_->store32(e.state, result.ok() ? kMailboxTaskDone : kMailboxTaskFailed);  // model: terminal, the last store
  ring_parent();
}

int MailboxChild::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sealed_ = true;  // from here on no entry is stored into: the parent owns every held run's terminal
  }
  ControlFrame& c = view_.control();
  char text[kMailboxErrorTextSize];
  copy_text(text, sizeof text, reason);
  stores_->store_bytes(c.stop_reason, text, sizeof text);
  stores_->store32(c.endpoint_state, kEndpointStopped);  // model: stop
  ring_parent();
  return kChildExitEndpointStopped;
}

int MailboxChild::exit_sweep() {
  handler_.drain(now_ns() + options_.drain_timeout_ns);
  {
    std::lock_guard<std::mutex> lock(mu_);
    sealed_ = true;
    char text[kMailboxErrorTextSize];
    copy_text(text, sizeof text, "the child shut down before this run reached its terminal");
    // Keyed on parity, not state: a run published but never staged reads IDLE
    // and is owed a terminal all the same (R11).
    for (uint64_t i = 0; i < view_.entry_count(); ++i) {
      MailboxRunEntry& e = view_.entry(i);
      // model: sweep
      if (load_acquire(e.entry_generation) % 2 == 0 || mailbox_state_is_terminal(load_acquire(e.state))) continue;
      stores_->store32(reinterpret_cast<uint32_t&>(e.rc), static_cast<uint32_t>(StatusCode::kAborted));
      stores_->store_bytes(e.error_text, text, sizeof text);
      stores_->store32(e.state, kMailboxEndpointFailed);
    }
    owed_.clear();
  }
  stores_->store32(view_.control().endpoint_state, kEndpointExited);  // model: exited
  ring_parent();
  return kChildExitClean;
}

}  // namespace simpler
