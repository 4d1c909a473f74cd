#include "simpler/types.h"

#include <iterator>

namespace simpler {

const char* dtype_name(DType t) {
  static const char* const kNames[] = {"f32", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u32", "u64", "f64"};
  static_assert(std::size(kNames) == static_cast<size_t>(DType::kCount), "one name per DType");
  const auto i = static_cast<size_t>(t);
  return i < static_cast<size_t>(DType::kCount) ? kNames[i] : "invalid";
}

const char* tag_name(Tag t) {
  static const char* const kNames[] = {"input", "output", "inout", "output_existing", "no_dep"};
  const auto i = static_cast<size_t>(t);
  return i < static_cast<size_t>(Tag::kCount) ? kNames[i] : "invalid";
}

const char* core_type_name(CoreType t) { return t == CoreType::AIC ? "AIC" : "AIV"; }

}  // namespace simpler
