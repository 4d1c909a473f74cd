#include "base/user_code.h"

namespace simpler {

thread_local const UserCodeMark* UserCodeMark::innermost_ = nullptr;

}  // namespace simpler
