#include "device/kernel_call.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <mutex>

namespace {
// The record of the kernel running on this thread, so simpler_kernel_fail
// needs no argument; null outside a kernel. Initial-exec: the crash reporter
// reads them in a signal handler, where no lazy TLS allocation may happen.
thread_local simpler::KernelFailure* tls_failure __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local const simpler::KernelLabel* tls_label __attribute__((tls_model("initial-exec"))) = nullptr;

void record_failure(simpler::KernelFailure* f, const char* message) {
  if (f->failed) return;  // the first report wins
  f->failed = true;
  std::strncpy(f->message, message != nullptr ? message : "(no message)", simpler::kKernelErrorBytes - 1);
  f->message[simpler::kKernelErrorBytes - 1] = '\0';
}

// Async-signal-safe text building for the crash line.
struct Line {
  char buf[512];
  size_t n = 0;
  void add(const char* s) {
    while (*s != '\0' && n < sizeof buf - 1) buf[n++] = *s++;
  }
  void add(uint64_t v) {
    char digits[20];
    int k = 0;
    do {
      digits[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (k > 0 && n < sizeof buf - 1) buf[n++] = digits[--k];
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
  }
  return "a fatal signal";
}

void report_crash(int sig) {
  if (const simpler::KernelLabel* label = tls_label) {
    Line line;
    line.add("simpler: ");
    line.add(signal_name(sig));
    line.add(" in kernel '");
    line.add(label->name != nullptr ? label->name : "?");
    line.add("' (func_id ");
    line.add(label->func_id);
    line.add(") of task ");
    line.add(label->task);
    line.add(": a kernel on a Level::Chip worker runs in this process; run it under Level::Node to isolate it\n");
    (void)!write(STDERR_FILENO, line.buf, line.n);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

extern "C" uint32_t simpler_block_index(void) { return tls_label != nullptr ? tls_label->block : 0; }

extern "C" uint32_t simpler_block_num(void) { return tls_label != nullptr ? tls_label->blocks : 1; }

extern "C" void simpler_kernel_fail(const char* message) {
  if (tls_failure != nullptr) record_failure(tls_failure, message);
}

namespace simpler {

bool call_kernel(simpler_kernel_fn fn, int64_t* args, KernelFailure& failure, const KernelLabel& label) {
  failure.failed = false;  // the message is read only when failed is set
  KernelFailure* const outer = tls_failure;
  const KernelLabel* const outer_label = tls_label;
  tls_failure = &failure;
  tls_label = &label;
  try {
    fn(args);
  } catch (const std::exception& e) {
    record_failure(&failure, e.what());
  } catch (...) {
    record_failure(&failure, "kernel threw a non-standard exception");
  }
  tls_failure = outer;
  tls_label = outer_label;
  return !failure.failed;
}

void install_kernel_crash_reporter() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
      struct sigaction current {};
      if (sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
          (current.sa_flags & SA_SIGINFO) != 0) {
        continue;  // the program (or a sanitizer) handles it already
      }
      struct sigaction sa {};
      sa.sa_handler = &report_crash;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESETHAND;
      sigaction(sig, &sa, nullptr);
    }
  });
}

}  // namespace simpler
