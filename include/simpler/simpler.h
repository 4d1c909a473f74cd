// Umbrella header of simpler's public API. Include this and link simpler::simpler.
#pragma once

#include "simpler/call_config.h"
#include "simpler/callable.h"
#include "simpler/kernel.h"
#include "simpler/orchestration.h"
#include "simpler/orchestrator.h"
#include "simpler/remote.h"
#include "simpler/run_handle.h"
#include "simpler/status.h"
#include "simpler/task_args.h"
#include "simpler/tensor.h"
#include "simpler/types.h"
#include "simpler/version.h"
#include "simpler/worker.h"
#include "simpler/worker_config.h"
