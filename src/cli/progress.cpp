#include "progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/core.h>

namespace simpler::cli {

ProgressLine::ProgressLine()
    : enabled_(isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressLine::~ProgressLine() { clear(); }

void ProgressLine::update(const std::string& text) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::seconds(1)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  fmt::print(stderr, "\r\033[K[{:5.1f} s] {}", elapsed, text);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::clear() {
  if (!drawn_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace simpler::cli
