#include "runtime/runtime.h"

#include "base/errors.h"
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

Status check_runtime_options(const RuntimeOptions& options, Device& device, const char* runtime, const char* why) {
  if (options.max_tasks_per_run == 0 || options.max_tasks_per_run > (1u << 24)) {
    return invalid_argument("max_tasks_per_run = {} is outside [1, 2^24]", options.max_tasks_per_run);
  }
  if (!device.memory().host_mapped()) {
    return invalid_argument("runtime = '{}' {}; backend '{}' has no host-mapped device memory", runtime, why,
                            device.backend());
  }
  return Status();
}

}  // namespace simpler
