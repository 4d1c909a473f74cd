// Deliberate leaks. Storage that a device thread may still write cannot be
// freed; it is abandoned instead, and marked so LeakSanitizer reports it as
// the intended leak it is rather than a bug. Any thread.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SIMPLER_HAS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMPLER_HAS_LSAN 1
#endif
#endif

#ifdef SIMPLER_HAS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace simpler {

// Takes ownership away from every smart pointer first; this only records intent.
template <typename T>
T* abandon(T* p) {
#ifdef SIMPLER_HAS_LSAN
  if (p != nullptr) __lsan_ignore_object(p);
#endif
  return p;
}

}  // namespace simpler
