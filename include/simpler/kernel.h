// The kernel ABI: what a kernel sees. A kernel is
//   SIMPLER_KERNEL void kernel_entry(int64_t* args) { ... }
// run by one simulated core thread at a time. args[i] is either a pointer to a
// DeviceTensor in device memory or a raw 64-bit scalar, in the task's order.
// A kernel reports failure with simpler_kernel_fail (first call wins) and returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// Declares the kernel's entry point as the symbol KernelLibrary::add_file looks
// up: unmangled, and exported even though simpler_add_kernel builds kernels with
// hidden visibility (so a kernel's helpers never clash with the host's).
#define SIMPLER_KERNEL extern "C" __attribute__((visibility("default")))

namespace simpler {

// The descriptor a tensor argument points at. Fixed layout, shared by the host
// runtime (which writes it into device memory) and kernels (which read it).
struct DeviceTensor {
  uint64_t data;   // device address of element [0, 0, ...] of the view
  uint32_t dtype;  // simpler::DType
  uint32_t ndim;
  int64_t shape[5];
  int64_t stride[5];  // in elements
};
static_assert(sizeof(DeviceTensor) == 96, "DeviceTensor is part of the kernel ABI");
static_assert(offsetof(DeviceTensor, shape) == 16, "DeviceTensor is part of the kernel ABI");

template <typename T>
inline T* tensor_data(const DeviceTensor* t) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(t->data));
}
inline const DeviceTensor* tensor_arg(const int64_t* args, int i) {
  return reinterpret_cast<const DeviceTensor*>(static_cast<uintptr_t>(args[i]));
}
inline float scalar_f32(int64_t raw) {
  float f;
  uint32_t bits = static_cast<uint32_t>(raw);
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline double scalar_f64(int64_t raw) {
  double d;
  std::memcpy(&d, &raw, sizeof d);
  return d;
}

}  // namespace simpler

extern "C" {
typedef void (*simpler_kernel_fn)(int64_t* args);
// Marks the calling core's current task as failed with `message` (copied,
// truncated to 255 bytes). Only meaningful on a core thread inside a kernel.
void simpler_kernel_fail(const char* message);
// The block of an SPMD task (submit_aiv_spmd) the calling kernel runs, and
// how many blocks the task has: 0 and 1 for an ordinary task.
uint32_t simpler_block_index(void);
uint32_t simpler_block_num(void);
}
