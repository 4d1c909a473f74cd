// The suite's orchestration shared object, built with simpler_add_orchestration.
// Run args: x (an f32 tensor, InOut), s (an f32 scalar), mode (a scalar).
// Mode 0 submits x *= s twice, as two tasks of the scale kernel (func_id 0);
// mode 1 refuses the run with an error; mode 2 throws.
#include <simpler/orchestration.h>

#include <stdexcept>

namespace {

simpler::Status scale_twice(simpler::ChipOrchestrator& o, const simpler::TaskArgs& run_args) {
  const uint64_t mode = run_args[2].scalar;
  if (mode == 1) {
    return simpler::Status(simpler::StatusCode::kInvalidArgument, "scale_orchestration: mode 1 refuses the run");
  }
  if (mode == 2) throw std::runtime_error("scale_orchestration: thrown on purpose");
  simpler::TaskArgs t;
  t.add_tensor(run_args[0].tensor, simpler::Tag::InOut).add_scalar_u64(run_args[1].scalar);
  for (int i = 0; i < 2; ++i) {
    if (auto r = o.submit_aiv(0, t); !r.ok()) return r.status();
  }
  return simpler::Status();
}

}  // namespace

SIMPLER_ORCHESTRATION(scale_twice)
