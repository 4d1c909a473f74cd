#include "device/sim/sim_runner.h"

#include "base/errors.h"

namespace simpler {

struct SimOps {
  static SimRunner& r(const HostApi& api) { return *static_cast<SimRunner*>(api.runner); }

  static Result<uint64_t> device_malloc(const HostApi& api, uint64_t bytes) { return r(api).memory_.allocate(bytes); }
  static Status device_free(const HostApi& api, uint64_t addr) { return r(api).memory_.free(addr); }
  static Status copy_to_device(const HostApi& api, uint64_t dst, const void* src, uint64_t n) {
    return r(api).memory_.copy_to_device(dst, src, n);
  }
  static Status copy_from_device(const HostApi& api, void* dst, uint64_t src, uint64_t n) {
    return r(api).memory_.copy_from_device(dst, src, n);
  }
  static Status memset_device(const HostApi& api, uint64_t dst, int value, uint64_t n) {
    return r(api).memory_.memset_device(dst, value, n);
  }
  static Result<uint64_t> retained_temp(const HostApi& api, uint64_t min_bytes) {
    SimRunner& run = r(api);
    uint64_t& addr = run.retained_addr_[api.slot];
    uint64_t& bytes = run.retained_bytes_[api.slot];
    if (addr != 0 && bytes >= min_bytes) return addr;
    SIMPLER_ASSIGN_OR_RETURN(const uint64_t fresh, run.memory_.allocate(min_bytes));
    if (addr != 0) (void)run.memory_.free(addr);
    addr = fresh;
    bytes = min_bytes;
    return addr;
  }
  static Result<uint64_t> arena_setup(const HostApi& api, uint64_t* bytes_out) {
    SimRunner& run = r(api);
    uint64_t& addr = run.arena_addr_[api.bank];
    if (addr == 0) {
      SIMPLER_ASSIGN_OR_RETURN(addr, run.memory_.allocate(run.arena_bytes_), "arena bank {}", api.bank);
    }
    if (bytes_out != nullptr) *bytes_out = run.arena_bytes_;
    return addr;
  }
  static Status upload_callable(const HostApi& api, uint32_t id) {
    SimRunner& run = r(api);
    std::lock_guard<std::mutex> lock(run.uploaded_mu_);
    run.uploaded_.insert(id);
    return Status();
  }
  static uint32_t swimlane_level(const HostApi& api) { return r(api).swimlane_level_; }
};

const HostApiOps& SimRunner::sim_ops() {
  static const HostApiOps kOps{"sim",
                               &SimOps::device_malloc,
                               &SimOps::device_free,
                               &SimOps::copy_to_device,
                               &SimOps::copy_from_device,
                               &SimOps::memset_device,
                               &SimOps::retained_temp,
                               &SimOps::arena_setup,
                               &SimOps::upload_callable,
                               &SimOps::swimlane_level};
  return kOps;
}

struct SimRunner::Tables final : GrantOwner::Pending {
  std::vector<uint64_t> retained_addr;
  std::vector<uint64_t> retained_bytes;
  std::vector<uint64_t> arena_addr;
};

SimRunner::SimRunner(GlobalMemory& memory, uint64_t arena_bytes, uint32_t swimlane_level)
    : memory_(memory), arena_bytes_(arena_bytes), swimlane_level_(swimlane_level) {}

SimRunner::~SimRunner() {
  Tables empty;
  swap_in(empty);
}

Result<std::unique_ptr<GrantOwner::Pending>> SimRunner::build_grant(uint32_t grant) const {
  auto t = std::make_unique<Tables>();
  t->retained_addr.assign(grant, 0);
  t->retained_bytes.assign(grant, 0);
  t->arena_addr.assign(grant, 0);
  return std::unique_ptr<Pending>(std::move(t));
}

void SimRunner::commit_grant(Pending& pending) noexcept { swap_in(static_cast<Tables&>(pending)); }

void SimRunner::swap_in(Tables& t) noexcept {
  retained_addr_.swap(t.retained_addr);
  retained_bytes_.swap(t.retained_bytes);
  arena_addr_.swap(t.arena_addr);
  // The previous grant's device memory goes back; freeing never allocates.
  for (uint64_t a : t.retained_addr) {
    if (a != 0) (void)memory_.free(a);
  }
  for (uint64_t a : t.arena_addr) {
    if (a != 0) (void)memory_.free(a);
  }
}

Result<HostApi> SimRunner::bind(uint32_t slot, uint32_t bank) {
  if (slot >= width()) return invalid_argument("pipeline_slot = {} is outside the grant of {}", slot, width());
  if (bank >= width()) return invalid_argument("arena_bank = {} is outside the grant of {}", bank, width());
  return HostApi{this, slot, bank, &sim_ops()};
}

bool SimRunner::callable_uploaded(uint32_t id) const {
  std::lock_guard<std::mutex> lock(uploaded_mu_);
  return uploaded_.count(id) != 0;
}

}  // namespace simpler
