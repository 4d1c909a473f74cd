// The request header as both sides handle it: the parent stores the fields
// while the frame's publication word reads 0; the child takes one snapshot of
// the words and decodes it. The decode is a pure function of the snapshot and
// of the entry generations it reads, so a fuzzer drives the very code the
// child runs (T7).
#pragma once

#include <cstdint>

#include "ipc/mailbox_layout.h"
#include "simpler/status.h"

namespace simpler {

// What the parent writes into a header under publication 0.
struct RequestFields {
  uint32_t protocol_version = 0;
  uint64_t entry_index = 0;
  uint64_t entry_generation = 0;
  uint64_t run_id = 0;
  uint64_t dispatch_id = 0;
  uint32_t task_slot = 0;
  uint32_t config_bytes = 0;
  uint32_t args_bytes = 0;

  bool operator==(const RequestFields&) const = default;
};

enum class HeaderVerdict : uint8_t {
  kRewriting,       // publication 0: the parent is rewriting the frame; skip it this scan
  kUnattributable,  // the index or generation names no possible occupant: the endpoint stops (R9)
  kStale,           // a past occupant's header: refuse the frame, store nothing to the entry (R8)
  kMalformed,       // this occupant's header, but its version or sizes are wrong: the run fails
  kAccepted,        // this occupant's header; its sizes fit the frame
};

struct DecodedHeader {
  HeaderVerdict verdict = HeaderVerdict::kRewriting;
  uint64_t publication = 0;
  RequestFields fields;  // copied whatever the verdict; act on them only as the verdict allows
  Status why;            // kUnattributable, kMalformed: the reason

  bool operator==(const DecodedHeader&) const = default;
};

// Stores every field but `publication` and `ready`, which frame the hand-off.
void store_request_fields(RequestHeader& h, const RequestFields& f);
// One snapshot of a shared header: `publication` with acquire, then the rest.
RequestHeader load_request_header(const RequestHeader& h);
// Classifies a snapshot against `view`'s entry table. Reads only the entry
// generation its index names, and only once that index is in range.
DecodedHeader decode_request_header(const RequestHeader& snapshot, const MailboxView& view);

}  // namespace simpler
