#include "runtime/runtime.h"

#include "base/named_registry.h"

namespace simpler {

namespace {
NamedRegistry<RuntimeInfo>& registry() {
  static NamedRegistry<RuntimeInfo> r("runtime", "runtime");
  return r;
}
}  // namespace

bool register_runtime(const RuntimeInfo& info) { return registry().add(info); }

std::vector<const RuntimeInfo*> registered_runtimes() { return registry().all(); }

Result<const RuntimeInfo*> runtime_named(const std::string& name) { return registry().named(name); }

}  // namespace simpler
