// Orchestrations as shared objects (simpler_add_orchestration, load_orchestration):
// the loader's refusals, the C boundary's checks, identity by content, the
// lifetime of the loaded object, and runs of a loaded orchestration on every
// registered target (conformance.h).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "conformance.h"
#include "kernels.h"
#include "simpler/simpler.h"
#include "task/digest.h"
#include "test_util.h"

namespace simpler {
namespace {

using namespace testing;

enum Mode : int64_t { kCompute = 0, kRefuse = 1, kThrow = 2 };

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file of this process's own under the test temp dir, removed with the object.
struct TempFile {
  explicit TempFile(const std::string& stem, const std::string& bytes)
      : path(::testing::TempDir() + stem + "." + std::to_string(getpid()) + ".so") {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
  }
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path;
};

KernelLibrary scale_kernel() {
  KernelLibrary k;
  Status s = k.add_file(0, CoreType::AIV, SIMPLER_TEST_KERNEL);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return k;
}

Orchestration load_ok(const std::string& path) {
  Result<Orchestration> o = load_orchestration(path);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  return o.ok() ? std::move(o).value() : Orchestration{};
}

// The loaded orchestration goes out of scope here, so every run below also
// proves that the callable's copy of the function keeps the .so loaded.
ChipCallable scale_callable() {
  return ChipCallable("scale_twice", load_ok(SIMPLER_TEST_ORCHESTRATION), scale_kernel(),
                      {Param::inout(), Param::scalar(), Param::scalar()});
}

TaskArgs scale_args(DeviceBuffer x, int64_t n, float s, Mode mode) {
  TaskArgs a;
  a.add_tensor(x.view({n}, DType::F32), Tag::InOut).add_scalar_f32(s).add_scalar(mode);
  return a;
}

// ---- Loading --------------------------------------------------------------------------------------

TEST(OrchestrationLoad, AMissingFileIsNotFoundNamingThePath) {
  const std::string path = ::testing::TempDir() + "simpler_no_such_orchestration.so";
  Result<Orchestration> o = load_orchestration(path);
  ASSERT_FALSE(o.ok());
  EXPECT_REFUSED(o.status(), StatusCode::kNotFound, path);
  EXPECT_REFUSED(o.status(), StatusCode::kNotFound, "cannot be read");
}

TEST(OrchestrationLoad, AFileThatIsNotASharedObjectIsRefusedNamingThePath) {
  TempFile junk("simpler_not_an_orchestration", "this is text, not an ELF shared object\n");
  Result<Orchestration> o = load_orchestration(junk.path);
  ASSERT_FALSE(o.ok());
  EXPECT_REFUSED(o.status(), StatusCode::kInvalidArgument, junk.path);
  EXPECT_REFUSED(o.status(), StatusCode::kInvalidArgument, "not a loadable shared object");
}

TEST(OrchestrationLoad, ASharedObjectWithoutTheEntryIsRefusedNamingThePath) {
  Result<Orchestration> o = load_orchestration(SIMPLER_TEST_KERNEL);
  ASSERT_FALSE(o.ok());
  EXPECT_REFUSED(o.status(), StatusCode::kInvalidArgument, SIMPLER_TEST_KERNEL);
  EXPECT_REFUSED(o.status(), StatusCode::kInvalidArgument, "exports no orchestration_entry symbol");
}

TEST(OrchestrationLoad, TheContentDigestIsTheSha256OfTheFileBytes) {
  const std::string bytes = read_bytes(SIMPLER_TEST_ORCHESTRATION);
  Orchestration o = load_ok(SIMPLER_TEST_ORCHESTRATION);
  EXPECT_EQ(o.path, SIMPLER_TEST_ORCHESTRATION);
  EXPECT_EQ(digest_hex(o.content), digest_hex(sha256(bytes.data(), bytes.size())));
  ChipCallable c("c", o, KernelLibrary{}, {});
  ASSERT_TRUE(c.orchestration_content().has_value());
  EXPECT_EQ(*c.orchestration_content(), o.content);
}

// The shared object stays loaded while any copy of the function lives and is
// unloaded with the last one (RTLD_NOLOAD finds only a loaded object).
TEST(OrchestrationLoad, TheSharedObjectStaysLoadedExactlyAsLongAsACopyOfTheFunction) {
  const auto loaded = [] {
    void* h = dlopen(SIMPLER_TEST_ROGUE_ORCHESTRATION, RTLD_NOW | RTLD_NOLOAD);
    if (h != nullptr) dlclose(h);
    return h != nullptr;
  };
  ASSERT_FALSE(loaded()) << "another test of this process left the rogue orchestration loaded";
  OrchestrationFn copy;
  {
    Orchestration o = load_ok(SIMPLER_TEST_ROGUE_ORCHESTRATION);
    copy = o.fn;
  }
  EXPECT_TRUE(loaded()) << "the .so was unloaded while a copy of its function lived";
  copy = nullptr;
  EXPECT_FALSE(loaded()) << "the .so stayed loaded after the last copy of its function died";
}

// ---- Identity -------------------------------------------------------------------------------------

TEST(OrchestrationIdentity, TheCallableDigestFollowsTheSharedObjectsBytesNotItsPath) {
  const std::vector<Param> sig{Param::inout(), Param::scalar(), Param::scalar()};
  const std::string bytes = read_bytes(SIMPLER_TEST_ORCHESTRATION);
  TempFile same("simpler_orchestration_copy", bytes);
  // A trailing byte changes the file, not what the dynamic loader maps.
  TempFile changed("simpler_orchestration_changed", bytes + '\n');

  const auto loaded_digest = [&](const std::string& path) {
    return digest_hex(ChipCallable("c", load_ok(path), scale_kernel(), sig).digest());
  };
  const std::string base = loaded_digest(SIMPLER_TEST_ORCHESTRATION);
  EXPECT_EQ(loaded_digest(same.path), base);
  EXPECT_NE(loaded_digest(changed.path), base);
  EXPECT_NE(loaded_digest(SIMPLER_TEST_ROGUE_ORCHESTRATION), base);
  const OrchestrationFn in_process = load_ok(SIMPLER_TEST_ORCHESTRATION).fn;
  EXPECT_NE(digest_hex(ChipCallable("c", in_process, scale_kernel(), sig).digest()), base)
      << "an in-process callable has the digest of the loaded one it was copied from";
}

// An in-process callable keeps the digest it had before orchestrations could
// be loaded (the value is that of commit 7b2fd92).
TEST(OrchestrationIdentity, AnInProcessCallableKeepsItsDigest) {
  KernelLibrary lib;
  ASSERT_TRUE(lib.add_function(
                     0, CoreType::AIV, "golden_kernel", +[](int64_t*) {})
                  .ok());
  ChipCallable c("golden", [](ChipOrchestrator&, const TaskArgs&) { return Status(); }, lib,
                 {Param::inout().with_dtype(DType::F32).with_shape({-1, 4}), Param::scalar()});
  EXPECT_FALSE(c.orchestration_content().has_value());
  EXPECT_EQ(digest_hex(c.digest()), "ee862f2a8e7c1bd7122e18ecf205c5317a3da44856a14a2c74fc09ed5af670c1");
}

// ---- Runs on every target -------------------------------------------------------------------------

class LoadedOrchestration : public TargetTest {};

TEST_P(LoadedOrchestration, ARunComputesTheKernelTasksResult) {
  Watchdog dog;
  Harness hw(scale_callable(), config());
  constexpr int64_t kN = 300;
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>(i) - 7.0f;
  DeviceBuffer d = upload(hw.w, x);
  Status s = hw.run(scale_args(d, kN, 1.5f, kCompute));
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::vector<float> got = download<float>(hw.w, d, kN);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], x[i] * 1.5f * 1.5f) << "element " << i;
  EXPECT_TRUE(hw.w.close().ok());
}

TEST_P(LoadedOrchestration, ItsReturnedErrorIsTheRunsResultWithItsCodeAndMessage) {
  Watchdog dog;
  Harness hw(scale_callable(), config());
  std::vector<float> x(16, 1.0f);
  DeviceBuffer d = upload(hw.w, x);
  Status s = hw.run(scale_args(d, 16, 2.0f, kRefuse));
  EXPECT_REFUSED(s, StatusCode::kInvalidArgument, "scale_orchestration: mode 1 refuses the run");
  EXPECT_REFUSED(s, StatusCode::kInvalidArgument, SIMPLER_TEST_ORCHESTRATION);
  EXPECT_EQ(download<float>(hw.w, d, 16), x) << "a refused run launched a task";
  ASSERT_TRUE(hw.run(scale_args(d, 16, 2.0f, kCompute)).ok()) << "the worker did not serve the next run";
  EXPECT_TRUE(hw.w.close().ok());
}

TEST_P(LoadedOrchestration, AnExceptionInsideTheSharedObjectBecomesUserCodeFailed) {
  Watchdog dog;
  Harness hw(scale_callable(), config());
  std::vector<float> x(16, 1.0f);
  DeviceBuffer d = upload(hw.w, x);
  Status s = hw.run(scale_args(d, 16, 2.0f, kThrow));
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, "orchestration threw: scale_orchestration: thrown on purpose");
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, SIMPLER_TEST_ORCHESTRATION);
  EXPECT_TRUE(hw.w.close().ok());
}

SIMPLER_ON_EVERY_TARGET(LoadedOrchestration);

// ---- The C boundary: a hand-written entry that breaks its contract ----------------------------------

Status run_rogue(int64_t mode) {
  Harness hw(ChipCallable("rogue", load_ok(SIMPLER_TEST_ROGUE_ORCHESTRATION), KernelLibrary{}, {Param::scalar()}));
  TaskArgs a;
  a.add_scalar(mode);
  Status s = hw.run(a);
  EXPECT_TRUE(hw.w.close().ok());
  return s;
}

TEST(OrchestrationBoundary, ACodeAboveTheStatusCodesIsRefusedNamingThePath) {
  Watchdog dog;
  Status s = run_rogue(0);
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, "returned 200, which is no status code");
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, SIMPLER_TEST_ROGUE_ORCHESTRATION);
}

TEST(OrchestrationBoundary, ANegativeCodeIsRefused) {
  Watchdog dog;
  EXPECT_REFUSED(run_rogue(1), StatusCode::kUserCodeFailed, "returned -1, which is no status code");
}

TEST(OrchestrationBoundary, AnUnterminatedMessageIsRefusedUnread) {
  Watchdog dog;
  Status s = run_rogue(2);
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, "returned INVALID_ARGUMENT with a message not NUL-terminated");
  EXPECT_EQ(s.message().find("xxxx"), std::string::npos) << s.to_string();
}

TEST(OrchestrationBoundary, AnExceptionThroughTheEntryPointIsCaughtAtTheBoundary) {
  Watchdog dog;
  Status s = run_rogue(3);
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, "let an exception escape its entry point");
  EXPECT_REFUSED(s, StatusCode::kUserCodeFailed, "rogue_orchestration: thrown through the C boundary");
}

TEST(OrchestrationBoundary, AWellFormedErrorPassesWithItsCode) {
  Watchdog dog;
  EXPECT_REFUSED(run_rogue(4), StatusCode::kOutOfRange, "rogue_orchestration: a well-formed error");
}

}  // namespace
}  // namespace simpler
