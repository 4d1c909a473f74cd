// PipelineContract: the run-resource depths a worker is asked to serve, and
// the one check of them that every level shares (ChipWorker::create and its
// regrant, RunResourceArena, NodeWorker::validate). Plain values and a pure
// function: any thread; owns nothing.
#pragma once

#include <cstdint>

#include "simpler/status.h"
#include "simpler/worker_config.h"

namespace simpler {

// The runtime's program contract: it serves any depth from 1 up and declares
// no upper limit of its own (R73). What does bound a depth is a resource, and
// each is checked where it lives: the mailbox cap (R69) at the node, graph
// arenas against device memory in ChipWorker::create.
//
// The kernel contract is separate: a chip callable written for an unconfigured
// Worker is served WorkerConfig's default depth (2, launch_depth = depth).
// That default is asserted by its own test and is not a limit here (R71, R73).
struct PipelineContract {
  uint32_t pipeline_depth = 0;  // run-resource sets: runs admitted at once
  uint32_t launch_depth = 0;    // runs launched at once; 0 = pipeline_depth
};

inline PipelineContract program_contract(const WorkerConfig& config) {
  return PipelineContract{config.pipeline_depth, config.launch_depth};
}

// Refuses a depth of 0 and a launch_depth above the depth (a launched run
// holds a set), naming the field; checks no upper depth.
Status is_valid_pipeline_contract(const PipelineContract& contract);

}  // namespace simpler
