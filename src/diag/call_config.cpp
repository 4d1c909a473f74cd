#include "diag/call_config.h"

#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "base/errors.h"

namespace simpler::diag {

Status validate_call_config(const CallConfig& config, const char* prefix) {
  if (config.swimlane_level > kMaxSwimlaneLevel) {
    return invalid_argument("{}swimlane_level = {} is out of range [0, {}]", prefix, config.swimlane_level,
                            kMaxSwimlaneLevel);
  }
  if (static_cast<uint8_t>(config.dump_args) > static_cast<uint8_t>(DumpArgs::Full)) {
    return invalid_argument("{}dump_args = {} is no DumpArgs", prefix, static_cast<int>(config.dump_args));
  }
  if (config.swimlane_level == 0 && config.dump_args == DumpArgs::Off) return Status();
  if (config.trace_dir.empty()) {
    return invalid_argument("{}trace_dir is empty: {} writes there", prefix,
                            config.swimlane_level > 0 ? "a swimlane trace" : "an argument dump");
  }
  std::error_code ec;
  std::filesystem::create_directories(config.trace_dir, ec);
  if (ec || !std::filesystem::is_directory(config.trace_dir, ec)) {
    return invalid_argument("{}trace_dir = '{}' cannot be created: {}", prefix, config.trace_dir,
                            ec ? ec.message() : "it is not a directory");
  }
  return Status();
}

std::string child_trace_dir(const std::string& dir, const char* kind, uint32_t index, uint32_t task) {
  return fmt::format("{}/{}{}/task{}", dir, kind, index, task);
}

Result<size_t> encode_call_config(const ChildCallConfig& config, uint8_t* out, size_t cap) {
  const size_t need = sizeof(CallConfigWire) + config.call.trace_dir.size();
  if (need > cap) {
    return invalid_argument("trace_dir is {} bytes; a child's request carries at most {}", config.call.trace_dir.size(),
                            cap - sizeof(CallConfigWire));
  }
  CallConfigWire w{};
  w.magic = CallConfigWire::kMagic;
  w.version = CallConfigWire::kVersion;
  w.swimlane_level = static_cast<uint8_t>(config.call.swimlane_level);
  w.dump_args = static_cast<uint8_t>(config.call.dump_args);
  w.dir_bytes = static_cast<uint32_t>(config.call.trace_dir.size());
  w.child_index = config.child_index;
  w.clock_offset_ns = config.clock_offset_ns;
  std::memcpy(out, &w, sizeof w);
  std::memcpy(out + sizeof w, config.call.trace_dir.data(), config.call.trace_dir.size());
  return need;
}

Result<ChildCallConfig> decode_call_config(const uint8_t* data, size_t bytes) {
  ChildCallConfig c;
  if (bytes == 0) return c;
  if (bytes < sizeof(CallConfigWire)) {
    return invalid_argument("call config: {} bytes, shorter than its {}-byte header", bytes, sizeof(CallConfigWire));
  }
  CallConfigWire w;
  std::memcpy(&w, data, sizeof w);
  if (w.magic != CallConfigWire::kMagic) return invalid_argument("call config: magic {:#x} is not CCFG", w.magic);
  if (w.version != CallConfigWire::kVersion) {
    return invalid_argument("call config: version {} (this build reads {})", w.version, CallConfigWire::kVersion);
  }
  if (w.swimlane_level > kMaxSwimlaneLevel) {
    return invalid_argument("call config: swimlane_level = {} is out of range [0, {}]", w.swimlane_level,
                            kMaxSwimlaneLevel);
  }
  if (w.dump_args > static_cast<uint8_t>(DumpArgs::Full)) {
    return invalid_argument("call config: dump_args = {} is not a DumpArgs", w.dump_args);
  }
  if (w.dir_bytes != bytes - sizeof w) {
    return invalid_argument("call config: dir_bytes = {} but {} bytes follow the header", w.dir_bytes,
                            bytes - sizeof w);
  }
  if (w.swimlane_level > 0 && w.dir_bytes == 0) {
    return invalid_argument("call config: trace_dir is empty with swimlane_level = {}", w.swimlane_level);
  }
  c.call.swimlane_level = w.swimlane_level;
  c.call.dump_args = static_cast<DumpArgs>(w.dump_args);
  c.call.trace_dir.assign(reinterpret_cast<const char*>(data + sizeof w), w.dir_bytes);
  if (c.call.trace_dir.find('\0') != std::string::npos) {
    return invalid_argument("call config: trace_dir holds a NUL byte");
  }
  c.child_index = w.child_index;
  c.clock_offset_ns = w.clock_offset_ns;
  return c;
}

}  // namespace simpler::diag
