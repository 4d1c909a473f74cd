// AIV kernel: x[i, j] += bias[0, j] over a strided 2-D f32 tile (args: x, bias).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* x = simpler::tensor_arg(args, 0);
  const DeviceTensor* bias = simpler::tensor_arg(args, 1);
  if (bias->shape[1] != x->shape[1]) {
    simpler_kernel_fail("bias_add: bias width differs from the tile's");
    return;
  }
  float* px = simpler::tensor_data<float>(x);
  const float* pb = simpler::tensor_data<float>(bias);
  for (int64_t i = 0; i < x->shape[0]; ++i) {
    for (int64_t j = 0; j < x->shape[1]; ++j) px[i * x->stride[0] + j * x->stride[1]] += pb[j * bias->stride[1]];
  }
}
