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

// Until `st` is done or `deadline_ns` (0 = none) passes: driving its worker
// where it may, else spinning then parking on the run's own bell.
bool await(detail::RunState& st, uint64_t deadline_ns) {
  if (st.is_done()) return true;
  if (st.driver != nullptr) {
    if (const std::optional<bool> done = st.driver->wait(st, deadline_ns)) return *done;
  }
  return spin_then_park(
      st.bell, [&] { return st.is_done(); }, st.spin, deadline_ns);
}
}  // namespace

bool RunHandle::done() const {
  if (state_ == nullptr) return false;
  if (!state_->is_done() && state_->driver != nullptr) state_->driver->poll(*state_);
  return state_->is_done();
}

Status RunHandle::wait() const {
  if (state_ == nullptr) return invalid_handle();
  await(*state_, 0);
  return state_->result;
}

Status RunHandle::wait_for(std::chrono::nanoseconds timeout) const {
  if (state_ == nullptr) return invalid_handle();
  const uint64_t deadline = now_ns() + static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 1));
  if (!await(*state_, deadline)) {
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
