#include "node/node_worker.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "base/errors.h"
#include "chip/pipeline_contract.h"
#include "device/backend_registry.h"
#include "diag/call_config.h"
#include "diag/chrome_trace.h"
#include "diag/trace_merge.h"
#include "ipc/chip_child_handler.h"
#include "ipc/mailbox_layout.h"
#include "ipc/sub_worker_handler.h"
#include "node/node_child_handler.h"
#include "runtime/runtime.h"
#include "task/args_blob.h"

namespace simpler {

namespace {
constexpr uint64_t kControlDeadlineNs = 30'000'000'000ull;
}  // namespace

Result<std::unique_ptr<ForkedChild>> require_grant(Result<std::unique_ptr<ForkedChild>> started, uint64_t requested,
                                                   const std::string& what) {
  SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<ForkedChild> child, std::move(started), "{}", what);
  const uint64_t granted = child->child_grant();
  if (granted < requested) {
    std::vector<EndpointEvent> none;
    (void)child->close(now_ns() + kControlDeadlineNs, none);
    return failed_precondition(
        "{}: the child granted {} run-resource sets of the pipeline_depth = {} requested; "
        "a node does not serve at a lower width",
        what, granted, requested);
  }
  return child;
}

// The Orchestrator of one node run, on the submitting thread.
class NodeOrchestrator final : public Orchestrator {
 public:
  NodeOrchestrator(NodeWorker& w, NodeRun& run) : w_(w), run_(run) {}

  Result<uint32_t> submit_next_level(CallableHandle callable, const TaskArgs& args, uint32_t worker) override {
    return record(next_level(callable, args, worker));
  }
  Result<uint32_t> submit_sub(FunctionHandle fn, const TaskArgs& args) override { return record(sub(fn, args)); }
  Result<uint32_t> submit_next_level_group(CallableHandle callable, const std::vector<TaskArgs>& args,
                                           const std::vector<uint32_t>& workers) override {
    return record(next_level_group(callable, args, workers));
  }
  Result<uint32_t> submit_sub_group(FunctionHandle fn, const std::vector<TaskArgs>& args) override {
    return record(sub_group(fn, args));
  }

  Result<TensorView> alloc(const std::vector<int64_t>& shape, DType dtype) override {
    TensorView probe = TensorView::unbound(shape, dtype);
    if (Status st = probe.validate(); !st.ok()) return record_status(st);
    const uint64_t bytes = std::max<uint64_t>(probe.end_byte(), 1);
    // Room for the record before the block is taken (R26): a std::bad_alloc
    // after the heap allocation would lose the block.
    try {
      reserve_one(run_.allocs);
      if (!scopes_.empty()) reserve_one(scopes_.back());
    } catch (const std::bad_alloc&) {
      return record_status(resource_exhausted("alloc: host memory exhausted recording a {}-byte intermediate", bytes));
    }
    auto addr = w_.heap_->alloc(bytes);
    if (!addr.ok()) return record_status(addr.status());
    run_.allocs.push_back(HeapAlloc{*addr});
    if (!scopes_.empty()) scopes_.back().push_back(static_cast<uint32_t>(run_.allocs.size() - 1));
    return TensorView(DeviceBuffer{*addr, bytes}, shape, dtype);
  }
  void scope_begin() override { scopes_.emplace_back(); }
  Status scope_end() override {
    if (scopes_.empty()) return record_status(failed_precondition("scope_end without scope_begin"));
    for (uint32_t i : scopes_.back()) run_.allocs[i].scope_ended = true;
    scopes_.pop_back();
    return Status();
  }
  uint32_t task_count() const override { return static_cast<uint32_t>(run_.tasks.size()); }

  const Status& first_error() const { return first_error_; }

 private:
  // Capacity for one more element, grown geometrically; may throw std::bad_alloc.
  template <typename T>
  static void reserve_one(std::vector<T>& v) {
    if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, v.capacity() * 2));
  }
  Status record_status(Status st) {
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    return st;
  }
  template <typename T>
  Result<T> record(Result<T> r) {
    if (!r.ok()) (void)record_status(r.status());
    return r;
  }

  // Checks one tensor argument and returns its address as the child sees it.
  // A device buffer's registration (the child of `worker` it lives in) goes
  // to `registration`.
  Result<uint64_t> place(const TaskArg& a, size_t i, bool sub, uint32_t worker, NodeTask& t, uint64_t& registration) {
    const DeviceBuffer& b = a.tensor.buffer();
    if (!b.bound()) {
      return invalid_argument(
          "argument {}: an unbound Output has no home at the node level; allocate it with "
          "Orchestrator::alloc",
          i);
    }
    if (is_node_device_addr(b.addr)) {
      if (sub)
        return invalid_argument("argument {}: a sub worker reads only shared-heap tensors, not device memory", i);
      if (w_.spec_.level == Level::Network) {
        return invalid_argument(
            "argument {}: a node worker takes only shared-heap tensors; its chips' device "
            "memory is its own",
            i);
      }
      SIMPLER_ASSIGN_OR_RETURN(const NodeWorker::DeviceAlloc d, w_.device_arg(b, worker), "argument {}", i);
      borrow(b.addr);
      registration = d.registration;
      return d.child_addr;
    }
    if (!w_.heap_->range().overlaps(b.addr, b.bytes)) {
      for (const HostRange& r : w_.spec_.inherited) {
        if (r.contains(b.addr, b.bytes)) return b.addr;
      }
    }
    if (!w_.heap_->range().contains(b.addr, b.bytes) || !w_.heap_->within_live_block(b.addr, b.bytes)) {
      return invalid_argument("argument {}: buffer {:#x}+{} is neither a live device allocation nor in the shared heap",
                              i, b.addr, b.bytes);
    }
    if (w_.heap_->write_held(b.addr)) {
      return failed_precondition(
          "argument {}: buffer {:#x} is held: a transfer into it was abandoned when its peer fell silent, and its "
          "bytes may still land until MPI completes it",
          i, b.addr);
    }
    bool run_owned = false;
    for (uint32_t k = 0; k < run_.allocs.size(); ++k) {
      if (run_.allocs[k].addr != b.addr) continue;
      run_owned = true;
      if (std::find(t.allocs.begin(), t.allocs.end(), k) == t.allocs.end()) {
        t.allocs.push_back(k);
        ++run_.allocs[k].users;
      }
    }
    if (!run_owned) borrow(b.addr);
    return b.addr;
  }
  void borrow(uint64_t addr) {
    if (std::find(run_.borrowed.begin(), run_.borrowed.end(), addr) == run_.borrowed.end()) {
      run_.borrowed.push_back(addr);
    }
  }

  // Places every tensor of `args` for `worker` (counting t's uses of run
  // allocations and the run's borrows) and encodes the child's blob. The
  // caller undoes t's counts on failure.
  Status encode(bool sub, const TaskArgs& args, uint32_t worker, NodeTask& t, std::vector<uint8_t>& blob,
                uint64_t& registration) {
    SIMPLER_RETURN_IF_ERROR(args.validate());
    TaskArgs wire = args;
    for (size_t i = 0; i < args.size(); ++i) {
      const TaskArg& a = args[i];
      if (a.kind != TaskArg::Kind::Tensor) continue;
      SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, place(a, i, sub, worker, t, registration));
      int64_t shape[kMaxDims], stride[kMaxDims];
      for (int d = 0; d < a.tensor.ndim(); ++d) {
        shape[d] = a.tensor.shape(d);
        stride[d] = a.tensor.stride(d);
      }
      wire[i].tensor = TensorView::from_parts(DeviceBuffer{addr, a.tensor.buffer().bytes}, a.tensor.dtype(),
                                              a.tensor.ndim(), shape, stride, a.tensor.offset());
    }
    return encode_args_blob(wire, blob);
  }
  void undo(NodeTask& t, size_t borrowed_before) {
    for (uint32_t k : t.allocs) --run_.allocs[k].users;
    run_.borrowed.resize(borrowed_before);
  }

  // The run's CallConfig as its children receive it: their directory is the run's parts_dir.
  CallConfig parts_call() const {
    CallConfig c = run_.call;
    c.trace_dir = run_.parts_dir;
    return c;
  }
  // A next-level task of a run with diagnostics tells its child (by its
  // index) where its part of the run goes; sub workers record nothing.
  Status child_config(bool sub, uint32_t worker, std::vector<uint8_t>& out) const {
    if (sub || (run_.call.swimlane_level == 0 && run_.call.dump_args == DumpArgs::Off)) return Status();
    out.resize(kRequestConfigCapacity);
    SIMPLER_ASSIGN_OR_RETURN(
        const size_t n,
        diag::encode_call_config(diag::ChildCallConfig{parts_call(), worker, 0}, out.data(), out.size()), "call");
    out.resize(n);
    return Status();
  }

  Result<uint32_t> build(bool sub, const Digest& digest, const TaskArgs& args, uint32_t worker) {
    auto t = std::make_unique<NodeTask>();
    const size_t borrowed_before = run_.borrowed.size();
    Status st = encode(sub, args, worker, *t, t->blob, t->registration);
    if (st.ok()) st = child_config(sub, worker, t->config);
    if (!st.ok()) {
      undo(*t, borrowed_before);
      return st;
    }
    t->id = w_.next_task_id_.fetch_add(1);
    t->index = static_cast<uint32_t>(run_.tasks.size());
    t->run = &run_;
    t->sub = sub;
    t->worker = worker;
    t->callable = digest;
    t->args = args;
    run_.tasks.push_back(std::move(t));
    return run_.tasks.back()->index;
  }

  Status check_callable(const CallableHandle& callable) const {
    if (callable.id >= w_.next_digests_.size() || w_.next_digests_[callable.id] != callable.digest) {
      return not_found("callable id {} is not registered with this worker", callable.id);
    }
    return Status();
  }

  Status check_function(const FunctionHandle& fn) const {
    if (fn.id >= w_.sub_digests_.size() || w_.sub_digests_[fn.id] != fn.digest) {
      return not_found("function id {} is not registered with this worker", fn.id);
    }
    return Status();
  }

  Result<uint32_t> next_level(CallableHandle callable, const TaskArgs& args, uint32_t worker) {
    if (worker >= w_.next_.size()) {
      return invalid_argument("worker = {}: this worker has {} {}s", worker, w_.next_.size(), w_.next_kind());
    }
    SIMPLER_RETURN_IF_ERROR(w_.check_alive(worker));
    SIMPLER_RETURN_IF_ERROR(check_callable(callable));
    return build(false, callable.digest, args, worker);
  }

  // All-or-nothing: every member is checked and encoded, or the group adds
  // nothing. Members go to distinct workers, published together.
  Result<uint32_t> build_group(bool sub, const Digest& digest, const std::vector<TaskArgs>& args,
                               const std::vector<uint32_t>& workers) {
    auto t = std::make_unique<NodeTask>();
    const size_t borrowed_before = run_.borrowed.size();
    for (size_t m = 0; m < args.size(); ++m) {
      GroupMember member;
      member.worker = sub ? 0 : workers[m];
      member.args = args[m];
      Status st = encode(sub, args[m], member.worker, *t, member.blob, member.registration);
      if (st.ok()) st = child_config(sub, member.worker, member.config);
      if (!st.ok()) {
        undo(*t, borrowed_before);
        return Status(st.code(), fmt::format("group member {}: {}", m, st.message()));
      }
      member.id = w_.next_task_id_.fetch_add(1);
      t->members.push_back(std::move(member));
    }
    t->id = t->members.front().id;
    t->index = static_cast<uint32_t>(run_.tasks.size());
    t->run = &run_;
    t->sub = sub;
    t->worker = t->members.front().worker;
    t->callable = digest;
    run_.tasks.push_back(std::move(t));
    return run_.tasks.back()->index;
  }

  Result<uint32_t> next_level_group(CallableHandle callable, const std::vector<TaskArgs>& args,
                                    const std::vector<uint32_t>& workers) {
    if (args.empty()) return invalid_argument("submit_next_level_group: a group needs at least one member");
    if (args.size() != workers.size()) {
      return invalid_argument("submit_next_level_group: {} argument sets for {} workers", args.size(), workers.size());
    }
    for (size_t m = 0; m < workers.size(); ++m) {
      if (workers[m] >= w_.next_.size()) {
        return invalid_argument("workers[{}] = {}: this worker has {} {}s", m, workers[m], w_.next_.size(),
                                w_.next_kind());
      }
      for (size_t k = 0; k < m; ++k) {
        if (workers[k] == workers[m]) {
          return invalid_argument("workers[{}] = workers[{}] = {}: a group's members run on distinct workers", k, m,
                                  workers[m]);
        }
      }
      SIMPLER_RETURN_IF_ERROR(w_.check_alive(workers[m]), "workers[{}]", m);
    }
    SIMPLER_RETURN_IF_ERROR(check_callable(callable));
    return build_group(false, callable.digest, args, workers);
  }

  Result<uint32_t> sub_group(FunctionHandle fn, const std::vector<TaskArgs>& args) {
    if (args.empty()) return invalid_argument("submit_sub_group: a group needs at least one member");
    if (args.size() > w_.subs_.size()) {
      return invalid_argument(
          "submit_sub_group: a group of {} runs its members at once on distinct sub workers; "
          "this node has sub_workers = {}",
          args.size(), w_.subs_.size());
    }
    SIMPLER_RETURN_IF_ERROR(check_function(fn));
    return build_group(true, fn.digest, args, {});
  }

  Result<uint32_t> sub(FunctionHandle fn, const TaskArgs& args) {
    if (w_.subs_.empty()) return failed_precondition("submit_sub: this worker has sub_workers = 0");
    SIMPLER_RETURN_IF_ERROR(check_function(fn));
    return build(true, fn.digest, args, 0);
  }

  NodeWorker& w_;
  NodeRun& run_;
  std::vector<std::vector<uint32_t>> scopes_;
  Status first_error_;
};

Status NodeWorker::validate(const NodeSpec& spec) {
  const WorkerConfig& c = spec.config;
  if (spec.level == Level::Network) {
    if (c.chips != 0) {
      return invalid_argument(
          "chips = {}: a Level::Network worker's next level is the nodes added with "
          "add_next_level_worker",
          c.chips);
    }
    if (c.launch_depth != 0) {
      return invalid_argument(
          "launch_depth = {}: a network launches nothing on a device itself; set launch_depth on "
          "the nodes it adds",
          c.launch_depth);
    }
    if (spec.nodes.size() + static_cast<uint64_t>(c.sub_workers) == 0) {
      return invalid_argument("no next-level worker added and sub_workers = 0: a network needs at least one child");
    }
    if (spec.nodes.size() > kNodeMaxChips) {
      return invalid_argument("{} next-level workers exceed {}", spec.nodes.size(), kNodeMaxChips);
    }
    for (size_t i = 0; i < spec.nodes.size(); ++i) {
      if (spec.nodes[i].external != nullptr) continue;  // its own process validates what it runs
      SIMPLER_RETURN_IF_ERROR(validate(spec.nodes[i]), "next-level worker {}", i);
    }
  } else if (c.chips + static_cast<uint64_t>(c.sub_workers) == 0) {
    return invalid_argument("chips = 0 and sub_workers = 0: a node needs at least one child");
  }
  if (c.chips > kNodeMaxChips) return invalid_argument("chips = {} exceeds {}", c.chips, kNodeMaxChips);
  if (c.sub_workers > kNodeMaxSubWorkers) {
    return invalid_argument("sub_workers = {} exceeds {}", c.sub_workers, kNodeMaxSubWorkers);
  }
  if (c.chips != 0) {
    // Checked here, before anything forks, rather than in each chip child's init.
    SIMPLER_RETURN_IF_ERROR(runtime_named(c.runtime).status());
    SIMPLER_RETURN_IF_ERROR(backend_named(c.backend).status());
  }
  SIMPLER_RETURN_IF_ERROR(is_valid_pipeline_contract(program_contract(c)));
  SIMPLER_ASSIGN_OR_RETURN(const size_t mailbox, mailbox_size(c.pipeline_depth), "pipeline_depth = {}",
                           c.pipeline_depth);
  // Every child's mailbox is mapped and its entry table written before the
  // child exists: a depth whose mailboxes exceed this machine's memory is
  // refused here, before anything is mapped, rather than by the mmap (or the
  // OOM killer, where memory is overcommitted) half way through init.
  const uint64_t children =
      (spec.level == Level::Network ? spec.nodes.size() : uint64_t{c.chips}) + uint64_t{c.sub_workers};
  const uint64_t memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t mailboxes = 0;
  if (__builtin_mul_overflow(uint64_t{mailbox}, children, &mailboxes) || mailboxes > memory) {
    return resource_exhausted(
        "pipeline_depth = {}: the mailboxes of {} children need {} x {} bytes, more than this machine's {} bytes of "
        "memory",
        c.pipeline_depth, children, children, mailbox, memory);
  }
  if (c.run_timeout.count() < 0)
    return invalid_argument("run_timeout = {} ms: must be >= 0 (0: no deadline)", c.run_timeout.count());
  return Status();
}

NodeWorker::NodeWorker(NodeSpec spec) : spec_(std::move(spec)) {
  if (spec_.level == Level::Network) {
    for (const NodeCallable& c : spec_.node_callables) next_digests_.push_back(c.digest());
  } else {
    for (const ChipCallable& c : spec_.chip_callables) next_digests_.push_back(c.digest());
  }
  for (uint32_t i = 0; i < spec_.functions.size(); ++i) sub_digests_.push_back(sub_function_digest(i));
}

Result<std::unique_ptr<NodeWorker>> NodeWorker::create(NodeSpec spec) {
  SIMPLER_RETURN_IF_ERROR(validate(spec));
  const WorkerConfig config = spec.config;
  std::unique_ptr<NodeWorker> w(new NodeWorker(std::move(spec)));
  SIMPLER_ASSIGN_OR_RETURN(w->heap_, SharedHeap::create(config.shared_heap_bytes));
  SIMPLER_RETURN_IF_ERROR(w->spawn_children());
  // Every child is forked; only now does this process start a thread.
  SIMPLER_RETURN_IF_ERROR(w->start_external());
  std::vector<EndpointPort*> next_ports, sub_ports;
  for (size_t i = 0; i < w->next_.size(); ++i) {
    if (w->external_[i] != nullptr) {
      next_ports.push_back(w->external_[i].get());
      continue;
    }
    w->ports_.push_back(std::make_unique<MailboxPort>(*w->next_[i]));
    next_ports.push_back(w->ports_.back().get());
  }
  for (auto& c : w->subs_) {
    w->ports_.push_back(std::make_unique<MailboxPort>(*c));
    sub_ports.push_back(w->ports_.back().get());
  }
  NodeWorker* self = w.get();
  Scheduler::Hooks hooks;
  hooks.retire = [self](NodeRun& run) { self->on_retire(run); };
  hooks.free_heap = [self](uint64_t addr) { (void)self->heap_->free(addr); };
  w->scheduler_ =
      std::make_unique<Scheduler>(next_ports, sub_ports, &w->heap_->bell(), std::move(hooks), config.pipeline_depth);
  w->waiter_driver_ = w->scheduler_->waiter_driver();
  w->scheduler_->start();
  return w;
}

HostRanges NodeWorker::shared_ranges() const {
  HostRanges r;
  r.ranges.push_back(heap_->range());
  r.ranges.insert(r.ranges.end(), spec_.inherited.begin(), spec_.inherited.end());
  return r;
}

Status NodeWorker::spawn_children() {
  SpawnOptions so;
  so.granted_sets = config_.pipeline_depth;
  so.child.shared_parent_bell = &heap_->bell();
  so.child.spin = kNodeSpin;
  so.respawn_budget = spec_.respawn_budget;
  so.respawn_window_ns = spec_.respawn_window_ns;
  // Every child's runs carry the deadline, a sub worker's too: a sub function
  // that never returns hangs its run exactly as a kernel would.
  const uint64_t timeout_ms = static_cast<uint64_t>(config_.run_timeout.count());
  so.endpoint.run_deadline_ns = timeout_ms > UINT64_MAX / 1'000'000ull ? UINT64_MAX : timeout_ms * 1'000'000ull;
  const HostRanges ranges = shared_ranges();
  // Every recipe and mailbox exists before the fork server forks, so each
  // child finds them at this process's addresses. A recipe owns copies of
  // what it builds from: the server runs it long after this returns.
  std::vector<ChildRecipe> recipes;
  std::vector<std::shared_ptr<SharedMapping>> mailboxes;
  std::vector<std::string> names;
  std::vector<int64_t> next_index;  // by recipe: its next-level index, or -1 for a sub worker
  // `process` names the child in ps ("simpler-chip0"); `what` in errors ("chip worker 0").
  auto add = [&](std::function<std::unique_ptr<RunHandler>()> make, std::string process, std::string what) -> Status {
    SIMPLER_ASSIGN_OR_RETURN(std::shared_ptr<SharedMapping> mailbox, ForkedChild::map_mailbox(so.granted_sets), "{}",
                             what);
    SIMPLER_ASSIGN_OR_RETURN(const MailboxView view,
                             MailboxView::attach(mailbox->data(), mailbox->size(), so.granted_sets));
    recipes.push_back(ChildRecipe{std::move(process), std::move(make), view, so.child});
    mailboxes.push_back(std::move(mailbox));
    names.push_back(std::move(what));
    return Status();
  };
  const uint32_t next_count = spec_.level == Level::Network ? static_cast<uint32_t>(spec_.nodes.size()) : config_.chips;
  next_.resize(next_count);
  external_.resize(next_count);
  for (uint32_t i = 0; i < next_count; ++i) {
    if (spec_.level == Level::Network && spec_.nodes[i].external != nullptr) continue;
    next_index.push_back(i);
    std::function<std::unique_ptr<RunHandler>()> make;
    if (spec_.level == Level::Network) {
      NodeSpec node = spec_.nodes[i];
      node.inherited = ranges.ranges;
      make = [node, callables = spec_.node_callables] { return std::make_unique<NodeChildHandler>(node, callables); };
    } else {
      make = [config = config_, callables = spec_.chip_callables, ranges] {
        return std::make_unique<ChipChildHandler>(config, callables, ranges);
      };
    }
    const char* process = spec_.level == Level::Network ? "simpler-node" : "simpler-chip";
    SIMPLER_RETURN_IF_ERROR(
        add(std::move(make), fmt::format("{}{}", process, i), fmt::format("{} {}", next_kind(), i)));
  }
  for (uint32_t i = 0; i < config_.sub_workers; ++i) {
    next_index.push_back(-1);
    SIMPLER_RETURN_IF_ERROR(
        add([functions = spec_.functions, ranges] { return std::make_unique<SubWorkerHandler>(functions, ranges); },
            fmt::format("simpler-sub{}", i), fmt::format("sub worker {}", i)));
  }
  SIMPLER_ASSIGN_OR_RETURN(server_, ForkServer::start(std::move(recipes)));
  // A chip's device addresses hold its incarnation (kNodeIncarnationShift).
  SpawnOptions chip_so = so;
  chip_so.max_replacements = kNodeMaxIncarnations - 1;
  const bool chips = spec_.level == Level::Node;
  for (uint32_t k = 0; k < names.size(); ++k) {
    const bool next = next_index[k] >= 0;
    SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<ForkedChild> c,
                             require_grant(ForkedChild::start(*server_, k, mailboxes[k], chips && next ? chip_so : so),
                                           next ? config_.pipeline_depth : 0, names[k]));
    if (next) {
      next_[static_cast<size_t>(next_index[k])] = std::move(c);
    } else {
      subs_.push_back(std::move(c));
    }
  }
  return Status();
}

Status NodeWorker::start_external() {
  if (spec_.level != Level::Network) return Status();
  ExternalContext ctx;
  ctx.pipeline_depth = config_.pipeline_depth;
  ctx.callables = next_digests_;
  ctx.shared = shared_ranges();
  ctx.bell = &heap_->bell();
  // External workers are closed before the heap goes (members' order).
  ctx.hold_shared = [heap = heap_.get()](uint64_t addr, bool write) {
    return heap->hold(addr, write ? SharedHeap::HoldKind::kWrite : SharedHeap::HoldKind::kRead);
  };
  const uint64_t timeout_ms = static_cast<uint64_t>(config_.run_timeout.count());
  ctx.run_deadline_ns = timeout_ms > UINT64_MAX / 1'000'000ull ? UINT64_MAX : timeout_ms * 1'000'000ull;
  for (uint32_t i = 0; i < spec_.nodes.size(); ++i) {
    if (spec_.nodes[i].external == nullptr) continue;
    ctx.index = i;
    SIMPLER_ASSIGN_OR_RETURN(external_[i], (*spec_.nodes[i].external)(ctx), "{} {}", next_kind(), i);
  }
  return Status();
}

NodeWorker::~NodeWorker() { (void)close(std::chrono::milliseconds(60'000)); }

uint32_t NodeWorker::admitted_runs() const {
  std::lock_guard<std::mutex> lock(admit_mu_);
  return admitted_;
}

ArenaCounts NodeWorker::run_set_counts() const { return scheduler_->run_resources().counts(); }

NodeWorker::Admission NodeWorker::try_admit() {
  std::lock_guard<std::mutex> lock(admit_mu_);
  if (closing_) return Admission::kClosing;
  if (admitted_ >= config_.pipeline_depth) return Admission::kFull;
  ++admitted_;
  return Admission::kAdmitted;
}

bool NodeWorker::begin_run() {
  // FIFO-bounded and lease-free (R41): a parked caller holds nothing.
  Admission a = Admission::kFull;
  spin_then_park(
      admit_bell_,
      [&] {
        a = try_admit();
        return a != Admission::kFull;
      },
      SpinPolicy{});
  return a == Admission::kAdmitted;
}

void NodeWorker::end_run() {
  {
    std::lock_guard<std::mutex> lock(admit_mu_);
    --admitted_;
  }
  admit_bell_.ring();
}

std::string NodeWorker::task_name(const NodeTask& t) const {
  if (t.sub) {
    for (size_t i = 0; i < sub_digests_.size(); ++i) {
      if (sub_digests_[i] == t.callable) return fmt::format("sub function {}", i);
    }
    return "sub function";
  }
  for (const ChipCallable& c : spec_.chip_callables) {
    if (c.digest() == t.callable) return c.name();
  }
  for (const NodeCallable& c : spec_.node_callables) {
    if (c.digest() == t.callable) return c.name();
  }
  return "task";
}

NodeWorker::RefusedFiles NodeWorker::take_refused_files(const NodeRun& run) const {
  RefusedFiles refused;
  // Every task, not only the stamped ones: a dump-only run stamps no times.
  const auto take = [&](const NodeTask& t, uint32_t worker) {
    if (t.sub) return;
    ExternalWorker* x = external_[worker].get();
    if (x == nullptr) return;
    if (auto note = x->take_shipment_note(run.id, t.index)) refused[{worker, t.index}] = std::move(note->refused);
  };
  for (const auto& t : run.tasks) {
    if (t->members.empty()) {
      take(*t, t->worker);
    } else {
      for (const GroupMember& m : t->members) take(*t, m.worker);
    }
  }
  return refused;
}

Status NodeWorker::export_trace(const NodeRun& run, const RefusedFiles& refused) const {
  const bool network = spec_.level == Level::Network;
  const char* kind = network ? "node" : "chip";
  diag::HostTrace h;
  h.pid = static_cast<int>(::getpid());
  h.label = run.trace_label.empty() ? (network ? "network" : "node") : run.trace_label;
  h.run = run.id;
  h.level = run.call.swimlane_level;
  constexpr uint32_t kOrchestratorTid = 1, kSchedulerTid = 2, kFirstServeTid = 3;
  const uint32_t first_sub_tid = kFirstServeTid + static_cast<uint32_t>(next_.size());
  h.lanes.push_back({"Orchestrator", kOrchestratorTid});
  h.lanes.push_back({"Scheduler", kSchedulerTid});
  for (uint32_t i = 0; i < next_.size(); ++i)
    h.lanes.push_back({fmt::format("Serve {}{}", kind, i), kFirstServeTid + i});
  for (uint32_t i = 0; i < subs_.size(); ++i) h.lanes.push_back({fmt::format("Sub{}", i), first_sub_tid + i});
  h.slices.push_back({kOrchestratorTid, "build", run.submit_ns, run.built_ns, fmt::format("\"run\":{}", run.id)});

  std::vector<diag::TraceFragment> fragments;
  const auto add = [&](const NodeTask& t, uint32_t worker, const TaskTimes& times) {
    if (times.publish_ns == 0) return;  // never published: ended by a predecessor's failure
    const std::string name = task_name(t);
    const std::string args =
        fmt::format("\"task\":{},\"run\":{},\"worker\":{},\"staged\":{}", t.index, run.id, worker, times.staged);
    h.slices.push_back({kSchedulerTid, "publish " + name, times.publish_ns, times.published_ns, args});
    const uint32_t tid = t.sub ? first_sub_tid + worker : kFirstServeTid + worker;
    // From the publication's start: the child may take the task before the
    // publishing thread reads the clock again.
    h.slices.push_back({tid, name, times.publish_ns, std::max(times.end_ns, times.published_ns), args});
    if (t.sub) return;
    diag::TraceFragment f;
    f.path = diag::child_trace_dir(run.parts_dir, kind, worker, t.index) + "/trace.json";
    if (ExternalWorker* x = external_[worker].get(); x != nullptr) {
      // Its files came over MPI (checked and written where a forked node's
      // would be); its clock is mapped onto this one.
      const ClockEstimate c = x->clock();
      f.clock_offset_ns = c.offset_ns;
      f.clock_rtt_ns = c.rtt_ns;
      f.remote_rank = spec_.nodes[worker].remote_rank;
      if (auto it = refused.find({worker, t.index}); it != refused.end()) f.refused = it->second;
    }
    fragments.push_back(std::move(f));
  };
  for (const auto& t : run.tasks) {
    if (t->members.empty()) {
      add(*t, t->worker, t->times);
    } else {
      for (const GroupMember& m : t->members) add(*t, m.worker, m.times);
    }
  }
  SIMPLER_ASSIGN_OR_RETURN(const diag::MergedTrace merged,
                           diag::merge_trace(h, fragments, run.trace_label.empty() ? "" : run.trace_label + "/"),
                           "trace of run {}", run.id);
  return diag::write_trace_file(run.call.trace_dir, run.id, merged.document);
}

void NodeWorker::on_retire(NodeRun& run) {
  const bool dumping = run.call.dump_args != DumpArgs::Off;
  if (run.call.swimlane_level > 0 || dumping) {
    Status st;
    try {
      const RefusedFiles refused = take_refused_files(run);
      if (run.call.swimlane_level > 0) st = export_trace(run, refused);
      // A trace marks a refused fragment as missing; an argument dump is the
      // evidence the user asked for, so losing it on the way back fails the
      // run, as a dump this host could not write does.
      if (dumping && !refused.empty() && st.ok()) {
        const auto& [key, why] = *refused.begin();
        st = internal_error("run {}: task {}'s argument dump from next-level worker {} did not arrive: {}", run.id,
                            key.second, key.first, why);
      }
    } catch (const std::bad_alloc&) {
      st = resource_exhausted("trace of run {}: host memory exhausted writing it", run.id);
    }
    if (!st.ok() && run.first_error.ok()) run.first_error = st;
  }
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    for (uint64_t addr : run.borrowed) {
      auto it = borrows_.find(addr);
      if (it != borrows_.end() && --it->second == 0) borrows_.erase(it);
    }
  }
  end_run();
}

Result<std::unique_ptr<NodeRun>> NodeWorker::new_run(std::function<void(const Status&)>& on_terminal,
                                                     const RunDiagnostics& diagnostics) {
  try {
    auto run = std::make_unique<NodeRun>();
    run->call = diagnostics.call;
    run->trace_label = diagnostics.trace_label;
    run->id = next_run_id_.fetch_add(1);
    if (diagnostics.call.swimlane_level > 0 || diagnostics.call.dump_args != DumpArgs::Off) {
      run->parts_dir = diagnostics.trace_label.empty() ? fmt::format("{}/run{}", diagnostics.call.trace_dir, run->id)
                                                       : diagnostics.call.trace_dir;
    }
    run->handle = std::make_shared<detail::RunState>(run->id, kNodeSpin);
    run->handle->on_terminal = std::move(on_terminal);
    run->handle->driver = waiter_driver_;
    return run;
  } catch (const std::bad_alloc&) {
    return resource_exhausted("submit: host memory exhausted creating the run; nothing was admitted");
  }
}

RunHandle NodeWorker::refused(const Status& why, const std::function<void(const Status&)>& on_terminal) {
  if (on_terminal) on_terminal(why);
  return detail::refused_run(0, why);
}

Status NodeWorker::check_diagnostics(const CallConfig& call) const { return diag::validate_call_config(call, "call."); }

RunHandle NodeWorker::submit(const std::function<Status(Orchestrator&)>& orchestration,
                             std::function<void(const Status&)> on_terminal, const RunDiagnostics& diagnostics) {
  if (Status st = check_diagnostics(diagnostics.call); !st.ok()) return refused(st, on_terminal);
  Result<std::unique_ptr<NodeRun>> made = new_run(on_terminal, diagnostics);
  if (!made.ok()) return refused(made.status(), on_terminal);
  std::unique_ptr<NodeRun> run = std::move(made).value();
  RunHandle handle(run->handle);
  if (!orchestration) {
    run->handle->complete(invalid_argument("submit: the orchestration is empty"), RunStats{});
  } else if (!begin_run()) {
    run->handle->complete(failed_precondition("submit: the worker is closed"), RunStats{});
  } else {
    build_and_schedule(std::move(run), orchestration);
  }
  return handle;
}

std::optional<RunHandle> NodeWorker::try_submit(const std::function<Status(Orchestrator&)>& orchestration,
                                                std::function<void(const Status&)> on_terminal,
                                                const RunDiagnostics& diagnostics) {
  if (!orchestration) return submit(orchestration, std::move(on_terminal), diagnostics);
  if (Status st = check_diagnostics(diagnostics.call); !st.ok()) return refused(st, on_terminal);
  const Admission a = try_admit();
  if (a == Admission::kFull) return std::nullopt;
  Result<std::unique_ptr<NodeRun>> made = new_run(on_terminal, diagnostics);
  if (!made.ok()) {
    if (a == Admission::kAdmitted) end_run();
    return refused(made.status(), on_terminal);
  }
  std::unique_ptr<NodeRun> run = std::move(made).value();
  RunHandle handle(run->handle);
  if (a == Admission::kClosing) {
    run->handle->complete(failed_precondition("submit: the worker is closed"), RunStats{});
  } else {
    build_and_schedule(std::move(run), orchestration);
  }
  return handle;
}

void NodeWorker::build_and_schedule(std::unique_ptr<NodeRun> run,
                                    const std::function<Status(Orchestrator&)>& orchestration) {
  NodeOrchestrator o(*this, *run);
  Status st;
  const uint64_t build_start = now_ns();
  run->submit_ns = build_start;
  // A throw is the user's code failing (USER_CODE_FAILED, as at the chip
  // level), not a defect inside simpler (INTERNAL).
  try {
    const UserCodeMark user_code(this);
    st = orchestration(o);
  } catch (const std::bad_alloc&) {
    // Host memory ran out under the orchestration (in simpler's calls or the
    // user's own code): exhaustion, as anywhere else, not a user-code defect.
    st = resource_exhausted("the orchestration ran out of host memory (std::bad_alloc); nothing was scheduled");
  } catch (const std::exception& e) {
    st = user_code_failed("the orchestration threw: {}", e.what());
  } catch (...) {
    st = user_code_failed("the orchestration threw a non-standard exception");
  }
  run->built_ns = now_ns();
  run->build_us = static_cast<double>(run->built_ns - build_start) / 1000.0;
  if (st.ok()) st = o.first_error();
  if (st.ok()) st = schedule(run);
  if (!st.ok()) {
    // Nothing was scheduled: the run ends here with its own error.
    for (HeapAlloc& a : run->allocs) (void)heap_->free(a.addr);
    end_run();
    run->handle->complete(st, RunStats{});
    return;
  }
}

Status NodeWorker::schedule(std::unique_ptr<NodeRun>& run) {
  size_t counted = 0;
  auto unborrow = [&] {
    std::lock_guard<std::mutex> lock(mem_mu_);
    for (size_t i = 0; i < counted; ++i) {
      auto it = borrows_.find(run->borrowed[i]);
      if (it != borrows_.end() && --it->second == 0) borrows_.erase(it);
    }
  };
  try {
    std::lock_guard<std::mutex> lock(mem_mu_);
    for (; counted < run->borrowed.size(); ++counted) ++borrows_[run->borrowed[counted]];
  } catch (const std::bad_alloc&) {
    unborrow();
    return resource_exhausted(
        "submit: host memory exhausted recording the run's borrowed buffers; nothing was scheduled");
  }
  if (!scheduler_->enqueue(std::move(run))) {
    unborrow();
    return resource_exhausted("submit: host memory exhausted handing the run to the scheduler; nothing was scheduled");
  }
  return Status();
}

Status NodeWorker::check_alive(uint32_t worker) const {
  if (auto f = external_[worker] != nullptr ? external_[worker]->failure() : next_[worker]->failure()) {
    return make_error(StatusCode::kAborted, "{} {} is gone: {}", next_kind(), worker, f->to_string());
  }
  return Status();
}

Status NodeWorker::lost(const char* what, uint64_t node_addr, const DeviceAlloc& a) const {
  return failed_precondition(
      "{}: buffer {:#x} was lost with chip worker {}, which died after the buffer was allocated (a replacement's "
      "device memory starts empty)",
      what, node_addr, a.worker);
}

bool NodeWorker::is_lost(const DeviceAlloc& a) const { return a.registration != next_[a.worker]->incarnation(); }

Result<NodeWorker::DeviceAlloc> NodeWorker::device_arg(const DeviceBuffer& b, uint32_t worker) const {
  std::unique_lock<std::mutex> lock(mem_mu_);
  auto it = device_allocs_.find(b.addr);
  if (it == device_allocs_.end() || it->second.worker != worker || b.bytes > it->second.bytes) {
    return invalid_argument("{:#x} is not a live allocation on target worker {}", b.addr, worker);
  }
  const DeviceAlloc a = it->second;
  lock.unlock();
  if (is_lost(a)) return lost("submit", b.addr, a);
  return a;
}

Result<NodeWorker::DeviceAlloc> NodeWorker::device_alloc(uint64_t node_addr, const char* what) const {
  std::lock_guard<std::mutex> lock(mem_mu_);
  auto it = device_allocs_.find(node_addr);
  if (it == device_allocs_.end()) return not_found("{}: {:#x} is not a live device allocation", what, node_addr);
  return it->second;
}

Status NodeWorker::on_device_buffer(const char* what, uint64_t node_addr, const DeviceAlloc& a,
                                    const std::function<Status(MailboxEndpoint&)>& command) {
  ForkedChild& c = *next_[a.worker];
  if (is_lost(a)) return lost(what, node_addr, a);
  const Status st = command(c.endpoint());
  // A child that died under the command took the buffer with it.
  if (!st.ok() && (is_lost(a) || !c.check().ok())) return lost(what, node_addr, a);
  return st;
}

template <typename T>
Result<T> NodeWorker::ask_living(uint32_t worker, const std::function<Result<T>(MailboxEndpoint&)>& command) {
  ForkedChild& c = *next_[worker];
  for (int attempt = 0;; ++attempt) {
    SIMPLER_RETURN_IF_ERROR(check_alive(worker));
    const uint64_t incarnation = c.incarnation();
    Result<T> r = command(c.endpoint());
    // A refusal from a living child is the answer. One that died under the
    // command is replaced; its replacement is asked once.
    if (r.ok() || attempt > 0 || (c.incarnation() == incarnation && c.check().ok())) return r;
    SIMPLER_RETURN_IF_ERROR(c.await_replacement(incarnation, now_ns() + kControlDeadlineNs),
                            "{} {} died under the command: {}", next_kind(), worker, r.status().to_string());
  }
}

Result<DeviceBuffer> NodeWorker::malloc_on(uint32_t worker, uint64_t bytes) {
  if (spec_.level == Level::Network) {
    return failed_precondition(
        "malloc_on: a Level::Network worker's next-level workers are nodes, whose device "
        "memory is their own; pass shared-heap tensors (malloc_shared)");
  }
  if (worker >= next_.size())
    return invalid_argument("worker = {}: this node has {} chip workers", worker, next_.size());
  uint64_t registration = 0;
  SIMPLER_ASSIGN_OR_RETURN(
      const uint64_t addr,
      ask_living<uint64_t>(
          worker,
          [&](MailboxEndpoint& ep) { return ep.control_malloc(bytes, now_ns() + kControlDeadlineNs, &registration); }),
      "malloc_on");
  if ((addr & ~kNodeChildAddrMask) != 0) {
    (void)endpoint_of(worker).control_free(addr, now_ns() + kControlDeadlineNs, registration);
    return internal_error("chip worker {} returned device address {:#x}, beyond 48 bits", worker, addr);
  }
  const uint64_t node_addr = kNodeDeviceTag | ((registration - 1) << kNodeIncarnationShift) |
                             (static_cast<uint64_t>(worker) << kNodeChipShift) | addr;
  std::lock_guard<std::mutex> lock(mem_mu_);
  device_allocs_[node_addr] = DeviceAlloc{worker, addr, bytes, registration};
  return DeviceBuffer{node_addr, bytes};
}

Result<DeviceBuffer> NodeWorker::malloc_shared(uint64_t bytes) {
  SIMPLER_ASSIGN_OR_RETURN(const uint64_t addr, heap_->alloc(bytes));
  std::lock_guard<std::mutex> lock(mem_mu_);
  shared_allocs_[addr] = bytes;
  return DeviceBuffer{addr, bytes};
}

Status NodeWorker::free(DeviceBuffer buffer) {
  std::unique_lock<std::mutex> lock(mem_mu_);
  if (auto b = borrows_.find(buffer.addr); b != borrows_.end()) {
    return failed_precondition("free: {:#x} is borrowed by {} live run(s); wait for them first", buffer.addr,
                               b->second);
  }
  if (is_node_device_addr(buffer.addr)) {
    auto it = device_allocs_.find(buffer.addr);
    if (it == device_allocs_.end()) return not_found("free: {:#x} is not a live device allocation", buffer.addr);
    const DeviceAlloc a = it->second;
    // Dropped even when lost: the buffer is gone either way, and its loss is reported once more here.
    device_allocs_.erase(it);
    lock.unlock();
    return on_device_buffer("free", buffer.addr, a, [&](MailboxEndpoint& ep) {
      return ep.control_free(a.child_addr, now_ns() + kControlDeadlineNs, a.registration);
    });
  }
  if (shared_allocs_.erase(buffer.addr) == 0) {
    return not_found("free: {:#x} is neither a device allocation nor a shared-heap block of this worker", buffer.addr);
  }
  lock.unlock();
  return heap_->free(buffer.addr);
}

Status NodeWorker::copy_to(DeviceBuffer dst, const void* src, uint64_t bytes, uint64_t dst_offset) {
  if (src == nullptr && bytes != 0) return invalid_argument("copy_to: src is null");
  if (is_node_device_addr(dst.addr)) {
    SIMPLER_ASSIGN_OR_RETURN(const DeviceAlloc a, device_alloc(dst.addr, "copy_to"));
    if (dst_offset > a.bytes || bytes > a.bytes - dst_offset) {
      return out_of_range("copy_to: {} bytes at offset {} exceed the {}-byte allocation", bytes, dst_offset, a.bytes);
    }
    return on_device_buffer("copy_to", dst.addr, a, [&](MailboxEndpoint& ep) {
      return ep.control_copy_to(a.child_addr, dst_offset, {static_cast<const uint8_t*>(src), bytes},
                                now_ns() + kControlDeadlineNs, a.registration);
    });
  }
  if (dst_offset > dst.bytes || !heap_->within_live_block(dst.addr + dst_offset, bytes)) {
    return out_of_range("copy_to: {:#x}+{} is not inside a live shared-heap block", dst.addr + dst_offset, bytes);
  }
  std::memcpy(reinterpret_cast<void*>(dst.addr + dst_offset), src, bytes);
  return Status();
}

Status NodeWorker::copy_from(void* dst, DeviceBuffer src, uint64_t bytes, uint64_t src_offset) {
  if (dst == nullptr && bytes != 0) return invalid_argument("copy_from: dst is null");
  if (is_node_device_addr(src.addr)) {
    SIMPLER_ASSIGN_OR_RETURN(const DeviceAlloc a, device_alloc(src.addr, "copy_from"));
    if (src_offset > a.bytes || bytes > a.bytes - src_offset) {
      return out_of_range("copy_from: {} bytes at offset {} exceed the {}-byte allocation", bytes, src_offset, a.bytes);
    }
    return on_device_buffer("copy_from", src.addr, a, [&](MailboxEndpoint& ep) {
      return ep.control_copy_from(a.child_addr, src_offset, {static_cast<uint8_t*>(dst), bytes},
                                  now_ns() + kControlDeadlineNs, a.registration);
    });
  }
  if (src_offset > src.bytes || !heap_->within_live_block(src.addr + src_offset, bytes)) {
    return out_of_range("copy_from: {:#x}+{} is not inside a live shared-heap block", src.addr + src_offset, bytes);
  }
  std::memcpy(dst, reinterpret_cast<const void*>(src.addr + src_offset), bytes);
  return Status();
}

Result<MemoryInfo> NodeWorker::memory_info_on(uint32_t worker) {
  if (worker >= next_.size()) {
    return invalid_argument("worker = {}: this worker has {} {}s", worker, next_.size(), next_kind());
  }
  if (external_[worker] != nullptr) {
    SIMPLER_RETURN_IF_ERROR(check_alive(worker));
    return external_[worker]->memory_info(now_ns() + kControlDeadlineNs);
  }
  SIMPLER_ASSIGN_OR_RETURN(
      const DeviceMemoryReport m,
      ask_living<DeviceMemoryReport>(
          worker, [](MailboxEndpoint& ep) { return ep.control_memory_info(now_ns() + kControlDeadlineNs); }),
      "{} {}", next_kind(), worker);
  return MemoryInfo{m.total_bytes, m.free_bytes};
}

Result<MemoryInfo> NodeWorker::memory_info() {
  MemoryInfo sum;
  std::string gone;
  uint32_t living = 0;
  for (uint32_t i = 0; i < next_.size(); ++i) {
    if (Status alive = check_alive(i); !alive.ok()) {
      gone += fmt::format("{}{}", gone.empty() ? "" : "; ", alive.message());
      continue;
    }
    SIMPLER_ASSIGN_OR_RETURN(const MemoryInfo m, memory_info_on(i));
    if (m.total_bytes > UINT64_MAX - sum.total_bytes) {
      return out_of_range("memory_info: the next-level workers' total device bytes exceed 2^64");
    }
    sum.total_bytes += m.total_bytes;
    sum.free_bytes += m.free_bytes;  // free <= total per chip, so this cannot wrap either
    ++living;
  }
  // A failed worker's memory is unknown, so no sum is the node's: the error
  // names each failed one and carries the living ones' sum, which
  // memory_info_on also reads one by one.
  if (!gone.empty()) {
    return make_error(StatusCode::kAborted, "memory_info: {}; the {} living {}(s) report {} free of {} total bytes",
                      gone, living, next_kind(), sum.free_bytes, sum.total_bytes);
  }
  return sum;
}

Status NodeWorker::close(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(admit_mu_);
    if (closing_ && scheduler_ == nullptr) return Status();
    closing_ = true;
  }
  admit_bell_.ring();
  const uint64_t deadline = deadline_after(timeout_ns(drain));
  if (scheduler_ != nullptr) scheduler_->stop(deadline);
  Status first;
  auto close_all = [&](std::vector<std::unique_ptr<ForkedChild>>& children) {
    for (auto& c : children) {
      if (c == nullptr) continue;  // an external next-level worker
      std::vector<EndpointEvent> events;
      Status st = c->close(std::max<uint64_t>(deadline, now_ns() + 5'000'000'000ull), events);
      if (!st.ok() && first.ok()) first = st;
    }
  };
  close_all(next_);
  close_all(subs_);
  for (auto& e : external_) {
    if (e == nullptr) continue;
    Status st = e->close(std::max<uint64_t>(deadline, now_ns() + 5'000'000'000ull));
    if (!st.ok() && first.ok()) first = st;
  }
  scheduler_.reset();
  ports_.clear();
  external_.clear();
  next_.clear();
  subs_.clear();
  server_.reset();  // every child of it is closed
  return first;
}

}  // namespace simpler
