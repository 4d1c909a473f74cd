// The node server: what serve_node runs on a rank other than 0. It builds
// its node (a NodeWorker with a shared heap of its own for the tensors that
// arrive, forked before MPI starts), answers the network's hello with the
// sets it grants and the NodeCallables it serves, then serves requests:
// each is classified (R7-R9) before anything is stored, its input bytes are
// received straight into the heap, and it runs as one node run whose
// terminal goes back with the output bytes. An unattributable request stops
// the endpoint (STOPPED with the reason; nothing more runs). A request that
// carries a traced or dumping CallConfig runs so into a private directory
// of this host (under $TMPDIR), whose files go back to the network (FILES)
// before the run's terminal, then are removed. Runs on the
// calling thread until SHUTDOWN; terminals are handed to it from the node's
// scheduler thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dist/wire.h"
#include "node/node_worker.h"
#include "simpler/remote.h"

namespace simpler::dist {

// Test seams: a forged message sent as this rank, and the points to send it at.
using RawSend = std::function<void(std::vector<uint8_t> bytes, int tag)>;
// One file of a run's shipment as the server is about to send it: `bytes`
// is what FILES declares, `send` how many of them go (a test shrinks it).
struct ShippedFile {
  std::string name;  // relative to the run's directory
  std::string path;  // on this host
  uint64_t bytes = 0;
  uint64_t send = 0;
};
struct ServeHooks {
  // After the n-th request (from 1) was taken and ACKed.
  std::function<void(uint64_t n)> on_request;
  // Before the n-th request's TERMINAL (`terminal`, already encoded) is sent.
  std::function<void(uint64_t n, const WireHeader& terminal, const RawSend& send)> before_terminal;
  // After the n-th request's TERMINAL and its output chunks were posted.
  std::function<void(uint64_t n)> after_terminal;
  // Before the n-th request's files are sent.
  std::function<void(uint64_t n, std::vector<ShippedFile>& files)> on_shipment;
  // Added to the clock this server reports in CLOCK_PONG: a node whose clock
  // runs that far ahead of the network's (its traces' timestamps do not move).
  int64_t pong_skew_ns = 0;
};

Status serve(NodeSpec spec, std::vector<NodeCallable> callables, const ServeOptions& options, ServeHooks hooks = {});

}  // namespace simpler::dist
