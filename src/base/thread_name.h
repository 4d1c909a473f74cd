// Names the calling thread (at most 15 characters are kept) so that perf, gdb
// and top tell the simulator's threads apart. Called by a thread on itself,
// once, when it starts. Owns nothing.
#pragma once

#include <pthread.h>

#include <string>
#include <utility>

#include <fmt/format.h>

namespace simpler {

template <typename... Args>
void name_this_thread(fmt::format_string<Args...> format, Args&&... args) {
  std::string name = fmt::format(format, std::forward<Args>(args)...);
  if (name.size() > 15) name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
}

}  // namespace simpler
