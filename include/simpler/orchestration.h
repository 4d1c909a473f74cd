// The orchestration ABI: a chip callable's orchestration built as a shared
// object (simpler_add_orchestration) and loaded with load_orchestration. The
// entry point runs on the thread that builds a run, as an in-process
// OrchestrationFn does; it owns nothing, and its outcome crosses the C
// boundary as a status code and a message in the caller's buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>

#include "simpler/orchestrator.h"
#include "simpler/status.h"

// The symbol load_orchestration looks up. Its contract:
//  - returns a StatusCode as an int32 (0: OK);
//  - on an error, writes a NUL-terminated message of at most
//    message_capacity bytes (the NUL included) into `message`;
//  - never lets an exception escape.
// Write it with SIMPLER_ORCHESTRATION, which keeps that contract for you.
extern "C" {
typedef int32_t (*simpler_orchestration_fn)(simpler::ChipOrchestrator* orchestrator, const simpler::TaskArgs* run_args,
                                            char* message, size_t message_capacity);
}

namespace simpler {

inline constexpr const char* kOrchestrationEntrySymbol = "orchestration_entry";

namespace detail {

// Formats without allocating: an error path may run out of host memory.
inline void write_orchestration_message(char* message, size_t capacity, const char* prefix, const char* text) {
  if (message == nullptr || capacity == 0) return;
  std::snprintf(message, capacity, "%s%s", prefix, text);
}

template <typename Fn>
int32_t call_orchestration(Fn&& fn, ChipOrchestrator* o, const TaskArgs* run_args, char* message,
                           size_t capacity) noexcept {
  try {
    const Status s = fn(*o, *run_args);
    if (!s.ok()) write_orchestration_message(message, capacity, "", s.message().c_str());
    return static_cast<int32_t>(s.code());
  } catch (const std::bad_alloc&) {
    write_orchestration_message(message, capacity, "orchestration: host memory exhausted", "");
    return static_cast<int32_t>(StatusCode::kResourceExhausted);
  } catch (const std::exception& e) {
    write_orchestration_message(message, capacity, "orchestration threw: ", e.what());
  } catch (...) {
    write_orchestration_message(message, capacity, "orchestration threw a non-standard exception", "");
  }
  return static_cast<int32_t>(StatusCode::kUserCodeFailed);
}

}  // namespace detail
}  // namespace simpler

// Exports `fn`, a Status(ChipOrchestrator&, const TaskArgs&) function of this
// shared object, as its orchestration entry point: its Status becomes the code
// and message, a thrown exception USER_CODE_FAILED with the exception's text.
// Use it once per shared object, at namespace scope.
#define SIMPLER_ORCHESTRATION(fn)                                                                      \
  extern "C" __attribute__((visibility("default"))) int32_t orchestration_entry(                       \
      simpler::ChipOrchestrator* orchestrator, const simpler::TaskArgs* run_args, char* message,       \
      size_t message_capacity) noexcept {                                                              \
    return simpler::detail::call_orchestration(fn, orchestrator, run_args, message, message_capacity); \
  }
