#include "ipc/test_hooks.h"

#ifdef SIMPLER_TEST_HOOKS

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "base/clock.h"

namespace simpler {

namespace {

constexpr size_t kLoggedTerminals = 256;

struct FaultRecord {
  uint32_t kind;
  uint32_t when;
  uint64_t nth;
  uint32_t entry;
  int32_t pid;
  uint64_t run_id;
  uint64_t value;
  uint64_t killed_ns;
};

struct TerminalRecord {
  uint64_t run_id;
  uint64_t generation;
  uint32_t state;
  int32_t pid;
};

// Shared by every process forked after the library loaded. Words are
// accessed atomically: several children and the test touch them at once.
struct HookPage {
  uint64_t frame_lifecycles;
  uint64_t entry_lifecycles;
  uint64_t violations;
  // H1 arming (the test) ...
  uint32_t armed;
  uint32_t when;
  uint64_t nth;
  char child[16];
  // ... and what it saw (the children).
  uint32_t fired;
  uint32_t terminal_count;
  uint64_t stores;
  FaultRecord record;
  TerminalRecord terminals[kLoggedTerminals];
  // H5 (the children).
  uint64_t identity_checked;
  uint64_t identity_mismatches;
};

HookPage* map_page() {
  void* p = mmap(nullptr, sizeof(HookPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "simpler test hooks: cannot map the shared hook page\n");
    std::abort();
  }
  return new (p) HookPage{};
}

// Mapped while the library loads, before anything can fork.
HookPage* const g_page = map_page();

template <typename T>
std::atomic_ref<T> shared(T& word) {
  return std::atomic_ref<T>(word);
}

bool is_terminal_state(uint32_t v) { return mailbox_state_is_terminal(v); }

}  // namespace

const char* store_kind_name(StoreKind kind) {
  switch (kind) {
    case StoreKind::kControl:
      return "control";
    case StoreKind::kFrameIdle:
      return "frame_idle";
    case StoreKind::kFrameRefused:
      return "frame_refused";
    case StoreKind::kFrameOther:
      return "frame_other";
    case StoreKind::kEntryEpoch:
      return "entry_epoch";
    case StoreKind::kEntryStaged:
      return "entry_staged";
    case StoreKind::kEntryAck:
      return "ack";
    case StoreKind::kEntryAccepted:
      return "entry_accepted";
    case StoreKind::kEntryLaunched:
      return "entry_launched";
    case StoreKind::kEntrySetSlot:
      return "entry_set_slot";
    case StoreKind::kEntryRc:
      return "entry_rc";
    case StoreKind::kEntryText:
      return "entry_text";
    case StoreKind::kEntryDisposition:
      return "entry_disposition";
    case StoreKind::kEntryTerminal:
      return "terminal";
    case StoreKind::kEntryOther:
      return "entry_other";
  }
  return "unknown";
}

StoreOrderCounts store_order_counts() {
  StoreOrderCounts c;
  c.frame_lifecycles = shared(g_page->frame_lifecycles).load();
  c.entry_lifecycles = shared(g_page->entry_lifecycles).load();
  c.violations = shared(g_page->violations).load();
  return c;
}

void arm_fault_store(std::string_view child, uint64_t nth, FaultWhen when) {
  shared(g_page->armed).store(0);
  std::memset(g_page->child, 0, sizeof g_page->child);
  std::memcpy(g_page->child, child.data(), std::min(child.size(), sizeof g_page->child - 1));
  shared(g_page->nth).store(nth);
  shared(g_page->when).store(static_cast<uint32_t>(when));
  shared(g_page->fired).store(0);
  shared(g_page->terminal_count).store(0);
  shared(g_page->stores).store(0);
  g_page->record = FaultRecord{};
  shared(g_page->armed).store(1);
}

void disarm_fault_store() { shared(g_page->armed).store(0); }

namespace {
// FNV-1a over the request's payload, then splitmix64 steps seeded by its
// identity: cheap, and a byte from another publication changes the trailer.
uint64_t payload_digest(const uint8_t* config, size_t config_bytes, const uint8_t* args, size_t args_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < config_bytes; ++i) h = (h ^ config[i]) * 0x100000001b3ull;
  for (size_t i = 0; i < args_bytes; ++i) h = (h ^ args[i]) * 0x100000001b3ull;
  return h;
}

void identity_trailer(uint8_t (&out)[kIdentityBytes], uint64_t run_id, uint64_t dispatch_id, const uint8_t* config,
                      size_t config_bytes, const uint8_t* args, size_t args_bytes) {
  const uint64_t digest = payload_digest(config, config_bytes, args, args_bytes);
  std::memcpy(out, &digest, sizeof digest);
  uint64_t s = run_id * 0x9e3779b97f4a7c15ull ^ (dispatch_id << 1 | dispatch_id >> 63);
  for (size_t i = sizeof digest; i < kIdentityBytes; ++i) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull + i);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    out[i] = static_cast<uint8_t>(z ^ (z >> 31));
  }
}
}  // namespace

void write_identity(uint8_t* at, uint64_t run_id, uint64_t dispatch_id, const uint8_t* config, size_t config_bytes,
                    const uint8_t* args, size_t args_bytes) {
  uint8_t t[kIdentityBytes];
  identity_trailer(t, run_id, dispatch_id, config, config_bytes, args, args_bytes);
  std::memcpy(at, t, sizeof t);
}

bool identity_matches(const uint8_t* at, uint64_t run_id, uint64_t dispatch_id, const uint8_t* config,
                      size_t config_bytes, const uint8_t* args, size_t args_bytes) {
  uint8_t t[kIdentityBytes];
  identity_trailer(t, run_id, dispatch_id, config, config_bytes, args, args_bytes);
  return std::memcmp(at, t, sizeof t) == 0;
}

void count_identity(bool matched) {
  shared(g_page->identity_checked).fetch_add(1);
  if (!matched) shared(g_page->identity_mismatches).fetch_add(1);
}

IdentityCounts identity_counts() {
  IdentityCounts c;
  c.checked = shared(g_page->identity_checked).load();
  c.mismatches = shared(g_page->identity_mismatches).load();
  return c;
}

FaultStoreLog fault_store_log() {
  FaultStoreLog log;
  log.fired = shared(g_page->fired).load() != 0;
  log.stores = shared(g_page->stores).load();
  if (log.fired) {
    const FaultRecord& r = g_page->record;
    log.kind = static_cast<StoreKind>(r.kind);
    log.when = static_cast<FaultWhen>(r.when);
    log.nth = r.nth;
    log.entry = r.entry;
    log.run_id = r.run_id;
    log.value = r.value;
    log.killed_ns = r.killed_ns;
    log.pid = r.pid;
  }
  const uint32_t n = shared(g_page->terminal_count).load();
  log.terminals_truncated = n > kLoggedTerminals;
  for (uint32_t i = 0; i < std::min<uint32_t>(n, kLoggedTerminals); ++i) {
    const TerminalRecord& t = g_page->terminals[i];
    // A slot is claimed before it is filled: a state of 0 is still being written.
    const uint32_t state = shared(const_cast<uint32_t&>(t.state)).load();
    if (state == 0) continue;
    log.terminals.push_back(LoggedTerminal{t.run_id, t.generation, state, t.pid});
  }
  return log;
}

CheckingStores::CheckingStores(MailboxView view, bool fatal)
    : view_(view), fatal_(fatal), terminal_gen_(view.entry_count(), 0) {
  if (!fatal_ || shared(g_page->armed).load() == 0) return;
  char name[17] = {};
  prctl(PR_GET_NAME, name);
  matched_ = g_page->child[0] == '\0' || std::strncmp(name, g_page->child, sizeof g_page->child) == 0;
  nth_ = shared(g_page->nth).load();
  when_ = static_cast<FaultWhen>(shared(g_page->when).load());
}

CheckingStores::Target CheckingStores::classify(const void* p, uint64_t value) const {
  Target t;
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(view_.base());
  if (off < kMailboxFramesOffset || off >= view_.bytes()) return t;
  if (off < kMailboxEntriesOffset) {
    t.frame = static_cast<int64_t>((off - kMailboxFramesOffset) / kMailboxFrameSize);
    const bool ready = off - kMailboxFramesOffset - static_cast<uint64_t>(t.frame) * kMailboxFrameSize ==
                       offsetof(RequestFrame, header) + offsetof(RequestHeader, ready);
    t.kind = !ready                          ? StoreKind::kFrameOther
             : value == kMailboxFrameRefused ? StoreKind::kFrameRefused
                                             : StoreKind::kFrameIdle;
    return t;
  }
  t.entry = static_cast<int64_t>((off - kMailboxEntriesOffset) / kMailboxEntryStride);
  const MailboxRunEntry& e = view_.entry(static_cast<size_t>(t.entry));
  t.generation = load_acquire(e.entry_generation);
  t.run_id = load_acquire(e.run_id);
  const uint64_t field = (off - kMailboxEntriesOffset) % kMailboxEntryStride;
  switch (field) {
    case kEntryOffRunEpoch:
      t.kind = StoreKind::kEntryEpoch;
      break;
    case kEntryOffState:
      t.kind = is_terminal_state(static_cast<uint32_t>(value)) ? StoreKind::kEntryTerminal
               : value == kMailboxFrameStaged                  ? StoreKind::kEntryStaged
               : value == kMailboxTaskLaunched                 ? StoreKind::kEntryLaunched
                                                               : StoreKind::kEntryOther;
      break;
    case kEntryOffConsumedAck:
      t.kind = StoreKind::kEntryAck;
      break;
    case kEntryOffAccepted:
      t.kind = StoreKind::kEntryAccepted;
      break;
    case kEntryOffSetSlot:
      t.kind = StoreKind::kEntrySetSlot;
      break;
    case kEntryOffRc:
      t.kind = StoreKind::kEntryRc;
      break;
    case kEntryOffErrorText:
      t.kind = StoreKind::kEntryText;
      break;
    case kEntryOffDisposition:
      t.kind = StoreKind::kEntryDisposition;
      break;
    default:
      t.kind = StoreKind::kEntryOther;
  }
  return t;
}

std::string CheckingStores::check(const Target& t, uint64_t value) {
  if (t.frame >= 0) {
    // R5: the child writes a frame only while the parent's publication
    // stands in it; once it handed the frame back (IDLE, then the ACK) or
    // refused it, the frame is the parent's until it republishes.
    const uint32_t ready = load_acquire(view_.frame(static_cast<size_t>(t.frame)).header.ready);
    if (ready != kMailboxTaskReady && ready != kMailboxPrepareReady) {
      return fmt::format(
          "{} store into request frame {}, whose hand-off already ended (it reads {}): the ACK or the "
          "refusal must be the last store of a frame hand-off (R5)",
          store_kind_name(t.kind), t.frame, ready);
    }
    return "";
  }
  if (t.entry < 0) return "";
  const uint64_t generation = t.generation;
  if (const uint64_t done = terminal_gen_[static_cast<size_t>(t.entry)]; done != 0) {
    // The next occupant's generation: odd, above the one the terminal ended.
    const uint64_t next = done % 2 == 1 ? done + 2 : done + 1;
    if (generation < next) {
      return fmt::format(
          "{} store into entry {} (generation {}) after its terminal under generation {}, before "
          "the entry was occupied again: the terminal must be the last store to an entry (R6)",
          store_kind_name(t.kind), t.entry, generation, done);
    }
  }
  if (t.kind == StoreKind::kEntryAck) {
    for (uint64_t open : open_) {
      if (open == value) return "";
    }
    return fmt::format(
        "ACK of publication {} into entry {} with no request frame handed back (IDLE) before it: the "
        "ACK must be the last store of a frame hand-off (R5)",
        value, t.entry);
  }
  return "";
}

void CheckingStores::account(const Target& t, uint64_t value) {
  if (t.kind == StoreKind::kFrameIdle) {
    // The publication this hand-back is for; the parent leaves it alone until the ACK.
    open_[t.frame] = load_acquire(view_.frame(static_cast<size_t>(t.frame)).header.publication);
  } else if (t.kind == StoreKind::kFrameRefused) {
    open_[t.frame] = 0;
    if (fatal_) shared(g_page->frame_lifecycles).fetch_add(1, std::memory_order_relaxed);
  } else if (t.kind == StoreKind::kEntryAck) {
    for (uint64_t& open : open_) {
      if (open == value) {
        open = 0;
        break;
      }
    }
    if (fatal_) shared(g_page->frame_lifecycles).fetch_add(1, std::memory_order_relaxed);
  } else if (t.kind == StoreKind::kEntryTerminal) {
    terminal_gen_[static_cast<size_t>(t.entry)] = t.generation;
    if (fatal_) shared(g_page->entry_lifecycles).fetch_add(1, std::memory_order_relaxed);
    if (matched_) {
      const uint32_t i = shared(g_page->terminal_count).fetch_add(1);
      if (i < kLoggedTerminals) {
        TerminalRecord& r = g_page->terminals[i];
        r.run_id = t.run_id;
        r.generation = t.generation;
        r.pid = getpid();
        shared(r.state).store(static_cast<uint32_t>(value));
      }
    }
  }
}

void CheckingStores::violation(const std::string& what) {
  ++violations_;
  last_violation_ = what;
  if (!fatal_) return;
  shared(g_page->violations).fetch_add(1);
  std::fprintf(stderr, "%s (pid %d): %s\n", kStoreOrderViolationMarker, static_cast<int>(getpid()), what.c_str());
  std::fflush(stderr);
  std::abort();
}

void CheckingStores::kill_at(const Target& t, uint64_t value, FaultWhen when) {
  FaultRecord& r = g_page->record;
  r.kind = static_cast<uint32_t>(t.kind);
  r.when = static_cast<uint32_t>(when);
  r.nth = count_;
  r.entry = t.entry >= 0 ? static_cast<uint32_t>(t.entry) : 0;
  r.run_id = t.run_id;
  r.value = value;
  r.pid = getpid();
  r.killed_ns = now_ns();
  raise(SIGKILL);
}

void CheckingStores::fault_before(const Target& t, uint64_t value) {
  if (!matched_ || shared(g_page->fired).load(std::memory_order_relaxed) != 0) return;
  shared(g_page->stores).store(++count_, std::memory_order_relaxed);
  if (count_ != nth_ || when_ != FaultWhen::kBefore) return;
  uint32_t expected = 0;
  if (shared(g_page->fired).compare_exchange_strong(expected, 1)) kill_at(t, value, FaultWhen::kBefore);
}

void CheckingStores::fault_after(const Target& t, uint64_t value) {
  if (!matched_ || count_ != nth_ || when_ != FaultWhen::kAfter) return;
  uint32_t expected = 0;
  if (shared(g_page->fired).compare_exchange_strong(expected, 1)) kill_at(t, value, FaultWhen::kAfter);
}

template <typename F>
void CheckingStores::store(const void* p, uint64_t value, F&& write) {
  std::lock_guard<std::mutex> lock(mu_);
  const Target t = classify(p, value);
  fault_before(t, value);
  if (std::string bad = check(t, value); !bad.empty()) violation(bad);
  write();
  if (after_write_) after_write_();
  account(t, value);
  fault_after(t, value);
}

void CheckingStores::store32(uint32_t& word, uint32_t value) {
  store(&word, value, [&] { store_release(word, value); });
}

void CheckingStores::store64(uint64_t& word, uint64_t value) {
  store(&word, value, [&] { store_release(word, value); });
}

void CheckingStores::store_bytes(void* dst, const void* src, size_t n) {
  store(dst, 0, [&] { std::memcpy(dst, src, n); });
}

void CheckingStores::set_after_write_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  after_write_ = std::move(hook);
}

uint64_t CheckingStores::violations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return violations_;
}

std::string CheckingStores::last_violation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_violation_;
}

}  // namespace simpler

#endif  // SIMPLER_TEST_HOOKS
