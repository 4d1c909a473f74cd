#include "diag/args_dump_lane.h"

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "base/errors.h"

namespace simpler {

const char* dump_role_name(DumpRole r) {
  switch (r) {
    case DumpRole::kInput:
      return "input";
    case DumpRole::kOutput:
      return "output";
    case DumpRole::kInOut:
      return "inout";
  }
  return "?";
}

const char* dump_stage_name(DumpStage s) {
  switch (s) {
    case DumpStage::kBefore:
      return "before";
    case DumpStage::kAfter:
      return "after";
  }
  return "?";
}

Status check_dump_lane_config(const DumpLaneConfig& c) {
  if (c.buffers < 2) return invalid_argument("dump lane buffers is {}; it must be at least 2", c.buffers);
  if (c.buffers > 4096) return invalid_argument("dump lane buffers is {}; at most 4096", c.buffers);
  if (c.records_per_buffer < 1 || c.records_per_buffer > 65536) {
    return invalid_argument("dump lane records_per_buffer is {}; it must be in [1, 65536]", c.records_per_buffer);
  }
  if (c.arena_bytes < 4096 || c.arena_bytes > (4ull << 30)) {
    return invalid_argument("dump lane arena_bytes is {}; it must be in [4 KiB, 4 GiB]", c.arena_bytes);
  }
  return Status();
}

struct DumpLane::Buffer {
  std::vector<DumpRecord> records;
  uint32_t count = 0;  // written by the producer before the buffer is pushed, read by the host after it is popped
};

void DumpLane::IndexQueue::init(uint32_t capacity) { slots_.assign(capacity, 0); }

bool DumpLane::IndexQueue::push(uint32_t v) {
  const uint64_t t = tail_.load(std::memory_order_relaxed);
  if (t - head_.load(std::memory_order_acquire) == slots_.size()) return false;
  slots_[t % slots_.size()] = v;
  tail_.store(t + 1, std::memory_order_release);
  return true;
}

bool DumpLane::IndexQueue::pop(uint32_t* v) {
  const uint64_t h = head_.load(std::memory_order_relaxed);
  if (h == tail_.load(std::memory_order_acquire)) return false;
  *v = slots_[h % slots_.size()];
  head_.store(h + 1, std::memory_order_release);
  return true;
}

Result<std::unique_ptr<DumpLane>> DumpLane::create(const DumpLaneConfig& config, Doorbell* host_bell) {
  SIMPLER_RETURN_IF_ERROR(check_dump_lane_config(config));
  return std::unique_ptr<DumpLane>(new DumpLane(config, host_bell));
}

DumpLane::DumpLane(const DumpLaneConfig& config, Doorbell* host_bell)
    : config_(config),
      payload_limit_(config.arena_bytes / 2),
      buffers_(config.buffers),
      arena_(new uint8_t[config.arena_bytes]),
      host_bell_(host_bell != nullptr ? host_bell : &own_host_bell_) {
  for (Buffer& b : buffers_) b.records.resize(config.records_per_buffer);
  free_.init(config.buffers);
  ready_.init(config.buffers);
  for (uint32_t i = 0; i < config.buffers; ++i) free_.push(i);
}

DumpLane::~DumpLane() = default;

uint64_t DumpLane::arena_free() const {
  return config_.arena_bytes - (write_pos_ - acked_pos_.load(std::memory_order_acquire));
}

bool DumpLane::take_buffer() {
  if (current_ != kNone) return true;
  uint32_t i = 0;
  if (!free_.pop(&i)) return false;
  current_ = i;
  buffers_[i].count = 0;
  return true;
}

// A buffer is published only between reservations, so every record in it is complete.
void DumpLane::publish_current() {
  if (current_ == kNone || buffers_[current_].count == 0) return;
  // ready_ has room for every buffer, so the push cannot fail.
  ready_.push(current_);
  current_ = kNone;
  host_bell_->ring();
}

DumpStep DumpLane::try_begin(const DumpRecord& meta, const DumpSource* src) {
  if (!pending_) {
    pending_ = true;
    total_.fetch_add(1, std::memory_order_relaxed);
  }
  const bool with_payload = src != nullptr && (meta.flags & DumpRecord::kMetadataOnly) == 0;
  uint64_t logical = meta.logical_bytes;
  if (with_payload) logical = static_cast<uint64_t>(src->view.numel()) * dtype_size(src->view.dtype());
  const uint64_t want = with_payload ? std::min(logical, payload_limit_) : 0;

  if (current_ != kNone && buffers_[current_].count == config_.records_per_buffer) publish_current();
  if (arena_free() < want) {
    // The bytes the host waits to see may sit in records not yet published:
    // hand them over now, or producer and host would wait on each other.
    publish_current();
    return DumpStep::kWouldBlock;
  }
  if (!take_buffer()) return DumpStep::kWouldBlock;

  open_ = true;
  open_record_ = meta;
  open_record_.magic = DumpRecord::kMagic;
  open_record_.version = DumpRecord::kVersion;
  open_record_.arena_pos = write_pos_;
  open_record_.payload_bytes = want;
  open_record_.logical_bytes = logical;
  if (with_payload && want < logical) open_record_.flags |= DumpRecord::kTruncated;
  if (src != nullptr) open_src_ = *src;
  open_start_ = write_pos_;
  open_copied_ = 0;
  write_pos_ += want;
  return DumpStep::kDone;
}

DumpStep DumpLane::copy_chunk(uint64_t max_bytes) {
  const uint64_t want = open_record_.payload_bytes;
  const TensorView& v = open_src_.view;
  const uint64_t esize = dtype_size(v.dtype());
  uint64_t budget = std::max<uint64_t>(max_bytes, esize);
  const int nd = v.ndim();
  const int64_t row_len = nd == 0 ? 1 : v.shape(nd - 1);
  const int64_t inner_stride = nd == 0 ? 1 : v.stride(nd - 1);
  while (open_copied_ < want && budget >= esize) {
    const int64_t e = static_cast<int64_t>(open_copied_ / esize);
    const int64_t row = e / row_len;
    const int64_t col = e % row_len;
    // The element offset of (row, col): decompose the row over the outer dimensions.
    int64_t at = v.offset() + col * inner_stride;
    int64_t r = row;
    for (int d = nd - 2; d >= 0; --d) {
      at += (r % v.shape(d)) * v.stride(d);
      r /= v.shape(d);
    }
    const uint64_t left_in_payload = (want - open_copied_) / esize;
    uint64_t n = std::min<uint64_t>({static_cast<uint64_t>(row_len - col), budget / esize, left_in_payload});
    if (inner_stride != 1) n = 1;
    const uint8_t* from = open_src_.base + static_cast<uint64_t>(at) * esize;
    uint64_t bytes = n * esize;
    uint64_t pos = (open_start_ + open_copied_) % config_.arena_bytes;
    const uint64_t first = std::min(bytes, config_.arena_bytes - pos);
    std::memcpy(arena_.get() + pos, from, first);
    if (first < bytes) std::memcpy(arena_.get(), from + first, bytes - first);
    open_copied_ += bytes;
    budget -= bytes;
  }
  return open_copied_ < want ? DumpStep::kInProgress : DumpStep::kDone;
}

void DumpLane::commit() {
  Buffer& b = buffers_[current_];
  b.records[b.count++] = open_record_;
  open_ = false;
  pending_ = false;
  collected_.fetch_add(1, std::memory_order_relaxed);
  if ((open_record_.flags & DumpRecord::kTruncated) != 0) truncated_.fetch_add(1, std::memory_order_relaxed);
  if (b.count == config_.records_per_buffer) publish_current();
}

void DumpLane::abandon() {
  write_pos_ = open_start_;
  open_ = false;
  drop_pending();
  // The abandoned record held the buffer's last slot: the switch that a
  // commit there would have made proceeds now, so the next record is record
  // 0 of the next buffer (seed 002's abandon-under-a-full-buffer walk, R125).
  if (current_ != kNone && buffers_[current_].count + 1 == config_.records_per_buffer) publish_current();
}

void DumpLane::drop_pending() {
  pending_ = false;
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void DumpLane::withdraw_pending() {
  if (!pending_) return;
  pending_ = false;
  total_.fetch_sub(1, std::memory_order_relaxed);
}

bool DumpLane::record(const DumpRecord& meta, const DumpSource* src) {
  const uint64_t deadline = now_ns() + config_.wait_ns;
  for (;;) {
    const uint64_t seen = host_progress_.load(std::memory_order_acquire);
    if (try_begin(meta, src) == DumpStep::kDone) break;
    if (!spin_then_park(
            producer_bell_, [&] { return host_progress_.load(std::memory_order_acquire) != seen; }, SpinPolicy{},
            deadline)) {
      drop_pending();
      return false;
    }
  }
  constexpr uint64_t kChunk = 1 << 20;
  while (copy_chunk(kChunk) == DumpStep::kInProgress) {
  }
  commit();
  return true;
}

void DumpLane::sink_record(const DumpRecord& r, const Sink& sink) {
  const uint64_t pos = r.arena_pos % config_.arena_bytes;
  const uint64_t first = std::min(r.payload_bytes, config_.arena_bytes - pos);
  sink(r, arena_.get() + pos, first, arena_.get(), r.payload_bytes - first);
  // The producer reserves in stream order and only the last reservation
  // rolls back, so the records arrive in arena order and each ack is the end of one.
  acked_pos_.store(r.arena_pos + r.payload_bytes, std::memory_order_release);
}

size_t DumpLane::drain(const Sink& sink) {
  size_t n = 0;
  uint32_t i = 0;
  while (ready_.pop(&i)) {
    Buffer& b = buffers_[i];
    for (uint32_t k = 0; k < b.count; ++k) sink_record(b.records[k], sink);
    n += b.count;
    b.count = 0;
    free_.push(i);
    host_progress_.fetch_add(1, std::memory_order_release);
    producer_bell_.ring();
  }
  return n;
}

Status DumpLane::drain_final(const Sink& sink) {
  if (open_ || pending_) {
    return failed_precondition("the dump lane's producer stopped with an argument {}: its accounting is unknown",
                               open_ ? "reserved mid-copy" : "waiting for room");
  }
  drain(sink);
  if (current_ != kNone) {
    Buffer& b = buffers_[current_];
    for (uint32_t k = 0; k < b.count; ++k) sink_record(b.records[k], sink);
    b.count = 0;
    free_.push(current_);
    current_ = kNone;
  }
  // Its committed records stand; what the aborted capture did not record is unknown.
  if (unsettled_) return failed_precondition("the dump lane's producer aborted a capture: its accounting is unknown");
  return Status();
}

DumpCounts DumpLane::counts() const {
  return {total_.load(std::memory_order_relaxed), collected_.load(std::memory_order_relaxed),
          dropped_.load(std::memory_order_relaxed), truncated_.load(std::memory_order_relaxed)};
}

}  // namespace simpler
