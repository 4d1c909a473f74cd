#include "dist/mpi_io.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "base/errors.h"
#include "base/leak.h"
#include "dist/mpi_session.h"
#include "dist/wire.h"

namespace simpler::dist {

namespace {
constexpr uint64_t kChunkWaitSleepNs = 50'000;
}  // namespace

bool Backoff::take_wake() {
  if (!woken_.exchange(false, std::memory_order_acq_rel)) return false;
  news();
  return true;
}

void Backoff::pause() {
  if (take_wake()) return;
  if (yielding()) {
    sched_yield();
    return;
  }
  sleep_ns_ = sleep_ns_ == 0 ? first_sleep_ns_ : std::min(sleep_ns_ * 2, max_sleep_ns_);
  doze(sleep_ns_);
}

void Backoff::doze(uint64_t ns) {
  if (take_wake()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(ns), [this] { return woken_.load(std::memory_order_acquire); });
  }
  take_wake();
}

void Backoff::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

std::shared_mutex& MpiCall::calls() {
  static std::shared_mutex* m = abandon(new std::shared_mutex);  // threads may call MPI until the process ends
  return *m;
}

Result<bool> try_recv_control(int rank, std::vector<uint8_t>& out) {
  int flag = 0;
  MPI_Status st;
  const MpiCall held;
  if (MPI_Iprobe(rank, kTagControl, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS) {
    return internal_error("MPI_Iprobe for rank {} failed", rank);
  }
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (count < 0 || count > kWireMaxMessage) {
    // Consumed so it is not seen again; the sender is no longer trusted.
    std::vector<uint8_t> sink(kWireMaxMessage);
    MPI_Recv(sink.data(), kWireMaxMessage, MPI_BYTE, rank, kTagControl, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return invalid_argument("a control message of {} bytes exceeds the {}-byte bound", count, kWireMaxMessage);
  }
  out.resize(static_cast<size_t>(count));
  if (MPI_Recv(out.data(), count, MPI_BYTE, rank, kTagControl, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
    return internal_error("MPI_Recv of a {}-byte control message from rank {} failed", count, rank);
  }
  return true;
}

Status send_control(int rank, const std::vector<uint8_t>& bytes) {
  const MpiCall held;
  if (MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, rank, kTagControl, MPI_COMM_WORLD) !=
      MPI_SUCCESS) {
    return internal_error("MPI_Send of a {}-byte control message to rank {} failed", bytes.size(), rank);
  }
  return Status();
}

Status post_chunks(int rank, int tag, const uint8_t* data, uint64_t bytes, std::vector<MPI_Request>& out) {
  for (uint64_t off = 0; off < bytes; off += kChunkBytes) {
    const int len = static_cast<int>(std::min(kChunkBytes, bytes - off));
    MPI_Request r;
    if (in_mpi([&] { return MPI_Isend(data + off, len, MPI_BYTE, rank, tag, MPI_COMM_WORLD, &r); }) != MPI_SUCCESS) {
      return internal_error("MPI_Isend of a {}-byte chunk to rank {} failed", len, rank);
    }
    out.push_back(r);
  }
  return Status();
}

Graveyard& Graveyard::instance() {
  static Graveyard* g = abandon(new Graveyard);  // its holds may be needed until the process ends
  return *g;
}

void Graveyard::bury(std::vector<MPI_Request>& reqs, std::shared_ptr<void> hold) {
  Grave grave{{}, std::move(hold)};
  for (MPI_Request& r : reqs) {
    if (r == MPI_REQUEST_NULL) continue;
    if (mpi_finalizing()) {  // MPI may be gone: its memory is kept for good
      grave.reqs.push_back(r);
      continue;
    }
    in_mpi([&] { return MPI_Cancel(&r); });
    if (!test_one(r)) grave.reqs.push_back(r);
  }
  reqs.clear();
  if (grave.reqs.empty()) return;
  grave.buried = grave.reqs.size();
  std::lock_guard<std::mutex> lock(mu_);
  count_.fetch_add(grave.buried, std::memory_order_acq_rel);
  graves_.push_back(std::move(grave));
}

void Graveyard::sweep() {
  if (count_.load(std::memory_order_acquire) == 0 || mpi_finalizing()) return;
  std::vector<std::shared_ptr<void>> released;  // dropped outside the locks: a hold's release takes the heap's
  std::lock_guard<std::mutex> lock(mu_);
  bool complete = false;
  for (Grave& g : graves_) complete = test_all(g.reqs) || complete;
  if (!complete) return;
  // A completion another thread's progress wrote the bytes for is ordered
  // only once that thread left MPI (MpiCall); one still inside: next sweep.
  std::unique_lock<std::shared_mutex> quiet(MpiCall::calls(), std::try_to_lock);
  if (!quiet.owns_lock()) return;
  for (size_t i = 0; i < graves_.size();) {
    if (!graves_[i].reqs.empty()) {
      ++i;
      continue;
    }
    count_.fetch_sub(graves_[i].buried, std::memory_order_acq_rel);
    released.push_back(std::move(graves_[i].hold));
    graves_.erase(graves_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void bury_posted(std::vector<Posted>& posted) {
  for (Posted& p : posted) {
    std::vector<MPI_Request> one{p.req};
    Graveyard::instance().bury(one, std::make_shared<std::vector<uint8_t>>(std::move(p.bytes)));
  }
  posted.clear();
}

std::shared_ptr<void> hold_all(std::vector<std::shared_ptr<void>> holds) {
  return std::make_shared<std::vector<std::shared_ptr<void>>>(std::move(holds));
}

Status recv_chunks(int rank, int tag, uint8_t* data, uint64_t bytes, uint64_t deadline_ns, const HoldFn& hold_data) {
  std::shared_ptr<uint8_t[]> scratch;
  if (data == nullptr) scratch.reset(new uint8_t[std::min(bytes, kChunkBytes)]);
  const auto bury = [&](std::vector<MPI_Request>& reqs) {
    Graveyard::instance().bury(reqs, scratch != nullptr ? std::shared_ptr<void>(scratch) : hold_data());
  };
  // OpenMPI moves a large message only inside MPI calls on either side, so
  // this waits by testing often (yielding) rather than by sleeping long.
  Backoff backoff(kChunkWaitSleepNs);
  for (uint64_t off = 0; off < bytes;) {
    // Straight into the tensor: every chunk is posted at once; a drain reuses
    // its one scratch chunk, so it goes one at a time.
    std::vector<MPI_Request> reqs;
    std::vector<int> lens;
    const uint64_t begin = off;
    do {
      const int len = static_cast<int>(std::min(kChunkBytes, bytes - off));
      MPI_Request r;
      uint8_t* dst = data != nullptr ? data + off : scratch.get();
      if (in_mpi([&] { return MPI_Irecv(dst, len, MPI_BYTE, rank, tag, MPI_COMM_WORLD, &r); }) != MPI_SUCCESS) {
        bury(reqs);
        return internal_error("MPI_Irecv of a {}-byte chunk from rank {} failed", len, rank);
      }
      reqs.push_back(r);
      lens.push_back(len);
      off += static_cast<uint64_t>(len);
    } while (off < bytes && data != nullptr);
    std::vector<MPI_Status> sts(reqs.size());
    for (;;) {
      int done = 0;
      if (in_mpi([&] { return MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, sts.data()); }) !=
          MPI_SUCCESS) {
        bury(reqs);
        return invalid_argument("a tensor chunk from rank {} (bytes {}..{}) is longer than announced", rank, begin,
                                off);
      }
      if (done) break;
      if (now_ns() >= deadline_ns) {
        bury(reqs);
        return make_error(StatusCode::kDeadlineExceeded,
                          "rank {} sent {} of the {} announced tensor bytes before the deadline", rank, begin, bytes);
      }
      backoff.pause();
    }
    for (size_t i = 0; i < sts.size(); ++i) {
      int got = 0;
      MPI_Get_count(&sts[i], MPI_BYTE, &got);
      if (got != lens[i]) {
        return invalid_argument("a tensor chunk from rank {} carries {} bytes, {} were announced", rank, got, lens[i]);
      }
    }
  }
  return Status();
}

bool test_all(std::vector<MPI_Request>& reqs) {
  if (reqs.empty()) return true;
  int done = 0;
  in_mpi([&] { return MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE); });
  if (done) reqs.clear();
  return done != 0;
}

bool test_one(MPI_Request& r) {
  int done = 0;
  in_mpi([&] { return MPI_Test(&r, &done, MPI_STATUS_IGNORE); });
  return done != 0;
}

Status post_control(int rank, std::vector<uint8_t> bytes, std::vector<Posted>& out) {
  out.push_back(Posted{std::move(bytes), MPI_REQUEST_NULL});
  Posted& p = out.back();
  if (in_mpi([&] {
        return MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, rank, kTagControl, MPI_COMM_WORLD,
                         &p.req);
      }) != MPI_SUCCESS) {
    out.pop_back();
    return internal_error("MPI_Isend of a control message to rank {} failed", rank);
  }
  return Status();
}

void reap_posted(std::vector<Posted>& posted) {
  std::erase_if(posted, [](Posted& p) { return test_one(p.req); });
}

}  // namespace simpler::dist
