// ForkedChild: one child process serving one mailbox. spawn() maps the region,
// registers it, forks, runs the serve loop with a handler built in the child,
// and waits for INIT_READY. The caller guarantees that no other thread of the
// process is running at the fork: one inside an allocator that does not guard
// its locks across fork (GCC 12's ASan) leaves a lock held in the child, and
// every thread the child then starts blocks on it forever.
// The parent side is used from the publisher thread; check() from any thread.
// Owns the mapping, the endpoint and the child's pid until close().
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/shared_memory.h"
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
  // `make_handler` runs in the child after fork, so a handler may own threads
  // and a device of its own.
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
  ForkedChild() = default;
  // Records how the child ended; requires mu_.
  void record_exit(int wait_status);

  std::shared_ptr<SharedMapping> mapping_;
  uint64_t child_grant_ = 0;
  std::unique_ptr<MailboxEndpoint> endpoint_;
  pid_t pid_ = -1;
  std::mutex mu_;
  std::optional<Status> ended_;  // set once reaped
  bool clean_exit_ = false;
  bool closed_ = false;
};

}  // namespace simpler
