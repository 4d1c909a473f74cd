#include "simpler/version.h"

namespace simpler {

const char* version_string() { return SIMPLER_VERSION; }

const char* build_options() {
  static const char* const kOptions = "build_type=" SIMPLER_BUILD_TYPE " sanitize=" SIMPLER_SANITIZE_OPT "";
  return kOptions;
}

}  // namespace simpler
