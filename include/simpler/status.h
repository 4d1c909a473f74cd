// Status and Result<T>: errors as values across threads, processes and the C
// boundary. Any thread may create, copy and read them; a Status is immutable
// once built. Owns only its message text.
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace simpler {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed; nothing changed
  kNotFound,            // unknown callable, func_id or handle
  kFailedPrecondition,  // wrong phase: use after close, register after init, ...
  kOutOfRange,          // a tensor outside its buffer, an address outside device memory
  kResourceExhausted,   // graph or device memory capacity exceeded
  kKernelFailed,        // a kernel reported failure
  kDeadlineExceeded,    // a bounded wait expired
  kAborted,             // poisoned by an earlier failure or a close
  kUnimplemented,       // a capability that is not built yet
  kInternal,            // a broken invariant inside simpler
  kUserCodeFailed,      // user code (an orchestration, a host function) threw; the message has its text
  kDeviceFault,         // the device reported a sticky fault: everything on it ended; it refuses work until reset
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "KERNEL_FAILED: task 3 ..." or "OK".
  std::string to_string() const;

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<T, Status>, "Result<Status> is meaningless; use Status");

 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  // The error, or an OK status when this holds a value.
  Status status() const { return ok() ? Status() : std::get<1>(v_); }

  // Precondition: ok(). Reading the value of an error is a caller bug and throws
  // std::bad_variant_access rather than returning garbage.
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace simpler
