// Scratch directories for tests that write traces, dumps or CLI output.
// scratch_dir() gives the running test a fresh, empty directory of its own
// under the temp dir; it is removed when that test ends having passed and kept
// (its path printed) when it failed, so a green suite leaves nothing behind
// and a red test leaves its evidence. Call from the test's own thread.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace simpler::testing {

class ScratchDirs : public ::testing::EmptyTestEventListener {
 public:
  // The listener of this process, appended to gtest's on first use (gtest
  // owns and deletes it). Only the process that made a directory removes it:
  // a forked child that ends a test of its own leaves its parent's alone.
  static ScratchDirs& instance() {
    static ScratchDirs* const dirs = [] {
      auto* d = new ScratchDirs;
      ::testing::UnitTest::GetInstance()->listeners().Append(d);
      return d;
    }();
    return *dirs;
  }

  std::string make(const std::string& kind, const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string test = info != nullptr ? info->name() : "outside_a_test";
    std::replace(test.begin(), test.end(), '/', '_');  // a parametrised test's name is "Name/param"
    const auto dir = std::filesystem::temp_directory_path() /
                     fmt::format("simpler_{}_{}_{}_{}", kind, static_cast<long>(::getpid()), test, tag);
    std::filesystem::remove_all(dir);
    dirs_.push_back(dir.string());
    return dir.string();
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (::getpid() != owner_) return;
    for (const auto& dir : dirs_) {
      if (info.result()->Failed()) {
        std::fprintf(stderr, "scratch directory kept for diagnosis: %s\n", dir.c_str());
      } else {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    }
    dirs_.clear();
  }

 private:
  ScratchDirs() : owner_(::getpid()) {}
  pid_t owner_;
  std::vector<std::string> dirs_;
};

// A fresh directory named after the test: temp/simpler_<kind>_<pid>_<test>_<tag>.
inline std::string scratch_dir(const std::string& kind, const std::string& tag) {
  return ScratchDirs::instance().make(kind, tag);
}

}  // namespace simpler::testing
