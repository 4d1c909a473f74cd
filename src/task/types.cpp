#include "simpler/types.h"

#include <iterator>

namespace simpler {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
      return 2;
    case DType::I8:
    case DType::U8:
      return 1;
    case DType::I64:
    case DType::U64:
    case DType::F64:
      return 8;
    case DType::kCount:
      break;
  }
  return 0;
}

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
