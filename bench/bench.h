// The benchmark registry behind `simpler bench`. Called from the CLI's main
// thread only; each benchmark creates and closes its own Workers and peers.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace simpler::bench {

struct BenchInfo {
  std::string name;
  std::string description;
};

std::vector<BenchInfo> list();
// Runs one benchmark (and its peer, in the same run). With json, prints exactly
// one JSON object on one line; otherwise a readable table. Returns a process
// exit code: 0 ok, 2 unknown name, 1 failure.
int run(const std::string& name, bool json, std::ostream& out);

}  // namespace simpler::bench
