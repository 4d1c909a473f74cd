// The normalized form of the installed public headers that the R71 snapshot
// records: every file under include/simpler/ in path order, comments and blank
// lines dropped, whitespace runs collapsed, so only a change to what a user
// compiles against changes it. Used on one thread by the API snapshot test and
// by the refresh tool (simpler_api_snapshot); owns nothing.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "simpler/status.h"

namespace simpler::api_snapshot {

inline constexpr std::string_view kRefreshCommand = "cmake --build --preset default --target update_api_snapshot";

// A quote right after a digit-led token is a digit separator (1'000), not a
// character literal; reading it as one would swallow code up to the next quote.
inline bool is_digit_separator(std::string_view src, size_t quote) {
  auto in_token = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '\''; };
  size_t b = quote;
  while (b > 0 && in_token(src[b - 1])) --b;
  return b < quote && std::isdigit(static_cast<unsigned char>(src[b]));
}

// Removes // and /* */ comments outside string and character literals. Every
// newline is kept, so a block comment cannot join two lines of code.
inline std::string strip_comments(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      i += 2;
      while (i < src.size() && !(src[i] == '*' && i + 1 < src.size() && src[i + 1] == '/')) {
        if (src[i] == '\n') out += '\n';
        ++i;
      }
      i = std::min(i + 2, src.size());
      out += ' ';
    } else if (c == '"' || (c == '\'' && !is_digit_separator(src, i))) {
      out += c;
      for (++i; i < src.size() && src[i] != c && src[i] != '\n'; ++i) {
        out += src[i];
        if (src[i] == '\\' && i + 1 < src.size()) out += src[++i];
      }
      if (i < src.size() && src[i] == c) out += src[i++];
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

// The header's non-blank lines with comments removed and whitespace collapsed.
inline std::vector<std::string> normalize_header(std::string_view src) {
  std::vector<std::string> lines;
  std::istringstream in(strip_comments(src));
  for (std::string line; std::getline(in, line);) {
    std::string norm;
    for (char ch : line) {
      if (std::isspace(static_cast<unsigned char>(ch))) {
        if (!norm.empty() && norm.back() != ' ') norm += ' ';
      } else {
        norm += ch;
      }
    }
    if (!norm.empty() && norm.back() == ' ') norm.pop_back();
    if (!norm.empty()) lines.push_back(std::move(norm));
  }
  return lines;
}

// The whole snapshot: a preamble, then per header under `include_dir`/simpler
// (recursively, sorted by path) a "=== simpler/<path>" line and its lines.
inline Result<std::vector<std::string>> normalize_public_headers(const std::filesystem::path& include_dir) {
  namespace fs = std::filesystem;
  const fs::path root = include_dir / "simpler";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status(StatusCode::kNotFound, root.string() + ": no such directory");
  std::vector<fs::path> files;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  if (ec) return Status(StatusCode::kInternal, root.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out{"# The public API (R71): include/simpler/, comments and blank lines dropped.",
                               "# Refresh after a deliberate API change: " + std::string(kRefreshCommand)};
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return Status(StatusCode::kNotFound, f.string() + ": cannot be read");
    std::ostringstream text;
    text << in.rdbuf();
    out.push_back("=== " + fs::relative(f, include_dir).generic_string());
    for (std::string& line : normalize_header(text.str())) out.push_back(std::move(line));
  }
  return out;
}

}  // namespace simpler::api_snapshot
