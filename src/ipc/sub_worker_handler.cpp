#include "ipc/sub_worker_handler.h"

#include <exception>
#include <string>

#include "base/errors.h"
#include "task/args_blob.h"
#include "task/digest.h"

namespace simpler {

Digest sub_function_digest(uint32_t index) {
  const std::string id = fmt::format("simpler.sub_function:{}", index);
  return sha256(id.data(), id.size());
}

SubWorkerHandler::SubWorkerHandler(std::vector<SubFunction> functions, HostRanges shared)
    : functions_(std::move(functions)), heap_(std::move(shared)) {}

SubWorkerHandler::~SubWorkerHandler() { drain(now_ns() + 5'000'000'000ull); }

Status SubWorkerHandler::init() {
  thread_ = std::thread([this] { main(); });
  return Status();
}

void SubWorkerHandler::start(RunRequest request, RunTicket ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ticket.complete(failed_precondition("sub worker is draining"));
      return;
    }
    queue_.emplace_back(std::move(request), ticket);
  }
  bell_.ring();
}

Status SubWorkerHandler::call(const RunRequest& request) {
  uint32_t index = 0;
  while (index < functions_.size() && sub_function_digest(index) != request.callable) ++index;
  if (index == functions_.size()) return not_found("no sub function with digest {}", digest_hex(request.callable));
  auto args = decode_args_blob(request.args_blob.data(), request.args_blob.size());
  if (!args.ok()) return args.status();
  for (size_t i = 0; i < args->size(); ++i) {
    const TaskArg& a = (*args)[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    if (!heap_.contains(a.tensor.buffer().addr, a.tensor.buffer().bytes)) {
      return out_of_range("argument {}: buffer {:#x}+{} is not in the shared heap, the only memory a sub worker reads",
                          i, a.tensor.buffer().addr, a.tensor.buffer().bytes);
    }
  }
  try {
    return functions_[index](TaskArgsView(*args));
  } catch (const std::exception& e) {
    return internal_error("sub function {} threw: {}", index, e.what());
  } catch (...) {
    return internal_error("sub function {} threw a non-standard exception", index);
  }
}

void SubWorkerHandler::main() {
  for (;;) {
    spin_then_park(bell_, [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return stopping_ || !queue_.empty();
    }, SpinPolicy{});
    std::optional<std::pair<RunRequest, RunTicket>> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;  // stopping, nothing left
      job.emplace(std::move(queue_.front()));
      queue_.pop_front();
      busy_ = true;
    }
    job->second.accepted();  // a host function has no later launch marker than its call
    job->second.complete(call(job->first), kDispositionNativePrepared);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (queue_.empty()) idle_bell_.ring();
  }
}

void SubWorkerHandler::drain(uint64_t deadline_ns) {
  if (!thread_.joinable()) return;
  const bool idle = spin_then_park(idle_bell_, [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.empty() && !busy_;
  }, SpinPolicy{}, deadline_ns);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  bell_.ring();
  if (!idle) {
    thread_.detach();  // a function that does not return; the child exits after the sweep
    return;
  }
  thread_.join();
}

}  // namespace simpler
