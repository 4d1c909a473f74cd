#include "device/host_api.h"

#include "base/errors.h"

namespace simpler {

Status check_host_api_ops(const HostApiOps& o) {
  const void* const fields[kHostApiCallbacks] = {
      reinterpret_cast<const void*>(o.device_malloc),  reinterpret_cast<const void*>(o.device_free),
      reinterpret_cast<const void*>(o.copy_to_device), reinterpret_cast<const void*>(o.copy_from_device),
      reinterpret_cast<const void*>(o.memset_device),  reinterpret_cast<const void*>(o.retained_temp),
      reinterpret_cast<const void*>(o.arena_setup),    reinterpret_cast<const void*>(o.upload_callable),
      reinterpret_cast<const void*>(o.swimlane_level)};
  static const char* const kNames[kHostApiCallbacks] = {"device_malloc",    "device_free",     "copy_to_device",
                                                        "copy_from_device", "memset_device",   "retained_temp",
                                                        "arena_setup",      "upload_callable", "swimlane_level"};
  for (int i = 0; i < kHostApiCallbacks; ++i) {
    if (fields[i] == nullptr) {
      return invalid_argument("HostApiOps of backend '{}': {} is null", o.backend ? o.backend : "?", kNames[i]);
    }
  }
  return Status();
}

}  // namespace simpler
