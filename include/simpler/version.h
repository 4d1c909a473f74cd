// Version and build facts of the library. Any thread.
#pragma once

namespace simpler {
const char* version_string();
// Sanitizers, build type: for `simpler info`.
const char* build_options();
}  // namespace simpler
