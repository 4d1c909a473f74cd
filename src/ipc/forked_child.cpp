#include "ipc/forked_child.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errors.h"

namespace simpler {

Result<std::unique_ptr<ForkedChild>> ForkedChild::spawn(std::function<std::unique_ptr<RunHandler>()> make_handler,
                                                        SpawnOptions options) {
  SIMPLER_ASSIGN_OR_RETURN(const size_t bytes, mailbox_size(options.granted_sets));
  SIMPLER_ASSIGN_OR_RETURN(SharedMapping mapping, SharedMapping::create_anonymous(bytes));
  std::unique_ptr<ForkedChild> c(new ForkedChild());
  c->mapping_ = std::make_shared<SharedMapping>(std::move(mapping));
  SIMPLER_ASSIGN_OR_RETURN(c->endpoint_, MailboxEndpoint::create(c->mapping_->data(), c->mapping_->size(),
                                                                 options.granted_sets, options.endpoint));
  const MailboxView view = c->endpoint_->view();
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) return internal_error("fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    // A child whose parent is gone serves nobody: it dies with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kChildExitClean);
    std::unique_ptr<RunHandler> handler = make_handler();
    MailboxChild child(view, *handler, options.child);
    const int code = child.serve();
    // The process ends here without destroying the handler: after a stop its
    // runs' results are sealed away, so nothing may wait for them. _exit also
    // skips the parent's atexit handlers and buffered streams, which are not ours.
    _exit(code);
  }
  c->pid_ = pid;
  c->endpoint_->set_liveness(c.get());
  if (Status st = c->endpoint_->wait_ready(now_ns() + options.ready_timeout_ns); !st.ok()) {
    std::vector<EndpointEvent> none;
    (void)c->close(now_ns() + 1'000'000'000ull, none);
    return st;
  }
  c->child_grant_ = load_acquire(c->endpoint_->view().control().child_grant);
  return c;
}

ForkedChild::~ForkedChild() {
  if (!closed_ && pid_ > 0) {
    std::vector<EndpointEvent> events;
    (void)close(now_ns() + 5'000'000'000ull, events);
  }
}

void ForkedChild::record_exit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    const int code = WEXITSTATUS(wait_status);
    clean_exit_ = code == kChildExitClean;
    ended_ = clean_exit_ ? Status(StatusCode::kAborted, "the child exited")
                         : make_error(StatusCode::kAborted, "the child exited with code {}", code);
  } else if (WIFSIGNALED(wait_status)) {
    ended_ = make_error(StatusCode::kAborted, "the child was killed by signal {}", WTERMSIG(wait_status));
  } else {
    ended_ = make_error(StatusCode::kAborted, "the child ended with wait status {}", wait_status);
  }
}

Status ForkedChild::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return *ended_;
  int ws = 0;
  const pid_t r = waitpid(pid_, &ws, WNOHANG);
  if (r == pid_) record_exit(ws);
  if (r < 0) ended_ = internal_error("waitpid({}) failed: {}", pid_, std::strerror(errno));
  return ended_ ? *ended_ : Status();
}

void ForkedChild::kill(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ::kill(pid_, SIGKILL);
  int ws = 0;
  // SIGKILL cannot be caught, so this reap is prompt.
  while (waitpid(pid_, &ws, 0) < 0 && errno == EINTR) {
  }
  ended_ = make_error(StatusCode::kAborted, "{}", why);
}

Status ForkedChild::close(uint64_t deadline_ns, std::vector<EndpointEvent>& events) {
  if (closed_) return failed_precondition("child {} already closed", pid_);
  endpoint_->request_shutdown();
  Status ended;
  for (;;) {
    endpoint_->poll(events);
    if (Status st = check(); !st.ok()) {
      ended = st;
      break;
    }
    if (now_ns() >= deadline_ns) {
      kill(fmt::format("the child did not exit by its close deadline; killed"));
      ended = check();
      break;
    }
    endpoint_->wait(deadline_ns);
  }
  endpoint_->poll(events);
  endpoint_->poison(ended);
  endpoint_->poll(events);
  closed_ = true;
  endpoint_.reset();
  mapping_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  return clean_exit_ ? Status() : ended;
}

}  // namespace simpler
