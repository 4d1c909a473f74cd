// AIV kernel: y = sqrt(x) over 1-D f32 views (args: x, y). A negative input
// fails the task with a message naming the element, leaving y unwritten.
#include <cmath>
#include <cstdio>

#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* x = simpler::tensor_arg(args, 0);
  const DeviceTensor* y = simpler::tensor_arg(args, 1);
  const float* px = simpler::tensor_data<float>(x);
  float* py = simpler::tensor_data<float>(y);
  for (int64_t i = 0; i < x->shape[0]; ++i) {
    const float v = px[i * x->stride[0]];
    if (v < 0.f) {
      char message[128];
      std::snprintf(message, sizeof message, "checked_sqrt: x[%lld] = %g is negative", static_cast<long long>(i),
                    static_cast<double>(v));
      simpler_kernel_fail(message);
      return;
    }
  }
  for (int64_t i = 0; i < x->shape[0]; ++i) py[i * y->stride[0]] = std::sqrt(px[i * x->stride[0]]);
}
