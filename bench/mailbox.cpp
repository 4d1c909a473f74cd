// mailbox_round_trip and mailbox_bytes: the parent <-> child mailbox on its
// own, with no Scheduler and no device. A forked child serves one mailbox with
// an echo handler (a request completes the moment it is staged; a control
// command is answered at once) while this thread drives the parent endpoint
// directly, as the Scheduler does. Floor: a cache line bounced between two
// forked processes over shared memory.
#include <unistd.h>

#include <array>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "base/shared_memory.h"
#include "benchmarks.h"
#include "ipc/forked_child.h"
#include "peers.h"

namespace simpler::bench {
namespace {

constexpr int kWarmup = 500;
constexpr int kRoundTrips = 5000;
constexpr int kFloorRoundTrips = 20000;
constexpr uint64_t kDeadlineNs = 10'000'000'000ull;
// What every run-state grant cost before the mailbox split transport from
// execution: one 64 KiB frame per run, fixed at the old PTO_PIPELINE_MAX_DEPTH
// of 3 whatever the grant (seed 000).
constexpr uint64_t kOldFrameBytes = 65536;
constexpr uint64_t kOldFixedRuns = 3;
constexpr std::array<uint64_t, 5> kGrants = {1, 2, 3, 64, 1024};

class EchoHandler final : public RunHandler {
 public:
  void start(RunRequest /*request*/, RunTicket ticket) override { ticket.complete(Status()); }
  Result<ControlReply> control(const ControlCommand& cmd, uint8_t*, uint32_t, uint32_t) override {
    ControlReply r;
    r.value = cmd.args[0];
    return r;
  }
};

struct RoundTrips {
  Summary control;
  Summary ack;       // publish -> the child's ACK of the request frame
  Summary terminal;  // publish -> the run's terminal seen by poll()
};

Result<RoundTrips> measure(MailboxEndpoint& ep) {
  std::vector<double> control, ack, terminal;
  for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
    const uint64_t t0 = wall_ns();
    Result<uint64_t> echoed = ep.control_malloc(static_cast<uint64_t>(i), now_ns() + kDeadlineNs);
    const uint64_t t1 = wall_ns();
    if (!echoed.ok()) return echoed.status();
    if (*echoed != static_cast<uint64_t>(i)) return Status(StatusCode::kInternal, "control echo mismatch");
    if (i >= kWarmup) control.push_back(to_us(t1 - t0));
  }
  ControlFrame& c = ep.view().control();
  std::vector<EndpointEvent> events;
  for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
    PublishSpec spec;
    spec.run_id = static_cast<uint64_t>(i) + 1;
    spec.dispatch_id = spec.run_id;
    const uint64_t t0 = wall_ns();
    Result<Publication> pub = ep.publish(spec);
    if (!pub.ok()) return pub.status();
    const MailboxRunEntry& e = ep.view().entry(pub->entry);
    if (!spin_then_park(
            c.parent_bell, [&] { return load_acquire(e.consumed_ack) == pub->publication; }, SpinPolicy{},
            now_ns() + kDeadlineNs)) {
      return Status(StatusCode::kDeadlineExceeded, "no ACK from the echo child");
    }
    const uint64_t t1 = wall_ns();
    events.clear();
    const uint64_t deadline = now_ns() + kDeadlineNs;
    for (;;) {
      ep.poll(events);
      if (!events.empty() && events.back().kind == EndpointEvent::Kind::kTerminal) break;
      if (now_ns() >= deadline) return Status(StatusCode::kDeadlineExceeded, "no terminal from the echo child");
      ep.wait(deadline);
    }
    const uint64_t t2 = wall_ns();
    if (!events.back().status.ok()) return events.back().status;
    if (i < kWarmup) continue;
    ack.push_back(to_us(t1 - t0));
    terminal.push_back(to_us(t2 - t0));
  }
  return RoundTrips{summarize(std::move(control)), summarize(std::move(ack)), summarize(std::move(terminal))};
}

Json p50_p99(const Summary& s) { return Json{{"p50", round3(s.p50)}, {"p99", round3(s.p99)}}; }

}  // namespace

Result<Json> mailbox_round_trip() {
  Result<std::unique_ptr<ForkedChild>> child =
      ForkedChild::spawn([] { return std::make_unique<EchoHandler>(); }, SpawnOptions{});
  if (!child.ok()) return child.status();
  Result<RoundTrips> mine = measure((*child)->endpoint());
  std::vector<EndpointEvent> events;
  const Status closed = (*child)->close(now_ns() + kDeadlineNs, events);
  if (!mine.ok()) return mine.status();
  if (!closed.ok()) return closed;

  Result<Summary> floor = forked_spin_round_trip_us(kFloorRoundTrips);
  if (!floor.ok()) return floor.status();
  Result<Summary> pipe = pipe_round_trip_us(kWarmup, kRoundTrips);
  if (!pipe.ok()) return pipe.status();

  Json j;
  j["unit"] = "us";
  j["control_command"] = summary_json(mine->control);
  j["control_command"]["what"] = "one control-frame command answered at once by the child (cmd_seq -> reply_seq)";
  j["request_ack"] = summary_json(mine->ack);
  j["request_ack"]["what"] = "publish a request frame -> the child's ACK in the run-state entry";
  j["request_terminal"] = summary_json(mine->terminal);
  j["request_terminal"]["what"] = "publish -> the run's terminal seen by poll() (the child completes on staging)";
  j["peer"] = summary_json(*floor);
  j["peer"]["what"] =
      "floor: one cache line of shared memory bounced between this process and a forked child, both spinning";
  j["ratio_vs_peer"] = {{"control_p50", round3(mine->control.p50 / floor->p50)},
                        {"request_ack_p50", round3(mine->ack.p50 / floor->p50)},
                        {"request_terminal_p50", round3(mine->terminal.p50 / floor->p50)}};
  j["pipe_round_trip"] = p50_p99(*pipe);
  j["pipe_round_trip"]["what"] = "one byte each way over two pipes with a forked child (blocking read)";
  return j;
}

Result<Json> mailbox_bytes() {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t old_fixed = kOldFixedRuns * kOldFrameBytes;
  Json grants;
  for (uint64_t g : kGrants) {
    Result<size_t> bytes = mailbox_size(g);
    if (!bytes.ok()) return bytes.status();
    // The endpoint must take exactly this extent and refuse one byte less
    // before writing anything: the figure is the real registration bound.
    Result<SharedMapping> mapping = SharedMapping::create_anonymous(*bytes);
    if (!mapping.ok()) return mapping.status();
    const bool fits = MailboxEndpoint::create(mapping->data(), *bytes, g).ok();
    const bool short_refused = !MailboxEndpoint::create(mapping->data(), *bytes - 1, g).ok();
    Json row{{"bytes", *bytes},
             {"mapped_bytes", (*bytes + page - 1) / page * page},
             {"entry_table_bytes", *bytes - kMailboxEntriesOffset},
             {"registers_at_exact_size", fits},
             {"refuses_one_byte_less", short_refused},
             {"ratio_vs_old_fixed", round3(static_cast<double>(*bytes) / static_cast<double>(old_fixed))},
             {"old_one_frame_per_run_bytes", g * kOldFrameBytes}};
    if (g > kOldFixedRuns) row["old_layout_could_grant"] = false;
    grants[std::to_string(g)] = row;
  }
  Json j;
  j["unit"] = "bytes";
  j["layout"] = fmt::format("(1 + K) x {} B frames + (G + K) x {} B entries, K = {}", kMailboxFrameSize,
                            kMailboxEntryStride, kMailboxRequestFrames);
  j["grants"] = grants;
  j["peer"] = {{"bytes", old_fixed},
               {"what", fmt::format("the old fixed layout: {} x {} B frames, one per run, at most {} runs whatever "
                                    "the grant",
                                    kOldFixedRuns, kOldFrameBytes, kOldFixedRuns)}};
  return j;
}

}  // namespace simpler::bench
