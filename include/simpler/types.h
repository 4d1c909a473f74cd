// Vocabulary types of the public API: levels, data types, argument tags, core
// types and chip geometries. Plain values; safe to use from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "simpler/status.h"

namespace simpler {

enum class Level : uint8_t { Chip = 2, Node = 3, Network = 4 };

// Element types. Their numbers travel in args blobs and in DeviceTensor::dtype,
// so they never change: a new type goes last, before kCount.
enum class DType : uint8_t { F32 = 0, F16, BF16, I8, I16, I32, I64, U8, U32, U64, F64, kCount };
// 0 for a value outside the enum. Inline: every byte range of every view asks.
constexpr size_t dtype_size(DType t) {
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
const char* dtype_name(DType t);

// How a task uses a tensor argument; dependencies are derived from these tags
// over overlapping tensor regions.
enum class Tag : uint8_t {
  Input = 0,       // read
  Output,          // written; a view without a buffer is allocated by the runtime
  InOut,           // read and written
  OutputExisting,  // written into a buffer the caller already owns
  NoDep,           // passed through, creates no dependency
  kCount
};
const char* tag_name(Tag t);
inline bool tag_writes(Tag t) { return t == Tag::Output || t == Tag::InOut || t == Tag::OutputExisting; }
inline bool tag_reads(Tag t) { return t == Tag::Input || t == Tag::InOut; }

// Device memory of a chip, or summed over the chips of a node or network.
struct MemoryInfo {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

enum class CoreType : uint8_t { AIC = 0, AIV = 1 };
const char* core_type_name(CoreType t);

// The shape of a simulated chip. A cluster is 1 AIC + 2 AIV cores; AICPU
// threads run the chip runtime's scheduler.
struct Geometry {
  std::string name;
  uint32_t clusters = 0;
  uint32_t aicpu_threads = 0;

  uint32_t aic_cores() const { return clusters; }
  uint32_t aiv_cores() const { return clusters * 2; }
  uint32_t cores() const { return clusters * 3; }

  static Geometry small();  // 2 clusters (2 AIC + 4 AIV), 2 AICPU threads; the default
  static Geometry a2a3();   // 24 clusters (72 cores), 4 AICPU threads
  static Geometry a5();     // 36 clusters (108 cores), 5 AICPU threads
  static std::vector<Geometry> presets();
  static Result<Geometry> by_name(const std::string& name);
  // Refuses zero or absurd sizes, naming the field.
  Status validate() const;
};

}  // namespace simpler
