// Remote nodes over MPI: a Level::Network worker on MPI rank 0 reaches nodes
// served on the other ranks of one `mpirun` job (Worker::add_remote_worker),
// and every other rank serves one node (serve_node). Plain values and free
// functions; serve_node blocks the calling thread for the node's life.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "simpler/callable.h"
#include "simpler/status.h"

namespace simpler {

class Worker;

struct RemoteNodeOptions {
  // The node sends a heartbeat every serve period; a rank the network hears
  // nothing from this long is presumed dead: every run it held ends with an
  // error naming the rank, and the worker takes no more work.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(5)};
  // How long init() waits for the rank's node server to answer.
  std::chrono::milliseconds ready_timeout{std::chrono::seconds(60)};
};

struct ServeOptions {
  // The node server's own shared heap, where the tensors of the requests in
  // flight are received and the node's children read and write them.
  uint64_t tensor_heap_bytes = 1ull << 30;
  // Sent from a thread of its own, however long the serve loop is busy.
  std::chrono::milliseconds heartbeat_period{std::chrono::milliseconds(100)};
  // The network sending nothing this long (it heartbeats too) ends serve_node.
  std::chrono::milliseconds network_timeout{std::chrono::seconds(30)};
  // How long serve_node waits for the network's hello.
  std::chrono::milliseconds hello_timeout{std::chrono::seconds(60)};
};

// This process's rank and the job's size, from mpirun's environment (0 and 1
// outside mpirun); readable before anything initialises MPI.
int mpi_rank();
int mpi_size();

// On a rank other than 0: `node`, an uninitialised Level::Node Worker with its
// chip callables and functions registered, is initialised here (it forks its
// children before MPI starts) and serves the network on rank 0, running the
// NodeCallables in `callables` (the network registers the same names).
// Returns when the network closes (OK), or with why the node stopped serving.
// `node` is left closed.
Status serve_node(Worker&& node, std::vector<NodeCallable> callables, ServeOptions options = {});

}  // namespace simpler
