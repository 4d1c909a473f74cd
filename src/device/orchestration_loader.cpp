#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "base/errors.h"
#include "simpler/callable.h"
#include "simpler/orchestration.h"
#include "task/digest.h"

namespace simpler {
namespace {

// Room for any message an orchestration writes; a longer one is truncated by
// SIMPLER_ORCHESTRATION and refused when a hand-written entry leaves it unterminated.
constexpr size_t kMessageCapacity = 1024;

// The C boundary's other side: the entry's code and message become a Status,
// and whatever breaks the contract becomes a USER_CODE_FAILED naming the path.
Status call_entry(simpler_orchestration_fn entry, const std::string& path, ChipOrchestrator& o,
                  const TaskArgs& run_args) {
  char message[kMessageCapacity] = {};
  int32_t code = 0;
  try {
    code = entry(&o, &run_args, message, sizeof message);
  } catch (const std::exception& e) {
    return user_code_failed("orchestration '{}' let an exception escape its entry point: {}", path, e.what());
  } catch (...) {
    return user_code_failed("orchestration '{}' let a non-standard exception escape its entry point", path);
  }
  if (!is_status_code(code)) {
    return user_code_failed("orchestration '{}' returned {}, which is no status code (0..{})", path, code,
                            static_cast<int>(StatusCode::kDeviceFault));
  }
  if (code == 0) return Status();
  if (std::memchr(message, '\0', sizeof message) == nullptr) {
    return user_code_failed("orchestration '{}' returned {} with a message not NUL-terminated within {} bytes", path,
                            status_code_name(static_cast<StatusCode>(code)), sizeof message);
  }
  return Status(static_cast<StatusCode>(code), fmt::format("orchestration '{}': {}", path, message));
}

}  // namespace

Result<Orchestration> load_orchestration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("orchestration file '{}' cannot be read: {}", path, std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return not_found("orchestration file '{}' cannot be read: {}", path, std::strerror(errno));
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    return invalid_argument("orchestration file '{}' is not a loadable shared object: {}", path, dlerror());
  }
  std::shared_ptr<void> handle(h, [](void* p) { dlclose(p); });
  auto entry = reinterpret_cast<simpler_orchestration_fn>(dlsym(h, kOrchestrationEntrySymbol));
  if (entry == nullptr) {
    return invalid_argument("orchestration file '{}' exports no {} symbol (declare it with SIMPLER_ORCHESTRATION)",
                            path, kOrchestrationEntrySymbol);
  }
  Orchestration out;
  out.path = path;
  out.content = sha256(bytes.data(), bytes.size());
  out.fn = [handle = std::move(handle), entry, path](ChipOrchestrator& o, const TaskArgs& run_args) {
    return call_entry(entry, path, o, run_args);
  };
  return out;
}

}  // namespace simpler
