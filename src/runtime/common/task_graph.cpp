#include "runtime/common/task_graph.h"

#include "base/errors.h"

namespace simpler {

namespace {
bool same_region(const TensorView& a, const TensorView& b) {
  if (a.offset() != b.offset() || a.ndim() != b.ndim() || dtype_size(a.dtype()) != dtype_size(b.dtype())) return false;
  for (int d = 0; d < a.ndim(); ++d) {
    if (a.shape(d) != b.shape(d) || a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

bool is_contiguous(const TensorView& v) {
  return v.end_byte() - v.first_byte() == static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype());
}
}  // namespace

bool write_covers(const TensorView& w, const TensorView& a) {
  if (same_region(w, a)) return true;
  return is_contiguous(w) && w.first_byte() <= a.first_byte() && a.end_byte() <= w.end_byte();
}

void FirstError::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  key_ = UINT64_MAX;
  status_ = Status();
  failed_.store(false, std::memory_order_relaxed);
}

void FirstError::record(uint32_t task, uint32_t subtask, Status status) {
  const uint64_t key = uint64_t{task} << 32 | subtask;
  std::lock_guard<std::mutex> lock(mu_);
  if (key < key_) {
    key_ = key;
    status_ = std::move(status);
  }
  failed_.store(true, std::memory_order_release);
}

Status FirstError::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

Status kernel_failure(uint32_t task, TaskKind kind, uint32_t sub, uint32_t func_id, uint32_t blocks,
                      const char* message) {
  const char* const what =
      kind == TaskKind::Mix ? (sub == 0 ? "mix AIC" : "mix AIV") : core_type_name(subtask_core(kind, 0));
  if (blocks > 1) {
    return make_error(StatusCode::kKernelFailed, "task {} ({} kernel, func_id {}, block {} of {}) failed: {}", task,
                      what, func_id, sub, blocks, message);
  }
  return make_error(StatusCode::kKernelFailed, "task {} ({} kernel, func_id {}) failed: {}", task, what, func_id,
                    message);
}

}  // namespace simpler
