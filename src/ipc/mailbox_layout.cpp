#include "ipc/mailbox_layout.h"

#include <cstring>

#include "base/errors.h"

namespace simpler {

Result<size_t> mailbox_size(size_t granted_sets) {
  if (granted_sets < 1 || granted_sets > kMailboxMaxGrantedSets) {
    return out_of_range("mailbox grant {} is outside [1, {}]", granted_sets, kMailboxMaxGrantedSets);
  }
  size_t entries = 0;
  size_t table = 0;
  size_t total = 0;
  if (__builtin_add_overflow(granted_sets, kMailboxRequestFrames, &entries) ||
      __builtin_mul_overflow(entries, kMailboxEntryStride, &table) ||
      __builtin_add_overflow(kMailboxEntriesOffset, table, &total)) {
    return out_of_range("mailbox size for grant {} is not representable", granted_sets);
  }
  return total;
}

namespace {

WireConstant wc(const char* name, uint64_t value) {
  WireConstant c{};
  std::strncpy(c.name, name, sizeof c.name - 1);
  c.value = value;
  return c;
}

}  // namespace

std::vector<WireConstant> mailbox_wire_constants() {
  return {
      wc("MAILBOX_MAGIC", kMailboxMagic),
      wc("MAILBOX_PROTOCOL_VERSION", kMailboxProtocolVersion),
      wc("MAILBOX_FRAME_SIZE", kMailboxFrameSize),
      wc("MAILBOX_REQUEST_FRAMES", kMailboxRequestFrames),
      wc("MAILBOX_ENTRY_STRIDE", kMailboxEntryStride),
      wc("MAILBOX_ERROR_MSG_SIZE", kMailboxErrorTextSize),
      wc("MAILBOX_MAX_GRANTED_SETS", kMailboxMaxGrantedSets),
      wc("MAILBOX_ENTRIES_OFFSET", kMailboxEntriesOffset),
      wc("STATE_IDLE", kMailboxIdle),
      wc("STATE_TASK_READY", kMailboxTaskReady),
      wc("STATE_FRAME_REFUSED", kMailboxFrameRefused),
      wc("STATE_FRAME_STAGED", kMailboxFrameStaged),
      wc("STATE_TASK_LAUNCHED", kMailboxTaskLaunched),
      wc("STATE_TASK_DONE", kMailboxTaskDone),
      wc("STATE_TASK_FAILED", kMailboxTaskFailed),
      wc("STATE_ENDPOINT_FAILED", kMailboxEndpointFailed),
      wc("STATE_PREPARE_READY", kMailboxPrepareReady),
      wc("STATE_ACTIVATE", kMailboxActivate),
      wc("STATE_CANCEL", kMailboxCancel),
      wc("DISPOSITION_NONE", kDispositionNone),
      wc("DISPOSITION_VALIDATED_ONLY", kDispositionValidatedOnly),
      wc("DISPOSITION_NATIVE_PREPARED", kDispositionNativePrepared),
      wc("CTRL_MALLOC", kCtrlMalloc),
      wc("CTRL_FREE", kCtrlFree),
      wc("CTRL_COPY_TO", kCtrlCopyTo),
      wc("CTRL_COPY_FROM", kCtrlCopyFrom),
      wc("CTRL_MEMORY_INFO", kCtrlMemoryInfo),
      wc("CTRL_DATA_OFFSET", kControlDataOffset),
      wc("CTRL_OFF_INIT_CODE", offsetof(ControlFrame, init_code)),
      wc("FRAME_OFF_PUBLICATION", offsetof(RequestHeader, publication)),
      wc("FRAME_OFF_ENTRY_INDEX", offsetof(RequestHeader, entry_index)),
      wc("FRAME_OFF_ENTRY_GENERATION", offsetof(RequestHeader, entry_generation)),
      wc("FRAME_OFF_RUN_ID", offsetof(RequestHeader, run_id)),
      wc("FRAME_OFF_DISPATCH_ID", offsetof(RequestHeader, dispatch_id)),
      wc("FRAME_OFF_TASK_SLOT", offsetof(RequestHeader, task_slot)),
      wc("FRAME_OFF_DIGEST", offsetof(RequestFrame, callable_digest)),
      wc("FRAME_OFF_CONFIG", offsetof(RequestFrame, config)),
      wc("FRAME_OFF_ARGS", offsetof(RequestFrame, args)),
      wc("ENTRY_OFF_GENERATION", kEntryOffGeneration),
      wc("ENTRY_OFF_RUN_ID", kEntryOffRunId),
      wc("ENTRY_OFF_DISPATCH_ID", kEntryOffDispatchId),
      wc("ENTRY_OFF_TASK_SLOT", kEntryOffTaskSlot),
      wc("ENTRY_OFF_SET_SLOT", kEntryOffSetSlot),
      wc("ENTRY_OFF_LEASE_GENERATION", kEntryOffLeaseGeneration),
      wc("ENTRY_OFF_STATE", kEntryOffState),
      wc("ENTRY_OFF_DISPOSITION", kEntryOffDisposition),
      wc("ENTRY_OFF_RUN_EPOCH", kEntryOffRunEpoch),
      wc("ENTRY_OFF_RC", kEntryOffRc),
      wc("ENTRY_OFF_ACCEPTED", kEntryOffAccepted),
      wc("ENTRY_OFF_CONSUMED_ACK", kEntryOffConsumedAck),
      wc("ENTRY_OFF_ERROR_TEXT", kEntryOffErrorText),
      wc("ENTRY_OFF_ACTIVATION", kEntryOffActivation),
  };
}

std::string wire_disagreements(const std::vector<WireConstant>& ours, const WireConstant* theirs, size_t count) {
  std::string out;
  if (count > kMaxWireConstants) {
    return fmt::format("peer lists {} wire constants, more than {}\n", count, kMaxWireConstants);
  }
  std::vector<bool> matched(count, false);
  for (const WireConstant& mine : ours) {
    bool found = false;
    for (size_t i = 0; i < count; ++i) {
      if (std::strncmp(mine.name, theirs[i].name, sizeof mine.name) != 0) continue;
      found = true;
      matched[i] = true;
      if (mine.value != theirs[i].value) {
        out += fmt::format("{}: ours {} theirs {}\n", mine.name, mine.value, theirs[i].value);
      }
    }
    if (!found) out += fmt::format("{}: missing on the peer\n", mine.name);
  }
  for (size_t i = 0; i < count; ++i) {
    if (!matched[i]) out += fmt::format("{}: unknown here\n", read_text(theirs[i].name, sizeof theirs[i].name));
  }
  return out;
}

void copy_text(char* dst, size_t capacity, std::string_view text) {
  const size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
  std::memcpy(dst, text.data(), n);
  std::memset(dst + n, 0, capacity - n);
}

std::string read_text(const char* src, size_t capacity) { return std::string(src, strnlen(src, capacity - 1)); }

Result<MailboxView> MailboxView::attach(void* base, size_t extent, uint64_t granted_sets) {
  SIMPLER_ASSIGN_OR_RETURN(const size_t need, mailbox_size(granted_sets));
  if (base == nullptr) return invalid_argument("mailbox base is null");
  if (reinterpret_cast<uintptr_t>(base) % alignof(MailboxRunEntry) != 0) {
    return invalid_argument("mailbox base {} is not {}-byte aligned", base, alignof(MailboxRunEntry));
  }
  if (extent < need) {
    return out_of_range("mailbox extent {} B cannot hold grant {} ({} B needed)", extent, granted_sets, need);
  }
  return MailboxView(static_cast<uint8_t*>(base), granted_sets);
}

}  // namespace simpler
