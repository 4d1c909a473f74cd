// Test builds only (SIMPLER_TEST_HOOKS): the store primitive every child loop
// uses instead of PlainStores, which checks the order of its stores (T15:
// R5 the ACK ends each frame hand-off, R6 the terminal ends each entry
// occupancy) and carries H1 (SIGKILL at a child's N-th store). Its counters,
// the H1 arming and the H1 log live in one MAP_SHARED page mapped when the
// library loads, so every child forked later shares them with the test.
// CheckingStores: any thread of its child (one lock). The free functions:
// any thread of any process; arm H1 before the child it aims at is forked.
#pragma once

#ifdef SIMPLER_TEST_HOOKS

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ipc/mailbox_layout.h"
#include "ipc/store_primitive.h"

namespace simpler {

// A checked child prints this with the violation on stderr, then aborts; the
// suite's FAIL_REGULAR_EXPRESSION fails any test whose output holds it.
inline constexpr const char* kStoreOrderViolationMarker = "SIMPLER STORE ORDER VIOLATION";

// What a child store wrote, as the checker and the H1 log name it.
enum class StoreKind : uint32_t {
  kControl,        // the control frame (init, replies, stop, exit)
  kFrameIdle,      // a request frame handed back: IDLE
  kFrameRefused,   // a request frame returned unserved: FRAME_REFUSED
  kFrameOther,     // any other store into a request frame (none is legal)
  kEntryEpoch,     // run_epoch at staging
  kEntryStaged,    // state FRAME_STAGED
  kEntryAck,       // consumed_ack: the end of a frame hand-off
  kEntryAccepted,  // accepted = 1
  kEntryLaunched,  // state TASK_LAUNCHED
  kEntrySetSlot,   // set_slot
  kEntryRc,        // rc
  kEntryText,      // error_text
  kEntryDisposition,
  kEntryTerminal,  // state DONE / FAILED / ENDPOINT_FAILED: the end of an occupancy
  kEntryOther,
};
const char* store_kind_name(StoreKind kind);

// T15, summed over every checked child of this process tree since the
// library loaded.
struct StoreOrderCounts {
  uint64_t frame_lifecycles = 0;  // hand-offs ended by an ACK or a refusal
  uint64_t entry_lifecycles = 0;  // occupancies ended by a terminal
  uint64_t violations = 0;
};
StoreOrderCounts store_order_counts();

// H1. `child` is the process name the child runs under ("simpler-chip0";
// empty: any child); `nth` counts that child's stores from its start (0:
// count, never kill). Fires once per arming, so the dead child's
// replacement, a child of the same name, lives. Re-arming clears the log.
enum class FaultWhen : uint32_t { kBefore = 0, kAfter = 1 };
void arm_fault_store(std::string_view child, uint64_t nth, FaultWhen when);
void disarm_fault_store();

// One terminal a matched child stored (before any kill: it happened).
struct LoggedTerminal {
  uint64_t run_id = 0;
  uint64_t generation = 0;
  uint32_t state = 0;
  pid_t pid = 0;
};
// What H1 saw since the last arming.
struct FaultStoreLog {
  bool fired = false;
  // The store the kill was at (with `when`, whether it was made).
  StoreKind kind = StoreKind::kControl;
  FaultWhen when = FaultWhen::kBefore;
  uint64_t nth = 0;
  uint32_t entry = 0;      // for an entry store
  uint64_t run_id = 0;     // the entry's run (the parent's word) at the kill
  uint64_t value = 0;      // a word store's value
  uint64_t killed_ns = 0;  // now_ns() just before raise(SIGKILL)
  pid_t pid = 0;
  // Stores made so far by the last matched child (while not fired): what a
  // test reads to learn how many stores a child makes before it serves.
  uint64_t stores = 0;
  std::vector<LoggedTerminal> terminals;  // every terminal matched children stored, in order
  bool terminals_truncated = false;
};
FaultStoreLog fault_store_log();

// H5, payload identity. The parent writes kIdentityBytes after a request's
// args blob, in the frame's spare capacity (not counted in args_bytes: the
// wire is the production one): a digest of the config and args bytes, then
// a pattern of (run id, dispatch id, byte index). The child checks them
// against the header it accepted and the payload it copied, before its ACK.
// A mismatch means it took another publication's payload, or a torn one,
// for this header. Only requests with room for the trailer carry one.
inline constexpr size_t kIdentityBytes = 32;
inline bool identity_fits(size_t args_bytes) { return args_bytes + kIdentityBytes <= kRequestArgsCapacity; }
void write_identity(uint8_t* at, uint64_t run_id, uint64_t dispatch_id, const uint8_t* config, size_t config_bytes,
                    const uint8_t* args, size_t args_bytes);
bool identity_matches(const uint8_t* at, uint64_t run_id, uint64_t dispatch_id, const uint8_t* config,
                      size_t config_bytes, const uint8_t* args, size_t args_bytes);
// One request the child checked; summed over every child of this process
// tree since the library loaded.
void count_identity(bool matched);
struct IdentityCounts {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
};
IdentityCounts identity_counts();

// The checking store primitive. `fatal`: a violation prints the marker and
// aborts the process (the child loop's use); otherwise it is only counted
// here (the checker's own test drives it with bad sequences).
class CheckingStores final : public StorePrimitive {
 public:
  CheckingStores(MailboxView view, bool fatal);
  void store32(uint32_t& word, uint32_t value) override;
  void store64(uint64_t& word, uint64_t value) override;
  void store_bytes(void* dst, const void* src, size_t n) override;

  uint64_t violations() const;
  std::string last_violation() const;
  // Runs after each store and before the checker accounts for it: where the
  // parent, reacting to the store, can interleave (the checker's own tests).
  void set_after_write_hook(std::function<void()> hook);

 private:
  struct Target {
    StoreKind kind = StoreKind::kControl;
    int64_t frame = -1;  // request frame index
    int64_t entry = -1;  // entry index
    // The entry's occupancy as it stood before the store: once a terminal is
    // written the parent may release and occupy the entry again at once, so
    // nothing about the ended occupancy may be read after the store.
    uint64_t generation = 0;
    uint64_t run_id = 0;
  };
  Target classify(const void* p, uint64_t value) const;
  // Before the store: what it would break; "" when legal.
  std::string check(const Target& t, uint64_t value);
  // After the store: the lifecycles it ended.
  void account(const Target& t, uint64_t value);
  void violation(const std::string& what);
  // H1: counts the store; kills before it when due.
  void fault_before(const Target& t, uint64_t value);
  void fault_after(const Target& t, uint64_t value);
  void kill_at(const Target& t, uint64_t value, FaultWhen when);
  template <typename F>
  void store(const void* p, uint64_t value, F&& write);

  MailboxView view_;
  bool fatal_;
  bool matched_ = false;  // H1 aims at this child
  uint64_t nth_ = 0;
  FaultWhen when_ = FaultWhen::kBefore;

  mutable std::mutex mu_;
  uint64_t count_ = 0;
  // Per frame: the publication handed back by an IDLE and not yet ACKed (0: none).
  uint64_t open_[kMailboxRequestFrames] = {};
  // Per entry: the generation its last terminal was stored under (0: none).
  std::vector<uint64_t> terminal_gen_;
  uint64_t violations_ = 0;
  std::string last_violation_;
  std::function<void()> after_write_;
};

}  // namespace simpler

#endif  // SIMPLER_TEST_HOOKS
