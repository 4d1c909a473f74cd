// CallConfig's checks and its wire form. validate_call_config runs on the
// submitting thread (or at Worker::init for the default); the codec carries
// a CallConfig in a mailbox request's config region to a chip child, whose
// serve thread decodes it (bounded, validating: the bytes crossed a process
// boundary).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "simpler/call_config.h"
#include "simpler/status.h"

namespace simpler::diag {

// INVALID_ARGUMENT naming `<prefix>swimlane_level` (> 4) or
// `<prefix>trace_dir` (empty with a level, or not creatable), UNIMPLEMENTED
// for any dump_args but Off. On success a traced config's directory exists;
// on a refusal nothing was created.
Status validate_call_config(const CallConfig& config, const char* prefix = "");

// The wire form: magic and version first, fixed layout, the directory's
// bytes after the header.
struct CallConfigWire {
  static constexpr uint32_t kMagic = 0x47464343;  // "CCFG"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic;
  uint16_t version;
  uint8_t swimlane_level;
  uint8_t dump_args;
  uint32_t dir_bytes;
  // Where the child's trace sits in its parent's file: its process label
  // index (chip<i>) and the parent's clock minus the child's, in ns (0 for
  // forked children: one host, one steady_clock).
  uint32_t child_index;
  int64_t clock_offset_ns;
};
static_assert(sizeof(CallConfigWire) == 24);
static_assert(offsetof(CallConfigWire, dir_bytes) == 8 && offsetof(CallConfigWire, clock_offset_ns) == 16);

// What a child learns from the wire.
struct ChildCallConfig {
  CallConfig call;
  uint32_t child_index = 0;
  int64_t clock_offset_ns = 0;
};

// Where a next-level child writes its part of a node or network run traced
// or dumped into `dir`: dir/<kind><index>/task<task> (chip1/task3: the
// node's task 3, run by chip 1). The parent merges the trace from there.
std::string child_trace_dir(const std::string& dir, const char* kind, uint32_t index, uint32_t task);

// Bytes written to `out` (capacity `cap`), or INVALID_ARGUMENT naming
// trace_dir when it does not fit.
Result<size_t> encode_call_config(const ChildCallConfig& config, uint8_t* out, size_t cap);
// Validates every field and the length; refuses naming the field. Zero
// bytes decode as the default (no diagnostics).
Result<ChildCallConfig> decode_call_config(const uint8_t* data, size_t bytes);

}  // namespace simpler::diag
