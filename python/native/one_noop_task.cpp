// The native orchestration python3 -m simpler.bench drives from Python for
// py_l2_latency: one no-op AIV task (func_id 0), as bench/harness.cpp's
// one_noop_task, built as a shared object so that what is measured is
// Python's submit and wait, not a Python orchestration. Runs on the thread
// that builds the run; owns nothing.
#include <simpler/orchestration.h>

namespace {

simpler::Status one_noop_task(simpler::ChipOrchestrator& o, const simpler::TaskArgs& /*run_args*/) {
  return o.submit_aiv(0, simpler::TaskArgs{}).status();
}

}  // namespace

SIMPLER_ORCHESTRATION(one_noop_task)
