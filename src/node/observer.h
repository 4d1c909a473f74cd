// The coherent-snapshot observer (R74-R77): evidence of how wide a child
// endpoint really ran, read only from its run-state entries. A snapshot makes
// two passes over every entry's identity and state and reports an instant only
// when the second pass confirms the first. The sampler thread holds its own
// reference to each mailbox mapping for its whole life, completes a first
// sample before start() returns, and parks between samples.
// Threads: start/stop/evidence from one controlling thread; the sampler is its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "base/doorbell.h"
#include "base/shared_memory.h"
#include "ipc/mailbox_layout.h"

namespace simpler {

struct EntryKey {
  uint64_t generation = 0;
  uint64_t run_id = 0;
  uint64_t dispatch_id = 0;
  uint32_t state = 0;
  uint32_t set_slot = kMailboxNoSet;
  friend bool operator==(const EntryKey&, const EntryKey&) = default;
};

EntryKey read_entry_key(const MailboxView& view, size_t entry);

struct Instant {
  std::vector<uint32_t> held_slots;                            // distinct sets held by an occupied, non-terminal entry
  std::vector<uint64_t> launched;                              // dispatch ids of entries reading LAUNCHED
  std::vector<std::pair<uint32_t, uint64_t>> slot_dispatches;  // (set, dispatch id) of each held entry
};

// Two passes over `entries` entries through `read` (pass 1 all, then pass 2
// all, into `scratch`); nothing unless every key read the same both times.
std::optional<Instant> coherent_snapshot(size_t entries, const std::function<EntryKey(size_t)>& read,
                                         std::vector<EntryKey>& scratch);

struct Evidence {
  uint32_t widest_held = 0;                         // most distinct sets held at one coherent instant
  uint32_t widest = 0;                              // most entries reading LAUNCHED at one coherent instant
  std::set<uint32_t> held_sets;                     // every set seen held
  std::map<uint32_t, uint32_t> dispatches_by_slot;  // distinct dispatches seen holding each set
  uint64_t instants = 0;                            // coherent instants seen
  uint64_t first_sample_ns = 0;                     // when the first coherent sample completed
};

class Observer {
 public:
  struct Target {
    std::shared_ptr<const SharedMapping> mapping;  // kept mapped while the sampler lives
    MailboxView view;
  };

  ~Observer();
  // Test hook, run before every sample on the sampler thread; set before start.
  void set_sample_hook(std::function<void()> hook) { s_->hook = std::move(hook); }
  // Starts the sampler and returns once its first sample is complete (the
  // readiness handshake), or its error.
  Status start(std::vector<Target> targets, uint64_t deadline_ns);
  // Stops and joins by deadline_ns. Returns the sampler's own failure (an
  // exception it caught) or, when it did not stop in time, an error naming
  // the live reader: it is then left running, holding its own mappings.
  Status stop(uint64_t deadline_ns);
  Evidence evidence(size_t target) const;
  // The sampler thread has left its loops (stopped, failed, or start() gave up).
  bool sampler_finished() const;

 private:
  // Everything the sampler touches, shared with it, so a sampler that would
  // not stop outlives this object safely.
  struct State {
    std::function<void()> hook;
    std::vector<Target> targets;
    std::vector<Evidence> evidence;
    std::vector<std::map<uint32_t, uint64_t>> last_dispatch;  // per target: set -> last dispatch seen
    std::vector<EntryKey> scratch;
    mutable std::mutex mu;
    Status failure;
    std::atomic<uint32_t> ready{0};
    std::atomic<uint32_t> finished{0};
    std::atomic<bool> stop{false};
    Doorbell ready_bell;
    Doorbell stop_bell;
    void main();
    void sample();
  };
  std::shared_ptr<State> s_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace simpler
