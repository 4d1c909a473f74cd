// Kernels and callables. A KernelLibrary maps func_ids to kernels (loaded
// from .so files or registered in-process); a ChipCallable bundles an
// orchestration (in-process, or loaded from a .so), its kernels and its
// signature, identified by a SHA-256 digest of its contents; a NodeCallable
// is one run of a node, identified by its name. Built on one thread, then
// immutable.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "simpler/kernel.h"
#include "simpler/task_args.h"

namespace simpler {

class ChipOrchestrator;
class Orchestrator;
class TaskArgsView;

using Digest = std::array<uint8_t, 32>;
std::string digest_hex(const Digest& d);

struct KernelInfo {
  uint32_t func_id = 0;
  CoreType core = CoreType::AIV;
  std::string name;  // symbol or file name, part of the identity
  simpler_kernel_fn fn = nullptr;
  Digest content{};  // SHA-256 of the .so bytes, or of the name for in-process kernels
};

class KernelLibrary {
 public:
  // Loads one kernel .so exporting kernel_entry (see simpler_add_kernel).
  Status add_file(uint32_t func_id, CoreType core, const std::string& path);
  // Registers an in-process function; `name` must identify its code.
  Status add_function(uint32_t func_id, CoreType core, std::string name, simpler_kernel_fn fn);

  const KernelInfo* find(uint32_t func_id) const;
  const std::map<uint32_t, KernelInfo>& all() const { return kernels_; }

 private:
  std::map<uint32_t, KernelInfo> kernels_;
  std::vector<std::shared_ptr<void>> handles_;  // dlopen handles, closed with the last copy
};

// The orchestration of a chip callable: submits tasks for one run. A returned
// error fails the run before anything is launched.
using OrchestrationFn = std::function<Status(ChipOrchestrator& o, const TaskArgs& run_args)>;

// An orchestration loaded from a shared object (load_orchestration).
struct Orchestration {
  std::string path;
  OrchestrationFn fn;  // keeps the shared object loaded while any copy of it lives
  Digest content{};    // SHA-256 of the file's bytes: its identity, whatever its path
};

// Loads a shared object built with simpler_add_orchestration (its entry point
// is declared with SIMPLER_ORCHESTRATION, simpler/orchestration.h). Refuses,
// naming the path: NOT_FOUND when the file cannot be read, INVALID_ARGUMENT
// when it is not a loadable shared object or exports no orchestration_entry.
Result<Orchestration> load_orchestration(const std::string& path);

class ChipCallable {
 public:
  ChipCallable(std::string name, OrchestrationFn orchestrate, KernelLibrary kernels, std::vector<Param> signature);
  // The loaded orchestration's content digest joins the identity, so a
  // rebuilt .so is a different callable.
  ChipCallable(std::string name, Orchestration orchestration, KernelLibrary kernels, std::vector<Param> signature);

  const std::string& name() const { return name_; }
  const OrchestrationFn& orchestrate() const { return orchestrate_; }
  const KernelLibrary& kernels() const { return kernels_; }
  const std::vector<Param>& signature() const { return signature_; }
  // Set when the orchestration was loaded from a shared object.
  const std::optional<Digest>& orchestration_content() const { return orchestration_content_; }
  // SHA-256 over the name, the signature, every kernel's identity and, when
  // set, the orchestration's content digest.
  const Digest& digest() const { return digest_; }

 private:
  Digest compute_digest() const;

  std::string name_;
  OrchestrationFn orchestrate_;
  KernelLibrary kernels_;
  std::vector<Param> signature_;
  std::optional<Digest> orchestration_content_;
  Digest digest_{};
};

// The orchestration of a node callable: builds one run of a Level::Node
// worker, in that node's own process, with the handles its worker returned
// when it registered its chip callables and functions (capture them).
using NodeOrchestrationFn = std::function<Status(Orchestrator& o, const TaskArgs& run_args)>;

// What a Level::Network worker runs on one of its next-level (node) workers.
// The node receives `run_args` decoded from the mailbox; their tensors live
// in the network worker's shared heap, which every node process maps.
class NodeCallable {
 public:
  NodeCallable(std::string name, NodeOrchestrationFn orchestrate);

  const std::string& name() const { return name_; }
  const NodeOrchestrationFn& orchestrate() const { return orchestrate_; }
  // SHA-256 over the name: a std::function has no content to hash, so the
  // name is the identity, and both sides of the mailbox derive it.
  const Digest& digest() const { return digest_; }

 private:
  std::string name_;
  NodeOrchestrationFn orchestrate_;
  Digest digest_{};
};

// A registered chip or node callable, as Worker::register_callable returned it.
struct CallableHandle {
  uint32_t id = 0;
  Digest digest{};
};

// A host function that a node's sub worker process runs as one task. Its
// tensors live in the node's shared heap; it runs on the sub worker's thread
// and must not throw (a thrown exception fails the task with its message).
using SubFunction = std::function<Status(const TaskArgsView& args)>;

// A registered sub function, as Worker::register_function returned it.
struct FunctionHandle {
  uint32_t id = 0;
  Digest digest{};
};

}  // namespace simpler
