// One AICPU thread's argument-dump lane: fixed-size metadata records in
// buffers that cycle producer -> host -> producer, and a circular payload
// arena whose bytes the host acknowledges (back-pressure). Exactly one
// producer thread (the lane's AICPU thread) and one host thread use a lane;
// the producer surface is resumable (try_begin / copy_chunk / commit /
// abandon) with at most one open reservation, and record() is the blocking
// capture the AICPU-dispatch routes use. Owns its buffers and its arena.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/doorbell.h"
#include "simpler/status.h"
#include "simpler/tensor.h"

namespace simpler {

enum class DumpRole : uint8_t { kInput = 1, kOutput = 2, kInOut = 3 };
enum class DumpStage : uint8_t { kBefore = 1, kAfter = 2 };
const char* dump_role_name(DumpRole r);
const char* dump_stage_name(DumpStage s);

// One captured argument at one stage. Fixed layout: the record is what a
// device would write into GM for the host to read.
struct DumpRecord {
  static constexpr uint32_t kMagic = 0x44524543;  // "DREC"
  static constexpr uint16_t kVersion = 1;
  static constexpr uint8_t kTruncated = 1;     // payload_bytes < logical_bytes: the arena clamp cut it
  static constexpr uint8_t kMetadataOnly = 2;  // HYBRID, unmarked: no bytes by selection

  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t arg_index = 0;
  uint64_t run_epoch = 0;
  uint64_t task_id = 0;
  uint64_t order = 0;  // the run's capture sequence: execution order across lanes
  uint32_t func_id = 0;
  uint8_t role = 0;   // DumpRole
  uint8_t stage = 0;  // DumpStage
  uint8_t dtype = 0;  // DType
  uint8_t ndim = 0;
  uint8_t flags = 0;
  uint8_t reserved[7] = {};
  int64_t offset = 0;  // elements, from the buffer start
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // elements
  uint64_t device_addr = 0;       // the buffer's
  uint64_t arena_pos = 0;         // where the payload starts in the lane's byte stream (monotonic)
  uint64_t payload_bytes = 0;     // bytes in the arena, row-major over the view
  uint64_t logical_bytes = 0;     // numel x element size
  uint64_t reserved2[3] = {};
};
static_assert(sizeof(DumpRecord) == 192, "DumpRecord is a fixed 192-byte layout");
static_assert(offsetof(DumpRecord, run_epoch) == 8 && offsetof(DumpRecord, offset) == 48 &&
                  offsetof(DumpRecord, arena_pos) == 144,
              "DumpRecord field offsets are part of its layout");

// Where the producer reads a view's elements: `base` is the host address of
// the buffer's first byte (the simulated GM is host memory).
struct DumpSource {
  const uint8_t* base = nullptr;
  TensorView view;
};

struct DumpLaneConfig {
  uint32_t buffers = 8;                // metadata buffers cycling between producer and host (>= 2)
  uint32_t records_per_buffer = 256;   // >= 1
  uint64_t arena_bytes = 16ull << 20;  // payload arena; one payload is clamped to half of it
  uint64_t wait_ns = 1'000'000'000;    // record(): how long the producer waits for room before it drops
};
Status check_dump_lane_config(const DumpLaneConfig& c);

enum class DumpStep : uint8_t {
  kDone,        // try_begin: reservation open; copy_chunk: every byte copied
  kInProgress,  // copy_chunk: bytes remain
  kWouldBlock,  // try_begin: no arena room or no free buffer yet; nothing reserved, nothing counted
};

// Accounting: total == collected + dropped whenever no argument is pending.
struct DumpCounts {
  uint64_t total = 0;      // arguments the producer set out to capture
  uint64_t collected = 0;  // committed records (complete, or marked truncated)
  uint64_t dropped = 0;    // abandoned reservations and waits that ran out
  uint64_t truncated = 0;  // of collected
};

class DumpLane {
 public:
  // `host_bell`: the doorbell the producer rings when it publishes a buffer
  // (one host thread serving several lanes passes its own); null: the lane's.
  static Result<std::unique_ptr<DumpLane>> create(const DumpLaneConfig& config, Doorbell* host_bell = nullptr);
  ~DumpLane();
  DumpLane(const DumpLane&) = delete;
  DumpLane& operator=(const DumpLane&) = delete;

  // ---- producer thread ----
  // Opens the lane's one reservation for `meta` (its arena fields are filled
  // here); `src` null or `meta.flags & kMetadataOnly`: no payload. A first
  // attempt for an argument counts it in `total`; a kWouldBlock retry of the
  // same argument does not. Calling it with a reservation open is a defect.
  DumpStep try_begin(const DumpRecord& meta, const DumpSource* src);
  // Copies at most `max_bytes` (> 0) more of the open reservation's payload.
  DumpStep copy_chunk(uint64_t max_bytes);
  // Publishes the open record into the current buffer; counts it collected.
  void commit();
  // Closes the open reservation without a record: the arena rolls back to
  // where it was before try_begin; counts one dropped. When the record was
  // to take the buffer's last slot, the buffer is published.
  void abandon();
  // Gives up on an argument whose try_begin never opened (counts one dropped).
  void drop_pending();
  // Withdraws an argument whose try_begin only ever answered kWouldBlock:
  // it never was a record, so it leaves `total` as if never attempted (R109).
  void withdraw_pending();
  // The producer's abort: the lane's terminal stays unclosed, so
  // drain_final reports its accounting unknown (R115, R117).
  void mark_unsettled() { unsettled_ = true; }
  // Payload bytes the open reservation has copied so far.
  uint64_t open_copied() const { return open_copied_; }
  // The blocking capture: waits (spin, then park) up to config.wait_ns for
  // room, copying in chunks; returns false when it recorded a drop instead.
  bool record(const DumpRecord& meta, const DumpSource* src);
  bool reservation_open() const { return open_; }

  // ---- host thread ----
  // Receives one record and its payload, which may wrap around the arena's end: [a, a+na) then [b, b+nb).
  using Sink = std::function<void(const DumpRecord&, const uint8_t* a, size_t na, const uint8_t* b, size_t nb)>;
  // Takes every published buffer: sinks its records in order, acknowledges
  // their payload bytes and returns the buffer to the producer. Returns the
  // number of records sunk.
  size_t drain(const Sink& sink);
  // Once the producer is proved stopped (its thread joined, or the run's
  // done callback observed): drains the published buffers and the
  // producer's unpublished one. FAILED_PRECONDITION, sinking nothing more,
  // when a reservation or a pending argument is left open: the lane's
  // accounting is then unknown.
  Status drain_final(const Sink& sink);
  // Producer's counters; exact once the producer stopped.
  DumpCounts counts() const;
  // Rung when the producer publishes a buffer: a host thread parks on it.
  Doorbell& host_bell() { return *host_bell_; }
  const DumpLaneConfig& config() const { return config_; }

 private:
  DumpLane(const DumpLaneConfig& config, Doorbell* host_bell);
  struct Buffer;
  // A single-producer single-consumer ring of buffer indices.
  class IndexQueue {
   public:
    void init(uint32_t capacity);
    bool push(uint32_t v);
    bool pop(uint32_t* v);

   private:
    std::vector<uint32_t> slots_;
    std::atomic<uint64_t> head_{0};  // next pop
    std::atomic<uint64_t> tail_{0};  // next push
  };

  bool take_buffer();
  void publish_current();
  uint64_t arena_free() const;
  void sink_record(const DumpRecord& r, const Sink& sink);

  const DumpLaneConfig config_;
  const uint64_t payload_limit_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<uint8_t[]> arena_;
  IndexQueue free_;   // host -> producer
  IndexQueue ready_;  // producer -> host
  Doorbell own_host_bell_;
  Doorbell* const host_bell_;
  Doorbell producer_bell_;
  std::atomic<uint64_t> host_progress_{0};  // bumped with every ack or returned buffer
  std::atomic<uint64_t> acked_pos_{0};      // host: payload bytes consumed (monotonic)

  // Producer-owned.
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t current_ = kNone;
  uint64_t write_pos_ = 0;
  bool pending_ = false;
  bool open_ = false;
  bool unsettled_ = false;
  DumpRecord open_record_{};
  DumpSource open_src_{};
  uint64_t open_start_ = 0;   // write_pos_ before the reservation
  uint64_t open_copied_ = 0;  // payload bytes copied so far
  std::atomic<uint64_t> total_{0}, collected_{0}, dropped_{0}, truncated_{0};
};

}  // namespace simpler
