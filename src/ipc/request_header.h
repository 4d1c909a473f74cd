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
  kUnattributable,  // the index or generation names no possible occupant: the endpoint stops (R9)
  // Refused unserved, the frame word the only store, the run resolved by the
  // parent from its own record (R8): a past occupant's header (stale); no
  // publication (the parent stores it before the ready word, so a ready frame
  // without one is corrupt); an occupant that already left IDLE (the one
  // hand-off per occupant happened: a replayed or torn header); or a header
  // that names the occupant's generation but another run (a leftover header
  // whose generation was corrupted into the current one).
  kRefused,
  kMalformed,  // this occupant's header, but its version or sizes are wrong: the run fails
  kAccepted,   // this occupant's header; its sizes fit the frame
};

struct DecodedHeader {
  HeaderVerdict verdict = HeaderVerdict::kRefused;
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
// its index names (generation, then state), and only once that index is in range.
DecodedHeader decode_request_header(const RequestHeader& snapshot, const MailboxView& view);

}  // namespace simpler
