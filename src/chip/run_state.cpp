#include "chip/run_state.h"

#include <cstdlib>

#include "base/errors.h"

namespace simpler {
namespace detail {

void RunState::complete(Status status, const RunStats& s) {
  if (is_done()) std::abort();
  result = std::move(status);
  stats = s;
  done.store(1, std::memory_order_release);
  bell.ring();
  if (on_terminal) on_terminal(result);
}

RunHandle refused_run(uint64_t run_id, Status status) {
  auto st = std::make_shared<RunState>(run_id);
  st->complete(std::move(status), RunStats{});
  return RunHandle(std::move(st));
}

}  // namespace detail

namespace {
Status invalid_handle() { return failed_precondition("RunHandle is empty (default-constructed or moved from)"); }
}  // namespace

bool RunHandle::done() const { return state_ != nullptr && state_->is_done(); }

Status RunHandle::wait() const {
  if (state_ == nullptr) return invalid_handle();
  spin_then_park(
      state_->bell, [&] { return state_->is_done(); }, state_->spin);
  return state_->result;
}

Status RunHandle::wait_for(std::chrono::nanoseconds timeout) const {
  if (state_ == nullptr) return invalid_handle();
  const uint64_t deadline = now_ns() + static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 1));
  if (!spin_then_park(
          state_->bell, [&] { return state_->is_done(); }, state_->spin, deadline)) {
    return make_error(StatusCode::kDeadlineExceeded, "run {} not finished after {} ms", state_->run_id,
                      std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  }
  return state_->result;
}

Status RunHandle::result() const {
  if (state_ == nullptr) return invalid_handle();
  if (!state_->is_done()) return failed_precondition("run {} is not finished; wait() for it first", state_->run_id);
  return state_->result;
}

RunStats RunHandle::stats() const { return done() ? state_->stats : RunStats{}; }

uint64_t RunHandle::run_id() const { return state_ == nullptr ? 0 : state_->run_id; }

}  // namespace simpler
