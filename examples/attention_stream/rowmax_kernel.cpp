// AIV kernel: m[i] = max over j of s[i, j], u32 (args: s [t, t], m [t, 1]).
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* s = simpler::tensor_arg(args, 0);
  const DeviceTensor* m = simpler::tensor_arg(args, 1);
  const int64_t rows = s->shape[0], cols = s->shape[1];
  if (m->shape[0] != rows || m->shape[1] != 1 || cols < 1) {
    simpler_kernel_fail("attention_stream rowmax: m must be [rows of s, 1]");
    return;
  }
  const uint32_t* ps = simpler::tensor_data<uint32_t>(s);
  uint32_t* pm = simpler::tensor_data<uint32_t>(m);
  for (int64_t i = 0; i < rows; ++i) {
    uint32_t best = ps[i * s->stride[0]];
    for (int64_t j = 1; j < cols; ++j) {
      const uint32_t v = ps[i * s->stride[0] + j * s->stride[1]];
      if (v > best) best = v;
    }
    pm[i * m->stride[0]] = best;
  }
}
