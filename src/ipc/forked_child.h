// ForkedChild: one child process serving one mailbox, forked by a
// ForkServer. start() registers the mailbox, has the server fork the child
// and waits for INIT_READY; spawn() does the same for a single child with a
// server of its own. Every fork happens in a process with one thread: the
// caller of spawn() guarantees it (one thread inside an allocator that does
// not guard its locks across fork, as GCC 12's ASan, leaves a lock held in
// the child, and every thread the child then starts blocks on it forever),
// the fork server is single-threaded by construction.
// The parent side is used from the publisher thread; check() from any thread.
// Owns the endpoint and its hold on the mapping and the child until close().
#pragma once

#include <sys/types.h>

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

struct SpawnOptions {
  uint64_t granted_sets = 2;
  EndpointOptions endpoint;
  ChildOptions child;
  uint64_t ready_timeout_ns = 30'000'000'000ull;
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
  pid_t pid() const { return pid_; }

  Status check() override;
  void kill(const std::string& why) override;

  // Sticky shutdown, then collects the sweep's terminals until the child
  // exits; past deadline_ns it is killed. Every run still held afterwards gets
  // a terminal. Reaps the child and unmaps. OK for a clean exit, else how
  // the child ended.
  Status close(uint64_t deadline_ns, std::vector<EndpointEvent>& events);

 private:
  ForkedChild(ForkServer& server, uint32_t recipe) : server_(&server), recipe_(recipe) {}
  // Has the server fork the child and opens its pidfd.
  Status launch();
  // Records how the child ended; requires mu_.
  void record_exit(int wait_status);
  // Whether the child has exited (its pidfd is readable); requires mu_.
  bool exited();

  // spawn(): the server this child alone uses; destroyed last, after close().
  std::unique_ptr<ForkServer> own_server_;
  ForkServer* server_;
  const uint32_t recipe_;
  std::shared_ptr<SharedMapping> mapping_;
  uint64_t child_grant_ = 0;
  std::unique_ptr<MailboxEndpoint> endpoint_;
  pid_t pid_ = -1;
  int pidfd_ = -1;  // the child's, opened while the server keeps it unreaped
  std::mutex mu_;
  std::optional<Status> ended_;  // set once reaped
  bool clean_exit_ = false;
  bool closed_ = false;
};

}  // namespace simpler
