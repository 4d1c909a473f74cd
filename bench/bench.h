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
  // Runs only as `mpirun -np 2 simpler bench NAME`: rank 0 measures, rank 1
  // serves (serve_rank). `simpler bench` with no name leaves it out.
  bool needs_mpi = false;
};

std::vector<BenchInfo> list();
// Runs one benchmark (and its peer, in the same run). With json, prints exactly
// one JSON object on one line; otherwise a readable table. Returns a process
// exit code: 0 ok, 2 unknown name, 1 failure.
int run(const std::string& name, bool json, std::ostream& out);
// An MPI benchmark on a rank other than 0: serve_rank plays this rank's part
// (the node, then the peer's echo) and returns an exit code.
bool serves_on_this_rank(const std::string& name);
int serve_rank(const std::string& name);

}  // namespace simpler::bench
