// fmt-formatted constructors for Status values and the propagation macros,
// for simpler's own sources. Any thread.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "simpler/status.h"

namespace simpler {

// Every constructor of an error below is cold and out of line: the compiler
// moves the branches that build an error, with their formatting, out of the
// hot code beside them. A call that succeeds then runs through a few cache
// lines instead of a function-sized stretch, which counts when it runs cold
// (the first submit after a long run that evicted the host's caches).
#define SIMPLER_COLD [[gnu::cold, gnu::noinline]]

template <typename... A>
SIMPLER_COLD Status make_error(StatusCode code, fmt::format_string<A...> f, A&&... a) {
  return Status(code, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
SIMPLER_COLD Status invalid_argument(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kInvalidArgument, f, std::forward<A>(a)...);
}
template <typename... A>
SIMPLER_COLD Status failed_precondition(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kFailedPrecondition, f, std::forward<A>(a)...);
}
template <typename... A>
SIMPLER_COLD Status out_of_range(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kOutOfRange, f, std::forward<A>(a)...);
}
template <typename... A>
SIMPLER_COLD Status not_found(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kNotFound, f, std::forward<A>(a)...);
}
template <typename... A>
SIMPLER_COLD Status resource_exhausted(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kResourceExhausted, f, std::forward<A>(a)...);
}
template <typename... A>
SIMPLER_COLD Status internal_error(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kInternal, f, std::forward<A>(a)...);
}

// Whether `code` is the number of a StatusCode (for decoders of codes that
// crossed a process boundary). kDeviceFault is the last code.
inline bool is_status_code(int64_t code) { return code >= 0 && code <= static_cast<int64_t>(StatusCode::kDeviceFault); }

template <typename... A>
SIMPLER_COLD Status user_code_failed(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kUserCodeFailed, f, std::forward<A>(a)...);
}

namespace detail {
inline Status with_context(Status s) { return s; }
// "context: original message", with the original code.
template <typename... A>
SIMPLER_COLD Status with_context(const Status& s, fmt::format_string<A...> f, A&&... a) {
  return Status(s.code(), fmt::format(f, std::forward<A>(a)...) + ": " + s.message());
}
}  // namespace detail

}  // namespace simpler

#define SIMPLER_CONCAT_INNER(a, b) a##b
#define SIMPLER_CONCAT(a, b) SIMPLER_CONCAT_INNER(a, b)

// SIMPLER_RETURN_IF_ERROR(status_expr [, "context {}", args...]): returns the
// error from the enclosing function (which returns Status or any Result<T>),
// its message prefixed with the formatted context when one is given.
#define SIMPLER_RETURN_IF_ERROR(expr, ...)                                                           \
  do {                                                                                               \
    ::simpler::Status simpler_status_ = (expr);                                                      \
    if (!simpler_status_.ok()) [[unlikely]] {                                                        \
      return ::simpler::detail::with_context(std::move(simpler_status_) __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                                \
  } while (0)

// SIMPLER_ASSIGN_OR_RETURN(lhs, result_expr [, "context {}", args...]):
// evaluates a Result<T>; on an error returns it (with the context, as above),
// otherwise moves the value into `lhs`, which may declare it (`auto x`).
#define SIMPLER_ASSIGN_OR_RETURN(lhs, expr, ...) \
  SIMPLER_ASSIGN_OR_RETURN_IMPL(SIMPLER_CONCAT(simpler_result_, __LINE__), lhs, expr __VA_OPT__(, ) __VA_ARGS__)
#define SIMPLER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr, ...)                           \
  auto tmp = (expr);                                                                 \
  if (!tmp.ok()) [[unlikely]]                                                        \
    return ::simpler::detail::with_context(tmp.status() __VA_OPT__(, ) __VA_ARGS__); \
  lhs = std::move(tmp).value()
