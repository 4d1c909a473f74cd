#include "dist/node_server.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "base/errors.h"
#include "diag/call_config.h"
#include "dist/mpi_io.h"
#include "dist/mpi_session.h"
#include "node/shared_heap.h"

namespace simpler::dist {

namespace {

constexpr int kNetworkRank = 0;
constexpr uint64_t kBusySleepNs = 50'000;     // runs in flight: terminals are near
constexpr uint64_t kIdleSleepNs = 1'000'000;  // nothing held: only a request can come

uint64_t ms_to_ns(std::chrono::milliseconds ms) { return static_cast<uint64_t>(ms.count()) * 1'000'000ull; }

// A shipment's chunks in flight at most: beyond it the server waits for the
// network to take some, so a large dump never sits in memory whole.
constexpr uint64_t kShipmentInFlightBytes = 32ull << 20;

// One run the node holds for the network.
struct Held {
  uint32_t entry = 0;
  uint64_t generation = 0;
  uint64_t run_epoch = 0;
  uint64_t dispatch_id = 0;
  uint64_t n = 0;  // which request, from 1
  std::vector<TensorRow> rows;
  std::vector<uint64_t> allocs;  // per row, in the server's heap
  std::string files_dir;         // the run's private directory when it records; removed after its shipment
  Status result;
};

// Sends still in flight and the heap blocks they read from.
struct Outgoing {
  std::vector<uint8_t> header;
  std::vector<MPI_Request> reqs;
  std::vector<uint64_t> allocs;
};

// Sends HEARTBEAT every period from a thread of its own, so that a serve
// loop busy for longer (building a run's orchestration, receiving a large
// input, waiting for heap) never reads as a dead node. At most a few in
// flight: a network that stopped receiving never completes them. Every
// beat sends the same bytes, which outlive any send still in flight.
class Heartbeat {
 public:
  Heartbeat(uint64_t session, uint64_t period_ns)
      : beat_(new std::vector<uint8_t>(encode_simple(MsgKind::kHeartbeat, session, 0, 0, 0, 0))),
        period_ns_(period_ns),
        thread_([this] { loop(); }) {}
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    // A send MPI still holds may read the bytes after this: they stay with it.
    Graveyard::instance().bury(sent_, std::shared_ptr<void>(std::move(beat_)));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      std::erase_if(sent_, [](MPI_Request& r) { return test_one(r); });
      if (sent_.size() < 8) {
        MPI_Request req = MPI_REQUEST_NULL;
        if (in_mpi([&] {
              return MPI_Isend(beat_->data(), static_cast<int>(beat_->size()), MPI_BYTE, kNetworkRank, kTagControl,
                               MPI_COMM_WORLD, &req);
            }) == MPI_SUCCESS) {
          sent_.push_back(req);
        }
      }
      cv_.wait_for(lock, std::chrono::nanoseconds(period_ns_), [this] { return stop_; });
    }
  }

  std::unique_ptr<std::vector<uint8_t>> beat_;
  const uint64_t period_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<MPI_Request> sent_;  // the beating thread's, then the destructor's
  std::thread thread_;             // last: it starts once the rest exists
};

class NodeServer {
 public:
  NodeServer(std::unique_ptr<SharedHeap> heap, std::unique_ptr<NodeWorker> node, std::vector<NodeCallable> callables,
             const ServeOptions& options, ServeHooks hooks, uint64_t granted)
      : heap_(std::move(heap)),
        node_(std::move(node)),
        callables_(std::move(callables)),
        options_(options),
        hooks_(std::move(hooks)),
        granted_(granted),
        mirror_(std::min<uint64_t>(granted, kWireMaxEntries)) {}

  Status run();

 private:
  Status hello();
  // One message from the network; false when serving ends.
  bool handle(const std::vector<uint8_t>& bytes, Status& result);
  void handle_request(const Message& m);
  // Ends the endpoint (R9): the reason goes to the network; nothing more runs.
  void stop(const Status& why);
  void post(std::vector<uint8_t> bytes);
  void send_terminal(std::unique_ptr<Held> h);
  // Sends every file under h.files_dir as FILES chunks, then removes it.
  void ship_files(const Held& h);
  // The run's diagnostics from the request's CallConfig (bounded,
  // validating): its files go to a private directory of this host.
  Result<NodeWorker::RunDiagnostics> diagnostics_of(const Message& m, Held& h);
  void fail_request(std::unique_ptr<Held> h, const Status& why);
  void free_allocs(const std::vector<uint64_t>& allocs);
  // A heap block, waiting while sends in flight still hold blocks.
  Result<uint64_t> alloc(uint64_t bytes, bool received, uint64_t deadline_ns);
  void reap();
  void drain_completions();

  std::unique_ptr<SharedHeap> heap_;
  std::unique_ptr<NodeWorker> node_;
  const std::vector<NodeCallable> callables_;
  const ServeOptions options_;
  const ServeHooks hooks_;
  const uint64_t granted_;
  uint64_t session_ = 0;
  std::vector<EntryIdentity> mirror_;  // per entry: the last generation taken, and its epoch while it runs
  uint64_t next_epoch_ = 0;
  uint64_t requests_ = 0;
  uint32_t in_flight_ = 0;
  bool stopped_ = false;
  uint64_t last_heard_ns_ = 0;
  std::vector<Posted> control_;
  std::vector<Outgoing> outgoing_;
  std::string scratch_;  // this server's directory for the runs' private ones

  std::mutex done_mu_;  // the node's scheduler thread hands terminals over
  std::vector<std::unique_ptr<Held>> done_;
  // The serve loop's polling; a terminal handed over wakes it.
  Backoff backoff_{kIdleSleepNs};
};

void NodeServer::post(std::vector<uint8_t> bytes) { (void)post_control(kNetworkRank, std::move(bytes), control_); }

void NodeServer::reap() {
  Graveyard::instance().sweep();
  reap_posted(control_);
  for (size_t i = 0; i < outgoing_.size();) {
    if (test_all(outgoing_[i].reqs)) {
      free_allocs(outgoing_[i].allocs);
      outgoing_.erase(outgoing_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

Result<uint64_t> NodeServer::alloc(uint64_t bytes, bool received, uint64_t deadline_ns) {
  // A finished run's blocks come back once the network has taken its
  // outputs, which may be just after its next request arrived.
  Backoff backoff(kBusySleepNs);
  for (;;) {
    reap();
    // A received tensor is overwritten whole; an output starts zeroed, so a
    // kernel that leaves part of it unwritten returns no stale bytes.
    auto a = received ? heap_->alloc_for_overwrite(bytes) : heap_->alloc(bytes);
    if (a.ok() || outgoing_.empty() || now_ns() >= deadline_ns) return a;
    backoff.pause();
  }
}

void NodeServer::free_allocs(const std::vector<uint64_t>& allocs) {
  for (uint64_t a : allocs) {
    if (a != 0) (void)heap_->free(a);
  }
}

Status NodeServer::hello() {
  const uint64_t deadline = now_ns() + ms_to_ns(options_.hello_timeout);
  std::vector<uint8_t> buf;
  Backoff backoff(kIdleSleepNs);
  for (;;) {
    SIMPLER_ASSIGN_OR_RETURN(const bool got, try_recv_control(kNetworkRank, buf), "serve_node");
    if (got) break;
    if (now_ns() >= deadline) {
      return make_error(StatusCode::kDeadlineExceeded, "serve_node: no hello from the network (rank 0) within {} ms",
                        options_.hello_timeout.count());
    }
    backoff.pause();
  }
  SIMPLER_ASSIGN_OR_RETURN(const Message m, decode_message(buf), "serve_node: the network's hello");
  if (m.kind != MsgKind::kHello || m.h.session == 0) {
    return invalid_argument("serve_node: the network's first message is {}, not HELLO", msg_kind_name(m.kind));
  }
  session_ = m.h.session;
  std::vector<Digest> digests;
  for (const NodeCallable& c : callables_) digests.push_back(c.digest());
  post(encode_hello_reply(session_, granted_, digests));
  last_heard_ns_ = now_ns();
  return Status();
}

void NodeServer::stop(const Status& why) {
  if (stopped_) return;
  stopped_ = true;
  post(encode_text(MsgKind::kStopped, session_, why.message()));
}

Status NodeServer::run() {
  SIMPLER_RETURN_IF_ERROR(hello());
  const uint64_t network_timeout = ms_to_ns(options_.network_timeout);
  std::vector<uint8_t> buf;
  Status result;
  auto beat = std::make_unique<Heartbeat>(session_, ms_to_ns(options_.heartbeat_period));
  bool driving = false;
  for (;;) {
    // While news is fresh this loop yields rather than sleeps, and stands in
    // for the node's scheduler thread (Scheduler::drive): a request reaches
    // its node run, and the run's terminal this loop, without a hand-off.
    // Before it sleeps it hands the rounds back.
    if (backoff_.yielding()) {
      driving = true;
      if (node_->drive_scheduler()) backoff_.news();
    } else if (driving) {
      driving = false;
      node_->release_scheduler();
    }
    drain_completions();
    reap();
    Result<bool> got = try_recv_control(kNetworkRank, buf);
    if (!got.ok()) {
      stop(got.status());
      continue;
    }
    if (*got) {
      last_heard_ns_ = now_ns();
      backoff_.news();
      if (!handle(buf, result)) break;
      continue;
    }
    if (now_ns() - last_heard_ns_ > network_timeout) {
      result = make_error(StatusCode::kAborted, "serve_node: the network (rank 0) sent nothing for {} ms",
                          options_.network_timeout.count());
      break;
    }
    backoff_.set_max_sleep(in_flight_ != 0 ? kBusySleepNs : kIdleSleepNs);
    backoff_.pause();
  }
  beat.reset();
  // Every run still held ends with the node; its terminal is not sent.
  (void)node_->close(std::chrono::milliseconds(10'000));
  drain_completions();
  const uint64_t until = now_ns() + 2'000'000'000ull;
  Backoff tail(kBusySleepNs);
  while ((!control_.empty() || !outgoing_.empty()) && now_ns() < until) {
    reap();
    tail.pause();
  }
  bury_posted(control_);
  for (Outgoing& o : outgoing_) {
    std::vector<std::shared_ptr<void>> holds{std::make_shared<std::vector<uint8_t>>(std::move(o.header))};
    for (uint64_t a : o.allocs) {
      if (a != 0) holds.push_back(heap_->hold(a, SharedHeap::HoldKind::kRead));
    }
    Graveyard::instance().bury(o.reqs, hold_all(std::move(holds)));
  }
  outgoing_.clear();
  std::error_code ec;
  if (!scratch_.empty()) std::filesystem::remove_all(scratch_, ec);
  return result;
}

bool NodeServer::handle(const std::vector<uint8_t>& bytes, Status& result) {
  auto m = decode_message(bytes);
  if (!m.ok()) {
    stop(Status(m.status().code(), "a malformed message from the network: " + m.status().message()));
    return true;
  }
  if (m->kind == MsgKind::kShutdown && m->h.session == session_) return false;
  if (m->kind == MsgKind::kClockPing) {
    if (m->h.session == session_)
      post(encode_simple(MsgKind::kClockPong, session_, 0, 0, 0, m->h.value,
                         static_cast<uint64_t>(static_cast<int64_t>(now_ns()) + hooks_.pong_skew_ns)));
    return true;
  }
  if (m->kind == MsgKind::kHeartbeat || stopped_) return true;
  if (m->kind == MsgKind::kMemoryQuery) {
    if (auto info = node_->memory_info(); info.ok()) {
      post(encode_memory_reply(session_, info->total_bytes, info->free_bytes));
    }
    return true;
  }
  if (m->kind != MsgKind::kRequest) {
    stop(invalid_argument("the network sent {}, which a network never sends to a node", msg_kind_name(m->kind)));
    return true;
  }
  handle_request(*m);
  return true;
}

void NodeServer::handle_request(const Message& m) {
  const Classified c = classify_request(m, session_, static_cast<uint32_t>(mirror_.size()), mirror_);
  if (c.verdict == Verdict::kUnattributable) {
    stop(c.why);
    return;
  }
  const int tag = kTagDataBase + static_cast<int>(m.h.entry);
  const uint64_t timeout = ms_to_ns(options_.network_timeout);
  if (c.verdict == Verdict::kStale) {
    // R8: nothing runs and nothing is stored; the inputs are drained by
    // their own tag so the occupant's are not taken for them.
    for (const TensorRow& r : m.rows) {
      if ((r.flags & kToNode) == 0) continue;
      if (Status st = recv_chunks(kNetworkRank, tag, nullptr, r.bytes, now_ns() + timeout + r.bytes * 10, {});
          !st.ok()) {
        stop(st);
        return;
      }
    }
    return;
  }
  auto h = std::make_unique<Held>();
  h->entry = m.h.entry;
  h->generation = m.h.generation;
  h->run_epoch = ++next_epoch_;
  h->dispatch_id = m.h.dispatch_id;
  h->n = ++requests_;
  h->rows = m.rows;
  h->allocs.assign(m.rows.size(), 0);
  Status alloc_failed;
  for (size_t k = 0; k < m.rows.size() && alloc_failed.ok(); ++k) {
    auto a = alloc(m.rows[k].bytes, (m.rows[k].flags & kToNode) != 0, now_ns() + timeout);
    if (!a.ok()) {
      alloc_failed = Status(a.status().code(), fmt::format("tensor row {} ({} bytes) in the node server's heap: {}", k,
                                                           m.rows[k].bytes, a.status().message()));
    } else {
      h->allocs[k] = *a;
    }
  }
  for (size_t k = 0; k < m.rows.size(); ++k) {
    const TensorRow& r = m.rows[k];
    if ((r.flags & kToNode) == 0) continue;
    auto* dst = h->allocs[k] != 0 ? reinterpret_cast<uint8_t*>(h->allocs[k]) : nullptr;
    const auto hold = [&] { return heap_->hold(h->allocs[k], SharedHeap::HoldKind::kWrite); };
    if (Status st = recv_chunks(kNetworkRank, tag, dst, r.bytes, now_ns() + timeout + r.bytes * 10, hold); !st.ok()) {
      free_allocs(h->allocs);
      stop(st);
      return;
    }
  }
  mirror_[h->entry] = EntryIdentity{h->generation, h->run_epoch};
  ++in_flight_;
  post(encode_simple(MsgKind::kAck, session_, h->entry, h->generation, h->run_epoch, h->dispatch_id));
  if (hooks_.on_request) hooks_.on_request(h->n);
  if (!alloc_failed.ok()) {
    fail_request(std::move(h), alloc_failed);
    return;
  }
  size_t k = 0;
  while (k < callables_.size() && callables_[k].digest() != m.callable) ++k;
  if (k == callables_.size()) {
    fail_request(std::move(h), not_found("no NodeCallable with digest {} on this node", digest_hex(m.callable)));
    return;
  }
  // The decoder checked that every tensor names exactly one row.
  TaskArgs args = *decode_args_blob(m.args_blob.data(), m.args_blob.size());
  for (size_t i = 0; i < args.size(); ++i) {
    TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    const TensorView& t = a.tensor;
    size_t row = 0;
    while (m.rows[row].addr != t.buffer().addr) ++row;
    int64_t shape[kMaxDims], stride[kMaxDims];
    for (int d = 0; d < t.ndim(); ++d) {
      shape[d] = t.shape(d);
      stride[d] = t.stride(d);
    }
    // The row holds the buffer from its offset, a multiple of every element
    // size, and the decoder checked the view lies inside it.
    const int64_t rebased =
        t.numel() == 0 ? 0 : t.offset() - static_cast<int64_t>(m.rows[row].offset / dtype_size(t.dtype()));
    a.tensor = TensorView::from_parts(DeviceBuffer{h->allocs[row], m.rows[row].bytes}, t.dtype(), t.ndim(), shape,
                                      stride, rebased);
  }
  auto diagnostics = diagnostics_of(m, *h);
  if (!diagnostics.ok()) {
    fail_request(std::move(h), diagnostics.status());
    return;
  }
  const NodeCallable& callable = callables_[k];
  Held* held = h.get();
  const auto orchestration = [&, held](Orchestrator& o) {
    post(
        encode_simple(MsgKind::kAccepted, session_, held->entry, held->generation, held->run_epoch, held->dispatch_id));
    return callable.orchestrate()(o, args);
  };
  // The terminal reaches this thread through done_, from whichever thread ends the run.
  std::shared_ptr<Held> owner(h.release());
  const std::function<void(const Status&)> on_terminal = [this, owner](const Status& result) {
    auto mine = std::make_unique<Held>(std::move(*owner));
    mine->result = result;
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      done_.push_back(std::move(mine));
    }
    backoff_.wake();
  };
  if (node_->try_submit(orchestration, on_terminal, *diagnostics).has_value()) return;
  // Admission waits for a run to retire, which takes scheduler rounds this
  // thread, blocked, cannot drive: the node's own thread takes them back.
  node_->release_scheduler();
  (void)node_->submit(orchestration, on_terminal, *diagnostics);
}

Result<NodeWorker::RunDiagnostics> NodeServer::diagnostics_of(const Message& m, Held& h) {
  SIMPLER_ASSIGN_OR_RETURN(const diag::ChildCallConfig c, diag::decode_call_config(m.config.data(), m.config.size()),
                           "node task {}: the request's CallConfig", m.h.dispatch_id);
  NodeWorker::RunDiagnostics d;
  if (c.call.swimlane_level == 0 && c.call.dump_args == DumpArgs::Off) return d;
  if (scratch_.empty()) {
    scratch_ = (std::filesystem::temp_directory_path() /
                fmt::format("simpler_serve_{}_{}", launcher_rank(), static_cast<long>(::getpid())))
                   .string();
  }
  // The network's directory may not exist on this host: the run records
  // here, and its files travel back named relative to this directory.
  h.files_dir = fmt::format("{}/run{}", scratch_, h.run_epoch);
  std::error_code ec;
  std::filesystem::remove_all(h.files_dir, ec);
  d.call = c.call;
  d.call.trace_dir = h.files_dir;
  d.trace_label = fmt::format("node{}", c.child_index);
  return d;
}

void NodeServer::ship_files(const Held& h) {
  namespace fs = std::filesystem;
  std::vector<ShippedFile> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(h.files_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    ShippedFile f;
    f.path = it->path().string();
    f.name = it->path().lexically_relative(h.files_dir).generic_string();
    f.bytes = f.send = it->file_size(ec);
    if (ec) break;
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const ShippedFile& a, const ShippedFile& b) { return a.name < b.name; });
  if (hooks_.on_shipment) hooks_.on_shipment(h.n, files);
  uint64_t total = 0;
  for (ShippedFile& f : files) {
    f.send = std::min(f.send, f.bytes);
    total += f.bytes;
  }
  // A shipment the network would refuse is not sent: its fragment shows as
  // missing there, and the run's result is unchanged.
  const bool sendable = !ec && !files.empty() && files.size() <= kWireMaxFiles && total <= kWireMaxShipmentBytes;
  const uint64_t deadline = now_ns() + ms_to_ns(options_.network_timeout);
  std::vector<uint8_t> chunk(kFileChunkBytes);
  Backoff backoff(kBusySleepNs);
  for (uint32_t i = 0; sendable && i < files.size(); ++i) {
    const ShippedFile& f = files[i];
    std::FILE* in = std::fopen(f.path.c_str(), "rb");
    if (in == nullptr) break;
    uint64_t off = 0;
    do {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kFileChunkBytes, f.send - off));
      if (n != 0 && std::fread(chunk.data(), 1, n, in) != n) break;
      for (;;) {
        uint64_t in_flight = 0;
        for (const Posted& p : control_) in_flight += p.bytes.size();
        if (in_flight < kShipmentInFlightBytes || now_ns() >= deadline) break;
        reap();
        backoff.pause();
      }
      post(encode_file_chunk(session_, h.entry, h.generation, h.run_epoch, h.dispatch_id,
                             static_cast<uint32_t>(files.size()), total, FileChunkHead{f.bytes, off, i, 0}, f.name,
                             std::span<const uint8_t>(chunk.data(), n)));
      off += n;
    } while (off < f.send);
    std::fclose(in);
  }
  fs::remove_all(h.files_dir, ec);
}

void NodeServer::fail_request(std::unique_ptr<Held> h, const Status& why) {
  h->result = why;
  send_terminal(std::move(h));
}

void NodeServer::drain_completions() {
  std::vector<std::unique_ptr<Held>> done;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done.swap(done_);
  }
  for (auto& h : done) send_terminal(std::move(h));
}

void NodeServer::send_terminal(std::unique_ptr<Held> h) {
  --in_flight_;
  mirror_[h->entry].run_epoch = 0;  // free: the next request there must be newer
  Outgoing out;
  out.allocs = std::move(h->allocs);
  if (stopped_) {
    // The network already ended this run when it read STOPPED.
    free_allocs(out.allocs);
    std::error_code ec;
    if (!h->files_dir.empty()) std::filesystem::remove_all(h->files_dir, ec);
    return;
  }
  std::vector<uint64_t> sizes;
  std::vector<size_t> returned;
  if (h->result.ok()) {
    for (size_t k = 0; k < h->rows.size(); ++k) {
      if ((h->rows[k].flags & kFromNode) == 0) continue;
      sizes.push_back(h->rows[k].bytes);
      returned.push_back(k);
    }
  }
  // The files first: the network has them in place when it reads the terminal.
  if (!h->files_dir.empty()) ship_files(*h);
  out.header = encode_terminal(session_, h->entry, h->generation, h->run_epoch, h->dispatch_id, h->result, sizes);
  if (hooks_.before_terminal) {
    WireHeader wh;
    std::memcpy(&wh, out.header.data(), sizeof wh);
    hooks_.before_terminal(h->n, wh, [this](std::vector<uint8_t> bytes, int tag) {
      if (tag == kTagControl) {
        post(std::move(bytes));
        return;
      }
      Outgoing raw;
      raw.header = std::move(bytes);
      (void)post_chunks(kNetworkRank, tag, raw.header.data(), raw.header.size(), raw.reqs);
      outgoing_.push_back(std::move(raw));
    });
  }
  MPI_Request r;
  if (in_mpi([&] {
        return MPI_Isend(out.header.data(), static_cast<int>(out.header.size()), MPI_BYTE, kNetworkRank, kTagControl,
                         MPI_COMM_WORLD, &r);
      }) != MPI_SUCCESS) {
    free_allocs(out.allocs);
    stop(internal_error("MPI_Isend of a TERMINAL failed"));
    return;
  }
  out.reqs.push_back(r);
  const int tag = kTagDataBase + static_cast<int>(h->entry);
  for (size_t k : returned) {
    (void)post_chunks(kNetworkRank, tag, reinterpret_cast<const uint8_t*>(out.allocs[k]), h->rows[k].bytes, out.reqs);
  }
  outgoing_.push_back(std::move(out));
  if (hooks_.after_terminal) hooks_.after_terminal(h->n);
}

}  // namespace

Status serve(NodeSpec spec, std::vector<NodeCallable> callables, const ServeOptions& options, ServeHooks hooks) {
  if (launcher_rank() == kNetworkRank) {
    return failed_precondition("serve_node: this is MPI rank 0, where the network runs; serve nodes on the others");
  }
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<SharedHeap> heap, SharedHeap::create(options.tensor_heap_bytes),
                           "serve_node: tensor_heap_bytes = {}", options.tensor_heap_bytes);
  spec.inherited.push_back(heap->range());
  const uint64_t granted = spec.config.pipeline_depth;
  // The node forks its children here, before MPI starts its threads.
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<NodeWorker> node, NodeWorker::create(std::move(spec)), "serve_node");
  SIMPLER_RETURN_IF_ERROR(ensure_mpi(), "serve_node");
  MpiUse use;
  NodeServer server(std::move(heap), std::move(node), std::move(callables), options, std::move(hooks), granted);
  return server.run();
}

}  // namespace simpler::dist
