#include "chip/pipeline_contract.h"

#include "base/errors.h"

namespace simpler {

Status is_valid_pipeline_contract(const PipelineContract& c) {
  if (c.pipeline_depth == 0) return invalid_argument("pipeline_depth = 0: the grant must be at least 1");
  if (c.launch_depth > c.pipeline_depth) {
    return invalid_argument("launch_depth = {} exceeds pipeline_depth = {}: a launched run holds a set", c.launch_depth,
                            c.pipeline_depth);
  }
  return Status();
}

}  // namespace simpler
