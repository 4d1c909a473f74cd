// A hand-written orchestration entry (no SIMPLER_ORCHESTRATION) that breaks
// the C boundary's contract the way its one run arg, a scalar, selects, so
// the loading side's checks have something to refuse.
#include <simpler/orchestration.h>

#include <cstring>
#include <stdexcept>

extern "C" __attribute__((visibility("default"))) int32_t orchestration_entry(simpler::ChipOrchestrator*,
                                                                              const simpler::TaskArgs* run_args,
                                                                              char* message, size_t capacity) {
  switch ((*run_args)[0].scalar) {
    case 0:
      return 200;
    case 1:
      return -1;
    case 2:
      std::memset(message, 'x', capacity);
      return static_cast<int32_t>(simpler::StatusCode::kInvalidArgument);
    case 3:
      throw std::runtime_error("rogue_orchestration: thrown through the C boundary");
    default:
      std::snprintf(message, capacity, "rogue_orchestration: a well-formed error");
      return static_cast<int32_t>(simpler::StatusCode::kOutOfRange);
  }
}
