// AIC kernel: o = p·v (first != 0) or o = 3·o + p·v (first == 0), u32
// wrapping mod 2^32 (args: p [t, t], v [t, d], o [t, d], first). The factor
// makes the result depend on the order of the steps, not only on their sum.
#include <simpler/kernel.h>

SIMPLER_KERNEL void kernel_entry(int64_t* args) {
  using simpler::DeviceTensor;
  const DeviceTensor* p = simpler::tensor_arg(args, 0);
  const DeviceTensor* v = simpler::tensor_arg(args, 1);
  const DeviceTensor* o = simpler::tensor_arg(args, 2);
  const bool first = args[3] != 0;
  const int64_t rows = p->shape[0], inner = p->shape[1], d = v->shape[1];
  if (v->shape[0] != inner || o->shape[0] != rows || o->shape[1] != d) {
    simpler_kernel_fail("attention_stream accumulate: tile shapes do not chain");
    return;
  }
  const uint32_t* pp = simpler::tensor_data<uint32_t>(p);
  const uint32_t* pv = simpler::tensor_data<uint32_t>(v);
  uint32_t* po = simpler::tensor_data<uint32_t>(o);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      uint32_t acc = 0;
      for (int64_t x = 0; x < inner; ++x)
        acc += pp[i * p->stride[0] + x * p->stride[1]] * pv[x * v->stride[0] + j * v->stride[1]];
      uint32_t& out = po[i * o->stride[0] + j * o->stride[1]];
      out = first ? acc : 3u * out + acc;
    }
  }
}
