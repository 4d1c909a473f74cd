// process_id(): the calling process's id without a system call. getpid() is
// one, ~1 µs on a paravirtualised host, and every native phase call of a run
// checks the pid (ExecutionContext). A fork() child refreshes the cached value
// (pthread_atfork) before fork() returns in it. Any thread; owns one word.
#pragma once

#include <sys/types.h>

namespace simpler {

pid_t process_id();

}  // namespace simpler
