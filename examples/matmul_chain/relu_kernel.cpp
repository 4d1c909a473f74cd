// AIV kernel: y = max(x, 0) over strided 2-D f32 tiles of equal shape (args: x, y).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* x = simpler::tensor_arg(args, 0);
  const DeviceTensor* y = simpler::tensor_arg(args, 1);
  if (x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1]) {
    simpler_kernel_fail("relu: x and y differ in shape");
    return;
  }
  const float* px = simpler::tensor_data<float>(x);
  float* py = simpler::tensor_data<float>(y);
  for (int64_t i = 0; i < x->shape[0]; ++i) {
    for (int64_t j = 0; j < x->shape[1]; ++j) {
      const float v = px[i * x->stride[0] + j * x->stride[1]];
      py[i * y->stride[0] + j * y->stride[1]] = v > 0.f ? v : 0.f;
    }
  }
}
