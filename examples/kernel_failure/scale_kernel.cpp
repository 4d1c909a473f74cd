// AIV kernel: z = factor * y over 1-D f32 views (args: y, z, factor as f32 bits).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* y = simpler::tensor_arg(args, 0);
  const DeviceTensor* z = simpler::tensor_arg(args, 1);
  const float factor = simpler::scalar_f32(args[2]);
  const float* py = simpler::tensor_data<float>(y);
  float* pz = simpler::tensor_data<float>(z);
  for (int64_t i = 0; i < z->shape[0]; ++i) pz[i * z->stride[0]] = factor * py[i * y->stride[0]];
}
