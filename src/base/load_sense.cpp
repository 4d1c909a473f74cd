#include "base/load_sense.h"

#include <cstdlib>
#include <cstring>

namespace simpler {

LoadSense& load_sense() {
  // Never destroyed: a detached or late thread may still spin at exit.
  static LoadSense* const sense = [] {
    auto* s = new LoadSense();
    const char* env = std::getenv("SIMPLER_LOAD_SENSE");
    s->set_enabled(env == nullptr || std::strcmp(env, "0") != 0);
    return s;
  }();
  return *sense;
}

#ifdef SIMPLER_TEST_HOOKS
namespace hooks {
namespace {
std::atomic<int> g_forced_state{-1};
std::atomic<uint64_t> g_batch_gap{0};
}  // namespace

void force_load_state(int state) { g_forced_state.store(state, std::memory_order_relaxed); }
int forced_load_state() noexcept { return g_forced_state.load(std::memory_order_relaxed); }
void add_spin_batch_gap(uint64_t extra_ns) { g_batch_gap.store(extra_ns, std::memory_order_relaxed); }
uint64_t spin_batch_gap() noexcept { return g_batch_gap.load(std::memory_order_relaxed); }
}  // namespace hooks
#endif

}  // namespace simpler
