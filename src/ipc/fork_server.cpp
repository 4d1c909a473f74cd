#include "ipc/fork_server.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>

#include "base/errors.h"
#include "base/fault_hooks.h"
#include "base/load_sense.h"

namespace simpler {

// What the server answers, over a SOCK_SEQPACKET socket (one message each).
struct ForkServer::Reply {
  uint64_t seq;         // the request's, echoed; 0 for the greeting
  int32_t error;        // errno, 0 for success
  int32_t pid;          // the child spawned or reaped; the server's own in the greeting
  uint32_t exited;      // reap: 1 when the child was collected
  int32_t wait_status;  // reap: as waitpid gives it
};

namespace {

// A request from the parent; the server answers each with one Reply.
enum ForkOp : uint32_t { kOpSpawn = 1, kOpReap = 2, kOpExit = 3 };
struct Request {
  uint64_t seq;
  uint32_t op;
  uint32_t recipe;  // kOpSpawn
  int32_t pid;      // kOpReap
  uint32_t reserved;
};

// How long start() waits for the server's greeting: it comes at once, so
// only a server that is gone or stopped runs into it.
constexpr uint64_t kGreetingNs = 30'000'000'000ull;

[[noreturn]] void end_children(const std::vector<pid_t>& children) {
  for (pid_t c : children) ::kill(c, SIGKILL);
  // Collected here, so none is left a zombie for whoever adopts it; SIGKILL
  // cannot be caught, so each exit is prompt.
  for (pid_t c : children) {
    while (waitpid(c, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  _exit(0);
}

[[noreturn]] void run_child(const ChildRecipe& recipe, int sock, int parent_fd, pid_t server) {
  close(sock);
  close(parent_fd);
  // A child whose server is gone serves nobody: it dies with it. The server
  // has one thread, so this follows the server process.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != server) _exit(kChildExitClean);
  // Before the handler starts threads: each inherits the name.
  prctl(PR_SET_NAME, recipe.name.c_str());
  std::unique_ptr<RunHandler> handler = recipe.make_handler();
  MailboxChild child(recipe.mailbox, *handler, recipe.child);
  const int code = child.serve();
  // The process ends here without destroying the handler: after a stop its
  // runs' results are sealed away, so nothing may wait for them. _exit also
  // skips the parent's atexit handlers and buffered streams, which are not ours.
  _exit(code);
}

}  // namespace

void ForkServer::serve(int sock, pid_t parent, const std::vector<ChildRecipe>& recipes) {
  // Children stay unreaped until the parent asks, whatever SIGCHLD the user's
  // process had set.
  signal(SIGCHLD, SIG_DFL);
#ifdef SIMPLER_TEST_HOOKS
  (void)hooks::disarm_alloc_fault();  // the forking thread's H2 count is the test's, not this process's
#endif
  prctl(PR_SET_NAME, "simpler-fork");
  const int parent_fd = static_cast<int>(syscall(SYS_pidfd_open, parent, 0));
  Reply hello{};
  hello.error = parent_fd < 0 ? errno : 0;
  hello.pid = getpid();
  // Opened, then checked: a parent that is still ours now is the process the pidfd names.
  if (parent_fd >= 0 && getppid() != parent) _exit(0);
  if (send(sock, &hello, sizeof hello, MSG_NOSIGNAL) != sizeof hello || parent_fd < 0) _exit(0);
  const pid_t self = getpid();
  std::vector<pid_t> children;
  for (;;) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {parent_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      end_children(children);
    }
    if (fds[1].revents != 0) end_children(children);  // the parent process is gone, whichever thread forked us
    if (fds[0].revents == 0) continue;
    Request rq{};
    const ssize_t n = recv(sock, &rq, sizeof rq, MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) end_children(children);  // the parent closed its end
    Reply reply{};
    reply.seq = rq.seq;
    if (n != static_cast<ssize_t>(sizeof rq)) {
      reply.error = EPROTO;
    } else if (rq.op == kOpExit) {
      end_children(children);
    } else if (rq.op == kOpSpawn && rq.recipe < recipes.size()) {
      const pid_t pid = hooks::fork_fault_hit() ? (errno = EAGAIN, -1) : fork();
      if (pid == 0) run_child(recipes[rq.recipe], sock, parent_fd, self);
      if (pid < 0) {
        reply.error = errno;
      } else {
        children.push_back(pid);
        reply.pid = pid;
      }
    } else if (rq.op == kOpReap) {
      auto it = std::find(children.begin(), children.end(), rq.pid);
      int ws = 0;
      const pid_t r = it == children.end() ? -1 : waitpid(rq.pid, &ws, WNOHANG);
      if (it == children.end()) {
        reply.error = ESRCH;
      } else if (r < 0) {
        reply.error = errno;
      } else {
        reply.pid = rq.pid;
        reply.exited = r == rq.pid ? 1 : 0;
        reply.wait_status = ws;
        if (r == rq.pid) children.erase(it);
      }
    } else {
      reply.error = EINVAL;
    }
    if (send(sock, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply) end_children(children);
  }
}

Result<std::unique_ptr<ForkServer>> ForkServer::start(std::vector<ChildRecipe> recipes) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return resource_exhausted("fork server: socketpair failed: {}", std::strerror(errno));
  }
  // Allocated before the fork: once the server runs, nothing may fail before
  // this object owns it (its destructor ends and reaps it).
  std::unique_ptr<ForkServer> s;
  try {
    s.reset(new ForkServer(sv[0], -1));
  } catch (const std::bad_alloc&) {
    close(sv[0]);
    close(sv[1]);
    return resource_exhausted("fork server: host memory exhausted before the fork");
  }
  const pid_t parent = getpid();
  const pid_t pid = hooks::fork_fault_hit() ? (errno = EAGAIN, -1) : fork();
  if (pid < 0) {
    const int e = errno;
    close(sv[1]);
    return resource_exhausted("fork server: fork failed: {}", std::strerror(e));  // s closes sv[0]
  }
  // On both sides, so that the server's children inherit the record: their
  // threads are this job's, not a neighbour's (LoadSense).
  if (pid == 0) {
    load_sense().note_fork_server(getpid(), parent);
    close(sv[0]);
    serve(sv[1], parent, recipes);
  }
  load_sense().note_fork_server(pid, parent);
  close(sv[1]);
  s->pid_ = pid;
  std::lock_guard<std::mutex> lock(s->mu_);
  SIMPLER_ASSIGN_OR_RETURN(const Reply hello, s->receive(0, now_ns() + kGreetingNs), "fork server");
  if (hello.error != 0) {
    return failed_precondition("fork server: it cannot watch its parent process: pidfd_open: {} (Linux 5.3 or later)",
                               std::strerror(hello.error));
  }
  return s;
}

ForkServer::~ForkServer() {
  if (pid_ < 0) {  // the fork failed: only the socket is ours
    close(fd_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Request rq{++seq_, kOpExit, 0, 0, 0};
    (void)send(fd_, &rq, sizeof rq, MSG_NOSIGNAL);
  }
  // Closing is an exit request too, should the send have failed.
  close(fd_);
  int ws = 0;
  while (waitpid(pid_, &ws, 0) < 0 && errno == EINTR) {
  }
  load_sense().forget_fork_server(pid_);
}

Result<ForkServer::Reply> ForkServer::receive(uint64_t seq, uint64_t deadline_ns) {
  for (;;) {
    const uint64_t now = now_ns();
    if (now >= deadline_ns)
      return make_error(StatusCode::kDeadlineExceeded, "the fork server (pid {}) did not answer", pid_);
    pollfd p{fd_, POLLIN, 0};
    const uint64_t wait_ms = (deadline_ns - now + 999'999) / 1'000'000;
    const int r = poll(&p, 1, static_cast<int>(std::min<uint64_t>(wait_ms, INT_MAX)));
    if (r < 0 && errno != EINTR) return internal_error("poll on the fork server's socket: {}", std::strerror(errno));
    if (r <= 0) continue;  // timed out (the deadline check ends it) or interrupted
    Reply reply{};
    // MSG_TRUNC: the length the message had, so an oversized one is seen as such.
    const ssize_t n = recv(fd_, &reply, sizeof reply, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return make_error(StatusCode::kAborted, "the fork server (pid {}) is gone", pid_);
    if (n != static_cast<ssize_t>(sizeof reply)) {
      return internal_error("the fork server sent a reply of {} bytes, not {}", n, sizeof reply);
    }
    if (reply.seq == seq) return reply;
    const auto late = std::find(timed_out_spawns_.begin(), timed_out_spawns_.end(), reply.seq);
    if (late == timed_out_spawns_.end()) continue;
    timed_out_spawns_.erase(late);
    // Unreaped by the server until it exits, so the pid is still that child.
    if (reply.error == 0 && reply.pid > 0) ::kill(reply.pid, SIGKILL);
  }
}

Result<ForkServer::Reply> ForkServer::call(uint32_t op, uint32_t recipe, pid_t pid, uint64_t deadline_ns) {
  const Request rq{++seq_, op, recipe, pid, 0};
  if (send(fd_, &rq, sizeof rq, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof rq)) {
    return make_error(StatusCode::kAborted, "the fork server (pid {}) is gone: {}", pid_, std::strerror(errno));
  }
  return receive(rq.seq, deadline_ns);
}

Result<pid_t> ForkServer::spawn(uint32_t recipe, uint64_t deadline_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  Result<Reply> answered = call(kOpSpawn, recipe, 0, deadline_ns);
  if (answered.status().code() == StatusCode::kDeadlineExceeded) timed_out_spawns_.push_back(seq_);
  SIMPLER_ASSIGN_OR_RETURN(const Reply r, std::move(answered));
  if (r.error == EINVAL) return internal_error("the fork server has no recipe {}", recipe);
  if (r.error != 0) return resource_exhausted("the fork server could not fork a child: {}", std::strerror(r.error));
  if (r.pid <= 0) return internal_error("the fork server reported child pid {}", r.pid);
  return static_cast<pid_t>(r.pid);
}

Result<std::optional<int>> ForkServer::reap(pid_t pid, uint64_t deadline_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  SIMPLER_ASSIGN_OR_RETURN(const Reply r, call(kOpReap, 0, pid, deadline_ns));
  if (r.error != 0) return internal_error("the fork server cannot reap child {}: {}", pid, std::strerror(r.error));
  if (r.pid != pid || r.exited > 1) {
    return internal_error("the fork server answered a reap of child {} with pid {} exited {}", pid, r.pid, r.exited);
  }
  return r.exited == 1 ? std::optional<int>(r.wait_status) : std::nullopt;
}

}  // namespace simpler
