// AIC kernel: s = q·kᵀ over u32 tiles, wrapping mod 2^32 (args: q [t, d],
// k [t, d], s [t, t]).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* q = simpler::tensor_arg(args, 0);
  const DeviceTensor* k = simpler::tensor_arg(args, 1);
  const DeviceTensor* s = simpler::tensor_arg(args, 2);
  const int64_t rows = q->shape[0], cols = k->shape[0], d = q->shape[1];
  if (k->shape[1] != d || s->shape[0] != rows || s->shape[1] != cols) {
    simpler_kernel_fail("attention_stream score: tile shapes do not chain");
    return;
  }
  const uint32_t* pq = simpler::tensor_data<uint32_t>(q);
  const uint32_t* pk = simpler::tensor_data<uint32_t>(k);
  uint32_t* ps = simpler::tensor_data<uint32_t>(s);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      uint32_t acc = 0;
      for (int64_t x = 0; x < d; ++x)
        acc += pq[i * q->stride[0] + x * q->stride[1]] * pk[j * k->stride[0] + x * k->stride[1]];
      ps[i * s->stride[0] + j * s->stride[1]] = acc;
    }
  }
}
