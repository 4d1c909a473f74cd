// HostApi: the host callbacks a chip runtime may use for one run, bound by
// value. HostApiOps is one complete, immutable table per backend; a HostApi
// binds (runner, slot, bank, ops) for one run, and every callback reaches its
// runner and selection only through the value it is given: no thread-local or
// global selects a run's resources. Any thread may call through a HostApi; the
// backend's runner must outlive every HostApi bound to it.
#pragma once

#include <cstdint>

#include "simpler/status.h"

namespace simpler {

struct HostApi;

struct HostApiOps {
  const char* backend;
  Result<uint64_t> (*device_malloc)(const HostApi& api, uint64_t bytes);
  Status (*device_free)(const HostApi& api, uint64_t addr);
  Status (*copy_to_device)(const HostApi& api, uint64_t dst, const void* src, uint64_t bytes);
  Status (*copy_from_device)(const HostApi& api, void* dst, uint64_t src, uint64_t bytes);
  Status (*memset_device)(const HostApi& api, uint64_t dst, int value, uint64_t bytes);
  // The slot's retained temp buffer: kept across runs of that slot, grown on demand.
  Result<uint64_t> (*retained_temp)(const HostApi& api, uint64_t min_bytes);
  // The bank's graph-definition arena: its device address and size.
  Result<uint64_t> (*arena_setup)(const HostApi& api, uint64_t* bytes_out);
  // Records that the callable's image is resident on the device.
  Status (*upload_callable)(const HostApi& api, uint32_t callable_id);
  uint32_t (*swimlane_level)(const HostApi& api);
};

// Number of callbacks in HostApiOps, for completeness checks (R78). Tied to
// the struct: a callback added to it without a name in check_host_api_ops
// fails to build.
inline constexpr int kHostApiCallbacks = 9;
static_assert(sizeof(HostApiOps) == sizeof(const char*) + kHostApiCallbacks * sizeof(void (*)()),
              "HostApiOps changed: update kHostApiCallbacks and check_host_api_ops");

struct HostApi {
  void* runner = nullptr;
  uint32_t slot = 0;
  uint32_t bank = 0;
  const HostApiOps* ops = nullptr;

  bool bound() const { return runner != nullptr && ops != nullptr; }
  Result<uint64_t> device_malloc(uint64_t bytes) const { return ops->device_malloc(*this, bytes); }
  Status device_free(uint64_t addr) const { return ops->device_free(*this, addr); }
  Status copy_to_device(uint64_t dst, const void* src, uint64_t n) const {
    return ops->copy_to_device(*this, dst, src, n);
  }
  Status copy_from_device(void* dst, uint64_t src, uint64_t n) const {
    return ops->copy_from_device(*this, dst, src, n);
  }
  Status memset_device(uint64_t dst, int value, uint64_t n) const { return ops->memset_device(*this, dst, value, n); }
  Result<uint64_t> retained_temp(uint64_t min_bytes) const { return ops->retained_temp(*this, min_bytes); }
  Result<uint64_t> arena_setup(uint64_t* bytes_out) const { return ops->arena_setup(*this, bytes_out); }
  Status upload_callable(uint32_t id) const { return ops->upload_callable(*this, id); }
  uint32_t swimlane_level() const { return ops->swimlane_level(*this); }
};

// Every callback of `ops` is non-null (R78); names the first missing one.
Status check_host_api_ops(const HostApiOps& ops);

}  // namespace simpler
