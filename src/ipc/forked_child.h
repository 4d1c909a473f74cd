// ForkedChild: one mailbox and the child process serving it, forked by a
// ForkServer. start() registers the mailbox, has the server fork the child
// and waits for INIT_READY; spawn() does the same for a single child with a
// server of its own. Every fork happens in a process with one thread: the
// caller of spawn() guarantees it (one thread inside an allocator that does
// not guard its locks across fork, as GCC 12's ASan, leaves a lock held in
// the child, and every thread the child then starts blocks on it forever),
// the fork server is single-threaded by construction.
// maintain() replaces a child that died: the same mailbox is registered
// again and the server forks a new child from the same recipe, within a
// budget of replacements per window (and SpawnOptions::max_replacements in
// all); past it the worker is failed for good.
// Threads: the publisher thread polls the endpoint and calls maintain();
// check(), failure(), incarnation(), pid() and the endpoint's control
// commands from any thread. Owns the endpoint, its hold on the mapping and
// the child until close().
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/shared_memory.h"
#include "ipc/fork_server.h"
#include "ipc/mailbox_child.h"
#include "ipc/mailbox_endpoint.h"

namespace simpler {

// The default respawn budget: a child that dies a fourth time within a minute
// is broken, not unlucky.
inline constexpr size_t kRespawnBudget = 3;
inline constexpr uint64_t kRespawnWindowNs = 60'000'000'000ull;

struct SpawnOptions {
  uint64_t granted_sets = 2;
  EndpointOptions endpoint;
  ChildOptions child;
  uint64_t ready_timeout_ns = 30'000'000'000ull;
  // How many times over its life the child may be replaced, whatever the window.
  uint64_t max_replacements = UINT64_MAX;
  // A child that keeps dying is replaced at most respawn_budget times within
  // any respawn_window_ns; the next death fails its worker for good.
  size_t respawn_budget = kRespawnBudget;
  uint64_t respawn_window_ns = kRespawnWindowNs;
};

class ForkedChild final : public ChildLiveness {
 public:
  // A mailbox mapping for `granted_sets`, to be mapped before the fork server
  // so the parent and the child see it at one address.
  static Result<std::shared_ptr<SharedMapping>> map_mailbox(uint64_t granted_sets);
  // Registers `mailbox` (the mapping recipe `recipe` of `server` serves), has
  // the server fork the child and waits for its INIT_READY.
  static Result<std::unique_ptr<ForkedChild>> start(ForkServer& server, uint32_t recipe,
                                                    std::shared_ptr<SharedMapping> mailbox, SpawnOptions options);
  // One child with a fork server of its own. `make_handler` runs in the child
  // after fork, so a handler may own threads and a device of its own.
  static Result<std::unique_ptr<ForkedChild>> spawn(std::function<std::unique_ptr<RunHandler>()> make_handler,
                                                    SpawnOptions options);
  ~ForkedChild() override;

  MailboxEndpoint& endpoint() { return *endpoint_; }
  // The mailbox mapping, shared with any reader (an observer) that must keep
  // it mapped for its own life, past close().
  std::shared_ptr<const SharedMapping> mapping() const { return mapping_; }
  // What the child's handler reported it resolved (R68); 0 for none.
  uint64_t child_grant() const { return child_grant_; }
  // The current child's.
  pid_t pid() const;

  Status check() override;
  void kill(const std::string& why) override;

  // Publisher thread, after each poll of the endpoint. A child that died
  // (the endpoint gave each run it held a terminal) is replaced: its mailbox
  // is registered again and the server forks a new child from the recipe,
  // whose INIT_READY later polls see; within the respawn budget, else
  // the worker is failed. True when the state changed.
  bool maintain();
  // The current child answered INIT_READY and the endpoint takes work.
  bool serving() const { return state_.load(std::memory_order_acquire) == State::kServing; }
  // Why this worker takes no more work, for good (a spent budget, a
  // replacement that could not be forked, stop_replacing()); nullopt while
  // it serves or a replacement is on its way.
  std::optional<Status> failure() const;
  // Why the last child that was replaced died (its liveness check's cause:
  // DEVICE_FAULT for a chip child that exited over a sticky device fault);
  // nullopt before any replacement. Any thread.
  std::optional<Status> last_death() const;
  // Fails the worker with `cause` (the node is closing): nothing more is replaced.
  void stop_replacing(const Status& cause);
  // Which child this is: the endpoint's registration, one more per replacement.
  uint64_t incarnation() const { return endpoint_->registration(); }
  // Waits until a replacement of incarnation `incarnation` was forked (pid()
  // names it from then on) or the worker failed, or until deadline_ns.
  Status await_replacement(uint64_t incarnation, uint64_t deadline_ns);

  // Sticky shutdown, then collects the sweep's terminals until the child
  // exits; past deadline_ns it is killed. Every run still held afterwards gets
  // a terminal. Reaps the child and unmaps. OK for a clean exit, else how
  // the child ended.
  Status close(uint64_t deadline_ns, std::vector<EndpointEvent>& events);

 private:
  enum class State : uint8_t { kStarting, kServing, kFailed };
  ForkedChild(ForkServer& server, uint32_t recipe, SpawnOptions options)
      : server_(&server), recipe_(recipe), options_(std::move(options)) {}
  // Has the server fork the child and opens its pidfd; the state is then kStarting.
  Status launch();
  // The current child died with `cause`: forks its replacement, or fails the
  // worker when the budget is spent.
  bool replace(const Status& cause);
  void fail(const Status& cause);
  // Records how the child ended; requires mu_.
  void record_exit(int wait_status);
  // Whether the child has exited (its pidfd is readable); requires mu_.
  bool exited();

  // spawn(): the server this child alone uses; destroyed last, after close().
  std::unique_ptr<ForkServer> own_server_;
  ForkServer* server_;
  const uint32_t recipe_;
  const SpawnOptions options_;
  std::shared_ptr<SharedMapping> mapping_;
  uint64_t child_grant_ = 0;
  std::unique_ptr<MailboxEndpoint> endpoint_;
  std::atomic<State> state_{State::kStarting};
  Doorbell changed_;  // rung at every state change, for await_replacement()
  // The incarnation whose child was forked last (pid() names it).
  std::atomic<uint64_t> launched_incarnation_{1};
  // Publisher thread: when each replacement in the window was forked, and
  // by when the one starting must answer INIT_READY.
  std::deque<uint64_t> replaced_ns_;
  uint64_t ready_deadline_ns_ = 0;

  mutable std::mutex mu_;
  pid_t pid_ = -1;
  int pidfd_ = -1;               // the child's, opened while the server keeps it unreaped
  std::optional<Status> ended_;  // set once reaped
  bool clean_exit_ = false;
  std::optional<Status> failure_;  // with kFailed
  std::optional<Status> last_death_;
  bool closed_ = false;
};

}  // namespace simpler
