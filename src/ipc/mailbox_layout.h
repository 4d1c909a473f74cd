// The mailbox wire layout: one control frame, K request frames and M = G + K
// run-state entries in one shared region per child. Both sides include this;
// every struct here is fixed-layout and lives only in the shared mapping.
// Cross-process words are accessed through load_acquire/store_release below;
// MailboxView is a non-owning, bounds-checked view any thread may hold.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/doorbell.h"
#include "simpler/status.h"

namespace simpler {

inline constexpr uint64_t kMailboxMagic = 0x3158424d4c504d53ull;  // "SMPLMBX1"
// 2: the control frame carries the StatusCode of an INIT_FAILED (init_code).
inline constexpr uint32_t kMailboxProtocolVersion = 2;
inline constexpr size_t kMailboxFrameSize = 65536;
inline constexpr size_t kMailboxRequestFrames = 2;  // K: bounds concurrent hand-off, not runs
inline constexpr size_t kMailboxEntryStride = 384;  // S
inline constexpr size_t kMailboxErrorTextSize = 256;
// The entry table may span at most 1 TiB, so every admitted size is far from
// overflowing size_t; the cap (about 2.86e9) is below the uint32 pipeline_depth
// bound, so some depths a facade accepts are refused here (decision §4.5).
inline constexpr uint64_t kMailboxEntryTableCap = 1ull << 40;
inline constexpr uint64_t kMailboxMaxGrantedSets = kMailboxEntryTableCap / kMailboxEntryStride - kMailboxRequestFrames;
inline constexpr size_t kMailboxControlOffset = 0;
inline constexpr size_t kMailboxFramesOffset = kMailboxFrameSize;
inline constexpr size_t kMailboxEntriesOffset = (1 + kMailboxRequestFrames) * kMailboxFrameSize;

// (1 + K)·64 KiB + (G + K)·S, refusing G outside [1, kMailboxMaxGrantedSets].
Result<size_t> mailbox_size(size_t granted_sets);

// One vocabulary for frame and entry words; which value is legal where is
// fixed: frames carry readiness, entries carry run progress.
enum MailboxState : uint32_t {
  kMailboxIdle = 0,            // frame: free. entry: published, not yet staged
  kMailboxTaskReady = 1,       // frame: a request waits for the child
  kMailboxFrameRefused = 2,    // frame: returned unserved (stale header); the child's only store to it
  kMailboxFrameStaged = 3,     // entry: the child copied the payload out
  kMailboxTaskLaunched = 4,    // entry: passed the launch marker
  kMailboxTaskDone = 5,        // entry terminal: success
  kMailboxTaskFailed = 6,      // entry terminal: the run failed (rc, text)
  kMailboxEndpointFailed = 7,  // entry terminal: the child's exit sweep owed this run
  kMailboxPrepareReady = 8,    // frame: a staged successor waits: prepare it, launch only on ACTIVATE
  kMailboxActivate = 9,        // entry activation word (parent): launch the staged run
  kMailboxCancel = 10,         // entry activation word (parent): end the staged run unlaunched
};
inline constexpr bool mailbox_state_is_terminal(uint32_t s) {
  return s == kMailboxTaskDone || s == kMailboxTaskFailed || s == kMailboxEndpointFailed;
}

enum MailboxDisposition : uint32_t {
  kDispositionNone = 0,
  kDispositionValidatedOnly = 1,
  kDispositionNativePrepared = 2,
};

enum MailboxInitState : uint32_t { kInitPending = 0, kInitReady = 1, kInitFailed = 2 };
enum MailboxEndpointState : uint32_t {
  kEndpointStarting = 0,
  kEndpointServing = 1,
  kEndpointStopped = 2,  // unattributable header: reason in ControlFrame::stop_reason
  kEndpointExited = 3,   // shut down after the exit sweep
};
enum MailboxControlOp : uint32_t {
  kCtrlNone = 0,
  kCtrlMalloc = 1,
  kCtrlFree = 2,
  kCtrlCopyTo = 3,
  kCtrlCopyFrom = 4,
  kCtrlMemoryInfo = 5,  // reply value: total bytes; reply data: the free bytes as one uint64
};

struct ControlCommand {
  MailboxControlOp op = kCtrlNone;
  uint64_t args[4] = {};
};
struct ControlReply {
  uint64_t value = 0;
  uint32_t data_bytes = 0;  // reply payload at the front of the data area
};

// Exit codes of a forked child (decision §4.6).
inline constexpr int kChildExitClean = 0;
inline constexpr int kChildExitInitFailed = 3;
inline constexpr int kChildExitEndpointStopped = 4;
// A chip child whose device reported a sticky fault: it exits once every run
// it started has its terminal, since only a new process resets the device;
// the parent gives whatever it still held DEVICE_FAULT and replaces it.
inline constexpr int kChildExitDeviceFault = 5;

struct WireConstant {
  char name[40];
  uint64_t value;
};
static_assert(sizeof(WireConstant) == 48);
inline constexpr size_t kMaxWireConstants = 64;
inline constexpr size_t kControlDataOffset = 16384;
inline constexpr size_t kControlDataCapacity = kMailboxFrameSize - kControlDataOffset;

// Written by the parent at registration (identity, parent_wire), by the child
// (init_state, endpoint_state, child_wire, replies, stop_reason) and by either
// through the command words. Each word has exactly one writing side.
struct ControlFrame {
  uint64_t magic;
  uint32_t version;
  uint32_t entry_stride;
  uint64_t granted_sets;
  uint64_t entry_count;
  uint64_t mapped_bytes;
  uint32_t init_state;      // child
  uint32_t shutdown;        // parent; sticky
  uint32_t endpoint_state;  // child
  uint32_t parent_wire_count;
  Doorbell child_bell;   // the child parks here; rung on publication, command, shutdown
  Doorbell parent_bell;  // the parent parks here; rung on ACK, acceptance, terminal, reply, stop
  uint64_t cmd_seq;      // parent: a new command is posted
  uint64_t reply_seq;    // child: the reply to cmd_seq is complete
  uint32_t cmd_op;
  uint32_t cmd_data_bytes;
  uint64_t cmd_args[4];
  int32_t reply_code;  // StatusCode
  uint32_t reply_data_bytes;
  uint64_t reply_value;
  uint32_t child_wire_count;
  uint32_t child_grant;  // child, before INIT_READY: the sets its handler resolved (0: holds none)
  char reply_text[kMailboxErrorTextSize];
  char stop_reason[kMailboxErrorTextSize];
  char init_error[4096];
  WireConstant parent_wire[kMaxWireConstants];
  WireConstant child_wire[kMaxWireConstants];
  uint32_t init_code;  // child, with INIT_FAILED: the StatusCode of the failure (init_error is its text)
  uint8_t reserved1[kControlDataOffset - 10908];
  uint8_t data[kControlDataCapacity];  // command and reply payload
};

struct RequestHeader {
  uint32_t ready;  // MailboxState: IDLE / TASK_READY / PREPARE_READY (parent), IDLE / FRAME_REFUSED (child)
  uint32_t protocol_version;
  uint64_t publication;  // endpoint-unique; 0 while the parent rewrites the frame
  uint64_t entry_index;
  uint64_t entry_generation;
  uint64_t run_id;
  uint64_t dispatch_id;
  uint32_t task_slot;
  uint32_t config_bytes;
  uint32_t args_bytes;
  uint32_t reserved;
};

inline constexpr size_t kRequestConfigCapacity = 1024;
inline constexpr size_t kRequestArgsCapacity = kMailboxFrameSize - sizeof(RequestHeader) - 32 - kRequestConfigCapacity;

// Transport only: nothing about the run's life (R2).
struct RequestFrame {
  RequestHeader header;
  uint8_t callable_digest[32];
  uint8_t config[kRequestConfigCapacity];
  uint8_t args[kRequestArgsCapacity];
};

// set_slot of an entry whose run holds no run-resource set (yet).
inline constexpr uint32_t kMailboxNoSet = 0xffffffffu;

// One run, from publication until the parent consumed its terminal (R3).
struct alignas(64) MailboxRunEntry {
  uint64_t entry_generation;  // parent: odd at occupation, even at release
  uint64_t run_id;            // parent
  uint64_t dispatch_id;       // parent
  uint32_t task_slot;         // parent
  uint32_t set_slot;          // parent: kMailboxNoSet at occupation; child: the set it took (decision §4.8)
  uint64_t lease_generation;  // parent
  uint32_t state;             // child (the parent resets it at occupation)
  uint32_t disposition;       // child
  uint64_t run_epoch;         // child, at staging
  int32_t rc;                 // child: StatusCode of the terminal
  uint32_t accepted;          // child, at the launch marker; sticky
  uint64_t consumed_ack;      // child: the publication it consumed; its last store for that frame
  char error_text[kMailboxErrorTextSize];  // child: NUL-terminated
  // parent: 0, then ACTIVATE or CANCEL once for a run published PREPARE_READY.
  // A word of its own, so `state` keeps one writing side.
  uint32_t activation;
  uint8_t reserved[52];
};

static_assert(sizeof(ControlFrame) == kMailboxFrameSize);
static_assert(offsetof(ControlFrame, magic) == 0 && offsetof(ControlFrame, version) == 8);
static_assert(offsetof(ControlFrame, init_state) == 40 && offsetof(ControlFrame, shutdown) == 44);
static_assert(offsetof(ControlFrame, endpoint_state) == 48);
static_assert(offsetof(ControlFrame, child_bell) == 56 && offsetof(ControlFrame, parent_bell) == 64);
static_assert(offsetof(ControlFrame, cmd_seq) == 72 && offsetof(ControlFrame, reply_seq) == 80);
static_assert(offsetof(ControlFrame, cmd_args) == 96 && offsetof(ControlFrame, reply_value) == 136);
static_assert(offsetof(ControlFrame, reply_text) == 152 && offsetof(ControlFrame, stop_reason) == 408);
static_assert(offsetof(ControlFrame, init_error) == 664 && offsetof(ControlFrame, parent_wire) == 4760);
static_assert(offsetof(ControlFrame, child_wire) == 7832 && offsetof(ControlFrame, init_code) == 10904);
static_assert(offsetof(ControlFrame, reserved1) == 10908);
static_assert(offsetof(ControlFrame, data) == kControlDataOffset);
static_assert(sizeof(RequestHeader) == 64);
static_assert(offsetof(RequestHeader, publication) == 8 && offsetof(RequestHeader, entry_index) == 16);
static_assert(offsetof(RequestHeader, entry_generation) == 24 && offsetof(RequestHeader, run_id) == 32);
static_assert(offsetof(RequestHeader, dispatch_id) == 40 && offsetof(RequestHeader, task_slot) == 48);
static_assert(offsetof(RequestHeader, args_bytes) == 56);
static_assert(sizeof(RequestFrame) == kMailboxFrameSize);
static_assert(offsetof(RequestFrame, callable_digest) == 64 && offsetof(RequestFrame, config) == 96);
static_assert(offsetof(RequestFrame, args) == 1120);
static_assert(sizeof(MailboxRunEntry) == kMailboxEntryStride && alignof(MailboxRunEntry) == 64);
static_assert(offsetof(MailboxRunEntry, entry_generation) == 0 && offsetof(MailboxRunEntry, run_id) == 8);
static_assert(offsetof(MailboxRunEntry, dispatch_id) == 16 && offsetof(MailboxRunEntry, task_slot) == 24);
static_assert(offsetof(MailboxRunEntry, set_slot) == 28 && offsetof(MailboxRunEntry, lease_generation) == 32);
static_assert(offsetof(MailboxRunEntry, state) == 40 && offsetof(MailboxRunEntry, disposition) == 44);
static_assert(offsetof(MailboxRunEntry, run_epoch) == 48 && offsetof(MailboxRunEntry, rc) == 56);
static_assert(offsetof(MailboxRunEntry, accepted) == 60 && offsetof(MailboxRunEntry, consumed_ack) == 64);
static_assert(offsetof(MailboxRunEntry, error_text) == 72);
static_assert(offsetof(MailboxRunEntry, activation) == 328);
static_assert(kMailboxEntriesOffset % alignof(MailboxRunEntry) == 0);

// Exported byte offsets, for readers on the far side of the wire (and R3's
// cross-check); code in this repository uses the struct members.
inline constexpr size_t kEntryOffGeneration = offsetof(MailboxRunEntry, entry_generation);
inline constexpr size_t kEntryOffRunId = offsetof(MailboxRunEntry, run_id);
inline constexpr size_t kEntryOffDispatchId = offsetof(MailboxRunEntry, dispatch_id);
inline constexpr size_t kEntryOffTaskSlot = offsetof(MailboxRunEntry, task_slot);
inline constexpr size_t kEntryOffSetSlot = offsetof(MailboxRunEntry, set_slot);
inline constexpr size_t kEntryOffLeaseGeneration = offsetof(MailboxRunEntry, lease_generation);
inline constexpr size_t kEntryOffState = offsetof(MailboxRunEntry, state);
inline constexpr size_t kEntryOffDisposition = offsetof(MailboxRunEntry, disposition);
inline constexpr size_t kEntryOffRunEpoch = offsetof(MailboxRunEntry, run_epoch);
inline constexpr size_t kEntryOffRc = offsetof(MailboxRunEntry, rc);
inline constexpr size_t kEntryOffAccepted = offsetof(MailboxRunEntry, accepted);
inline constexpr size_t kEntryOffConsumedAck = offsetof(MailboxRunEntry, consumed_ack);
inline constexpr size_t kEntryOffErrorText = offsetof(MailboxRunEntry, error_text);
inline constexpr size_t kEntryOffActivation = offsetof(MailboxRunEntry, activation);

// Every constant both sides must agree on, by name (R18).
std::vector<WireConstant> mailbox_wire_constants();
// "" when `theirs` equals `ours`; otherwise one line per disagreement
// (differing value, missing or unexpected name).
std::string wire_disagreements(const std::vector<WireConstant>& ours, const WireConstant* theirs, size_t count);

template <typename T>
T load_acquire(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_acquire);
}
template <typename T>
T load_relaxed(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_relaxed);
}
template <typename T>
void store_release(T& word, T value) {
  std::atomic_ref<T>(word).store(value, std::memory_order_release);
}
template <typename T>
void store_relaxed(T& word, T value) {
  std::atomic_ref<T>(word).store(value, std::memory_order_relaxed);
}

// Copies `text` into a fixed NUL-terminated field, truncating to fit.
void copy_text(char* dst, size_t capacity, std::string_view text);
// Reads a fixed text field that crossed the mailbox: bounded, never past capacity.
std::string read_text(const char* src, size_t capacity);

// A checked view of one registered mailbox. Holds no ownership.
class MailboxView {
 public:
  // Refuses a grant outside the range and an extent below mailbox_size(G);
  // reads and writes nothing.
  static Result<MailboxView> attach(void* base, size_t extent, uint64_t granted_sets);
  MailboxView() = default;

  ControlFrame& control() const { return *reinterpret_cast<ControlFrame*>(base_ + kMailboxControlOffset); }
  RequestFrame& frame(size_t f) const { return reinterpret_cast<RequestFrame*>(base_ + kMailboxFramesOffset)[f]; }
  MailboxRunEntry& entry(size_t i) const {
    return reinterpret_cast<MailboxRunEntry*>(base_ + kMailboxEntriesOffset)[i];
  }
  uint8_t* base() const { return base_; }
  uint64_t entry_count() const { return granted_ + kMailboxRequestFrames; }
  size_t bytes() const { return kMailboxEntriesOffset + entry_count() * kMailboxEntryStride; }

 private:
  MailboxView(uint8_t* base, uint64_t granted) : base_(base), granted_(granted) {}
  uint8_t* base_ = nullptr;
  uint64_t granted_ = 0;
};

}  // namespace simpler
