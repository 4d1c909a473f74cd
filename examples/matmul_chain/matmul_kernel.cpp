// AIC kernel: c = a·b (accumulate == 0) or c += a·b (accumulate != 0) over
// strided 2-D f32 tiles (args: a [m, k], b [k, n], c [m, n], accumulate).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* a = simpler::tensor_arg(args, 0);
  const DeviceTensor* b = simpler::tensor_arg(args, 1);
  const DeviceTensor* c = simpler::tensor_arg(args, 2);
  const bool accumulate = args[3] != 0;
  const int64_t m = c->shape[0], n = c->shape[1], k = a->shape[1];
  if (a->shape[0] != m || b->shape[0] != k || b->shape[1] != n) {
    simpler_kernel_fail("matmul: tile shapes do not chain");
    return;
  }
  const float* pa = simpler::tensor_data<float>(a);
  const float* pb = simpler::tensor_data<float>(b);
  float* pc = simpler::tensor_data<float>(c);
  for (int64_t i = 0; i < m; ++i) {
    float* row = pc + i * c->stride[0];
    for (int64_t j = 0; j < n; ++j) {
      if (!accumulate) row[j * c->stride[1]] = 0.f;
    }
    // i-k-j order streams rows of b and c; the sum over k runs in a fixed order,
    // so the host reference can follow it.
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = pa[i * a->stride[0] + kk * a->stride[1]];
      const float* brow = pb + kk * b->stride[0];
      for (int64_t j = 0; j < n; ++j) row[j * c->stride[1]] += av * brow[j * b->stride[1]];
    }
  }
}
