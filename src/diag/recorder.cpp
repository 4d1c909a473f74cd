#include "diag/lane.h"

#include <algorithm>
#include <new>

#include <fmt/format.h>

#include "base/errors.h"

namespace simpler::diag {

Recorder::Recorder(uint32_t cores, uint32_t aicpu_threads, size_t lane_events) {
  for (uint32_t c = 0; c < cores; ++c) cores_.push_back(std::make_unique<Lane>(lane_events, &generation_));
  for (uint32_t a = 0; a < aicpu_threads; ++a) aicpu_.push_back(std::make_unique<Lane>(lane_events, &generation_));
}

LaneInfo Recorder::core_info(uint32_t core) {
  const uint32_t cluster = core / 3;
  const uint32_t sub = core % 3;
  if (sub == 0) return {fmt::format("AIC{}", cluster), 1 + core};
  return {fmt::format("AIV{}", cluster * 2 + sub - 1), 1 + core};
}

LaneInfo Recorder::aicpu_info(uint32_t aicpu) const { return {fmt::format("AICPU{}", aicpu), 1 + cores() + aicpu}; }

Status Recorder::begin_run(uint32_t level) {
  // Held through the generation bump, so a run beginning on another thread
  // cannot launch and record before this one's bump resets the lanes.
  std::lock_guard<std::mutex> lock(alloc_mu_);
  try {
    for (auto& l : cores_) l->allocate();
    for (auto& l : aicpu_) l->allocate();
  } catch (const std::bad_alloc&) {
    return resource_exhausted("swimlane_level = {}: the trace lanes ({} events each) do not fit host memory", level,
                              cores_.empty() ? 0 : cores_[0]->capacity());
  }
  uint64_t s = state_.load(std::memory_order_acquire);
  uint64_t runs = 0;
  for (;;) {
    runs = s & 0xffffffffull;
    const uint64_t live = std::max<uint64_t>(s >> 32, level);
    if (state_.compare_exchange_weak(s, (live << 32) | (runs + 1), std::memory_order_acq_rel)) break;
  }
  // No traced run was in flight, so nobody reads the lanes: writers reset
  // theirs at their next event.
  if (runs == 0) generation_.fetch_add(1, std::memory_order_acq_rel);
  return Status();
}

void Recorder::end_run() {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t runs = (s & 0xffffffffull) - 1;
    const uint64_t next = runs == 0 ? 0 : (s & ~0xffffffffull) | runs;
    if (state_.compare_exchange_weak(s, next, std::memory_order_acq_rel)) return;
  }
}

}  // namespace simpler::diag
