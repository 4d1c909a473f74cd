// fmt-formatted constructors for Status values, for simpler's own sources.
// Any thread.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "simpler/status.h"

namespace simpler {

template <typename... A>
Status make_error(StatusCode code, fmt::format_string<A...> f, A&&... a) {
  return Status(code, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
Status invalid_argument(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kInvalidArgument, f, std::forward<A>(a)...);
}
template <typename... A>
Status failed_precondition(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kFailedPrecondition, f, std::forward<A>(a)...);
}
template <typename... A>
Status out_of_range(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kOutOfRange, f, std::forward<A>(a)...);
}
template <typename... A>
Status not_found(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kNotFound, f, std::forward<A>(a)...);
}
template <typename... A>
Status resource_exhausted(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kResourceExhausted, f, std::forward<A>(a)...);
}
template <typename... A>
Status internal_error(fmt::format_string<A...> f, A&&... a) {
  return make_error(StatusCode::kInternal, f, std::forward<A>(a)...);
}

#define SIMPLER_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::simpler::Status simpler_status_ = (expr); \
    if (!simpler_status_.ok()) return simpler_status_; \
  } while (0)

}  // namespace simpler
