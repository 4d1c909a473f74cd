#include "base/errors.h"
#include "simpler/types.h"

namespace simpler {

Geometry Geometry::small() { return Geometry{"small", 2, 2}; }
Geometry Geometry::a2a3() { return Geometry{"a2a3", 24, 4}; }
Geometry Geometry::a5() { return Geometry{"a5", 36, 5}; }

std::vector<Geometry> Geometry::presets() { return {small(), a2a3(), a5()}; }

Result<Geometry> Geometry::by_name(const std::string& name) {
  for (Geometry g : presets()) {
    if (g.name == name) return g;
  }
  return invalid_argument("geometry '{}' is not one of small, a2a3, a5", name);
}

Status Geometry::validate() const {
  constexpr uint32_t kMaxClusters = 256;
  constexpr uint32_t kMaxAicpu = 16;
  if (clusters == 0 || clusters > kMaxClusters) {
    return invalid_argument("geometry.clusters = {} is outside [1, {}]", clusters, kMaxClusters);
  }
  if (aicpu_threads == 0 || aicpu_threads > kMaxAicpu) {
    return invalid_argument("geometry.aicpu_threads = {} is outside [1, {}]", aicpu_threads, kMaxAicpu);
  }
  return Status();
}

}  // namespace simpler
