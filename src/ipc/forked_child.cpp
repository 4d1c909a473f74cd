#include "ipc/forked_child.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/errors.h"

namespace simpler {

namespace {
// A bound on the fork server's answers and on a killed child's exit; both
// come at once unless something is badly wrong.
constexpr uint64_t kServerAnswerNs = 10'000'000'000ull;
}  // namespace

Result<std::shared_ptr<SharedMapping>> ForkedChild::map_mailbox(uint64_t granted_sets) {
  SIMPLER_ASSIGN_OR_RETURN(const size_t bytes, mailbox_size(granted_sets));
  SIMPLER_ASSIGN_OR_RETURN(SharedMapping mapping, SharedMapping::create_anonymous(bytes));
  return std::make_shared<SharedMapping>(std::move(mapping));
}

Result<std::unique_ptr<ForkedChild>> ForkedChild::start(ForkServer& server, uint32_t recipe,
                                                        std::shared_ptr<SharedMapping> mailbox, SpawnOptions options) {
  std::unique_ptr<ForkedChild> c(new ForkedChild(server, recipe));
  c->mapping_ = std::move(mailbox);
  SIMPLER_ASSIGN_OR_RETURN(c->endpoint_, MailboxEndpoint::create(c->mapping_->data(), c->mapping_->size(),
                                                                 options.granted_sets, options.endpoint));
  SIMPLER_RETURN_IF_ERROR(c->launch());
  c->endpoint_->set_liveness(c.get());
  if (Status st = c->endpoint_->wait_ready(now_ns() + options.ready_timeout_ns); !st.ok()) {
    std::vector<EndpointEvent> none;
    (void)c->close(now_ns() + 1'000'000'000ull, none);
    return st;
  }
  c->child_grant_ = load_acquire(c->endpoint_->view().control().child_grant);
  return c;
}

Result<std::unique_ptr<ForkedChild>> ForkedChild::spawn(std::function<std::unique_ptr<RunHandler>()> make_handler,
                                                        SpawnOptions options) {
  SIMPLER_ASSIGN_OR_RETURN(std::shared_ptr<SharedMapping> mailbox, map_mailbox(options.granted_sets));
  SIMPLER_ASSIGN_OR_RETURN(const MailboxView view,
                           MailboxView::attach(mailbox->data(), mailbox->size(), options.granted_sets));
  std::vector<ChildRecipe> recipes;
  recipes.push_back(ChildRecipe{"simpler-child", std::move(make_handler), view, options.child});
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<ForkServer> server, ForkServer::start(std::move(recipes)));
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<ForkedChild> c, start(*server, 0, std::move(mailbox), options));
  c->own_server_ = std::move(server);
  return c;
}

Status ForkedChild::launch() {
  SIMPLER_ASSIGN_OR_RETURN(const pid_t pid, server_->spawn(recipe_, now_ns() + kServerAnswerNs));
  // The server keeps the child unreaped until reap(), so this pid is the child.
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  const int e = errno;
  std::lock_guard<std::mutex> lock(mu_);
  pid_ = pid;
  pidfd_ = fd;
  ended_.reset();
  clean_exit_ = false;
  if (fd < 0) {
    // Without its pidfd nothing would notice the child's exit: end it now.
    ::kill(pid, SIGKILL);
    ended_ = internal_error("pidfd_open of child {} failed: {}", pid, std::strerror(e));
    return *ended_;
  }
  return Status();
}

ForkedChild::~ForkedChild() {
  if (!closed_ && pid_ > 0) {
    std::vector<EndpointEvent> events;
    (void)close(now_ns() + 5'000'000'000ull, events);
  }
  if (pidfd_ >= 0) ::close(pidfd_);
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

bool ForkedChild::exited() {
  pollfd p{pidfd_, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

Status ForkedChild::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return *ended_;
  if (!exited()) return Status();
  auto ws = server_->reap(pid_, now_ns() + kServerAnswerNs);
  if (!ws.ok()) {
    ended_ = make_error(StatusCode::kAborted, "the child exited; how is unknown: {}", ws.status().message());
  } else if (ws->has_value()) {
    record_exit(**ws);
  }
  return ended_ ? *ended_ : Status();
}

void ForkedChild::kill(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ::kill(pid_, SIGKILL);
  // SIGKILL cannot be caught, so the exit is prompt; the bound only keeps a
  // child stuck in the kernel from holding this thread.
  pollfd p{pidfd_, POLLIN, 0};
  const uint64_t deadline = now_ns() + kServerAnswerNs;
  for (uint64_t now = now_ns(); now < deadline; now = now_ns()) {
    if (poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000 + 1)) == 1) break;
  }
  (void)server_->reap(pid_, now_ns() + kServerAnswerNs);
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
