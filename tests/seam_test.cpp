// The seams themselves (issue 8): the registries name what the build has and
// refuse what it has not, and a runtime refuses a backend it cannot drive,
// naming both, before it touches the device.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "device/backend_registry.h"
#include "runtime/runtime.h"
#include "test_util.h"

namespace simpler {
namespace {

using testing::contains;

// A backend whose device memory is not mapped into this process: every call a
// runtime could make on it fails the test, so a refusal must come first.
class UnmappedMemory final : public DeviceMemory {
 public:
  Result<uint64_t> allocate(uint64_t) override { return touched(); }
  Status free(uint64_t) override { return touched(); }
  Status pin(uint64_t) override { return touched(); }
  void unpin(uint64_t) override { (void)touched(); }
  bool guarded() const override { return false; }
  GuardDamage check_guards(uint64_t, uint64_t) override {
    (void)touched();
    return {};
  }
  Result<Allocation> containing_allocation(uint64_t, uint64_t) const override { return touched(); }
  uint64_t allocation_size(uint64_t) const override { return 0; }
  uint64_t total_bytes() const override { return 1 << 20; }
  uint64_t free_bytes() const override { return 1 << 20; }
  bool host_mapped() const override { return false; }
  Status copy_to_device(uint64_t, const void*, uint64_t) override { return touched(); }
  Status copy_from_device(void*, uint64_t, uint64_t) override { return touched(); }
  Status memset_device(uint64_t, int, uint64_t) override { return touched(); }

 private:
  static Status touched() {
    ADD_FAILURE() << "a runtime used the memory of a backend it should have refused";
    return Status(StatusCode::kInternal, "touched");
  }
};

class UnmappedDevice final : public Device {
 public:
  const char* backend() const override { return "unmapped"; }
  const Geometry& geometry() const override { return geometry_; }
  DeviceMemory& memory() override { return memory_; }
  CoreRegisters& core_registers(uint32_t core) override { return regs_[core]; }
  void start(AicpuProgram*) override { ADD_FAILURE() << "started"; }
  void stop() override {}
  void ring_aicpu(uint32_t) override {}
  Result<std::unique_ptr<DeviceRunner>> create_runner(uint64_t) override {
    return Status(StatusCode::kUnimplemented, "no runner");
  }
  Status fault() const override { return Status(); }

 private:
  Geometry geometry_ = Geometry::small();
  UnmappedMemory memory_;
  std::unique_ptr<CoreRegisters[]> regs_{new CoreRegisters[Geometry::small().cores()]};
};

TEST(Seams, TheRegistriesListWhatIsBuiltAndRefuseAnythingElseByField) {
  std::string names;
  for (const RuntimeInfo* r : registered_runtimes()) names += std::string(r->name) + " ";
  EXPECT_TRUE(contains(names, "host_build_graph") && contains(names, "reference")) << names;
  ASSERT_TRUE(runtime_named("reference").ok());
  EXPECT_STREQ((*runtime_named("reference"))->name, "reference");
  EXPECT_FALSE((*runtime_named("reference"))->concurrent);
  EXPECT_TRUE((*runtime_named("host_build_graph"))->concurrent);
  const Status unknown = runtime_named("tmr").status();
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(unknown.message(), "runtime = 'tmr'") &&
              contains(unknown.message(), "host_build_graph, reference"))
      << unknown.message();
  ASSERT_TRUE(backend_named("sim").ok());
  const Status no_backend = backend_named("npu").status();
  EXPECT_TRUE(contains(no_backend.message(), "backend = 'npu'") && contains(no_backend.message(), "sim"))
      << no_backend.message();
}

TEST(Seams, ARuntimeRefusesABackendWithoutHostMappedMemoryNamingBoth) {
  for (const RuntimeInfo* r : registered_runtimes()) {
    const std::string name = r->name;
    UnmappedDevice device;
    auto created = r->create(device, RuntimeOptions{64, {}},
                             [](uint32_t, RunOutcome) { ADD_FAILURE() << "a refused runtime reported a run"; });
    ASSERT_FALSE(created.ok()) << name;
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(created.status().message(), std::string("runtime = '") + name + "'") &&
                contains(created.status().message(), "backend 'unmapped'"))
        << created.status().message();
  }
}

TEST(Seams, EveryRuntimeRefusesAnOutOfRangeTaskCapacity) {
  for (const RuntimeInfo* r : registered_runtimes()) {
    auto device = (*backend_named("sim"))->create(DeviceOptions{Geometry::small(), 1 << 20});
    ASSERT_TRUE(device.ok());
    for (uint32_t bad : {0u, (1u << 24) + 1}) {
      auto created = r->create(**device, RuntimeOptions{bad, {}}, [](uint32_t, RunOutcome) {});
      EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << r->name << " " << bad;
      EXPECT_TRUE(contains(created.status().message(), "max_tasks_per_run")) << created.status().message();
    }
  }
}

}  // namespace
}  // namespace simpler
