// ForkServer: the process every child of a worker is forked from. start()
// forks it while the parent still has one thread; it stays single-threaded,
// so a child can be forked from it at any later time (the first children at
// init, a replacement after a death) without forking a multi-threaded
// process. Everything a child needs (its recipe, its mailbox, the shared
// heaps) is mapped or built before start(), so each child sees it at the
// parent's addresses. The server watches the parent process through a pidfd
// (not the thread that forked it) and ends its children when that process is
// gone; each child dies with the server (PR_SET_PDEATHSIG, whose parent
// thread is the server's only one). The server is named "simpler-fork", each
// child by its recipe. Threads: start() with one thread in the
// process; spawn/reap from any thread (serialised). Owns the server process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ipc/mailbox_child.h"
#include "ipc/mailbox_layout.h"

namespace simpler {

// What the server runs in a child it forks: the handler built after the
// fork, serving `mailbox`. Referenced memory must exist before start().
struct ChildRecipe {
  // The child's process name (ps, /proc/<pid>/comm), as "simpler-chip0";
  // the kernel keeps its first 15 bytes.
  std::string name;
  std::function<std::unique_ptr<RunHandler>()> make_handler;
  MailboxView mailbox;
  ChildOptions child;
};

class ForkServer {
 public:
  // Forks the server with the recipes it may fork children from, and waits
  // until it watches this process. The caller guarantees no other thread
  // of this process runs (see ForkedChild).
  static Result<std::unique_ptr<ForkServer>> start(std::vector<ChildRecipe> recipes);
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;
  // Asks the server to exit (it kills any child still running) and reaps it.
  ~ForkServer();

  // Forks a child from recipe `recipe`; its pid. The child stays unreaped
  // (a zombie once it exits) until reap() collects it, so the pid cannot
  // name another process meanwhile.
  Result<pid_t> spawn(uint32_t recipe, uint64_t deadline_ns);
  // The wait status of child `pid` once it has exited (collecting it), or
  // nullopt while it runs.
  Result<std::optional<int>> reap(pid_t pid, uint64_t deadline_ns);
  pid_t pid() const { return pid_; }

 private:
  struct Reply;  // the server's answer to one request (fork_server.cpp)
  ForkServer(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  // The server process: answers requests on `sock` until the parent asks it
  // to exit, closes its end or is gone.
  [[noreturn]] static void serve(int sock, pid_t parent, const std::vector<ChildRecipe>& recipes);
  // One request and its reply (requires mu_).
  Result<Reply> call(uint32_t op, uint32_t recipe, pid_t pid, uint64_t deadline_ns);
  // The reply numbered `seq`; any other (one whose request timed out) is
  // dropped, and a child forked for a spawn that timed out is killed: no
  // one claimed it, and it would serve the mailbox of its recipe beside the
  // child spawned in its place.
  Result<Reply> receive(uint64_t seq, uint64_t deadline_ns);

  std::mutex mu_;
  int fd_;
  pid_t pid_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> timed_out_spawns_;  // their seqs (requires mu_)
};

}  // namespace simpler
