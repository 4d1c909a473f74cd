// Test kernel built with simpler_add_kernel: x *= factor over a 1-D f32 view
// (args: x inout, factor as an f32 scalar). A negative factor fails the task
// through simpler_kernel_fail, leaving x unchanged.
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  const simpler::DeviceTensor* x = simpler::tensor_arg(args, 0);
  const float factor = simpler::scalar_f32(args[1]);
  if (factor < 0.f) {
    simpler_kernel_fail("scale_kernel: factor is negative");
    return;
  }
  float* p = simpler::tensor_data<float>(x);
  for (int64_t i = 0; i < x->shape[0]; ++i) p[i * x->stride[0]] *= factor;
}
