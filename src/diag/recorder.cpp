#include "diag/lane.h"

#include <algorithm>
#include <new>

#include <fmt/format.h>

#include "base/errors.h"

namespace simpler::diag {

Recorder::Recorder(uint32_t cores, uint32_t aicpu_threads, size_t lane_events) {
  for (uint32_t c = 0; c < cores; ++c) cores_.push_back(std::make_unique<Lane>(lane_events));
  for (uint32_t a = 0; a < aicpu_threads; ++a) aicpu_.push_back(std::make_unique<Lane>(lane_events));
}

LaneInfo Recorder::core_info(uint32_t core) {
  const uint32_t cluster = core / 3;
  const uint32_t sub = core % 3;
  if (sub == 0) return {fmt::format("AIC{}", cluster), 1 + core};
  return {fmt::format("AIV{}", cluster * 2 + sub - 1), 1 + core};
}

LaneInfo Recorder::aicpu_info(uint32_t aicpu) const { return {fmt::format("AICPU{}", aicpu), 1 + cores() + aicpu}; }

Result<LaneWindow> Recorder::begin_run(uint32_t level) {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    for (auto& l : cores_) l->allocate();
    for (auto& l : aicpu_) l->allocate();
  } catch (const std::bad_alloc&) {
    return resource_exhausted("swimlane_level = {}: the trace lanes ({} events each) do not fit host memory", level,
                              cores_.empty() ? 0 : cores_[0]->capacity());
  }
  // The run has not launched: every event it will record comes at or after
  // each lane's end now.
  LaneWindow w;
  w.id = next_window_++;
  for (const auto& l : cores_) {
    w.core_begin.push_back(l->end());
    w.core_dropped.push_back(l->dropped());
  }
  for (const auto& l : aicpu_) {
    w.aicpu_begin.push_back(l->end());
    w.aicpu_dropped.push_back(l->dropped());
  }
  open_.emplace(w.id, w);
  raise_floors();  // with no other window open, stray events since the last one are free
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t runs = s & 0xffffffffull;
    const uint64_t live = std::max<uint64_t>(s >> 32, level);
    if (state_.compare_exchange_weak(s, (live << 32) | (runs + 1), std::memory_order_acq_rel)) break;
  }
  return w;
}

void Recorder::end_run(const LaneWindow& window) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_.erase(window.id) == 0) return;
  raise_floors();
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t runs = (s & 0xffffffffull) - 1;
    const uint64_t next = runs == 0 ? 0 : (s & ~0xffffffffull) | runs;
    if (state_.compare_exchange_weak(s, next, std::memory_order_acq_rel)) return;
  }
}

void Recorder::raise_floors() {
  const auto raise = [&](std::vector<std::unique_ptr<Lane>>& lanes, auto begin_of) {
    for (size_t i = 0; i < lanes.size(); ++i) {
      // Removing a window only raises the minimum; with none left the whole
      // ring is free (events recorded meanwhile belong to no traced run).
      uint64_t floor = lanes[i]->end();
      for (const auto& [id, w] : open_) floor = std::min(floor, begin_of(w)[i]);
      lanes[i]->raise_floor(floor);
    }
  };
  raise(cores_, [](const LaneWindow& w) -> const std::vector<uint64_t>& { return w.core_begin; });
  raise(aicpu_, [](const LaneWindow& w) -> const std::vector<uint64_t>& { return w.aicpu_begin; });
}

}  // namespace simpler::diag
