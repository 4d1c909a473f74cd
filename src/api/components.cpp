#include "device/backend_registry.h"
#include "runtime/runtime.h"
#include "simpler/worker_config.h"

namespace simpler {

std::vector<ComponentInfo> available_runtimes() {
  std::vector<ComponentInfo> out;
  for (const RuntimeInfo* r : registered_runtimes()) out.push_back({r->name, r->description});
  return out;
}

std::vector<ComponentInfo> available_backends() {
  std::vector<ComponentInfo> out;
  for (const BackendInfo* b : registered_backends()) out.push_back({b->name, b->description});
  return out;
}

}  // namespace simpler
