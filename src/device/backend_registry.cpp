#include "device/backend_registry.h"

#include "base/named_registry.h"

namespace simpler {

namespace {
NamedRegistry<BackendInfo>& registry() {
  static NamedRegistry<BackendInfo> r("backend", "backend");
  return r;
}
}  // namespace

bool register_backend(const BackendInfo& info) { return registry().add(info); }

std::vector<const BackendInfo*> registered_backends() { return registry().all(); }

Result<const BackendInfo*> backend_named(const std::string& name) { return registry().named(name); }

}  // namespace simpler
