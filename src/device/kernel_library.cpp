#include <dlfcn.h>

#include <fstream>
#include <iterator>

#include "base/errors.h"
#include "simpler/callable.h"
#include "task/digest.h"

namespace simpler {

Status KernelLibrary::add_file(uint32_t func_id, CoreType core, const std::string& path) {
  if (kernels_.count(func_id) != 0) return invalid_argument("func_id {} is already registered", func_id);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("kernel file '{}' cannot be read", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return invalid_argument("kernel file '{}': dlopen failed: {}", path, dlerror());
  std::shared_ptr<void> handle(h, [](void* p) { dlclose(p); });
  auto fn = reinterpret_cast<simpler_kernel_fn>(dlsym(h, "kernel_entry"));
  if (fn == nullptr) return invalid_argument("kernel file '{}' exports no kernel_entry symbol", path);
  KernelInfo info;
  info.func_id = func_id;
  info.core = core;
  info.name = path;
  info.fn = fn;
  info.content = sha256(bytes.data(), bytes.size());
  kernels_.emplace(func_id, std::move(info));
  handles_.push_back(std::move(handle));
  return Status();
}

Status KernelLibrary::add_function(uint32_t func_id, CoreType core, std::string name, simpler_kernel_fn fn) {
  if (kernels_.count(func_id) != 0) return invalid_argument("func_id {} is already registered", func_id);
  if (fn == nullptr) return invalid_argument("kernel '{}' (func_id {}): fn is null", name, func_id);
  KernelInfo info;
  info.func_id = func_id;
  info.core = core;
  info.fn = fn;
  info.content = sha256(name.data(), name.size());
  info.name = std::move(name);
  kernels_.emplace(func_id, std::move(info));
  return Status();
}

const KernelInfo* KernelLibrary::find(uint32_t func_id) const {
  auto it = kernels_.find(func_id);
  return it == kernels_.end() ? nullptr : &it->second;
}

ChipCallable::ChipCallable(std::string name, OrchestrationFn orchestrate, KernelLibrary kernels,
                           std::vector<Param> signature)
    : name_(std::move(name)),
      orchestrate_(std::move(orchestrate)),
      kernels_(std::move(kernels)),
      signature_(std::move(signature)),
      digest_(compute_digest()) {}

ChipCallable::ChipCallable(std::string name, Orchestration orchestration, KernelLibrary kernels,
                           std::vector<Param> signature)
    : name_(std::move(name)),
      orchestrate_(std::move(orchestration.fn)),
      kernels_(std::move(kernels)),
      signature_(std::move(signature)),
      orchestration_content_(orchestration.content),
      digest_(compute_digest()) {}

Digest ChipCallable::compute_digest() const {
  Sha256 h;
  h.update("simpler.chip_callable.v1");
  h.update(name_);
  const uint64_t n = signature_.size();
  h.update(&n, sizeof n);
  for (const Param& p : signature_) {
    const uint8_t b[2] = {static_cast<uint8_t>(p.kind), static_cast<uint8_t>(p.tag)};
    h.update(b, sizeof b);
    // Constraints are part of the identity only when set, so a callable
    // without them keeps its digest.
    if (p.dtype) {
      const uint8_t t[2] = {0xD7, static_cast<uint8_t>(*p.dtype)};
      h.update(t, sizeof t);
    }
    if (p.shape) {
      const uint64_t rank = p.shape->size();
      h.update("shape", 5);
      h.update(&rank, sizeof rank);
      h.update(p.shape->data(), rank * sizeof(int64_t));
    }
  }
  for (const auto& [id, k] : kernels_.all()) {
    h.update(&id, sizeof id);
    const auto core = static_cast<uint8_t>(k.core);
    h.update(&core, 1);
    h.update(k.content.data(), k.content.size());
  }
  // Likewise only when set: an in-process orchestration keeps its digest.
  if (orchestration_content_) {
    h.update("orchestration");
    h.update(orchestration_content_->data(), orchestration_content_->size());
  }
  return h.finish();
}

NodeCallable::NodeCallable(std::string name, NodeOrchestrationFn orchestrate)
    : name_(std::move(name)), orchestrate_(std::move(orchestrate)) {
  Sha256 h;
  h.update("simpler.node_callable.v1");
  h.update(name_);
  digest_ = h.finish();
}

}  // namespace simpler
