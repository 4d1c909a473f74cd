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
  std::unique_ptr<ForkedChild> c(new ForkedChild(server, recipe, options));
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
  c->state_.store(State::kServing, std::memory_order_release);
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
  const Result<pid_t> spawned = server_->spawn(recipe_, now_ns() + kServerAnswerNs);
  if (!spawned.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ended_) ended_ = spawned.status();  // no child yet: nothing runs, nothing is to be killed
    return spawned.status();
  }
  const pid_t pid = *spawned;
  // The server keeps the child unreaped until reap(), so this pid is the child.
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  const int e = errno;
  std::lock_guard<std::mutex> lock(mu_);
  if (pidfd_ >= 0) ::close(pidfd_);  // the dead child's, reaped
  pid_ = pid;
  pidfd_ = fd;
  ended_.reset();
  clean_exit_ = false;
  state_.store(State::kStarting, std::memory_order_release);
  if (fd < 0) {
    // Without its pidfd nothing would notice the child's exit: end it now.
    ::kill(pid, SIGKILL);
    ended_ = internal_error("pidfd_open of child {} failed: {}", pid, std::strerror(e));
    return *ended_;
  }
  return Status();
}

ForkedChild::~ForkedChild() {
  if (!closed_ && endpoint_ != nullptr) {
    std::vector<EndpointEvent> events;
    (void)close(now_ns() + 5'000'000'000ull, events);
  }
  if (pidfd_ >= 0) ::close(pidfd_);
}

pid_t ForkedChild::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pid_;
}

bool ForkedChild::maintain() {
  switch (state_.load(std::memory_order_acquire)) {
    case State::kServing: {
      if (!endpoint_->poisoned()) return false;
      if (Status ended = check(); !ended.ok()) return replace(ended);
      // Poisoned, with the child alive. One that stopped its endpoint or
      // ended its exit sweep exits next, and a later round replaces it; any
      // other poison is this side's defect, and the worker takes no more work.
      if (load_acquire(endpoint_->view().control().endpoint_state) >= kEndpointStopped) return false;
      fail(*endpoint_->poisoned());
      return true;
    }
    case State::kStarting: {
      const std::optional<Status> ready = endpoint_->ready_state();
      if (ready && ready->ok()) {
        state_.store(State::kServing, std::memory_order_release);
        changed_.ring();
        return true;
      }
      if (ready) {
        kill(ready->to_string());  // it exits by itself after INIT_FAILED; this reaps it
        return replace(*ready);
      }
      if (Status ended = check(); !ended.ok()) {
        return replace(Status(ended.code(), "before INIT_READY: " + ended.message()));
      }
      if (now_ns() < ready_deadline_ns_) return false;
      const std::string why =
          fmt::format("it did not report INIT_READY within {} ms; killed", options_.ready_timeout_ns / 1'000'000);
      kill(why);
      return replace(make_error(StatusCode::kDeadlineExceeded, "{}", why));
    }
    case State::kFailed:
      return false;
  }
  return false;
}

bool ForkedChild::replace(const Status& cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_death_ = cause;
  }
  const uint64_t now = now_ns();
  while (!replaced_ns_.empty() && now - replaced_ns_.front() >= options_.respawn_window_ns) replaced_ns_.pop_front();
  if (replaced_ns_.size() >= options_.respawn_budget) {
    fail(make_error(StatusCode::kAborted,
                    "it died again after {} replacements within {} s and is not replaced any more; it last died "
                    "with: {}",
                    replaced_ns_.size(), options_.respawn_window_ns / 1'000'000'000ull, cause.to_string()));
    return true;
  }
  if (incarnation() > options_.max_replacements) {
    fail(make_error(StatusCode::kAborted, "it died again after {} replacements, all it may have; it last died with: {}",
                    options_.max_replacements, cause.to_string()));
    return true;
  }
  replaced_ns_.push_back(now);
  // The same mailbox, registered afresh: the server's recipe points at it,
  // and no control command reaches it before the new child exists.
  if (Status st = endpoint_->reregister([this] { return launch(); }); !st.ok()) {
    fail(make_error(st.code(), "its replacement could not be started: {}; it had died with: {}", st.message(),
                    cause.to_string()));
    return true;
  }
  ready_deadline_ns_ = now_ns() + options_.ready_timeout_ns;
  launched_incarnation_.store(incarnation(), std::memory_order_release);
  changed_.ring();
  return true;
}

void ForkedChild::fail(const Status& cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = cause;
  }
  state_.store(State::kFailed, std::memory_order_release);
  changed_.ring();
}

std::optional<Status> ForkedChild::failure() const {
  if (state_.load(std::memory_order_acquire) != State::kFailed) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::optional<Status> ForkedChild::last_death() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_death_;
}

void ForkedChild::stop_replacing(const Status& cause) {
  if (state_.load(std::memory_order_acquire) != State::kFailed) fail(cause);
}

Status ForkedChild::await_replacement(uint64_t incarnation, uint64_t deadline_ns) {
  for (;;) {
    const uint32_t armed = changed_.arm();
    // Not incarnation(): the registration moves on before the replacement is
    // forked, and until then pid() still names the dead child.
    if (launched_incarnation_.load(std::memory_order_acquire) != incarnation ||
        state_.load(std::memory_order_acquire) == State::kFailed) {
      return Status();
    }
    if (now_ns() >= deadline_ns) {
      return make_error(StatusCode::kDeadlineExceeded, "no child replaced the dead one by the deadline");
    }
    changed_.park(armed, deadline_ns);
  }
}

void ForkedChild::record_exit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    const int code = WEXITSTATUS(wait_status);
    clean_exit_ = code == kChildExitClean;
    if (code == kChildExitDeviceFault) {
      ended_ = Status(StatusCode::kDeviceFault,
                      "the child exited: its device reported a sticky fault, which only a new child resets");
    } else {
      ended_ = clean_exit_ ? Status(StatusCode::kAborted, "the child exited")
                           : make_error(StatusCode::kAborted, "the child exited with code {}", code);
    }
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
  if (ended_ || pid_ <= 0) return;
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
  if (closed_) return failed_precondition("child {} already closed", pid());
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
