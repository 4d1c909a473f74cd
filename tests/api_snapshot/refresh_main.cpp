// simpler_api_snapshot INCLUDE_DIR OUT_FILE: rewrites the R71 public API
// snapshot from the headers. Run it through the update_api_snapshot target
// (see api_snapshot/api_normalize.h for the command), then review the diff.
#include <cstdio>
#include <fstream>

#include "api_snapshot/api_normalize.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s INCLUDE_DIR OUT_FILE\n", argv[0]);
    return 2;
  }
  auto lines = simpler::api_snapshot::normalize_public_headers(argv[1]);
  if (!lines.ok()) {
    std::fprintf(stderr, "simpler_api_snapshot: %s\n", lines.status().message().c_str());
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  for (const std::string& line : *lines) out << line << '\n';
  out.close();
  if (!out) {
    std::fprintf(stderr, "simpler_api_snapshot: cannot write %s\n", argv[2]);
    return 1;
  }
  std::printf("simpler_api_snapshot: wrote %zu lines to %s\n", lines->size(), argv[2]);
  return 0;
}
