// In-process test kernels shared by the runtime and refusal tests, and a tiny
// harness that opens a chip Worker with one callable. Kernels run on simulated
// core threads; the probes they use are process-wide atomics reset per test.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "simpler/simpler.h"
#include "test_util.h"

namespace simpler::testing {

// ---- Kernels -----------------------------------------------------------------------------------

// AIC: C = (args[3] ? C : 0) + A x B over 2-D f32 tiles (A: MxK, B: KxN, C: MxN).
inline void matmul_kernel(int64_t* args) {
  const DeviceTensor *a = tensor_arg(args, 0), *b = tensor_arg(args, 1), *c = tensor_arg(args, 2);
  const bool accumulate = args[3] != 0;
  for (int64_t i = 0; i < c->shape[0]; ++i) {
    for (int64_t j = 0; j < c->shape[1]; ++j) {
      float s = accumulate ? at2(c, i, j) : 0.f;
      for (int64_t k = 0; k < a->shape[1]; ++k) s += at2(a, i, k) * at2(b, k, j);
      at2(c, i, j) = s;
    }
  }
}

// AIV: C = max(C + bias[j], 0) over a 2-D f32 tile and a 1-D bias tile.
inline void bias_relu_kernel(int64_t* args) {
  const DeviceTensor *c = tensor_arg(args, 0), *bias = tensor_arg(args, 1);
  const float* pb = tensor_data<float>(bias);
  for (int64_t i = 0; i < c->shape[0]; ++i) {
    for (int64_t j = 0; j < c->shape[1]; ++j) at2(c, i, j) = std::max(at2(c, i, j) + pb[j * bias->stride[0]], 0.f);
  }
}

// Mix task (args: X, W, P, Q, s): the AIC subtask writes P = X x W; the two AIV
// subtasks write Q = X * s, rows [0, M/2) and [M/2, M) respectively.
inline void mix_aic_kernel(int64_t* args) {
  const DeviceTensor *x = tensor_arg(args, 0), *w = tensor_arg(args, 1), *p = tensor_arg(args, 2);
  for (int64_t i = 0; i < p->shape[0]; ++i) {
    for (int64_t j = 0; j < p->shape[1]; ++j) {
      float s = 0;
      for (int64_t k = 0; k < x->shape[1]; ++k) s += at2(x, i, k) * at2(w, k, j);
      at2(p, i, j) = s;
    }
  }
}
inline void scale_rows(int64_t* args, int64_t lo, int64_t hi) {
  const DeviceTensor *x = tensor_arg(args, 0), *q = tensor_arg(args, 3);
  const float s = scalar_f32(args[4]);
  for (int64_t i = lo; i < hi; ++i) {
    for (int64_t j = 0; j < q->shape[1]; ++j) at2(q, i, j) = at2(x, i, j) * s;
  }
}
inline void mix_aiv0_kernel(int64_t* args) { scale_rows(args, 0, tensor_arg(args, 3)->shape[0] / 2); }
inline void mix_aiv1_kernel(int64_t* args) {
  const int64_t m = tensor_arg(args, 3)->shape[0];
  scale_rows(args, m / 2, m);
}

// AIV: R = P + Q over 2-D f32 views.
inline void add2d_kernel(int64_t* args) {
  const DeviceTensor *p = tensor_arg(args, 0), *q = tensor_arg(args, 1), *r = tensor_arg(args, 2);
  for (int64_t i = 0; i < r->shape[0]; ++i) {
    for (int64_t j = 0; j < r->shape[1]; ++j) at2(r, i, j) = at2(p, i, j) + at2(q, i, j);
  }
}

// AIV: x = (x * 3 + args[1]) mod 1000003 over a 1-D i64 view (order-sensitive).
inline void affine_kernel(int64_t* args) {
  const DeviceTensor* x = tensor_arg(args, 0);
  int64_t* p = tensor_data<int64_t>(x);
  for (int64_t i = 0; i < x->shape[0]; ++i) {
    int64_t& v = p[i * x->stride[0]];
    v = (v * 3 + args[1]) % 1000003;
  }
}

// AIV: fill a 1-D i64 view with args[1].
inline void fill_kernel(int64_t* args) {
  const DeviceTensor* x = tensor_arg(args, 0);
  for (int64_t i = 0; i < x->shape[0]; ++i) tensor_data<int64_t>(x)[i * x->stride[0]] = args[1];
}

// AIV: copy a 1-D i64 view (args[0]) into another (args[1]).
inline void copy_kernel(int64_t* args) {
  const DeviceTensor *src = tensor_arg(args, 0), *dst = tensor_arg(args, 1);
  for (int64_t i = 0; i < src->shape[0]; ++i) {
    tensor_data<int64_t>(dst)[i * dst->stride[0]] = tensor_data<int64_t>(src)[i * src->stride[0]];
  }
}

// AIV: 1-D f32 out = in * args[2] + args[3] (f32 scalars).
inline void axpb_kernel(int64_t* args) {
  const DeviceTensor *in = tensor_arg(args, 0), *out = tensor_arg(args, 1);
  const float a = scalar_f32(args[2]), b = scalar_f32(args[3]);
  for (int64_t i = 0; i < in->shape[0]; ++i) {
    tensor_data<float>(out)[i * out->stride[0]] = tensor_data<float>(in)[i * in->stride[0]] * a + b;
  }
}

// AIV: fails with a message naming its scalar when args[1] < 0, else fills args[0] (i64) with args[1].
inline void check_kernel(int64_t* args) {
  if (args[1] < 0) {
    const std::string m = "check_kernel: value " + std::to_string(args[1]) + " is negative";
    simpler_kernel_fail(m.c_str());
    return;
  }
  fill_kernel(args);
}

// Rendezvous: each task arrives and waits (bounded) until args[1] tasks have
// arrived, i.e. are running at the same moment; fails its task otherwise. Then
// fills its args[0] (1-D or 2-D i64/f32 view, element-wise) with ones.
inline std::atomic<int> g_arrived{0};
inline void rendezvous_kernel(int64_t* args) {
  const int want = static_cast<int>(args[1]);
  g_arrived.fetch_add(1);
  if (!eventually([&] { return g_arrived.load() >= want; }, std::chrono::seconds(10))) {
    const std::string m = "rendezvous: only " + std::to_string(g_arrived.load()) + " of " + std::to_string(want) +
                          " tasks were running at once";
    simpler_kernel_fail(m.c_str());
    return;
  }
  const DeviceTensor* t = tensor_arg(args, 0);
  const int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
  const int64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
  const int64_t rs = t->ndim == 2 ? t->stride[0] : 0;
  const int64_t cs = t->ndim == 2 ? t->stride[1] : t->stride[0];
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) tensor_data<int64_t>(t)[i * rs + j * cs] = 1;
  }
}

// Exclusion probe: records the most tasks seen inside at once. Each task waits
// up to 100 ms for company, so two tasks without an edge between them are
// almost surely seen together; two with an edge never are.
inline std::atomic<int> g_inside{0};
inline std::atomic<int> g_max_inside{0};
inline void probe_kernel(int64_t*) {
  const int now = g_inside.fetch_add(1) + 1;
  int seen = g_max_inside.load();
  while (now > seen && !g_max_inside.compare_exchange_weak(seen, now)) {
  }
  eventually([] { return g_inside.load() >= 2; }, std::chrono::milliseconds(100));
  int m = g_max_inside.load();
  const int here = g_inside.load();
  while (here > m && !g_max_inside.compare_exchange_weak(m, here)) {
  }
  g_inside.fetch_sub(1);
}

// Gate: blocks (bounded, 30 s) until g_gate_open, then counts itself.
inline std::atomic<bool> g_gate_open{false};
inline std::atomic<int> g_gate_passed{0};
inline std::atomic<int> g_gate_entered{0};
inline void gate_kernel(int64_t*) {
  g_gate_entered.fetch_add(1);
  eventually([] { return g_gate_open.load(); });
  g_gate_passed.fetch_add(1);
}

// Counts its executions.
inline std::atomic<int> g_count{0};
inline void count_kernel(int64_t*) { g_count.fetch_add(1); }

// ---- Harness -----------------------------------------------------------------------------------

struct KernelSpec {
  uint32_t func_id;
  CoreType core;
  const char* name;
  simpler_kernel_fn fn;
};

inline KernelLibrary make_kernels(const std::vector<KernelSpec>& specs) {
  KernelLibrary k;
  for (const KernelSpec& s : specs) {
    Status st = k.add_function(s.func_id, s.core, s.name, s.fn);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return k;
}

// A chip Worker with one registered callable, initialised.
struct Harness {
  Harness(ChipCallable callable, WorkerConfig config = small_config()) : w(Level::Chip, config) {
    auto r = w.register_callable(std::move(callable));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) h = *r;
    Status s = w.init();
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  RunHandle submit(const TaskArgs& args = {}) { return w.submit(h, args); }
  Status run(const TaskArgs& args = {}) { return wait_run(submit(args)); }

  Worker w;
  CallableHandle h;
};

}  // namespace simpler::testing
