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
    : functions_(std::move(functions)),
      budget_(functions_.size()),
      heap_(std::move(shared)),
      queue_("sub worker", SpinPolicy{},
             [this](RunRequest& request, const RunTicket& ticket) { run(find(request.callable), request, ticket); }) {
  digests_.reserve(functions_.size());
  for (size_t i = 0; i < functions_.size(); ++i) {
    digests_.push_back(sub_function_digest(static_cast<uint32_t>(i)));
  }
}

SubWorkerHandler::~SubWorkerHandler() { drain(now_ns() + 5'000'000'000ull); }

Status SubWorkerHandler::init() {
  queue_.init();
  return Status();
}

void SubWorkerHandler::start(RunRequest request, RunTicket ticket) { (void)queue_.start(std::move(request), ticket); }

bool SubWorkerHandler::try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) {
  if (!loop_quiet) return false;  // it runs to its terminal here
  const size_t index = find(request.callable);
  if (!budget_.is_short(index)) return false;
  return queue_.try_run_inline([&] {
    run(index, request, ticket);
    return true;
  });
}

size_t SubWorkerHandler::find(const Digest& callable) const {
  size_t index = 0;
  while (index < digests_.size() && digests_[index] != callable) ++index;
  return index;
}

void SubWorkerHandler::run(size_t index, const RunRequest& request, const RunTicket& ticket) {
  ticket.accepted();  // a host function has no later launch marker than its call
  const uint64_t t0 = now_ns();
  const Status st = call(index, request);
  budget_.record(index, t0);
  ticket.complete(st, kDispositionNativePrepared);
  queue_.finished();
}

Status SubWorkerHandler::call(size_t index, const RunRequest& request) {
  if (index == functions_.size()) return not_found("no sub function with digest {}", digest_hex(request.callable));
  SIMPLER_ASSIGN_OR_RETURN(const TaskArgs args, decode_args_blob(request.args_blob.data(), request.args_blob.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    if (!heap_.contains(a.tensor.buffer().addr, a.tensor.buffer().bytes)) {
      return out_of_range("argument {}: buffer {:#x}+{} is not in the shared heap, the only memory a sub worker reads",
                          i, a.tensor.buffer().addr, a.tensor.buffer().bytes);
    }
  }
  // A throw is the user's code failing (USER_CODE_FAILED), not a defect
  // inside simpler (INTERNAL).
  try {
    return functions_[index](TaskArgsView(args));
  } catch (const std::exception& e) {
    return user_code_failed("sub function {} threw: {}", index, e.what());
  } catch (...) {
    return user_code_failed("sub function {} threw a non-standard exception", index);
  }
}

void SubWorkerHandler::drain(uint64_t deadline_ns) { (void)queue_.drain(deadline_ns); }

}  // namespace simpler
