#include <simpler/kernel.h>

// x[i] *= s, with s an f32 scalar; fails on an empty tensor to exercise the ABI.
SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  const simpler::DeviceTensor* x = simpler::tensor_arg(args, 0);
  const float s = simpler::scalar_f32(args[1]);
  if (x->shape[0] == 0) {
    simpler_kernel_fail("scale_kernel: empty tensor");
    return;
  }
  for (int64_t i = 0; i < x->shape[0]; ++i) simpler::tensor_data<float>(x)[i] *= s;
}
