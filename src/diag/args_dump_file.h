// A run's argument dump on disk, and what users ask of it: DIR/manifest.json
// (one entry per captured argument, with its byte range in DIR/args.bin) and
// DIR/args.bin. ArgsDumpWriter is fed by one host thread (the run's
// collector); the reader, the per-tensor summary and the diff are pure
// functions used by `simpler dump show|diff`. The loader validates every
// field before a byte is read, naming the entry and field it refuses.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "diag/args_dump_lane.h"
#include "simpler/status.h"
#include "simpler/types.h"

namespace simpler {

inline constexpr int kArgsDumpVersion = 1;

enum class DumpSelection : uint8_t { kOff = 0, kPartial, kHybrid, kFull };
const char* dump_selection_name(DumpSelection s);

class ArgsDumpWriter {
 public:
  // Creates `dir` (and its parents) and DIR/args.bin.
  static Result<std::unique_ptr<ArgsDumpWriter>> open(const std::string& dir);
  ~ArgsDumpWriter();
  ArgsDumpWriter(const ArgsDumpWriter&) = delete;
  ArgsDumpWriter& operator=(const ArgsDumpWriter&) = delete;

  // The sink lane `lane`'s host thread drains into: appends the payload to
  // args.bin and remembers the record. The first write error is sticky.
  DumpLane::Sink sink_for(uint32_t lane);

  struct Summary {
    uint64_t run_epoch = 0;
    DumpSelection selection = DumpSelection::kFull;
    // Every lane drained after its producer was proved stopped; false: the
    // accounting is unknown (a lane stopped mid-argument, or no stop proof).
    bool complete = false;
    std::vector<DumpCounts> lanes;
    std::function<std::string(uint32_t func_id)> kernel_name;
  };
  // Writes manifest.json; returns the first error of the whole dump.
  Status finish(const Summary& summary);
  uint64_t records() const { return entries_.size(); }

 private:
  struct Entry {
    DumpRecord rec;
    uint32_t lane;
    uint64_t bin_offset;
  };
  ArgsDumpWriter(std::string dir, std::FILE* bin);
  std::string dir_;
  std::FILE* bin_;
  uint64_t bin_bytes_ = 0;
  Status first_error_;
  std::vector<Entry> entries_;
};

// One argument at one stage, as the manifest describes it.
struct DumpedArg {
  uint64_t task = 0;
  std::string kernel;
  uint32_t func_id = 0;
  DumpRole role = DumpRole::kInput;
  DumpStage stage = DumpStage::kBefore;
  uint32_t arg = 0;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  uint64_t bin_offset = 0;
  uint64_t bytes = 0;  // in args.bin
  uint64_t logical_bytes = 0;
  bool truncated = false;
  bool metadata_only = false;
  uint64_t order = 0;
  uint32_t lane = 0;
};

struct ArgsDump {
  std::string dir;
  uint64_t run_epoch = 0;
  std::string selection;
  bool complete = false;
  DumpCounts counts;            // summed over lanes
  std::vector<DumpedArg> args;  // in capture order
  std::vector<uint8_t> bin;
};

// Loads DIR/manifest.json and DIR/args.bin, checking every entry against
// the bin and its own shape.
Result<ArgsDump> load_args_dump(const std::string& dir);

// Element i (row-major over the argument's shape) of a dumped argument.
double dumped_element(const ArgsDump& dump, const DumpedArg& arg, uint64_t i);
uint64_t dumped_elements(const DumpedArg& arg);  // in args.bin

struct TensorSummary {
  uint64_t elements = 0;
  double min = 0, max = 0, mean = 0;  // over the finite elements
  uint64_t nan = 0, inf = 0;
};
TensorSummary summarize(const ArgsDump& dump, const DumpedArg& arg);

struct DumpDifference {
  bool differs = false;
  std::string what;  // one sentence: the task, kernel, argument, element and both values, or why nothing compares
  uint64_t task = 0;
  uint32_t arg = 0;
  std::vector<int64_t> index;  // of the first differing element
  double a = 0, b = 0;
};
// Walks `a`'s outputs and inouts after their tasks ran, in a's execution
// order, and names the first whose bytes differ from the same task's and
// argument's in `b` beyond |x - y| <= atol + rtol * |y| (NaN equals NaN).
// An argument missing from `b` or of another shape is a difference.
DumpDifference diff_args_dumps(const ArgsDump& a, const ArgsDump& b, double rtol, double atol);

// The argument dumps under a directory, each as (label, dump dir): a chip
// run's own ("", DIR or DIR/args_dump), or every chip's part of the node or
// network runs under it (run1/chip1/task3, run2/node0/task2/chip1/task0; or
// chip1/task3 given run1's directory), by run, then in the order of their
// tasks: by node task, then chip, level by level (a node task's predecessors
// were submitted, so numbered, before it). Empty when none.
std::vector<std::pair<std::string, std::string>> find_args_dumps(const std::string& dir);

}  // namespace simpler
