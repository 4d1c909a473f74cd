// The wire between a network (MPI rank 0) and a remote node server (another
// rank): fixed-layout messages, magic and version first, and the bounded,
// validating decoders both sides run on whatever arrived before acting on it.
// Pure functions of their inputs (no MPI here), so unit tests and the fuzzer
// drive the very code the endpoints run. Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "simpler/callable.h"
#include "simpler/status.h"
#include "task/args_blob.h"

namespace simpler::dist {

inline constexpr uint32_t kWireMagic = 0x49504d53;  // "SMPI"
inline constexpr uint16_t kWireVersion = 3;
// Control messages travel on kTagControl; the tensor bytes of the run that
// occupies entry e on kTagDataBase + e, so the chunks of two runs never
// interleave and a refused message's chunks can be drained by their own tag.
inline constexpr int kTagControl = 1;
inline constexpr int kTagDataBase = 16;
// Tensor bytes go in chunks of at most this size, each one MPI message sent
// from and received into the tensor's own memory (no staging copy).
inline constexpr uint64_t kChunkBytes = 8ull << 20;
// Bounds of what a decoder accepts.
inline constexpr uint32_t kWireMaxEntries = 4096;  // remote runs in flight per node; tags stay < 32767
inline constexpr uint32_t kWireMaxCallables = 1024;
inline constexpr uint32_t kWireMaxText = 16384;
inline constexpr uint64_t kWireMaxTensorBytes = 1ull << 40;
// A request's CallConfig (the CCFG wire form, diag/call_config.h), as a
// forked node's mailbox request carries it in its config region.
inline constexpr uint32_t kWireMaxConfig = 1024;
// A traced or dumping run's files (its node trace.json and argument dumps)
// travel back to the network as FILES messages of at most kFileChunkBytes of
// data each, named relative to the run's directory there.
inline constexpr uint64_t kFileChunkBytes = 256u << 10;
inline constexpr uint32_t kWireMaxFiles = 4096;
inline constexpr uint32_t kWireMaxFileName = 512;
inline constexpr uint64_t kWireMaxFileBytes = 1ull << 32;
inline constexpr uint64_t kWireMaxShipmentBytes = 1ull << 34;

enum class MsgKind : uint16_t {
  kHello = 1,         // network -> node: session, requested sets (R68)
  kHelloReply = 2,    // node -> network: granted sets, its NodeCallables' digests
  kRequest = 3,       // network -> node: one run; input chunks follow
  kAck = 4,           // node -> network: request taken; carries the run epoch it minted
  kAccepted = 5,      // node -> network: the node admitted the run (launch marker)
  kTerminal = 6,      // node -> network: the run's one terminal; output chunks follow
  kHeartbeat = 7,     // either way: alive
  kStopped = 8,       // node -> network: the endpoint stopped (an unattributable request); reason text
  kShutdown = 9,      // network -> node: drain and exit serve_node
  kMemoryQuery = 10,  // network -> node: memory_info
  kMemoryReply = 11,  // node -> network: total, free
  kClockPing = 12,    // network -> node: value = the network's clock (ns) when sent
  kClockPong = 13,    // node -> network: value = the node's clock when it answered; dispatch_id = the ping's value
  kFiles = 14,        // node -> network: one chunk of one file of a run's shipment, before its TERMINAL
};
inline constexpr uint16_t kMsgKindLast = 14;
const char* msg_kind_name(MsgKind k);

// Every message starts with this header; payload_bytes more bytes follow in
// the same MPI message.
struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t session;        // the network's, chosen at hello; every later message carries it
  uint32_t entry;          // the entry the run occupies on the network's side
  uint32_t tensor_count;   // request: tensor table rows; terminal: buffers returned; files: files shipped
  uint64_t generation;     // the entry's occupancy generation, odd while occupied (R7)
  uint64_t run_epoch;      // minted by the node per request it takes (ACK), echoed after
  uint64_t dispatch_id;    // the network's task id, echoed (diagnostics)
  uint64_t value;          // hello: sets requested; reply: granted; memory reply: total bytes;
                           // request: CallConfig bytes; files: the shipment's bytes; clock: a clock
  int32_t status_code;     // terminal: the run's StatusCode
  uint32_t payload_bytes;  // after the header
};
static_assert(sizeof(WireHeader) == 64);
static_assert(offsetof(WireHeader, magic) == 0);
static_assert(offsetof(WireHeader, session) == 8);
static_assert(offsetof(WireHeader, generation) == 24);
static_assert(offsetof(WireHeader, value) == 48);
static_assert(offsetof(WireHeader, payload_bytes) == 60);

// A request's tensor table: one row per distinct buffer its arguments name,
// in first-use order. A row carries bytes [offset, offset + bytes) of its
// buffer: the span of every view of it, from a 64-byte boundary (so each
// view's element offset rebases exactly). The node allocates `bytes` of its
// own, receives the row's chunks when kToNode, sends them back with the
// terminal when kFromNode. A written row goes both ways: the bytes a kernel
// leaves unwritten keep the caller's values, as on a local node.
inline constexpr uint32_t kToNode = 1;    // read by the run, or written (whose unwritten bytes are kept)
inline constexpr uint32_t kFromNode = 2;  // written by the run (Output, OutputExisting, InOut)
inline constexpr uint64_t kRowAlignment = 64;
struct TensorRow {
  uint64_t addr;          // the network's buffer address, only to match the args blob's buffers
  uint64_t buffer_bytes;  // the buffer's size, as the args blob names it
  uint64_t offset;        // of the row's first byte in the buffer; a multiple of kRowAlignment
  uint64_t bytes;
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(TensorRow) == 40);
static_assert(offsetof(TensorRow, offset) == 16);
static_assert(offsetof(TensorRow, flags) == 32);

// Layouts of the payloads:
//   hello reply: digests (32 bytes each, header.value >= requested)
//   request:     callable digest (32), tensor_count rows, the args blob, then value bytes of CallConfig
//   files:       a FileChunkHead, its name, then the chunk's data
//   terminal:    tensor_count uint64 sizes (the returned buffers), then the text
//   stopped:     the text
//   memory reply: free bytes (uint64)
inline constexpr size_t kRequestFixedBytes = sizeof(Digest);

// One FILES message: bytes [offset, offset + data) of file file_index (of
// the header's tensor_count) whose whole size is file_bytes. A file's chunks
// come in order; an empty file is one chunk without data.
struct FileChunkHead {
  uint64_t file_bytes;
  uint64_t offset;
  uint32_t file_index;
  uint32_t name_bytes;
};
static_assert(sizeof(FileChunkHead) == 24);
static_assert(offsetof(FileChunkHead, file_index) == 16);

// How many chunk messages carry `bytes` (0 for 0).
inline constexpr uint64_t chunk_count(uint64_t bytes) { return (bytes + kChunkBytes - 1) / kChunkBytes; }

// A structurally valid message: the header, and views into the bytes it was
// decoded from (valid while they are).
struct Message {
  WireHeader h{};
  MsgKind kind = MsgKind::kHeartbeat;
  std::span<const uint8_t> payload;
  // kRequest
  Digest callable{};
  std::vector<TensorRow> rows;
  std::span<const uint8_t> args_blob;
  std::span<const uint8_t> config;  // CCFG bytes; empty: no diagnostics
  // kFiles
  FileChunkHead file{};
  std::string_view file_name;
  std::span<const uint8_t> file_data;
  // kTerminal: the returned buffers' sizes; kStopped, kTerminal: the text
  std::vector<uint64_t> sizes;
  std::string_view text;
  // kHelloReply
  std::vector<Digest> digests;
};

// Decodes `n` bytes that arrived over MPI. Never reads past them; refuses,
// naming the field: a short message, a wrong magic or version, an unknown
// kind, a payload length that disagrees with the header or the kind's
// layout, counts or sizes past the bounds above, a terminal status code
// that is no StatusCode, and a request whose args blob does not decode or
// names a tensor buffer that is not exactly one of its rows.
Result<Message> decode_message(std::span<const uint8_t> bytes);

// What the network checks of a FILES chunk beyond its layout, before any of
// it touches its disk: the name is relative and stays in the run's directory
// (1..kWireMaxFileName bytes of [A-Za-z0-9._-/], no empty, `.` or `..`
// component), and the file, file count and shipment are within the bounds
// above. A refusal names the field; it refuses the shipment, not the run.
Status validate_file_chunk(const Message& m);

// Encoders (the sender's own values; the decoder is the check).
std::vector<uint8_t> encode_simple(MsgKind kind, uint64_t session, uint32_t entry, uint64_t generation,
                                   uint64_t run_epoch, uint64_t dispatch_id, uint64_t value = 0);
std::vector<uint8_t> encode_hello_reply(uint64_t session, uint64_t granted, std::span<const Digest> digests);
std::vector<uint8_t> encode_request(uint64_t session, uint32_t entry, uint64_t generation, uint64_t dispatch_id,
                                    const Digest& callable, std::span<const TensorRow> rows,
                                    std::span<const uint8_t> args_blob, std::span<const uint8_t> config = {});
std::vector<uint8_t> encode_file_chunk(uint64_t session, uint32_t entry, uint64_t generation, uint64_t run_epoch,
                                       uint64_t dispatch_id, uint32_t files, uint64_t shipment_bytes,
                                       const FileChunkHead& head, std::string_view name, std::span<const uint8_t> data);
std::vector<uint8_t> encode_terminal(uint64_t session, uint32_t entry, uint64_t generation, uint64_t run_epoch,
                                     uint64_t dispatch_id, const Status& status, std::span<const uint64_t> sizes);
std::vector<uint8_t> encode_text(MsgKind kind, uint64_t session, std::string_view text);
std::vector<uint8_t> encode_memory_reply(uint64_t session, uint64_t total, uint64_t free_bytes);

// The distinct buffers of `args` as a request's tensor table, and per row the
// views the run writes (exactly their elements come back: a row's other
// bytes may belong to a task beside it). Or why they cannot go to a remote
// node: a runtime-allocated Output has no bytes to send or a place to return them to.
struct TensorPlan {
  std::vector<TensorRow> rows;
  std::vector<std::vector<TensorView>> writes;  // per row
};
Result<TensorPlan> plan_tensors(const TaskArgs& args);
// Whether a returned row may land in the caller's buffer as it arrives: only
// when its one written view is dense and spans the row, so the row holds no
// byte the run did not write.
bool row_lands_in_place(const TensorRow& row, const std::vector<TensorView>& writes);
// Copies exactly `writes`' elements from `received` (the row's bytes) into
// the caller's buffer at `buffer` (its first byte).
void scatter_writes(const TensorRow& row, const std::vector<TensorView>& writes, const uint8_t* received,
                    uint8_t* buffer);

// What one side knows about an entry: the generation it occupies it under
// (even: free) and, on the network's side, the epoch the node acknowledged.
struct EntryIdentity {
  uint64_t generation = 0;
  uint64_t run_epoch = 0;  // 0 until ACKed
};

// The verdicts of R7-R9 for a message that names an entry.
enum class Verdict : uint8_t {
  kAccept,          // the current occupant's
  kStale,           // a valid entry and an odd generation that is not its current one: refused,
                    // dropped (its chunks drained), nothing else changes (R8)
  kUnattributable,  // no possible occupant (index out of range, even generation, another
                    // session, or an epoch that contradicts the ACK): the endpoint stops (R9)
};
struct Classified {
  Verdict verdict = Verdict::kUnattributable;
  Status why;  // kStale, kUnattributable
};
// The network's classification of an ACK, ACCEPTED or TERMINAL from the node.
Classified classify_reply(const Message& m, uint64_t session, std::span<const EntryIdentity> entries);
// The node's classification of a REQUEST: `entries` is the node's mirror, the
// generation of the last request it took per entry (a request for a
// generation it already took, or older, is a replay: stale).
Classified classify_request(const Message& m, uint64_t session, uint32_t entry_count,
                            std::span<const EntryIdentity> entries);

}  // namespace simpler::dist
