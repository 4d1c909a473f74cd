// The benchmark registry behind `simpler bench`. Called from the CLI's main
// thread only; each benchmark creates and closes its own Workers and peers.
#pragma once

#include <cstdint>
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
// The load of the goals: two busy neighbours on a 2-vCPU machine.
inline constexpr uint32_t kDefaultCompareNeighbours = 2;

struct RunOptions {
  bool json = false;
  // Busy-loop processes (Neighbours) running beside the benchmark for its
  // whole duration; 0: a quiet run.
  uint32_t neighbours = 0;
  // Runs the benchmark quiet, then beside `neighbours` busy processes, and
  // reports both and loaded_over_quiet: loaded ÷ quiet for every figure.
  bool compare_load = false;
};
// Runs one benchmark (and its peer, in the same run). With json, prints exactly
// one JSON object on one line; otherwise a readable table. Returns a process
// exit code: 0 ok, 2 unknown name, 1 failure.
int run(const std::string& name, const RunOptions& options, std::ostream& out);
// An MPI benchmark on a rank other than 0: serve_rank plays this rank's part
// (the node, then the peer's echo) and returns an exit code.
bool serves_on_this_rank(const std::string& name);
int serve_rank(const std::string& name);

}  // namespace simpler::bench
