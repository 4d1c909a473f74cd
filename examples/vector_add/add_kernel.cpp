// AIV kernel: c = a + b over 1-D f32 views (args: a, b, c).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* a = simpler::tensor_arg(args, 0);
  const DeviceTensor* b = simpler::tensor_arg(args, 1);
  const DeviceTensor* c = simpler::tensor_arg(args, 2);
  if (a->shape[0] != c->shape[0] || b->shape[0] != c->shape[0]) {
    simpler_kernel_fail("vector_add: a, b and c differ in length");
    return;
  }
  const float* pa = simpler::tensor_data<float>(a);
  const float* pb = simpler::tensor_data<float>(b);
  float* pc = simpler::tensor_data<float>(c);
  for (int64_t i = 0; i < c->shape[0]; ++i) {
    pc[i * c->stride[0]] = pa[i * a->stride[0]] + pb[i * b->stride[0]];
  }
}
