#include "node/node_child_handler.h"

#include <exception>

#include <fmt/format.h>

#include "base/errors.h"
#include "base/leak.h"
#include "diag/call_config.h"
#include "task/args_blob.h"

namespace simpler {

NodeChildHandler::NodeChildHandler(NodeSpec spec, std::vector<NodeCallable> callables)
    : spec_(std::move(spec)),
      callables_(std::move(callables)),
      budget_(callables_.size()),
      queue_("node worker", kNodeSpin,
             [this](RunRequest& request, const RunTicket& ticket) { (void)submit(request, ticket, /*wait=*/true); }) {}

NodeChildHandler::~NodeChildHandler() { drain(now_ns() + 5'000'000'000ull); }

Status NodeChildHandler::init() {
  SIMPLER_ASSIGN_OR_RETURN(node_, NodeWorker::create(spec_));
  queue_.init();
  return Status();
}

void NodeChildHandler::start(RunRequest request, RunTicket ticket) { (void)queue_.start(std::move(request), ticket); }

Result<TaskArgs> NodeChildHandler::decode(const RunRequest& request) const {
  SIMPLER_ASSIGN_OR_RETURN(TaskArgs args, decode_args_blob(request.args_blob.data(), request.args_blob.size()));
  const HostRanges shared{spec_.inherited};
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    const DeviceBuffer& b = a.tensor.buffer();
    if (!shared.contains(b.addr, b.bytes)) {
      return out_of_range(
          "argument {}: buffer {:#x}+{} is not in the network's shared heap, the only memory a "
          "node worker is handed",
          i, b.addr, b.bytes);
    }
  }
  return args;
}

Result<NodeWorker::RunDiagnostics> NodeChildHandler::diagnostics_of(const RunRequest& request) {
  SIMPLER_ASSIGN_OR_RETURN(const diag::ChildCallConfig c,
                           diag::decode_call_config(request.config.data(), request.config.size()), "node task {}",
                           request.task_slot);
  NodeWorker::RunDiagnostics d;
  if (c.call.swimlane_level == 0 && c.call.dump_args == DumpArgs::Off) return d;
  d.call = c.call;
  d.call.trace_dir = diag::child_trace_dir(c.call.trace_dir, "node", c.child_index, request.task_slot);
  d.trace_label = fmt::format("node{}", c.child_index);
  return d;
}

size_t NodeChildHandler::callable_index(const Digest& digest) const {
  size_t k = 0;
  while (k < callables_.size() && callables_[k].digest() != digest) ++k;
  return k;
}

bool NodeChildHandler::try_run_inline(const RunRequest& request, const RunTicket& ticket, bool loop_quiet) {
  if (!loop_quiet) return false;  // kept to a quiet loop: not measured with a frame waiting
  const size_t k = callable_index(request.callable);
  if (!budget_.is_short(k)) return false;
  // Not admitted: untouched, so start() takes it next.
  return queue_.try_run_inline([&] { return submit(request, ticket, /*wait=*/false); });
}

bool NodeChildHandler::submit(const RunRequest& request, const RunTicket& ticket, bool wait) {
  const size_t k = callable_index(request.callable);
  if (k == callables_.size()) {
    ticket.complete(not_found("no node callable with digest {}", digest_hex(request.callable)));
    queue_.finished();
    return true;
  }
  auto args = decode(request);
  if (!args.ok()) {
    ticket.complete(args.status());
    queue_.finished();
    return true;
  }
  auto diagnostics = diagnostics_of(request);
  if (!diagnostics.ok()) {
    ticket.complete(diagnostics.status());
    queue_.finished();
    return true;
  }
  const NodeCallable& callable = callables_[k];
  // The orchestration runs once the node admitted the run, which is this
  // level's launch marker; a throw fails the run through submit's own catch.
  const std::function<Status(Orchestrator&)> orchestration = [&](Orchestrator& o) {
    ticket.accepted();
    return callable.orchestrate()(o, *args);
  };
  std::function<void(const Status&)> on_terminal = [this, ticket](const Status& result) {
    ticket.complete(result, kDispositionNativePrepared);
    queue_.finished();
  };
  const uint64_t t0 = now_ns();
  if (wait) {
    (void)node_->submit(orchestration, std::move(on_terminal), *diagnostics);
  } else if (!node_->try_submit(orchestration, std::move(on_terminal), *diagnostics).has_value()) {
    return false;
  }
  budget_.record(k, t0);
  return true;
}

Result<ControlReply> NodeChildHandler::control(const ControlCommand& cmd, uint8_t* data, uint32_t, uint32_t capacity) {
  if (cmd.op != kCtrlMemoryInfo) {
    return failed_precondition(
        "control op {}: a node worker's device memory is its own, not addressable from the "
        "network level",
        static_cast<uint32_t>(cmd.op));
  }
  SIMPLER_ASSIGN_OR_RETURN(const MemoryInfo m, node_->memory_info());
  return memory_info_reply(m.total_bytes, m.free_bytes, data, capacity);
}

void NodeChildHandler::drain(uint64_t deadline_ns) {
  if (node_ == nullptr) return;
  // A queued submission may wait for admission, which only the scheduler's
  // rounds give: its own thread takes them over for the drain.
  node_->release_scheduler();
  const bool idle = queue_.drain(deadline_ns);
  // Closing the node unblocks a submission waiting for admission and ends
  // every run it still holds, each through its ticket.
  const uint64_t now = now_ns();
  (void)node_->close(std::chrono::milliseconds(deadline_ns > now ? (deadline_ns - now) / 1'000'000ull : 0));
  if (idle) {
    node_.reset();
    return;
  }
  // An orchestration that does not return may still be inside the node: keep
  // it alive for that thread; the child exits after the sweep.
  abandon(node_.release());
}

}  // namespace simpler
