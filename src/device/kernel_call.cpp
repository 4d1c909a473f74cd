#include "device/kernel_call.h"

#include <cstring>
#include <exception>

namespace {
// The record of the kernel running on this thread, so simpler_kernel_fail
// needs no argument; null outside a kernel.
thread_local simpler::KernelFailure* tls_failure = nullptr;

void record_failure(simpler::KernelFailure* f, const char* message) {
  if (f->failed) return;  // the first report wins
  f->failed = true;
  std::strncpy(f->message, message != nullptr ? message : "(no message)", simpler::kKernelErrorBytes - 1);
  f->message[simpler::kKernelErrorBytes - 1] = '\0';
}
}  // namespace

extern "C" void simpler_kernel_fail(const char* message) {
  if (tls_failure != nullptr) record_failure(tls_failure, message);
}

namespace simpler {

bool call_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure) {
  failure.failed = false;  // the message is read only when failed is set
  KernelFailure* const outer = tls_failure;
  tls_failure = &failure;
  try {
    fn(args);
  } catch (const std::exception& e) {
    record_failure(&failure, e.what());
  } catch (...) {
    record_failure(&failure, "kernel threw a non-standard exception");
  }
  tls_failure = outer;
  return !failure.failed;
}

}  // namespace simpler
