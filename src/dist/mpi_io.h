// The MPI calls both endpoints make, each bounded by a deadline so a rank
// that died (which OpenMPI 4.1 does not report, docs/remote_nodes.md) ends
// a wait instead of hanging it: control messages up to kWireMaxMessage, and
// tensor bytes in chunks straight from and into the tensor's memory. Any
// thread (MPI_THREAD_MULTIPLE); a call's buffers are the caller's.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "base/clock.h"
#include "simpler/status.h"

namespace simpler::dist {

// The largest control message either side sends (a request with a full
// args blob, a terminal with its text, a hello reply with every digest, a
// FILES chunk).
inline constexpr int kWireMaxMessage = 512 << 10;

// Polling MPI without burning a shared core: yields for a short while after
// the last news, then sleeps, doubling up to `max_sleep_ns`. MPI cannot wake
// a parked thread, but the process's own threads can: wake() (any thread)
// ends a sleep at once and counts as news, so a poller that dozed off while
// nothing was held answers a run published, or a terminal handed over, at
// once instead of a sleep later. news, pause and set_max_sleep: the polling
// thread only.
class Backoff {
 public:
  static constexpr uint64_t kYieldNs = 200'000;  // after news, yield rather than sleep this long
  static constexpr uint64_t kFirstSleepNs = 20'000;

  explicit Backoff(uint64_t max_sleep_ns, uint64_t yield_ns = kYieldNs, uint64_t first_sleep_ns = kFirstSleepNs)
      : max_sleep_ns_(max_sleep_ns), yield_ns_(yield_ns), first_sleep_ns_(first_sleep_ns) {}
  void news() {
    last_news_ns_ = now_ns();
    sleep_ns_ = 0;
  }
  void pause();
  // pause() would yield now, not sleep: news came within the yield window.
  bool yielding() const { return now_ns() - last_news_ns_ < yield_ns_; }
  void set_max_sleep(uint64_t ns) { max_sleep_ns_ = ns; }
  // Sleeps up to `ns` unless woken (a wake counts as news).
  void doze(uint64_t ns);
  void wake();

 private:
  bool take_wake();

  uint64_t max_sleep_ns_;
  const uint64_t yield_ns_;
  const uint64_t first_sleep_ns_;
  uint64_t last_news_ns_ = now_ns();
  uint64_t sleep_ns_ = 0;
  std::atomic<bool> woken_{false};
  std::mutex mu_;  // orders wake() against a sleeper's check, so no wake is lost
  std::condition_variable cv_;
};

// One control message from `rank` if one is waiting: true and `out` filled,
// false when none. A message longer than kWireMaxMessage is consumed and
// reported as an error (the sender breaks the protocol).
Result<bool> try_recv_control(int rank, std::vector<uint8_t>& out);
// Blocking send of a small control message (eager, so it returns at once
// whether or not the peer lives).
Status send_control(int rank, const std::vector<uint8_t>& bytes);
// Every MPI call simpler makes is made inside an MpiCall: a shared hold on
// one process-wide lock for the call's length. The completion of a request
// orders the bytes MPI wrote for it only through OpenMPI's own atomics, and
// those bytes may have been written by another thread's call (progress is
// process-wide): neither the C++ memory model nor ThreadSanitizer sees that
// order. The graveyard gives memory back only under the lock held
// exclusively, when no thread is inside MPI, which orders every write an
// earlier call made. MPI calls made by the program itself are outside it.
class MpiCall {
 public:
  MpiCall() : lock_(calls()) {}
  // try_lock it exclusively to find a moment no MpiCall is under way.
  static std::shared_mutex& calls();

 private:
  std::shared_lock<std::shared_mutex> lock_;
};
// Makes `call` (MPI calls only) inside an MpiCall; returns what it returns.
template <class Call>
auto in_mpi(Call&& call) {
  const MpiCall held;
  return call();
}
// Tests one request (inside an MpiCall): true once it completed.
bool test_one(MPI_Request& r);

// Requests given up on (a deadline passed, a peer fell silent) whose memory
// MPI may still use: a receive already matched when it was cancelled goes on
// writing once its peer resumes (ob1 cannot cancel it), a send may still
// read. Each lies here with a hold on its memory until MPI completes it, so
// that memory is neither freed nor reused before. One per process; any
// thread. Holds still here when MPI finalizes are never released.
class Graveyard {
 public:
  static Graveyard& instance();
  // Cancels what MPI can cancel; every request of `reqs` not complete after
  // that stays here with `hold`. Clears `reqs`.
  void bury(std::vector<MPI_Request>& reqs, std::shared_ptr<void> hold);
  // Completes what MPI has finished and drops those holds once no thread is
  // inside an MPI call (MpiCall); cheap when empty.
  void sweep();
  // Requests whose holds are still here, complete or not.
  size_t size() const { return count_.load(std::memory_order_acquire); }

 private:
  struct Grave {
    std::vector<MPI_Request> reqs;
    std::shared_ptr<void> hold;
    size_t buried = 0;  // requests it was buried with
  };
  Graveyard() = default;

  std::mutex mu_;
  std::vector<Grave> graves_;
  std::atomic<size_t> count_{0};
};

// A control message sent without waiting; its bytes live as long as the send.
struct Posted {
  std::vector<uint8_t> bytes;
  MPI_Request req = MPI_REQUEST_NULL;
};
// Sends `bytes` to `rank` without waiting, kept in `out` until reaped.
Status post_control(int rank, std::vector<uint8_t> bytes, std::vector<Posted>& out);
// Drops the sends of `posted` that completed.
void reap_posted(std::vector<Posted>& posted);
// Gives up on the sends of `posted`: each not complete is buried with its bytes.
void bury_posted(std::vector<Posted>& posted);

// Makes a hold for memory that a failed transfer may still touch, asked
// for only when one is abandoned.
using HoldFn = std::function<std::shared_ptr<void>()>;
// One hold standing for all of `holds`.
std::shared_ptr<void> hold_all(std::vector<std::shared_ptr<void>> holds);

// Posts the chunk sends of `bytes` at `data` on `tag`; the memory must stay
// untouched until every request in `out` completes.
Status post_chunks(int rank, int tag, const uint8_t* data, uint64_t bytes, std::vector<MPI_Request>& out);
// Receives `bytes` in chunks straight into `data`, each chunk's length
// checked; `data` null drains them through a chunk-sized scratch buffer.
// Past deadline_ns: DEADLINE_EXCEEDED, and the receives MPI could not
// cancel are buried with `hold_data()` (the scratch buffer for a drain).
Status recv_chunks(int rank, int tag, uint8_t* data, uint64_t bytes, uint64_t deadline_ns, const HoldFn& hold_data);
// Completes what it can of `reqs` without waiting; true when all are done.
bool test_all(std::vector<MPI_Request>& reqs);

}  // namespace simpler::dist
