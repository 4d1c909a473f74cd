// AIV kernel: softmax's numerator in integers, p = 128 >> min(7, (m - s) / 128):
// a power of two falling with the distance from the row's max, so every
// weight is exact (args: s [t, t], m [t, 1], p [t, t], all u32).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* s = simpler::tensor_arg(args, 0);
  const DeviceTensor* m = simpler::tensor_arg(args, 1);
  const DeviceTensor* p = simpler::tensor_arg(args, 2);
  const int64_t rows = s->shape[0], cols = s->shape[1];
  if (m->shape[0] != rows || m->shape[1] != 1 || p->shape[0] != rows || p->shape[1] != cols) {
    simpler_kernel_fail("attention_stream weight: m must be [rows, 1] and p the shape of s");
    return;
  }
  const uint32_t* ps = simpler::tensor_data<uint32_t>(s);
  const uint32_t* pm = simpler::tensor_data<uint32_t>(m);
  uint32_t* pp = simpler::tensor_data<uint32_t>(p);
  for (int64_t i = 0; i < rows; ++i) {
    const uint32_t row_max = pm[i * m->stride[0]];
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t v = ps[i * s->stride[0] + j * s->stride[1]];
      if (v > row_max) {
        // Only a stale or wrong row max can be below an element of its row.
        simpler_kernel_fail("attention_stream weight: an element exceeds its row's max");
        return;
      }
      const uint32_t shift = (row_max - v) / 128;
      pp[i * p->stride[0] + j * p->stride[1]] = 128u >> (shift < 7 ? shift : 7);
    }
  }
}
