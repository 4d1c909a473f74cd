// ProgressLine: a status line on stderr for long CLI work, redrawn at most once a
// second and only when stderr is a terminal (quiet in pipes, logs and CI).
// Used from the CLI's main thread only; owns nothing but its timing state.
#pragma once

#include <chrono>
#include <string>

namespace simpler::cli {

class ProgressLine {
 public:
  ProgressLine();   // enabled iff stderr is a terminal
  ~ProgressLine();  // clears the line it drew
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Cheap to call often: text is drawn only if a second passed since the last draw.
  void update(const std::string& text);
  // Erases the line so the next output starts on a clean row.
  void clear();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace simpler::cli
