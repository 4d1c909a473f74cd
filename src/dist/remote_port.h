// RemotePort: the network's endpoint for a node served on another MPI rank
// (serve_node there). It keeps the mailbox's contract as messages: publish
// occupies an entry (odd generation, R7) and sends the request with its input
// tensors; the node answers ACK (its run epoch), ACCEPTED (launch marker) and
// one TERMINAL with the output tensors, each naming entry, generation and
// epoch; a stale reply is dropped (R8), an unattributable or malformed one
// stops the endpoint and gives every held run a terminal with the reason
// (R9), as does a rank that sends nothing for heartbeat_timeout. The grant
// is checked at start (R68). Output bytes land straight in the network's
// shared heap, at the addresses this side recorded, never ones from the wire.
// A traced or dumping run carries its CallConfig with the request; the files
// the node sends back for it (FILES, before the TERMINAL) are checked and
// written under the directory a forked node would have written them to, or
// refused whole (the run's result unchanged). Ping-pongs at start and with
// each heartbeat estimate the node's clock against this one.
// Threads: the scheduler thread calls the EndpointPort methods; a receiver
// thread of its own takes every message from the rank, but stands down while
// a thread waiting for a run receives for it (receive_standing_in, any
// thread); memory_info and close come from the controlling thread.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dist/mpi_io.h"
#include "dist/mpi_session.h"
#include "dist/wire.h"
#include "node/external_worker.h"
#include "simpler/remote.h"

namespace simpler::dist {

struct RemotePortSends;

class RemotePort final : public ExternalWorker {
 public:
  // Receiver sleeps: while nothing is held only heartbeats come, and a
  // publish wakes it; while a run is held its answer may come any moment.
  static constexpr uint64_t kIdleSleepNs = 1'000'000;
  static constexpr uint64_t kBusySleepNs = 50'000;
  // The receiver stands down this long after a waiter's last
  // receive_standing_in() (hooks::force_stand_in_grace), and at most this
  // many messages are taken per call. While waiters keep standing in, the
  // receiver wakes once per grace to beat and check for silence: on a shared
  // core each wake is a hand-off that delays the run under way (at 100 µs
  // the p99 of back-to-back remote runs was 41-49 µs, at 1 ms 11-34 µs).
  // A run nobody stands in for, published within the grace, waits for it.
  static constexpr uint64_t kStandInGraceNs = 1'000'000;
  static constexpr uint32_t kStandInMessages = 8;

  // Says hello to `rank` and checks its answer (granted sets, callables)
  // before returning; then starts the receiver thread.
  static Result<std::unique_ptr<ExternalWorker>> start(int rank, RemoteNodeOptions options, const ExternalContext& ctx);
  ~RemotePort() override;

  uint32_t available_request_transport() override;
  uint64_t max_inflight_tasks() const override { return entries_.size(); }
  Result<Publication> publish(const PublishSpec& spec) override;
  Status activate(const Publication& p, bool launch) override;
  void poll(std::vector<EndpointEvent>& out) override;
  void poison(const Status& cause) override;
  std::optional<Status> poisoned() const override;
  bool needs_polling() const override { return true; }
  void receive_standing_in() override;
  void stop_standing_in() override;

  Result<MemoryInfo> memory_info(uint64_t deadline_ns) override;
  Status close(uint64_t deadline_ns) override;
  ClockEstimate clock() const override;
  std::optional<ShipmentNote> take_shipment_note(uint64_t run_id, uint32_t task) override;

  // Replies refused as stale (R8) so far by every port of this process; any thread.
  static uint64_t stale_replies();
  // Stand-ins that handed the receiving back (stop_standing_in) so far, by
  // every port of this process; any thread.
  static uint64_t stand_in_handbacks();

 private:
  // The files of one run as they arrive (FILES), written as `<name>.part`
  // and renamed once whole.
  struct Shipment {
    struct File {
      std::string name;
      uint64_t bytes = 0;
      uint64_t received = 0;
      std::FILE* out = nullptr;
      bool done = false;
    };
    uint32_t files = 0;  // declared by its first chunk
    uint64_t bytes = 0;
    uint64_t declared = 0;  // the sum of the sizes of the files seen
    std::map<uint32_t, File> by_index;
    std::string refused;
  };
  struct Entry {
    EntryIdentity id;  // generation odd while held; epoch from the ACK
    bool held = false;
    bool staged = false;  // published staged, not yet activated: nothing sent
    bool accepted_reported = false;
    uint64_t run_id = 0;
    uint64_t dispatch_id = 0;
    uint32_t task_slot = 0;
    uint64_t published_ns = 0;
    TensorPlan plan;
    std::vector<uint8_t> request;    // the encoded request, kept for the send
    std::vector<MPI_Request> sends;  // its input chunks in flight
    std::string files_dir;           // where its files go; empty when it records nothing
    Shipment shipment;
  };

  RemotePort(int rank, RemoteNodeOptions options, const ExternalContext& ctx, uint64_t session, uint64_t granted);
  void receive_loop();
  // Takes up to `max_messages` control messages from the rank and handles
  // each; `news` is set when the scheduler has something to do (a terminal,
  // or the endpoint stopped). Requires mu_: whoever receives handles in
  // arrival order. Whether any message came.
  bool receive_locked(uint32_t max_messages, bool& news);
  // Stops the endpoint when the rank sent nothing for `timeout_ns`.
  void check_silence(uint64_t timeout_ns);
  // One control message from the rank; requires mu_.
  void handle(const std::vector<uint8_t>& bytes);
  void handle_reply(const Message& m);
  void handle_file_chunk(Entry& en, const Message& m);
  // Closes and removes every file of `s` (a refused shipment keeps nothing).
  void discard(Entry& en, const std::string& why);
  // At the run's terminal: a shipment not whole is refused; the note is kept for the trace.
  void settle_shipment(Entry& en, bool endpoint_failure, const Status& status);
  void clock_sample(uint64_t sent_ns, uint64_t node_ns, uint64_t back_ns);
  // Sends entry `e`'s request and input chunks; requires mu_.
  Status send_request(uint32_t e);
  // The event naming entry e's run, of `kind`; the caller adds what else it carries.
  EndpointEvent event_of(uint32_t e, EndpointEvent::Kind kind) const;
  // Ends held entry `e` with `status`; requires mu_.
  void finish(uint32_t e, const Status& status, bool endpoint_failure);
  // Receives a TERMINAL's row into the caller's buffer: exactly `writes`'
  // elements; requires mu_.
  Status receive_outputs(const TensorRow& row, const std::vector<TensorView>& writes, int tag, uint64_t deadline_ns);
  void poison_locked(const Status& cause);
  void check_deadlines();
  std::string who() const;

  const int rank_;
  const RemoteNodeOptions options_;
  const ExternalContext ctx_;
  const uint64_t session_;
  MpiUse mpi_use_;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> free_;           // a stack of free entries
  std::atomic<uint32_t> free_count_{0};  // free_.size(), 0 once poisoned
  std::vector<EndpointEvent> pending_;   // for the next poll
  std::vector<uint8_t> recv_buf_;        // the message being handled
  // receive_outputs' bytes for a row it cannot receive in place
  std::shared_ptr<std::vector<uint8_t>> staging_ = std::make_shared<std::vector<uint8_t>>();
  std::optional<Status> poisoned_;  // written once, under mu_, before stopped_
  std::atomic<bool> stopped_{false};
  uint64_t next_publication_ = 0;
  std::atomic<uint64_t> last_heard_ns_{0};
  std::optional<std::pair<uint64_t, uint64_t>> memory_reply_;  // total, free
  std::condition_variable memory_cv_;
  bool memory_query_ = false;

  // Under note_mu_ (not mu_, which the receiver holds while bytes arrive):
  // the clock estimate, and shipment notes by (run, task) until the trace
  // merge takes them, bounded.
  mutable std::mutex note_mu_;
  std::map<std::pair<uint64_t, uint32_t>, ShipmentNote> notes_;
  ClockEstimate clock_;
  uint64_t best_rtt_ns_ = 0;     // 0: no sample yet
  std::vector<uint64_t> pings_;  // the send times of the last pings, so a pong echoes one of them

  std::unique_ptr<RemotePortSends> sends_;
  bool closed_ = false;
  std::atomic<bool> stop_{false};
  // The receiver's polling; woken when a request goes out, so a receiver
  // that slept through a quiet spell sees the answer without its sleep.
  Backoff receive_backoff_{kIdleSleepNs};
  const uint64_t stand_in_grace_ns_;
  std::atomic<uint64_t> stand_in_ns_{0};  // a waiter's last receive_standing_in(); 0 once it stopped
  std::thread receiver_;
};

namespace hooks {
#ifdef SIMPLER_TEST_HOOKS
// Test builds: ports started from now on stand their receiver down `ns`
// after a stand-in's last call (0: kStandInGraceNs again).
void force_stand_in_grace(uint64_t ns);
uint64_t forced_stand_in_grace() noexcept;
#else
inline constexpr uint64_t forced_stand_in_grace() noexcept { return 0; }
#endif
}  // namespace hooks

}  // namespace simpler::dist
