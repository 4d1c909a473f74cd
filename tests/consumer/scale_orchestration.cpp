#include <simpler/orchestration.h>

// One task of the scale kernel (func_id 0) over the run's own arguments.
simpler::Status scale(simpler::ChipOrchestrator& o, const simpler::TaskArgs& a) { return o.submit_aiv(0, a).status(); }
SIMPLER_ORCHESTRATION(scale)
