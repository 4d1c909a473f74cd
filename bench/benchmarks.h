// The benchmarks behind the registry. Each runs simpler and its peer in one
// process, from the calling thread, creating and closing its own Workers, and
// returns its figures as JSON (or the first error).
#pragma once

#include "harness.h"

namespace simpler::bench {

Result<Json> l2_latency();
Result<Json> runs_in_flight();
Result<Json> dispatch();
Result<Json> first_task();
Result<Json> scaling();
Result<Json> stream();
Result<Json> idle_cpu();
// Only in a build with the examples (swimlane.cpp runs matmul_chain).
Result<Json> swimlane();
Result<Json> native_run();
Result<Json> l3_sub_latency();
Result<Json> l3_pipelined();
Result<Json> l4_latency();
Result<Json> mailbox_round_trip();
Result<Json> mailbox_bytes();
Result<Json> mpi_latency();
Result<Json> mpi_bandwidth();

}  // namespace simpler::bench
