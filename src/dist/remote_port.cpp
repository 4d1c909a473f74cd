#include "dist/remote_port.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "base/errors.h"
#include "diag/call_config.h"
#include "dist/mpi_io.h"
#include "task/args_blob.h"

namespace simpler::dist {

namespace {

std::atomic<uint64_t> g_stale_replies{0};
std::atomic<uint64_t> g_stand_in_handbacks{0};

uint64_t ms_to_ns(std::chrono::milliseconds ms) { return static_cast<uint64_t>(ms.count()) * 1'000'000ull; }

constexpr int kClockPings = 4;  // at start; the one with the shortest round trip counts
constexpr size_t kPingsRemembered = 8;
constexpr size_t kNotesKept = 1024;  // shipment notes no traced run took (dump-only runs)

// Time for `bytes` of tensor data to arrive once their terminal did: the
// heartbeat bound plus a floor rate of 100 MB/s.
uint64_t transfer_deadline(uint64_t timeout_ns, uint64_t bytes) { return now_ns() + timeout_ns + bytes * 10; }

}  // namespace

// Sends in flight that outlive the call that posted them; under mu_.
struct RemotePortSends {
  std::vector<Posted> control;
  // Input chunks of entries that ended before their sends completed, with
  // a hold on what they read.
  std::vector<std::pair<std::vector<MPI_Request>, std::shared_ptr<void>>> retired;
};

Result<std::unique_ptr<ExternalWorker>> RemotePort::start(int rank, RemoteNodeOptions options,
                                                          const ExternalContext& ctx) {
  SIMPLER_RETURN_IF_ERROR(ensure_mpi());
  int me = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank <= 0 || rank >= size || rank == me) {
    return invalid_argument("rank = {}: a remote node is served on a rank in [1, {}) other than this one ({})", rank,
                            size, me);
  }
  std::random_device rd;
  const uint64_t session = ((uint64_t{rd()} << 32) ^ rd() ^ now_ns()) | 1;
  MpiUse use;
  std::vector<Posted> posted;
  SIMPLER_RETURN_IF_ERROR(
      post_control(rank, encode_simple(MsgKind::kHello, session, 0, 0, 0, 0, ctx.pipeline_depth), posted));
  const uint64_t deadline = now_ns() + ms_to_ns(options.ready_timeout);
  std::vector<uint8_t> buf;
  Backoff backoff(1'000'000);
  auto give_up = [&](Status why) {
    (void)post_control(rank, encode_simple(MsgKind::kShutdown, session, 0, 0, 0, 0), posted);
    const uint64_t until = now_ns() + 1'000'000'000ull;
    while (!posted.empty() && now_ns() < until) reap_posted(posted);
    bury_posted(posted);
    return why;
  };
  for (;;) {
    reap_posted(posted);
    SIMPLER_ASSIGN_OR_RETURN(const bool got, try_recv_control(rank, buf), "MPI rank {}", rank);
    if (got) break;
    if (now_ns() >= deadline) {
      return give_up(make_error(StatusCode::kDeadlineExceeded,
                                "MPI rank {} did not answer the network's hello within {} ms: is serve_node running "
                                "there?",
                                rank, options.ready_timeout.count()));
    }
    backoff.pause();
  }
  auto m = decode_message(buf);
  if (!m.ok()) {
    return give_up(
        Status(m.status().code(), fmt::format("MPI rank {} answered hello: {}", rank, m.status().message())));
  }
  if (m->kind != MsgKind::kHelloReply || m->h.session != session) {
    return give_up(invalid_argument("MPI rank {} answered hello with {} for session {:#x}", rank,
                                    msg_kind_name(m->kind), m->h.session));
  }
  // R68: a node that resolves fewer sets than the network's depth fails init.
  if (m->h.value < ctx.pipeline_depth) {
    return give_up(failed_precondition(
        "remote node on MPI rank {} grants {} run sets, fewer than the network's pipeline_depth {} (R68)", rank,
        m->h.value, ctx.pipeline_depth));
  }
  for (const Digest& d : ctx.callables) {
    bool found = false;
    for (const Digest& e : m->digests) found |= e == d;
    if (!found) {
      return give_up(not_found(
          "remote node on MPI rank {} serves no NodeCallable with digest {}: register the same names on both sides",
          rank, digest_hex(d)));
    }
  }
  const uint64_t granted = std::min<uint64_t>(m->h.value, kWireMaxEntries);
  // The node's clock against this one before any run: a few ping-pongs (the
  // node sends only heartbeats until it has a request); the shortest counts.
  ClockEstimate clock;
  for (int i = 0; i < kClockPings; ++i) {
    const uint64_t sent = now_ns();
    SIMPLER_RETURN_IF_ERROR(post_control(rank, encode_simple(MsgKind::kClockPing, session, 0, 0, 0, 0, sent), posted));
    for (;;) {
      reap_posted(posted);
      SIMPLER_ASSIGN_OR_RETURN(const bool got_pong, try_recv_control(rank, buf), "MPI rank {}", rank);
      if (got_pong) {
        const uint64_t back = now_ns();
        auto p = decode_message(buf);
        if (!p.ok()) {
          return give_up(Status(p.status().code(), fmt::format("MPI rank {}: {}", rank, p.status().message())));
        }
        if (p->kind == MsgKind::kHeartbeat) continue;
        if (p->kind != MsgKind::kClockPong || p->h.session != session || p->h.dispatch_id != sent) {
          return give_up(invalid_argument("MPI rank {} answered a clock ping with {}", rank, msg_kind_name(p->kind)));
        }
        const uint64_t rtt = back - sent;
        if (clock.rtt_ns == 0 || rtt < clock.rtt_ns) {
          clock.rtt_ns = rtt;
          clock.offset_ns = static_cast<int64_t>(sent + rtt / 2) - static_cast<int64_t>(p->h.value);
        }
        break;
      }
      if (now_ns() >= deadline) {
        return give_up(make_error(StatusCode::kDeadlineExceeded, "MPI rank {} answered no clock ping within {} ms",
                                  rank, options.ready_timeout.count()));
      }
      backoff.pause();
    }
  }
  while (!posted.empty() && now_ns() < deadline) reap_posted(posted);
  std::unique_ptr<RemotePort> port(new RemotePort(rank, options, ctx, session, granted));
  port->clock_ = clock;
  port->best_rtt_ns_ = clock.rtt_ns;
  port->receiver_ = std::thread([p = port.get()] { p->receive_loop(); });
  return std::unique_ptr<ExternalWorker>(std::move(port));
}

RemotePort::RemotePort(int rank, RemoteNodeOptions options, const ExternalContext& ctx, uint64_t session,
                       uint64_t granted)
    : rank_(rank),
      options_(options),
      ctx_(ctx),
      session_(session),
      entries_(granted),
      sends_(new RemotePortSends),
      stand_in_grace_ns_(hooks::forced_stand_in_grace() != 0 ? hooks::forced_stand_in_grace() : kStandInGraceNs) {
  for (uint64_t i = granted; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
  free_count_.store(static_cast<uint32_t>(free_.size()));
  last_heard_ns_.store(now_ns());
}

RemotePort::~RemotePort() { (void)close(now_ns() + 5'000'000'000ull); }

uint64_t RemotePort::stale_replies() { return g_stale_replies.load(std::memory_order_relaxed); }

uint64_t RemotePort::stand_in_handbacks() { return g_stand_in_handbacks.load(std::memory_order_relaxed); }

std::string RemotePort::who() const { return fmt::format("remote node on MPI rank {}", rank_); }

uint32_t RemotePort::available_request_transport() { return free_count_.load(std::memory_order_acquire); }

std::optional<Status> RemotePort::poisoned() const {
  // Without mu_, which the receiver holds while output bytes arrive: the
  // cause is written once, before the flag.
  if (!stopped_.load(std::memory_order_acquire)) return std::nullopt;
  return poisoned_;
}

Result<Publication> RemotePort::publish(const PublishSpec& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (poisoned_) return *poisoned_;
  SIMPLER_ASSIGN_OR_RETURN(const TaskArgs args, decode_args_blob(spec.args_blob.data(), spec.args_blob.size()), "{}",
                           who());
  SIMPLER_ASSIGN_OR_RETURN(TensorPlan plan, plan_tensors(args), "{}", who());
  // Where the node's files for this task go: where a forked node would write them.
  std::string files_dir;
  if (spec.config.size() > kWireMaxConfig) {
    return invalid_argument("{}: a CallConfig of {} bytes exceeds {}", who(), spec.config.size(), kWireMaxConfig);
  }
  if (!spec.config.empty()) {
    SIMPLER_ASSIGN_OR_RETURN(const diag::ChildCallConfig c,
                             diag::decode_call_config(spec.config.data(), spec.config.size()), "{}", who());
    if (c.call.swimlane_level > 0 || c.call.dump_args != DumpArgs::Off) {
      files_dir = diag::child_trace_dir(c.call.trace_dir, "node", c.child_index, spec.task_slot);
    }
  }
  for (const TensorRow& r : plan.rows) {
    if (!ctx_.shared.contains(r.addr, r.buffer_bytes)) {
      return out_of_range("{}: buffer {:#x}+{} is not in the network's shared heap, the only memory sent to a node",
                          who(), r.addr, r.buffer_bytes);
    }
  }
  if (free_.empty()) {
    poison_locked(internal_error("{}: a task was published with every entry held", who()));
    return internal_error("{}: no free entry; the endpoint is poisoned", who());
  }
  const uint32_t e = free_.back();
  free_.pop_back();
  free_count_.store(static_cast<uint32_t>(free_.size()), std::memory_order_release);
  Entry& en = entries_[e];
  ++en.id.generation;  // odd: occupied (R7)
  en.id.run_epoch = 0;
  en.held = true;
  en.staged = spec.staged;
  en.accepted_reported = false;
  en.run_id = spec.run_id;
  en.dispatch_id = spec.dispatch_id;
  en.task_slot = spec.task_slot;
  en.published_ns = now_ns();
  en.plan = std::move(plan);
  en.files_dir = files_dir;
  en.shipment = Shipment{};
  en.request = encode_request(session_, e, en.id.generation, spec.dispatch_id, spec.callable, en.plan.rows,
                              spec.args_blob, spec.config);
  if (!spec.staged) {
    if (Status st = send_request(e); !st.ok()) {
      // Not live: the entry goes back unreported, and the endpoint stops.
      en.held = false;
      ++en.id.generation;
      free_.push_back(e);
      poison_locked(st);
      return st;
    }
  }
  return Publication{0, e, en.id.generation, ++next_publication_};
}

Status RemotePort::send_request(uint32_t e) {
  Entry& en = entries_[e];
  MPI_Request r;
  if (in_mpi([&] {
        return MPI_Isend(en.request.data(), static_cast<int>(en.request.size()), MPI_BYTE, rank_, kTagControl,
                         MPI_COMM_WORLD, &r);
      }) != MPI_SUCCESS) {
    return internal_error("{}: MPI_Isend of a request failed", who());
  }
  en.sends.push_back(r);
  for (const TensorRow& row : en.plan.rows) {
    if ((row.flags & kToNode) == 0) continue;
    SIMPLER_RETURN_IF_ERROR(post_chunks(rank_, kTagDataBase + static_cast<int>(e),
                                        reinterpret_cast<const uint8_t*>(row.addr + row.offset), row.bytes, en.sends),
                            "{}", who());
  }
  // A waiter standing in receives the answer; waking this thread would
  // cost it a hand-off per run on a shared core.
  const uint64_t stand_in = stand_in_ns_.load(std::memory_order_acquire);
  if (stand_in == 0 || now_ns() >= stand_in + stand_in_grace_ns_) receive_backoff_.wake();
  return Status();
}

Status RemotePort::activate(const Publication& p, bool launch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (poisoned_) return *poisoned_;
  if (p.entry >= entries_.size() || !entries_[p.entry].held || entries_[p.entry].id.generation != p.entry_generation ||
      !entries_[p.entry].staged) {
    return failed_precondition("{}: entry {} generation {} holds no staged run", who(), p.entry, p.entry_generation);
  }
  Entry& en = entries_[p.entry];
  en.staged = false;
  if (!launch) {
    finish(p.entry, make_error(StatusCode::kAborted, "cancelled before activation"), false);
    if (ctx_.bell != nullptr) ctx_.bell->ring();
    return Status();
  }
  en.published_ns = now_ns();  // the deadline counts from here, as at a mailbox's ACTIVATE
  if (Status st = send_request(p.entry); !st.ok()) {
    poison_locked(st);
    return st;
  }
  return Status();
}

EndpointEvent RemotePort::event_of(uint32_t e, EndpointEvent::Kind kind) const {
  const Entry& en = entries_[e];
  EndpointEvent ev;
  ev.kind = kind;
  ev.run_id = en.run_id;
  ev.dispatch_id = en.dispatch_id;
  ev.task_slot = en.task_slot;
  ev.entry = e;
  return ev;
}

void RemotePort::finish(uint32_t e, const Status& status, bool endpoint_failure) {
  Entry& en = entries_[e];
  EndpointEvent ev = event_of(e, EndpointEvent::Kind::kTerminal);
  ev.status = status;
  ev.disposition = kDispositionNativePrepared;
  ev.accepted = en.accepted_reported;
  ev.endpoint_failure = endpoint_failure;
  pending_.push_back(std::move(ev));
  settle_shipment(en, endpoint_failure, status);
  if (!en.sends.empty()) {
    // What the sends read outlives them: the request's bytes and the input
    // rows' blocks. A silent peer may never complete them.
    std::vector<std::shared_ptr<void>> holds{std::make_shared<std::vector<uint8_t>>(std::move(en.request))};
    for (const TensorRow& row : en.plan.rows) {
      if ((row.flags & kToNode) != 0) holds.push_back(ctx_.hold_shared(row.addr, false));
    }
    if (endpoint_failure) {
      Graveyard::instance().bury(en.sends, hold_all(std::move(holds)));
    } else {
      sends_->retired.emplace_back(std::move(en.sends), hold_all(std::move(holds)));
      en.sends.clear();
    }
  }
  en.held = false;
  en.staged = false;
  en.plan = {};
  ++en.id.generation;  // even: free
  en.id.run_epoch = 0;
  free_.push_back(e);
  free_count_.store(poisoned_ ? 0 : static_cast<uint32_t>(free_.size()), std::memory_order_release);
}

void RemotePort::poison_locked(const Status& cause) {
  if (poisoned_) return;
  poisoned_ = cause;
  stopped_.store(true, std::memory_order_release);
  free_count_.store(0, std::memory_order_release);
  for (uint32_t e = 0; e < entries_.size(); ++e) {
    if (entries_[e].held) finish(e, cause, true);
  }
  free_count_.store(0, std::memory_order_release);
  memory_cv_.notify_all();
  if (ctx_.bell != nullptr) ctx_.bell->ring();
}

void RemotePort::poison(const Status& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  poison_locked(cause);
}

void RemotePort::poll(std::vector<EndpointEvent>& out) {
  // The receiver may hold the lock while tensor bytes arrive; it rings the
  // bell when done, so this poll need not wait for it.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (Entry& en : entries_) {
    if (!en.sends.empty()) (void)test_all(en.sends);
  }
  auto& retired = sends_->retired;
  for (size_t i = 0; i < retired.size();) {
    if (test_all(retired[i].first)) {
      retired.erase(retired.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (!poisoned_ && ctx_.run_deadline_ns != 0) {
    const uint64_t now = now_ns();
    for (uint32_t e = 0; e < entries_.size(); ++e) {
      const Entry& en = entries_[e];
      if (en.held && !en.staged && now - en.published_ns > ctx_.run_deadline_ns) {
        poison_locked(make_error(StatusCode::kDeadlineExceeded,
                                 "{}: task {} had no terminal {} ms after its publication (run_timeout); the node "
                                 "is presumed hung and takes no more work",
                                 who(), en.dispatch_id, ctx_.run_deadline_ns / 1'000'000ull));
        break;
      }
    }
  }
  out.insert(out.end(), pending_.begin(), pending_.end());
  pending_.clear();
}

void RemotePort::receive_loop() {
  const uint64_t timeout_ns = ms_to_ns(options_.heartbeat_timeout);
  const uint64_t period_ns = std::max<uint64_t>(timeout_ns / 10, 1'000'000);
  uint64_t next_beat = 0;
  while (!stop_.load() && !mpi_finalizing()) {
    Graveyard::instance().sweep();
    const uint64_t now = now_ns();
    if (now >= next_beat) {
      std::lock_guard<std::mutex> lock(mu_);
      reap_posted(sends_->control);
      // One heartbeat in flight at most: a dead peer never completes one.
      if (!poisoned_ && sends_->control.size() < 4) {
        (void)post_control(rank_, encode_simple(MsgKind::kHeartbeat, session_, 0, 0, 0, 0), sends_->control);
        // A clock ping rides with each heartbeat, so the estimate follows a drift.
        const uint64_t sent = now_ns();
        {
          std::lock_guard<std::mutex> clock_lock(note_mu_);
          pings_.push_back(sent);
          if (pings_.size() > kPingsRemembered) pings_.erase(pings_.begin());
        }
        (void)post_control(rank_, encode_simple(MsgKind::kClockPing, session_, 0, 0, 0, 0, sent), sends_->control);
      }
      next_beat = now + period_ns;
    }
    // A waiter receiving for its run (receive_standing_in) does what this
    // thread would; on one CPU this thread's polls would cost it a hand-off
    // each, so it dozes until the stand-in stops or falls silent.
    const uint64_t stand_in = stand_in_ns_.load(std::memory_order_acquire);
    if (stand_in != 0 && now < stand_in + stand_in_grace_ns_) {
      check_silence(timeout_ns);
      receive_backoff_.doze(stand_in + stand_in_grace_ns_ - now);
      continue;
    }
    bool received = false, news = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received = receive_locked(1, news);
    }
    if (news && ctx_.bell != nullptr) ctx_.bell->ring();
    if (received) {
      receive_backoff_.news();
      continue;
    }
    check_silence(timeout_ns);
    const bool holding = free_count_.load(std::memory_order_acquire) < entries_.size();
    receive_backoff_.set_max_sleep(holding ? kBusySleepNs : kIdleSleepNs);
    receive_backoff_.pause();
  }
}

bool RemotePort::receive_locked(uint32_t max_messages, bool& news) {
  bool received = false;
  for (uint32_t i = 0; i < max_messages; ++i) {
    Result<bool> got = try_recv_control(rank_, recv_buf_);
    if (got.ok() && !*got) break;
    received = true;
    last_heard_ns_.store(now_ns());
    const size_t pending = pending_.size();
    if (!got.ok()) {
      poison_locked(make_error(StatusCode::kAborted, "{} broke the protocol, the endpoint stopped (R9): {}", who(),
                               got.status().message()));
    } else {
      handle(recv_buf_);
    }
    // Only a terminal gives the scheduler something to do (an ACCEPTED
    // rides in its terminal's `accepted`): waking it for a heartbeat, an
    // ACK or an ACCEPTED would cost a hand-off per message on a shared core.
    news = news || poisoned_.has_value() ||
           std::any_of(pending_.begin() + static_cast<std::ptrdiff_t>(pending), pending_.end(),
                       [](const EndpointEvent& ev) { return ev.kind == EndpointEvent::Kind::kTerminal; });
    if (poisoned_) break;
  }
  return received;
}

void RemotePort::receive_standing_in() {
  stand_in_ns_.store(now_ns(), std::memory_order_release);
  // Never behind the receiver's transfer of a large output: the next call looks again.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  bool news = false;
  (void)receive_locked(kStandInMessages, news);
  lock.unlock();
  if (news && ctx_.bell != nullptr) ctx_.bell->ring();
}

void RemotePort::stop_standing_in() {
  stand_in_ns_.store(0, std::memory_order_release);
  receive_backoff_.wake();
  g_stand_in_handbacks.fetch_add(1, std::memory_order_relaxed);
}

void RemotePort::check_silence(uint64_t timeout_ns) {
  // Read before the clock: a stand-in may store a later time meanwhile.
  const uint64_t heard = last_heard_ns_.load();
  const uint64_t now = now_ns();
  if (now <= heard || now - heard <= timeout_ns) return;
  std::lock_guard<std::mutex> lock(mu_);
  poison_locked(make_error(StatusCode::kAborted,
                           "{} sent nothing for {} ms (heartbeat_timeout): the rank is presumed dead", who(),
                           options_.heartbeat_timeout.count()));
}

void RemotePort::handle(const std::vector<uint8_t>& bytes) {
  if (poisoned_) return;  // the endpoint stopped: nothing from the rank is acted on
  auto m = decode_message(bytes);
  if (!m.ok()) {
    poison_locked(make_error(StatusCode::kAborted, "{} sent a malformed message, the endpoint stopped (R9): {}", who(),
                             m.status().message()));
    return;
  }
  switch (m->kind) {
    case MsgKind::kHeartbeat:
      return;
    case MsgKind::kClockPong:
      if (m->h.session == session_) clock_sample(m->h.dispatch_id, m->h.value, now_ns());
      return;
    case MsgKind::kStopped:
      poison_locked(make_error(StatusCode::kAborted, "{} stopped its endpoint: {}", who(), std::string(m->text)));
      return;
    case MsgKind::kMemoryReply:
      if (m->h.session == session_ && memory_query_) {
        uint64_t free_bytes = 0;
        std::memcpy(&free_bytes, m->payload.data(), sizeof free_bytes);
        memory_reply_ = std::make_pair(m->h.value, free_bytes);
        memory_cv_.notify_all();
      }
      return;
    case MsgKind::kAck:
    case MsgKind::kAccepted:
    case MsgKind::kTerminal:
    case MsgKind::kFiles:
      handle_reply(*m);
      return;
    default:
      poison_locked(make_error(StatusCode::kAborted, "{} sent {}, which a node never sends; the endpoint stopped (R9)",
                               who(), msg_kind_name(m->kind)));
  }
}

void RemotePort::handle_reply(const Message& m) {
  std::vector<EntryIdentity> ids(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) ids[i] = entries_[i].id;
  const Classified c = classify_reply(m, session_, ids);
  const uint32_t e = m.h.entry;
  const uint64_t timeout_ns = ms_to_ns(options_.heartbeat_timeout);
  if (c.verdict == Verdict::kStale) {
    // R8: a past occupant's reply changes nothing; its chunks are drained by
    // their own tag so they are never taken for the occupant's.
    g_stale_replies.fetch_add(1, std::memory_order_relaxed);
    if (m.kind == MsgKind::kFiles) return;  // its bytes rode in the message
    for (uint64_t bytes : m.sizes) {
      if (Status st = recv_chunks(rank_, kTagDataBase + static_cast<int>(e), nullptr, bytes,
                                  transfer_deadline(timeout_ns, bytes), {});
          !st.ok()) {
        poison_locked(
            make_error(StatusCode::kAborted, "{}: draining a stale TERMINAL's tensor bytes: {}", who(), st.message()));
        return;
      }
    }
    return;
  }
  if (c.verdict == Verdict::kUnattributable) {
    poison_locked(make_error(StatusCode::kAborted, "{} sent an unattributable message, the endpoint stopped (R9): {}",
                             who(), c.why.message()));
    return;
  }
  Entry& en = entries_[e];
  if (!en.held || en.staged) {
    poison_locked(make_error(StatusCode::kAborted,
                             "{} answered entry {} generation {}, to which no request was sent; the endpoint stopped",
                             who(), e, m.h.generation));
    return;
  }
  if (m.kind == MsgKind::kAck) {
    en.id.run_epoch = m.h.run_epoch;
    return;
  }
  if (m.kind == MsgKind::kFiles) {
    handle_file_chunk(en, m);
    return;
  }
  if (m.kind == MsgKind::kAccepted) {
    if (!en.accepted_reported) {
      en.accepted_reported = true;
      pending_.push_back(event_of(e, EndpointEvent::Kind::kAccepted));
    }
    return;
  }
  // TERMINAL: the outputs, at the addresses this side recorded, sized as it expects.
  if (m.h.status_code != 0) {
    finish(e, Status(static_cast<StatusCode>(m.h.status_code), fmt::format("{}: {}", who(), m.text)), false);
    return;
  }
  std::vector<size_t> outs;
  for (size_t k = 0; k < en.plan.rows.size(); ++k) {
    if ((en.plan.rows[k].flags & kFromNode) != 0) outs.push_back(k);
  }
  if (outs.size() != m.sizes.size()) {
    poison_locked(
        make_error(StatusCode::kAborted,
                   "{}: TERMINAL for entry {} returns {} buffers, the request expects {}; the endpoint stopped", who(),
                   e, m.sizes.size(), outs.size()));
    return;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (en.plan.rows[outs[i]].bytes != m.sizes[i]) {
      poison_locked(make_error(StatusCode::kAborted,
                               "{}: TERMINAL for entry {} returns {} bytes for output {}, the request expects {}; the "
                               "endpoint stopped",
                               who(), e, m.sizes[i], i, en.plan.rows[outs[i]].bytes));
      return;
    }
  }
  for (size_t k : outs) {
    if (Status st = receive_outputs(en.plan.rows[k], en.plan.writes[k], kTagDataBase + static_cast<int>(e),
                                    transfer_deadline(timeout_ns, en.plan.rows[k].bytes));
        !st.ok()) {
      poison_locked(
          make_error(StatusCode::kAborted, "{}: receiving task {}'s outputs: {}", who(), en.dispatch_id, st.message()));
      return;
    }
  }
  finish(e, Status(), false);
}

Status RemotePort::receive_outputs(const TensorRow& row, const std::vector<TensorView>& writes, int tag,
                                   uint64_t deadline_ns) {
  uint8_t* const base = reinterpret_cast<uint8_t*>(row.addr);
  // A receive MPI cannot cancel keeps its block from reuse (and from new
  // runs) until it completes.
  if (row_lands_in_place(row, writes)) {
    return recv_chunks(rank_, tag, base + row.offset, row.bytes, deadline_ns,
                       [&] { return ctx_.hold_shared(row.addr, true); });
  }
  // The row holds bytes this run did not write (an input view's, or between
  // strided elements) that a task beside it may be writing now: only the
  // written elements leave the staging buffer.
  staging_->resize(row.bytes);
  SIMPLER_RETURN_IF_ERROR(recv_chunks(rank_, tag, staging_->data(), row.bytes, deadline_ns, [this] {
    // Given up to the receive; this port never reuses it.
    return std::shared_ptr<void>(std::exchange(staging_, std::make_shared<std::vector<uint8_t>>()));
  }));
  scatter_writes(row, writes, staging_->data(), base);
  return Status();
}

void RemotePort::handle_file_chunk(Entry& en, const Message& m) {
  Shipment& s = en.shipment;
  if (!s.refused.empty()) return;  // the rest of a refused shipment is dropped as it comes
  const auto refuse = [&](const Status& why) {
    discard(en, fmt::format("{}: task {}'s files refused: {}", who(), en.dispatch_id, why.message()));
  };
  if (en.files_dir.empty()) return refuse(invalid_argument("FILES for a run that records nothing"));
  if (Status st = validate_file_chunk(m); !st.ok()) return refuse(st);
  if (s.files == 0) {
    s.files = m.h.tensor_count;
    s.bytes = m.h.value;
  } else if (s.files != m.h.tensor_count || s.bytes != m.h.value) {
    return refuse(invalid_argument("FILES: tensor_count {} / value {} differ from the shipment's first chunk ({} / {})",
                                   m.h.tensor_count, m.h.value, s.files, s.bytes));
  }
  auto [it, fresh] = s.by_index.try_emplace(m.file.file_index);
  Shipment::File& f = it->second;
  if (fresh) {
    for (const auto& [i, other] : s.by_index) {
      if (i != m.file.file_index && other.name == m.file_name) {
        return refuse(invalid_argument("FILES: name \"{}\" names files {} and {}", m.file_name, i, m.file.file_index));
      }
    }
    f.name = std::string(m.file_name);
    f.bytes = m.file.file_bytes;
    s.declared += f.bytes;
    if (s.declared > s.bytes) {
      return refuse(invalid_argument("FILES: file_bytes of the files sent so far ({}) exceed value, the shipment's {}",
                                     s.declared, s.bytes));
    }
  } else if (f.name != m.file_name || f.bytes != m.file.file_bytes) {
    return refuse(invalid_argument("FILES: file_index {} changed its name or file_bytes mid-file", m.file.file_index));
  }
  if (f.done) return refuse(invalid_argument("FILES: file \"{}\" got a chunk after its last byte", f.name));
  if (m.file.offset != f.received) {
    return refuse(invalid_argument("FILES: offset {} of \"{}\", expected {} (a file's chunks come in order)",
                                   m.file.offset, f.name, f.received));
  }
  const std::filesystem::path path = std::filesystem::path(en.files_dir) / f.name;
  if (f.out == nullptr) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    f.out = std::fopen((path.string() + ".part").c_str(), "wb");
    if (f.out == nullptr) return refuse(internal_error("{}: cannot create it", path.string()));
  }
  if (!m.file_data.empty() && std::fwrite(m.file_data.data(), 1, m.file_data.size(), f.out) != m.file_data.size()) {
    return refuse(internal_error("{}: write failed", path.string()));
  }
  f.received += m.file_data.size();
  if (f.received == f.bytes) {
    const bool closed = std::fclose(f.out) == 0;
    f.out = nullptr;
    std::error_code ec;
    if (closed) std::filesystem::rename(path.string() + ".part", path, ec);
    if (!closed || ec) return refuse(internal_error("{}: could not be completed", path.string()));
    f.done = true;
  }
}

void RemotePort::discard(Entry& en, const std::string& why) {
  Shipment& s = en.shipment;
  if (s.refused.empty()) s.refused = why;
  for (auto& [i, f] : s.by_index) {
    if (f.out != nullptr) std::fclose(f.out);
    f.out = nullptr;
    const std::filesystem::path path = std::filesystem::path(en.files_dir) / f.name;
    std::error_code ec;
    std::filesystem::remove(path.string() + ".part", ec);
    if (f.done) std::filesystem::remove(path, ec);
  }
  s.by_index.clear();
}

void RemotePort::settle_shipment(Entry& en, bool endpoint_failure, const Status& status) {
  if (en.files_dir.empty()) return;
  Shipment& s = en.shipment;
  if (s.refused.empty()) {
    uint64_t received = 0;
    uint32_t whole = 0;
    for (const auto& [i, f] : s.by_index) {
      received += f.received;
      whole += f.done ? 1 : 0;
    }
    if (endpoint_failure && !s.by_index.empty()) {
      discard(en, fmt::format("{}: task {}'s files refused: the endpoint stopped mid-shipment: {}", who(),
                              en.dispatch_id, status.message()));
    } else if (s.by_index.empty() && status.ok() && !endpoint_failure) {
      // A recording run that succeeded wrote files; the node sends none
      // only when it found them unsendable (beyond the limits, unreadable).
      discard(en, fmt::format("{}: task {}'s files refused: FILES: none arrived before the TERMINAL of a run that "
                              "recorded (the node could not send them)",
                              who(), en.dispatch_id));
    } else if (whole != s.files || received != s.bytes) {
      discard(en, fmt::format("{}: task {}'s files refused: FILES: truncated, {} of {} files and {} of {} bytes "
                              "arrived before the TERMINAL",
                              who(), en.dispatch_id, whole, s.files, received, s.bytes));
    }
  }
  if (!s.refused.empty()) {
    std::lock_guard<std::mutex> lock(note_mu_);
    if (notes_.size() >= kNotesKept) notes_.erase(notes_.begin());
    notes_[{en.run_id, en.task_slot}] = ShipmentNote{s.refused};
  }
  en.shipment = Shipment{};
}

void RemotePort::clock_sample(uint64_t sent_ns, uint64_t node_ns, uint64_t back_ns) {
  std::lock_guard<std::mutex> lock(note_mu_);
  // Only an answer to a ping this side sent, and one that came back after it.
  auto it = std::find(pings_.begin(), pings_.end(), sent_ns);
  if (it == pings_.end() || back_ns < sent_ns) return;
  pings_.erase(it);
  const uint64_t rtt = back_ns - sent_ns;
  // The node read its clock somewhere inside the round trip: taken at its
  // midpoint, the estimate is off by at most half of it. A sample much
  // slower than the best seen (a busy peer) would only widen that.
  if (best_rtt_ns_ != 0 && rtt > 2 * best_rtt_ns_) return;
  clock_.offset_ns = static_cast<int64_t>(sent_ns + rtt / 2) - static_cast<int64_t>(node_ns);
  clock_.rtt_ns = rtt;
  best_rtt_ns_ = best_rtt_ns_ == 0 ? rtt : std::min(best_rtt_ns_, rtt);
}

ClockEstimate RemotePort::clock() const {
  std::lock_guard<std::mutex> lock(note_mu_);
  return clock_;
}

std::optional<ShipmentNote> RemotePort::take_shipment_note(uint64_t run_id, uint32_t task) {
  std::lock_guard<std::mutex> lock(note_mu_);
  auto it = notes_.find({run_id, task});
  if (it == notes_.end()) return std::nullopt;
  ShipmentNote n = std::move(it->second);
  notes_.erase(it);
  return n;
}

Result<MemoryInfo> RemotePort::memory_info(uint64_t deadline_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  if (poisoned_) return *poisoned_;
  memory_reply_.reset();
  memory_query_ = true;
  SIMPLER_RETURN_IF_ERROR(
      post_control(rank_, encode_simple(MsgKind::kMemoryQuery, session_, 0, 0, 0, 0), sends_->control), "{}", who());
  const bool answered = memory_cv_.wait_until(
      lock,
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(deadline_ns > now_ns() ? deadline_ns - now_ns() : 0),
      [&] { return memory_reply_.has_value() || poisoned_.has_value(); });
  memory_query_ = false;
  if (poisoned_) return *poisoned_;
  if (!answered) return make_error(StatusCode::kDeadlineExceeded, "{}: memory_info had no answer", who());
  return MemoryInfo{memory_reply_->first, memory_reply_->second};
}

Status RemotePort::close(uint64_t deadline_ns) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status();
    closed_ = true;
    // Sent even after a stop, so a node that still lives returns from serve_node.
    (void)post_control(rank_, encode_simple(MsgKind::kShutdown, session_, 0, 0, 0, 0), sends_->control);
    poison_locked(make_error(StatusCode::kAborted, "the network closed"));
  }
  stop_.store(true);
  receive_backoff_.wake();  // from a sleep or a stand-down
  if (receiver_.joinable()) receiver_.join();
  std::lock_guard<std::mutex> lock(mu_);
  Backoff backoff(1'000'000);
  while (!sends_->control.empty() && now_ns() < deadline_ns && !mpi_finalizing()) {
    reap_posted(sends_->control);
    backoff.pause();
  }
  bury_posted(sends_->control);
  for (auto& [reqs, hold] : sends_->retired) Graveyard::instance().bury(reqs, std::move(hold));
  sends_->retired.clear();
  return Status();
}

#ifdef SIMPLER_TEST_HOOKS
namespace hooks {
namespace {
std::atomic<uint64_t> g_forced_grace{0};
}
void force_stand_in_grace(uint64_t ns) { g_forced_grace.store(ns, std::memory_order_relaxed); }
uint64_t forced_stand_in_grace() noexcept { return g_forced_grace.load(std::memory_order_relaxed); }
}  // namespace hooks
#endif

}  // namespace simpler::dist
