#include "simpler/worker.h"

#include <new>

#include "base/errors.h"
#include "base/leak.h"
#include "base/process_id.h"
#include "chip/chip_worker.h"
#include "diag/call_config.h"
#include "dist/mpi_session.h"
#include "dist/node_server.h"
#include "dist/remote_port.h"
#include "ipc/sub_worker_handler.h"
#include "node/node_worker.h"

namespace simpler {

struct Worker::Impl {
  enum class Phase { Created, Ready, Closed };

  Impl(Level l, WorkerConfig c) : level(l), config(std::move(c)) {}

  Status require_ready(const char* what) const {
    SIMPLER_RETURN_IF_ERROR(require_initialised(what));
    return require_outside_its_code(what);
  }

  // memory_info and memory_info_on only read: the worker's own code may
  // call them (a test of a run's memory does), a forked copy may not.
  Status require_ready_to_observe(const char* what) const {
    SIMPLER_RETURN_IF_ERROR(require_initialised(what));
    return require_owning_process(what);
  }

  Status require_initialised(const char* what) const {
    if (phase == Phase::Created) return failed_precondition("{}: call init() first", what);
    if (phase == Phase::Closed) return failed_precondition("{}: the worker is closed", what);
    return Status();
  }

  // A worker serves the process that initialised it: a forked copy's threads
  // and children are not that process's.
  Status require_owning_process(const char* what) const {
    if (phase == Phase::Ready && process_id() != owner_pid) {
      return failed_precondition(
          "{}: this process was forked from process {}, which initialised the worker; a worker serves only "
          "that process",
          what, owner_pid);
    }
    return Status();
  }

  // An orchestration or kernel calling back into its own worker would wait
  // for itself (close, or a submit past pipeline_depth) or pull memory from
  // under its run.
  Status require_outside_its_code(const char* what) const {
    SIMPLER_RETURN_IF_ERROR(require_owning_process(what));
    if (phase != Phase::Ready) return Status();
    if ((chip != nullptr && chip->running_its_user_code()) || (node != nullptr && node->running_its_user_code())) {
      return failed_precondition(
          "{}: called from inside this worker's own orchestration or kernel, which cannot wait for or change "
          "the worker running it; an orchestration builds its run through its Orchestrator",
          what);
    }
    return Status();
  }

  Status require_node(const char* what) const {
    SIMPLER_RETURN_IF_ERROR(require_above_chip(what));
    return require_ready(what);
  }

  Status require_node_to_observe(const char* what) const {
    SIMPLER_RETURN_IF_ERROR(require_above_chip(what));
    return require_ready_to_observe(what);
  }

  Status require_above_chip(const char* what) const {
    if (level == Level::Chip) return failed_precondition("{}: Level::Node and Level::Network workers only", what);
    return Status();
  }

  Status require_created(const char* what) const {
    if (phase == Phase::Created) return Status();
    return failed_precondition("{}: only before init() (children fork at init)", what);
  }

  // init()'s work: checks, then builds the chip or the node (may throw
  // std::bad_alloc, which init() turns into its refusal).
  Status start();

  const Level level;
  const WorkerConfig config;
  Phase phase = Phase::Created;
  pid_t owner_pid = 0;  // the process that initialised it
  std::vector<ChipCallable> callables;
  std::vector<NodeCallable> node_callables;
  std::vector<NodeSpec> nodes;
  std::vector<SubFunction> functions;
  std::unique_ptr<ChipWorker> chip;
  std::unique_ptr<NodeWorker> node;
};

namespace {

// A parameter no run argument could satisfy, or whose requirement would be
// ignored, is refused when it is registered rather than at every submit.
Status check_param(const Param& p) {
  if (p.kind == TaskArg::Kind::Scalar) {
    if (p.tag != Tag::NoDep) return invalid_argument("a scalar has no direction (tag {})", static_cast<int>(p.tag));
    if (p.dtype || p.shape) return invalid_argument("a scalar takes no dtype or shape; they are for tensors");
    return Status();
  }
  if (p.kind != TaskArg::Kind::Tensor)
    return invalid_argument("kind {} is neither tensor nor scalar", static_cast<int>(p.kind));
  if (p.tag >= Tag::kCount) return invalid_argument("tag {} is not a Tag", static_cast<int>(p.tag));
  if (p.tag == Tag::Output) {
    return invalid_argument(
        "a run's output argument is a buffer the caller owns: Tag::OutputExisting (Param::output()), not Tag::Output");
  }
  if (p.dtype && *p.dtype >= DType::kCount)
    return invalid_argument("dtype {} is not a DType", static_cast<int>(*p.dtype));
  if (p.shape) {
    if (p.shape->size() > static_cast<size_t>(kMaxDims)) {
      return invalid_argument("shape has {} dimensions, the limit is {}", p.shape->size(), kMaxDims);
    }
    for (size_t d = 0; d < p.shape->size(); ++d) {
      if ((*p.shape)[d] < -1)
        return invalid_argument("shape[{}] = {}: an extent is >= 0, or -1 for any", d, (*p.shape)[d]);
    }
  }
  return Status();
}

}  // namespace

Worker::Worker(Level level, WorkerConfig config) : impl_(std::make_unique<Impl>(level, std::move(config))) {}

Worker::~Worker() {
  // Where close() is refused (a forked copy, or the worker's own code) the
  // worker cannot be taken apart either: its threads are another process's,
  // or one of them is this caller.
  if (!impl_->require_outside_its_code("~Worker").ok()) {
    (void)abandon(impl_.release());
    return;
  }
  (void)close();
}

Level Worker::level() const { return impl_->level; }
const WorkerConfig& Worker::config() const { return impl_->config; }

Result<CallableHandle> Worker::register_callable(ChipCallable callable) {
  if (impl_->phase != Impl::Phase::Created) {
    return failed_precondition("register_callable('{}'): callables are registered before init()", callable.name());
  }
  if (impl_->level == Level::Network) {
    return failed_precondition(
        "register_callable('{}'): a Level::Network worker runs NodeCallables; register the "
        "ChipCallable with the Level::Node worker you add",
        callable.name());
  }
  if (callable.name().empty()) return invalid_argument("register_callable: name is empty");
  if (!callable.orchestrate())
    return invalid_argument("register_callable('{}'): orchestrate is empty", callable.name());
  if (callable.signature().size() > kMaxTaskArgs) {
    return invalid_argument("register_callable('{}'): signature has {} parameters, the limit is {}", callable.name(),
                            callable.signature().size(), kMaxTaskArgs);
  }
  for (size_t i = 0; i < callable.signature().size(); ++i) {
    SIMPLER_RETURN_IF_ERROR(check_param(callable.signature()[i]), "register_callable('{}'): signature[{}]",
                            callable.name(), i);
  }
  for (const ChipCallable& c : impl_->callables) {
    if (c.name() == callable.name()) {
      return invalid_argument("register_callable('{}'): a callable with this name is already registered",
                              callable.name());
    }
  }
  CallableHandle h{static_cast<uint32_t>(impl_->callables.size()), callable.digest()};
  impl_->callables.push_back(std::move(callable));
  return h;
}

Result<CallableHandle> Worker::register_callable(NodeCallable callable) {
  if (impl_->level != Level::Network) {
    return failed_precondition("register_callable('{}'): NodeCallables run on a Level::Network worker's nodes",
                               callable.name());
  }
  SIMPLER_RETURN_IF_ERROR(impl_->require_created("register_callable"));
  if (callable.name().empty()) return invalid_argument("register_callable: name is empty");
  if (!callable.orchestrate())
    return invalid_argument("register_callable('{}'): orchestrate is empty", callable.name());
  for (const NodeCallable& c : impl_->node_callables) {
    if (c.name() == callable.name()) {
      return invalid_argument("register_callable('{}'): a callable with this name is already registered",
                              callable.name());
    }
  }
  CallableHandle h{static_cast<uint32_t>(impl_->node_callables.size()), callable.digest()};
  impl_->node_callables.push_back(std::move(callable));
  return h;
}

Result<uint32_t> Worker::add_next_level_worker(Worker&& worker) {
  if (impl_->level != Level::Network) {
    return failed_precondition("add_next_level_worker: Level::Network workers only; a node's next level is its chips");
  }
  SIMPLER_RETURN_IF_ERROR(impl_->require_created("add_next_level_worker"));
  if (&worker == this) return invalid_argument("add_next_level_worker: a worker cannot be its own next level");
  Impl& next = *worker.impl_;
  if (next.level != Level::Node) {
    return invalid_argument("add_next_level_worker: worker is a {} worker; a network's next level is Level::Node",
                            next.level == Level::Chip ? "Level::Chip" : "Level::Network");
  }
  if (next.phase != Impl::Phase::Created) {
    return failed_precondition(
        "add_next_level_worker: worker is already initialised or closed; add it before its "
        "init(), which the network runs in the node's own process");
  }
  NodeSpec spec;
  spec.level = Level::Node;
  spec.config = next.config;
  spec.chip_callables = next.callables;
  spec.functions = next.functions;
  SIMPLER_RETURN_IF_ERROR(NodeWorker::validate(spec), "add_next_level_worker: next-level worker {}",
                          impl_->nodes.size());
  impl_->nodes.push_back(std::move(spec));
  next.callables.clear();
  next.functions.clear();
  next.phase = Impl::Phase::Closed;
  return static_cast<uint32_t>(impl_->nodes.size() - 1);
}

Result<uint32_t> Worker::add_remote_worker(int rank, RemoteNodeOptions options) {
  if (impl_->level != Level::Network) {
    return failed_precondition("add_remote_worker: Level::Network workers only; a node's next level is its chips");
  }
  SIMPLER_RETURN_IF_ERROR(impl_->require_created("add_remote_worker"));
  if (rank <= 0) return invalid_argument("add_remote_worker: rank = {}: rank 0 runs the network", rank);
  if (options.heartbeat_timeout.count() <= 0 || options.ready_timeout.count() <= 0) {
    return invalid_argument("add_remote_worker: heartbeat_timeout and ready_timeout must be > 0");
  }
  for (const NodeSpec& n : impl_->nodes) {
    if (n.external != nullptr && n.remote_rank == rank) {
      return invalid_argument("add_remote_worker: rank {} was already added", rank);
    }
  }
  NodeSpec spec;
  spec.level = Level::Node;
  spec.remote_rank = rank;
  spec.external = std::make_shared<const ExternalWorkerFactory>(
      [rank, options](const ExternalContext& ctx) { return dist::RemotePort::start(rank, options, ctx); });
  impl_->nodes.push_back(std::move(spec));
  return static_cast<uint32_t>(impl_->nodes.size() - 1);
}

int mpi_rank() { return dist::launcher_rank(); }
int mpi_size() { return dist::launcher_size(); }

Status serve_node(Worker&& node, std::vector<NodeCallable> callables, ServeOptions options) {
  Worker::Impl& n = *node.impl_;
  if (n.level != Level::Node) return invalid_argument("serve_node: node is not a Level::Node worker");
  SIMPLER_RETURN_IF_ERROR(n.require_created("serve_node"));
  if (options.tensor_heap_bytes == 0) return invalid_argument("serve_node: tensor_heap_bytes is 0");
  if (options.heartbeat_period.count() <= 0 || options.network_timeout.count() <= 0 ||
      options.hello_timeout.count() <= 0) {
    return invalid_argument("serve_node: heartbeat_period, network_timeout and hello_timeout must be > 0");
  }
  for (size_t i = 0; i < callables.size(); ++i) {
    if (!callables[i].orchestrate()) return invalid_argument("serve_node: callable '{}' is empty", callables[i].name());
    for (size_t j = 0; j < i; ++j) {
      if (callables[j].name() == callables[i].name()) {
        return invalid_argument("serve_node: callable '{}' is given twice", callables[i].name());
      }
    }
  }
  NodeSpec spec;
  spec.level = Level::Node;
  spec.config = n.config;
  spec.chip_callables = std::move(n.callables);
  spec.functions = std::move(n.functions);
  n.callables.clear();
  n.functions.clear();
  n.phase = Worker::Impl::Phase::Closed;
  return dist::serve(std::move(spec), std::move(callables), options);
}

Result<FunctionHandle> Worker::register_function(SubFunction fn) {
  if (impl_->level == Level::Chip) {
    return failed_precondition("register_function: Level::Node and Level::Network workers only");
  }
  if (impl_->phase != Impl::Phase::Created) {
    return failed_precondition("register_function: functions are registered before init() (children fork at init)");
  }
  if (!fn) return invalid_argument("register_function: the function is empty");
  const auto id = static_cast<uint32_t>(impl_->functions.size());
  impl_->functions.push_back(std::move(fn));
  return FunctionHandle{id, sub_function_digest(id)};
}

namespace {

// The first field of a chip (its device, runtime and graph) set away from
// its default, or null.
const char* chip_field_set(const WorkerConfig& c) {
  const WorkerConfig defaults;
  if (c.geometry.name != defaults.geometry.name || c.geometry.clusters != defaults.geometry.clusters ||
      c.geometry.aicpu_threads != defaults.geometry.aicpu_threads) {
    return "geometry";
  }
  if (c.runtime != defaults.runtime) return "runtime";
  if (c.backend != defaults.backend) return "backend";
  if (c.device_memory_bytes != defaults.device_memory_bytes) return "device_memory_bytes";
  if (c.max_tasks_per_run != defaults.max_tasks_per_run) return "max_tasks_per_run";
  if (c.guard_device_memory.has_value()) return "guard_device_memory";
  const RuntimeEnv& env = c.runtime_env;
  if (env.task_window != 0 || env.heap_ring_bytes != 0 || env.dep_pool_entries != 0 || env.stall_timeout.count() != 0) {
    return "runtime_env";
  }
  return nullptr;
}

// Fields that mean something only at another level are refused rather than
// ignored: a user who sets them expects an effect (issue 9 item 9). A field
// whose default is not zero counts as set when it differs from its default.
Status check_fields_of_level(Level level, const WorkerConfig& c) {
  const WorkerConfig defaults;
  if (c.close_timeout.count() < 0) {
    return invalid_argument("close_timeout = {} ms: must be >= 0", c.close_timeout.count());
  }
  if (level == Level::Chip) {
    if (c.chips != 0)
      return invalid_argument("chips = {}: a Level::Chip worker is one chip; chips is for Level::Node", c.chips);
    if (c.sub_workers != 0) {
      return invalid_argument(
          "sub_workers = {}: Level::Chip has no sub workers; sub_workers is for Level::Node and "
          "Level::Network",
          c.sub_workers);
    }
    if (c.shared_heap_bytes != defaults.shared_heap_bytes) {
      return invalid_argument(
          "shared_heap_bytes = {}: Level::Chip has no shared heap; it is for Level::Node and "
          "Level::Network",
          c.shared_heap_bytes);
    }
  }
  if (level == Level::Network || (level == Level::Node && c.chips == 0)) {
    const char* const field = chip_field_set(c);
    if (field == nullptr) return Status();
    if (level == Level::Network) {
      return invalid_argument(
          "{} is set on a Level::Network worker, which has no chip of its own: set it on the "
          "Level::Node workers it adds",
          field);
    }
    return invalid_argument("{} is set on a Level::Node worker with chips = 0, which has no chip to apply it to",
                            field);
  }
  return Status();
}

}  // namespace

Status Worker::init() {
  // Out of host memory anywhere in the start is a refusal like any other:
  // what was built is unwound (children closed, mappings dropped) on the
  // way here, and the worker can be initialised again.
  try {
    return impl_->start();
  } catch (const std::bad_alloc&) {
    return resource_exhausted("init: host memory exhausted while starting the worker; nothing was started");
  }
}

Status Worker::Impl::start() {
  if (phase == Phase::Ready) return failed_precondition("init: already initialised");
  if (phase == Phase::Closed) return failed_precondition("init: the worker is closed");
  SIMPLER_RETURN_IF_ERROR(check_fields_of_level(level, config));
  // Before the call config's check, which creates its trace directory.
  if (level == Level::Chip || config.chips != 0) {
    SIMPLER_RETURN_IF_ERROR(ChipWorker::check_dump_supported(config.call.dump_args, config.runtime));
  }
  SIMPLER_RETURN_IF_ERROR(diag::validate_call_config(config.call, "call."));
  if (level != Level::Chip) {
    NodeSpec spec;
    spec.level = level;
    spec.config = config;
    spec.chip_callables = callables;
    spec.node_callables = node_callables;
    spec.nodes = nodes;
    spec.functions = functions;
    SIMPLER_ASSIGN_OR_RETURN(node, NodeWorker::create(std::move(spec)));
  } else {
    SIMPLER_ASSIGN_OR_RETURN(chip, ChipWorker::create(config, callables));
  }
  owner_pid = process_id();
  phase = Phase::Ready;
  return Status();
}

Result<DeviceBuffer> Worker::malloc(uint64_t bytes) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_ready("malloc"));
  if (impl_->level == Level::Network)
    return failed_precondition("malloc: a network has no device memory; use malloc_shared");
  if (impl_->node != nullptr) return failed_precondition("malloc: a node has several chips; name one with malloc_on");
  return impl_->chip->malloc(bytes);
}

Result<DeviceBuffer> Worker::malloc_on(uint32_t worker, uint64_t bytes) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_node("malloc_on"));
  return impl_->node->malloc_on(worker, bytes);
}

Result<DeviceBuffer> Worker::malloc_shared(uint64_t bytes) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_node("malloc_shared"));
  return impl_->node->malloc_shared(bytes);
}

Status Worker::free(DeviceBuffer buffer) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_ready("free"));
  if (impl_->node != nullptr) return impl_->node->free(buffer);
  return impl_->chip->free(buffer);
}

Status Worker::copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_ready("copy_to"));
  if (impl_->node != nullptr) return impl_->node->copy_to(dst, src, bytes, dst_offset);
  return impl_->chip->copy_to(dst, src, bytes, dst_offset);
}

Status Worker::copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset) {
  SIMPLER_RETURN_IF_ERROR(impl_->require_ready("copy_from"));
  if (impl_->node != nullptr) return impl_->node->copy_from(dst, src, bytes, src_offset);
  return impl_->chip->copy_from(dst, src, bytes, src_offset);
}

Result<MemoryInfo> Worker::memory_info() const {
  SIMPLER_RETURN_IF_ERROR(impl_->require_ready_to_observe("memory_info"));
  if (impl_->node != nullptr) return impl_->node->memory_info();
  return impl_->chip->memory_info();
}

Result<MemoryInfo> Worker::memory_info_on(uint32_t worker) const {
  SIMPLER_RETURN_IF_ERROR(impl_->require_node_to_observe("memory_info_on"));
  return impl_->node->memory_info_on(worker);
}

RunHandle Worker::submit(CallableHandle callable, const TaskArgs& args) {
  return submit(callable, args, impl_->config.call);
}

RunHandle Worker::submit(CallableHandle callable, const TaskArgs& args, const CallConfig& call) {
  if (Status st = impl_->require_ready("submit"); !st.ok()) return detail::refused_run(0, st);
  if (impl_->node != nullptr) {
    return detail::refused_run(
        0, failed_precondition("submit: this level runs orchestrations; use submit(orchestration)"));
  }
  if (callable.id >= impl_->callables.size() || impl_->callables[callable.id].digest() != callable.digest) {
    return detail::refused_run(0, not_found("submit: callable id {} (digest {}) is not registered with this worker",
                                            callable.id, digest_hex(callable.digest).substr(0, 16)));
  }
  return impl_->chip->submit(callable.id, args, call);
}

RunHandle Worker::submit(std::function<Status(Orchestrator&)> orchestration) {
  return submit(std::move(orchestration), impl_->config.call);
}

RunHandle Worker::submit(std::function<Status(Orchestrator&)> orchestration, const CallConfig& call) {
  if (Status st = impl_->require_node("submit"); !st.ok()) return detail::refused_run(0, st);
  return impl_->node->submit(orchestration, {}, NodeWorker::RunDiagnostics{call, {}});
}

Status Worker::run(CallableHandle callable, const TaskArgs& args) { return submit(callable, args).wait(); }

Status Worker::close() {
  if (impl_->phase == Impl::Phase::Closed) return Status();
  SIMPLER_RETURN_IF_ERROR(impl_->require_outside_its_code("close"));
  Status st;
  if (impl_->node != nullptr) {
    st = impl_->node->close(impl_->config.close_timeout);
    impl_->node.reset();
  }
  if (impl_->chip != nullptr) st = impl_->chip->close(impl_->config.close_timeout);
  if (st.ok())
    impl_->chip.reset();
  else
    abandon(impl_->chip.release());  // its device threads may still call back into it
  impl_->phase = Impl::Phase::Closed;
  return st;
}

}  // namespace simpler
