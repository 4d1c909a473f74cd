// The backends this build has, by name. A backend registers itself from its
// own folder with SIMPLER_REGISTER_BACKEND (at static initialisation); the
// chip finds it by WorkerConfig::backend. Lookups are safe from any thread
// once main() has started.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace simpler {

struct DeviceOptions {
  Geometry geometry;
  uint64_t memory_bytes = 0;
  // Guard bytes around every allocation, checked after each task (a backend
  // that cannot guard refuses it, naming the field).
  bool guard_memory = false;
};

struct BackendInfo {
  const char* name;
  const char* description;
  // Validates `options` (naming the field) and creates an unstarted device.
  Result<std::unique_ptr<Device>> (*create)(const DeviceOptions& options);
};

// Aborts on a duplicate name or a null field: a build defect.
bool register_backend(const BackendInfo& info);
// Every registered backend, by name.
std::vector<const BackendInfo*> registered_backends();
// The backend named `name`, or INVALID_ARGUMENT naming the field `backend`
// and listing the backends built.
Result<const BackendInfo*> backend_named(const std::string& name);

}  // namespace simpler

#define SIMPLER_REGISTER_BACKEND(ident, ...) \
  [[maybe_unused]] static const bool simpler_backend_registered_##ident = ::simpler::register_backend(__VA_ARGS__)
