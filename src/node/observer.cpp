#include "node/observer.h"

#include <algorithm>
#include <exception>

#include "base/errors.h"

namespace simpler {

namespace {
constexpr uint64_t kSamplePeriodNs = 50'000;
}  // namespace

EntryKey read_entry_key(const MailboxView& view, size_t entry) {
  const MailboxRunEntry& e = view.entry(entry);
  EntryKey k;
  k.generation = load_acquire(e.entry_generation);
  k.run_id = load_acquire(e.run_id);
  k.dispatch_id = load_acquire(e.dispatch_id);
  k.state = load_acquire(e.state);
  k.set_slot = load_acquire(e.set_slot);
  return k;
}

std::optional<Instant> coherent_snapshot(size_t entries, const std::function<EntryKey(size_t)>& read,
                                         std::vector<EntryKey>& scratch) {
  scratch.resize(entries);
  for (size_t i = 0; i < entries; ++i) scratch[i] = read(i);
  Instant in;
  for (size_t i = 0; i < entries; ++i) {
    if (!(read(i) == scratch[i])) return std::nullopt;
  }
  for (const EntryKey& k : scratch) {
    if (k.generation % 2 == 0 || mailbox_state_is_terminal(k.state)) continue;
    if (k.state == kMailboxTaskLaunched) in.launched.push_back(k.dispatch_id);
    if (k.set_slot == kMailboxNoSet) continue;
    in.slot_dispatches.emplace_back(k.set_slot, k.dispatch_id);
    // A set freed just before its old entry's terminal may already show in a
    // new entry: count sets, not entries.
    if (std::find(in.held_slots.begin(), in.held_slots.end(), k.set_slot) == in.held_slots.end()) {
      in.held_slots.push_back(k.set_slot);
    }
  }
  return in;
}

Observer::~Observer() {
  if (thread_.joinable()) (void)stop(now_ns() + 5'000'000'000ull);
}

Status Observer::start(std::vector<Target> targets, uint64_t deadline_ns) {
  if (thread_.joinable()) return failed_precondition("observer already started");
  State& s = *s_;
  s.targets = std::move(targets);
  s.evidence.assign(s.targets.size(), Evidence{});
  s.last_dispatch.assign(s.targets.size(), {});
  std::shared_ptr<State> state = s_;
  thread_ = std::thread([state] { state->main(); });
  if (!spin_then_park(
          s.ready_bell, [&] { return s.ready.load() != 0 || s.finished.load() != 0; }, SpinPolicy{}, deadline_ns)) {
    // The caller gives up on this observer: its sampler must not go on reading.
    s.stop.store(true);
    s.stop_bell.ring();
    return make_error(StatusCode::kDeadlineExceeded, "the observer's first sample did not complete in time");
  }
  std::lock_guard<std::mutex> lock(s.mu);
  return s.failure;
}

Status Observer::stop(uint64_t deadline_ns) {
  if (!thread_.joinable()) return failed_precondition("observer not running");
  State& s = *s_;
  s.stop.store(true);
  s.stop_bell.ring();
  if (!spin_then_park(
          s.ready_bell, [&] { return s.finished.load() != 0; }, SpinPolicy{}, deadline_ns)) {
    // A join here could hang; the sampler keeps its own state and mappings.
    thread_.detach();
    return make_error(StatusCode::kDeadlineExceeded,
                      "the observer's sampler did not stop in time; it is still a live reader of {} mailbox "
                      "mapping(s), which stay mapped",
                      s.targets.size());
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.failure;
}

bool Observer::sampler_finished() const { return s_->finished.load() != 0; }

Evidence Observer::evidence(size_t target) const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->evidence.at(target);
}

void Observer::State::sample() {
  if (hook) hook();
  for (size_t t = 0; t < targets.size(); ++t) {
    const MailboxView& view = targets[t].view;
    auto in = coherent_snapshot(
        view.entry_count(), [&](size_t i) { return read_entry_key(view, i); }, scratch);
    if (!in) continue;
    std::lock_guard<std::mutex> lock(mu);
    Evidence& e = evidence[t];
    if (e.instants++ == 0) e.first_sample_ns = now_ns();
    e.widest_held = std::max<uint32_t>(e.widest_held, static_cast<uint32_t>(in->held_slots.size()));
    e.widest = std::max<uint32_t>(e.widest, static_cast<uint32_t>(in->launched.size()));
    for (auto [slot, dispatch] : in->slot_dispatches) {
      e.held_sets.insert(slot);
      uint64_t& last = last_dispatch[t][slot];
      if (last != dispatch) {
        last = dispatch;
        ++e.dispatches_by_slot[slot];
      }
    }
  }
}

void Observer::State::main() {
  try {
    // Sleeps on every path, this first loop's included: a sampler must not
    // take a core from the run it watches.
    const auto nap = [&] {
      spin_then_park(
          stop_bell, [&] { return stop.load(); }, SpinPolicy{64, 0}, now_ns() + kSamplePeriodNs);
    };
    // The first pass must be coherent for every target before the handshake;
    // a stop (start() gave up, or stop()) ends the search.
    for (;;) {
      if (stop.load()) break;
      sample();
      bool all = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (const Evidence& e : evidence) all = all && e.instants != 0;
      }
      if (all) {
        ready.store(1);
        ready_bell.ring();
        break;
      }
      nap();
    }
    while (!stop.load()) {
      nap();
      if (stop.load()) break;
      sample();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu);
    failure = internal_error("the observer's sampler failed: {}", e.what());
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    failure = internal_error("the observer's sampler failed with a non-standard exception");
  }
  finished.store(1);
  ready_bell.ring();
}

}  // namespace simpler
