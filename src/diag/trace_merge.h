// One trace.json for a node or network run: the parent's own host lanes
// (Scheduler, a Serve lane per child, Sub lanes) as one process, and the
// trace.json fragment each child wrote for its part of the run, spliced in
// with their flow ids renumbered (unique in the file) and, for a nested
// node, their process labels prefixed. Runs on the thread retiring the run,
// after every child's terminal (each fragment was renamed into place first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diag/lane.h"
#include "simpler/status.h"

namespace simpler::diag {

// A slice on a host lane ("cat":"host"): `args_json` is the inside of its
// args object (`"task":3,"run":7`), or empty.
struct HostSlice {
  uint32_t tid = 0;
  std::string name;
  uint64_t begin_ns = 0;
  uint64_t end_ns = 0;
  std::string args_json;
};

// The parent process as its trace shows it.
struct HostTrace {
  int pid = 0;
  std::string label;  // node, network, node1 (a network's node child)
  uint64_t run = 0;
  uint32_t level = 0;
  std::vector<LaneInfo> lanes;
  std::vector<HostSlice> slices;
};

// A child's trace.json, where its part of the run is.
inline constexpr int kRemotePidShift = 22;

struct TraceFragment {
  std::string path;
  // The parent's clock minus the child's, added to every timestamp (0 for a
  // forked child: one host, one steady_clock).
  int64_t clock_offset_ns = 0;
  // A remote (MPI) node's fragment: its rank (-1: a forked child) and the
  // round trip of the ping-pong the offset came from; listed with both in
  // otherData.remote_fragments.
  // Its pids are moved up by rank << kRemotePidShift (above any Linux pid),
  // so another host's processes never share one with this host's.
  int remote_rank = -1;
  uint64_t clock_rtt_ns = 0;
  // Why the fragment's files were refused on arrival (empty: not refused);
  // a refused fragment is missing, and remote_fragments says why.
  std::string refused;
};

struct MergedTrace {
  std::string document;
  uint32_t fragments = 0;            // spliced in
  std::vector<std::string> missing;  // fragment paths that did not exist (a child whose run never ended on its device)
};

// Reads every fragment (bounded like trace_reader, validating what it
// rewrites: events are objects, pids and flow ids integers) and builds the
// whole document. `label_prefix` ("node1/") goes before every fragment's
// process label. INVALID_ARGUMENT naming the fragment and the event it refuses.
Result<MergedTrace> merge_trace(const HostTrace& host, const std::vector<TraceFragment>& fragments,
                                const std::string& label_prefix);

}  // namespace simpler::diag
