// End-to-end tests of a chip-level Worker on the small simulated geometry.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "simpler/simpler.h"

using namespace simpler;
using namespace std::chrono_literals;

namespace {

extern "C" void add_kernel(int64_t* args) {
  auto* a = tensor_arg(args, 0);
  auto* b = tensor_arg(args, 1);
  auto* c = tensor_arg(args, 2);
  const int64_t n = a->shape[0];
  for (int64_t i = 0; i < n; ++i) tensor_data<float>(c)[i] = tensor_data<float>(a)[i] + tensor_data<float>(b)[i];
}

TEST(WorkerTest, VectorAddMatchesHost) {
  KernelLibrary k;
  ASSERT_TRUE(k.add_function(0, CoreType::AIV, "add_kernel", add_kernel).ok());
  Worker w(Level::Chip);
  auto h = w.register_callable(
      ChipCallable("vadd", [](ChipOrchestrator& o, const TaskArgs& a) { return o.submit_aiv(0, a).status(); }, k,
                   {Param::input(), Param::input(), Param::output()}));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(w.init().ok());
  const int n = 1024;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = i;
    b[i] = 2 * i;
  }
  auto da = w.malloc(n * 4), db = w.malloc(n * 4), dc = w.malloc(n * 4);
  ASSERT_TRUE(da.ok() && db.ok() && dc.ok());
  ASSERT_TRUE(w.copy_to(*da, a.data(), n * 4).ok());
  ASSERT_TRUE(w.copy_to(*db, b.data(), n * 4).ok());
  TaskArgs args;
  args.add_tensor(da->view({n}, DType::F32), Tag::Input)
      .add_tensor(db->view({n}, DType::F32), Tag::Input)
      .add_tensor(dc->view({n}, DType::F32), Tag::OutputExisting);
  RunHandle r = w.submit(*h, args);
  Status s = r.wait_for(10s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(w.copy_from(c.data(), *dc, n * 4).ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(c[i], 3.0f * i);
  EXPECT_TRUE(w.close().ok());
}

}  // namespace
