// Whether this build is instrumented by AddressSanitizer or ThreadSanitizer,
// for code and tests whose bounds on measured times or sizes must allow for
// the instrumentation's slowdown. Any thread; a compile-time constant.
#pragma once

namespace simpler {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

}  // namespace simpler
