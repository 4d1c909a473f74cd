// UserCodeMark: whose user code (an orchestration, a kernel) the calling
// thread is running, so the public Worker can refuse a call back into that
// same worker: close() from its own orchestration would wait for itself.
// Set and read only by the marked thread itself; marks nest. Owns nothing.
#pragma once

namespace simpler {

class UserCodeMark {
 public:
  explicit UserCodeMark(const void* owner) noexcept : owner_(owner), outer_(innermost_) { innermost_ = this; }
  ~UserCodeMark() { innermost_ = outer_; }
  UserCodeMark(const UserCodeMark&) = delete;
  UserCodeMark& operator=(const UserCodeMark&) = delete;

  // Whether this thread is inside a mark of `owner`, at any depth: a node's
  // orchestration may run another worker's orchestration inside its own.
  static bool running_for(const void* owner) noexcept {
    for (const UserCodeMark* m = innermost_; m != nullptr; m = m->outer_) {
      if (m->owner_ == owner) return true;
    }
    return false;
  }

 private:
  const void* const owner_;
  const UserCodeMark* const outer_;
  static thread_local const UserCodeMark* innermost_;
};

}  // namespace simpler
