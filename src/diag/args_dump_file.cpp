#include "diag/args_dump_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/errors.h"

namespace simpler {

namespace {

using nlohmann::json;

std::string manifest_path(const std::string& dir) { return dir + "/manifest.json"; }
std::string bin_path(const std::string& dir) { return dir + "/args.bin"; }

double half_to_double(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(man, -24);
  } else if (exp == 31) {
    v = man == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(man + 1024, exp - 25);
  }
  return sign ? -v : v;
}

double bf16_to_double(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename T>
double load_as(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

double element_at(DType t, const uint8_t* p) {
  switch (t) {
    case DType::F32:
      return load_as<float>(p);
    case DType::F64:
      return load_as<double>(p);
    case DType::F16:
      return half_to_double(static_cast<uint16_t>(load_as<uint16_t>(p)));
    case DType::BF16:
      return bf16_to_double(static_cast<uint16_t>(load_as<uint16_t>(p)));
    case DType::I8:
      return load_as<int8_t>(p);
    case DType::I16:
      return load_as<int16_t>(p);
    case DType::I32:
      return load_as<int32_t>(p);
    case DType::I64:
      return load_as<int64_t>(p);
    case DType::U8:
      return load_as<uint8_t>(p);
    case DType::U32:
      return load_as<uint32_t>(p);
    case DType::U64:
      return load_as<uint64_t>(p);
    case DType::kCount:
      break;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

Result<DType> dtype_named(const std::string& name) {
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) {
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  return invalid_argument("unknown dtype \"{}\"", name);
}

template <typename E, size_t N>
Result<E> enum_named(const std::string& name, const std::pair<const char*, E> (&table)[N], const char* field) {
  for (const auto& [n, e] : table) {
    if (name == n) return e;
  }
  return invalid_argument("unknown {} \"{}\"", field, name);
}

constexpr std::pair<const char*, DumpRole> kRoles[] = {
    {"input", DumpRole::kInput}, {"output", DumpRole::kOutput}, {"inout", DumpRole::kInOut}};
constexpr std::pair<const char*, DumpStage> kStages[] = {{"before", DumpStage::kBefore}, {"after", DumpStage::kAfter}};

// Reads `key` of entry `j` as T, naming both when it is absent or of another type.
template <typename T>
Result<T> field(const json& j, const char* key, size_t entry) {
  const auto it = j.find(key);
  if (it == j.end()) return invalid_argument("manifest.json: record {} has no \"{}\"", entry, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return invalid_argument("manifest.json: record {} field \"{}\" has the wrong type", entry, key);
  }
}

Result<DumpedArg> parse_entry(const json& j, size_t i, uint64_t bin_size) {
  if (!j.is_object()) return invalid_argument("manifest.json: record {} is not an object", i);
  DumpedArg a;
  SIMPLER_ASSIGN_OR_RETURN(a.task, field<uint64_t>(j, "task", i));
  SIMPLER_ASSIGN_OR_RETURN(a.kernel, field<std::string>(j, "kernel", i));
  SIMPLER_ASSIGN_OR_RETURN(a.func_id, field<uint32_t>(j, "func_id", i));
  SIMPLER_ASSIGN_OR_RETURN(std::string role, field<std::string>(j, "role", i));
  SIMPLER_ASSIGN_OR_RETURN(a.role, enum_named(role, kRoles, "role"), "manifest.json: record {}", i);
  SIMPLER_ASSIGN_OR_RETURN(std::string stage, field<std::string>(j, "stage", i));
  SIMPLER_ASSIGN_OR_RETURN(a.stage, enum_named(stage, kStages, "stage"), "manifest.json: record {}", i);
  SIMPLER_ASSIGN_OR_RETURN(a.arg, field<uint32_t>(j, "arg", i));
  SIMPLER_ASSIGN_OR_RETURN(std::string dtype, field<std::string>(j, "dtype", i));
  SIMPLER_ASSIGN_OR_RETURN(a.dtype, dtype_named(dtype), "manifest.json: record {}", i);
  SIMPLER_ASSIGN_OR_RETURN(a.shape, field<std::vector<int64_t>>(j, "shape", i));
  SIMPLER_ASSIGN_OR_RETURN(a.strides, field<std::vector<int64_t>>(j, "strides", i));
  SIMPLER_ASSIGN_OR_RETURN(a.offset, field<int64_t>(j, "offset", i));
  SIMPLER_ASSIGN_OR_RETURN(a.bin_offset, field<uint64_t>(j, "bin_offset", i));
  SIMPLER_ASSIGN_OR_RETURN(a.bytes, field<uint64_t>(j, "bytes", i));
  SIMPLER_ASSIGN_OR_RETURN(a.logical_bytes, field<uint64_t>(j, "logical_bytes", i));
  SIMPLER_ASSIGN_OR_RETURN(a.truncated, field<bool>(j, "truncated", i));
  SIMPLER_ASSIGN_OR_RETURN(a.metadata_only, field<bool>(j, "metadata_only", i));
  SIMPLER_ASSIGN_OR_RETURN(a.order, field<uint64_t>(j, "order", i));
  SIMPLER_ASSIGN_OR_RETURN(a.lane, field<uint32_t>(j, "lane", i));

  if (a.shape.size() > static_cast<size_t>(kMaxDims) || a.strides.size() != a.shape.size()) {
    return invalid_argument("manifest.json: record {} has {} dims and {} strides (at most {} dims, one stride each)", i,
                            a.shape.size(), a.strides.size(), kMaxDims);
  }
  uint64_t numel = 1;
  for (int64_t d : a.shape) {
    if (d < 0 || (d > 0 && numel > (uint64_t{1} << 48) / static_cast<uint64_t>(d))) {
      return invalid_argument("manifest.json: record {} has shape dimension {}", i, d);
    }
    numel *= static_cast<uint64_t>(d);
  }
  const uint64_t esize = dtype_size(a.dtype);
  if (a.logical_bytes != numel * esize) {
    return invalid_argument("manifest.json: record {} says logical_bytes {} but its shape holds {}", i, a.logical_bytes,
                            numel * esize);
  }
  if (a.bytes % esize != 0) {
    return invalid_argument("manifest.json: record {} holds {} bytes, not whole {} elements", i, a.bytes, dtype);
  }
  if (a.metadata_only ? a.bytes != 0 : (a.truncated ? a.bytes >= a.logical_bytes : a.bytes != a.logical_bytes)) {
    return invalid_argument(
        "manifest.json: record {} holds {} of {} bytes, which its flags (truncated {}, "
        "metadata_only {}) do not allow",
        i, a.bytes, a.logical_bytes, a.truncated, a.metadata_only);
  }
  if (a.bin_offset > bin_size || a.bytes > bin_size - a.bin_offset) {
    return invalid_argument("manifest.json: record {} names bytes [{}, {}) of args.bin, which holds {}", i,
                            a.bin_offset, a.bin_offset + a.bytes, bin_size);
  }
  return a;
}

}  // namespace

const char* dump_selection_name(DumpSelection s) {
  switch (s) {
    case DumpSelection::kOff:
      return "off";
    case DumpSelection::kPartial:
      return "partial";
    case DumpSelection::kHybrid:
      return "hybrid";
    case DumpSelection::kFull:
      return "full";
  }
  return "?";
}

Result<std::unique_ptr<ArgsDumpWriter>> ArgsDumpWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return invalid_argument("cannot create the dump directory {}: {}", dir, ec.message());
  std::FILE* bin = std::fopen(bin_path(dir).c_str(), "wb");
  if (bin == nullptr) return invalid_argument("cannot create {}: {}", bin_path(dir), std::strerror(errno));
  return std::unique_ptr<ArgsDumpWriter>(new ArgsDumpWriter(dir, bin));
}

ArgsDumpWriter::ArgsDumpWriter(std::string dir, std::FILE* bin) : dir_(std::move(dir)), bin_(bin) {}

ArgsDumpWriter::~ArgsDumpWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
}

DumpLane::Sink ArgsDumpWriter::sink_for(uint32_t lane) {
  return [this, lane](const DumpRecord& r, const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    entries_.push_back({r, lane, bin_bytes_});
    if (!first_error_.ok()) return;
    if (std::fwrite(a, 1, na, bin_) != na || (nb != 0 && std::fwrite(b, 1, nb, bin_) != nb)) {
      first_error_ = internal_error("writing {}: {}", bin_path(dir_), std::strerror(errno));
      return;
    }
    bin_bytes_ += na + nb;
  };
}

Status ArgsDumpWriter::finish(const Summary& s) {
  if (std::fclose(bin_) != 0 && first_error_.ok()) {
    first_error_ = internal_error("closing {}: {}", bin_path(dir_), std::strerror(errno));
  }
  bin_ = nullptr;
  // Formatted straight into one buffer, not built as a JSON tree: a FULL dump
  // has thousands of records, and this runs once per dumping run.
  fmt::memory_buffer m;
  auto out = std::back_inserter(m);
  DumpCounts sum;
  for (const DumpCounts& c : s.lanes) {
    sum.total += c.total;
    sum.collected += c.collected;
    sum.dropped += c.dropped;
    sum.truncated += c.truncated;
  }
  fmt::format_to(out,
                 "{{\n \"simpler_args_dump_version\": {},\n \"run\": {},\n \"selection\": \"{}\",\n \"complete\": {},\n"
                 " \"total\": {},\n \"collected\": {},\n \"dropped\": {},\n \"truncated\": {},\n \"lanes\": [",
                 kArgsDumpVersion, s.run_epoch, dump_selection_name(s.selection), s.complete, sum.total, sum.collected,
                 sum.dropped, sum.truncated);
  for (size_t i = 0; i < s.lanes.size(); ++i) {
    const DumpCounts& c = s.lanes[i];
    fmt::format_to(out, "{}\n  {{\"lane\": {}, \"total\": {}, \"collected\": {}, \"dropped\": {}, \"truncated\": {}}}",
                   i == 0 ? "" : ",", i, c.total, c.collected, c.dropped, c.truncated);
  }
  fmt::format_to(out, "\n ],\n \"records\": [");
  std::vector<const Entry*> order;
  order.reserve(entries_.size());
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* x, const Entry* y) { return x->rec.order < y->rec.order; });
  std::map<uint32_t, std::string> kernels;  // func_id -> its escaped name
  bool first = true;
  for (const Entry* e : order) {
    const DumpRecord& r = e->rec;
    auto k = kernels.find(r.func_id);
    if (k == kernels.end()) {
      const std::string name = s.kernel_name ? s.kernel_name(r.func_id) : std::string();
      k = kernels.emplace(r.func_id, json(name).dump()).first;
    }
    const auto dims = [&](const int64_t* v) { return fmt::join(v, v + r.ndim, ", "); };
    fmt::format_to(out,
                   "{}\n  {{\"task\": {}, \"kernel\": {}, \"func_id\": {}, \"role\": \"{}\", \"stage\": \"{}\", "
                   "\"arg\": {}, \"dtype\": \"{}\", \"shape\": [{}], \"strides\": [{}], \"offset\": {}, "
                   "\"bin_offset\": {}, \"bytes\": {}, \"logical_bytes\": {}, \"truncated\": {}, "
                   "\"metadata_only\": {}, \"order\": {}, \"lane\": {}}}",
                   first ? "" : ",", r.task_id, k->second, r.func_id, dump_role_name(static_cast<DumpRole>(r.role)),
                   dump_stage_name(static_cast<DumpStage>(r.stage)), r.arg_index,
                   dtype_name(static_cast<DType>(r.dtype)), dims(r.shape), dims(r.stride), r.offset, e->bin_offset,
                   r.payload_bytes, r.logical_bytes, (r.flags & DumpRecord::kTruncated) != 0,
                   (r.flags & DumpRecord::kMetadataOnly) != 0, r.order, e->lane);
    first = false;
  }
  fmt::format_to(out, "\n ]\n}}\n");
  std::FILE* f = std::fopen(manifest_path(dir_).c_str(), "wb");
  const bool wrote = f != nullptr && std::fwrite(m.data(), 1, m.size(), f) == m.size();
  const bool closed = f != nullptr && std::fclose(f) == 0;
  if ((!wrote || !closed) && first_error_.ok()) first_error_ = internal_error("writing {}", manifest_path(dir_));
  return first_error_;
}

Result<ArgsDump> load_args_dump(const std::string& dir) {
  ArgsDump d;
  d.dir = dir;
  {
    std::ifstream bin(bin_path(dir), std::ios::binary);
    if (!bin) return not_found("{}: no args.bin (is it an args_dump directory?)", dir);
    d.bin.assign(std::istreambuf_iterator<char>(bin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(manifest_path(dir));
  if (!in) return not_found("{}: no manifest.json (is it an args_dump directory?)", dir);
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    return invalid_argument("{}: manifest.json is not JSON: {}", dir, e.what());
  }
  if (!m.is_object() || !m.contains("simpler_args_dump_version")) {
    return invalid_argument("{}: manifest.json is not a simpler argument dump (no simpler_args_dump_version)", dir);
  }
  if (m["simpler_args_dump_version"] != kArgsDumpVersion) {
    return invalid_argument("{}: manifest.json has version {}; this simpler reads version {}", dir,
                            m["simpler_args_dump_version"].dump(), kArgsDumpVersion);
  }
  try {
    d.run_epoch = m.at("run").get<uint64_t>();
    d.selection = m.at("selection").get<std::string>();
    d.complete = m.at("complete").get<bool>();
    d.counts = {m.at("total").get<uint64_t>(), m.at("collected").get<uint64_t>(), m.at("dropped").get<uint64_t>(),
                m.at("truncated").get<uint64_t>()};
  } catch (const json::exception& e) {
    return invalid_argument("{}: manifest.json header: {}", dir, e.what());
  }
  const auto records = m.find("records");
  if (records == m.end() || !records->is_array())
    return invalid_argument("{}: manifest.json has no records array", dir);
  d.args.reserve(records->size());
  for (size_t i = 0; i < records->size(); ++i) {
    SIMPLER_ASSIGN_OR_RETURN(DumpedArg a, parse_entry((*records)[i], i, d.bin.size()), "{}", dir);
    d.args.push_back(std::move(a));
  }
  // An incomplete dump was written without the producers' stop proof: its
  // counters may be ahead of the records the host received.
  if (d.complete ? d.args.size() != d.counts.collected : d.args.size() > d.counts.collected) {
    return invalid_argument("{}: manifest.json lists {} records but counts {} collected", dir, d.args.size(),
                            d.counts.collected);
  }
  if (d.complete ? d.counts.total != d.counts.collected + d.counts.dropped
                 : d.counts.total < d.counts.collected + d.counts.dropped) {
    return invalid_argument("{}: manifest.json counts total {} != collected {} + dropped {}", dir, d.counts.total,
                            d.counts.collected, d.counts.dropped);
  }
  return d;
}

uint64_t dumped_elements(const DumpedArg& arg) { return arg.bytes / dtype_size(arg.dtype); }

double dumped_element(const ArgsDump& dump, const DumpedArg& arg, uint64_t i) {
  return element_at(arg.dtype, dump.bin.data() + arg.bin_offset + i * dtype_size(arg.dtype));
}

TensorSummary summarize(const ArgsDump& dump, const DumpedArg& arg) {
  TensorSummary s;
  s.elements = dumped_elements(arg);
  double sum = 0;
  uint64_t finite = 0;
  for (uint64_t i = 0; i < s.elements; ++i) {
    const double v = dumped_element(dump, arg, i);
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      if (finite == 0 || v < s.min) s.min = v;
      if (finite == 0 || v > s.max) s.max = v;
      sum += v;
      ++finite;
    }
  }
  s.mean = finite == 0 ? 0 : sum / static_cast<double>(finite);
  return s;
}

namespace {

std::vector<int64_t> unravel(uint64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<int64_t>(i % static_cast<uint64_t>(shape[d]));
    i /= static_cast<uint64_t>(shape[d]);
  }
  return idx;
}

std::string describe(const DumpedArg& x) {
  return fmt::format("task {} ({}) {} argument {}", x.task, x.kernel, dump_role_name(x.role), x.arg);
}

}  // namespace

DumpDifference diff_args_dumps(const ArgsDump& a, const ArgsDump& b, double rtol, double atol) {
  std::map<std::tuple<uint64_t, uint32_t, DumpStage>, const DumpedArg*> in_b;
  for (const DumpedArg& x : b.args) in_b[{x.task, x.arg, x.stage}] = &x;
  std::vector<const DumpedArg*> outs;
  for (const DumpedArg& x : a.args) {
    if (x.stage == DumpStage::kAfter && x.role != DumpRole::kInput) outs.push_back(&x);
  }
  std::stable_sort(outs.begin(), outs.end(),
                   [](const DumpedArg* x, const DumpedArg* y) { return x->order < y->order; });
  DumpDifference d;
  uint64_t compared = 0;
  for (const DumpedArg* x : outs) {
    d.task = x->task;
    d.arg = x->arg;
    const auto it = in_b.find({x->task, x->arg, DumpStage::kAfter});
    if (it == in_b.end()) {
      d.differs = true;
      d.what = fmt::format("{} was captured in {} but not in {}", describe(*x), a.dir, b.dir);
      return d;
    }
    const DumpedArg& y = *it->second;
    if (x->shape != y.shape || x->dtype != y.dtype || x->kernel != y.kernel) {
      d.differs = true;
      d.what =
          fmt::format("{} is {} {} in {} but {} {} ({}) in {}", describe(*x), dtype_name(x->dtype),
                      fmt::join(x->shape, "x"), a.dir, dtype_name(y.dtype), fmt::join(y.shape, "x"), y.kernel, b.dir);
      return d;
    }
    const uint64_t n = std::min(dumped_elements(*x), dumped_elements(y));
    for (uint64_t i = 0; i < n; ++i) {
      const double va = dumped_element(a, *x, i);
      const double vb = dumped_element(b, y, i);
      const bool same =
          (std::isnan(va) && std::isnan(vb)) || va == vb || std::fabs(va - vb) <= atol + rtol * std::fabs(vb);
      if (!same) {
        d.differs = true;
        d.index = unravel(i, x->shape);
        d.a = va;
        d.b = vb;
        d.what = fmt::format("first difference: {}, element [{}]: {} in {} vs {} in {}", describe(*x),
                             fmt::join(d.index, ", "), va, a.dir, vb, b.dir);
        return d;
      }
    }
    ++compared;
  }
  d = DumpDifference{};
  d.what = fmt::format("no difference in {} outputs compared (rtol {}, atol {})", compared, rtol, atol);
  return d;
}

namespace {

namespace fs = std::filesystem;

bool is_dump_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / "manifest.json", ec) && fs::is_regular_file(p / "args.bin", ec);
}

// "chip12" -> ("chip", 12); a name without a number sorts by its text.
std::pair<std::string, uint64_t> split_number(const std::string& name) {
  size_t digits = name.size();
  while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
  if (digits == name.size() || name.size() - digits > 18) return {name, 0};
  return {name.substr(0, digits), std::stoull(name.substr(digits))};
}

// Execution order of a dump's place in the tree: run<R> first, then the
// other components in (worker, task) pairs with the task first, so
// run1/chip1/task3 sorts as (run 1, 3, 1).
std::vector<std::pair<std::string, uint64_t>> order_key(const std::string& label) {
  std::vector<std::pair<std::string, uint64_t>> parts;
  for (const fs::path& c : fs::path(label)) parts.push_back(split_number(c.string()));
  if (!parts.empty() && parts[0].first == "run") {
    std::vector<std::pair<std::string, uint64_t>> rest(parts.begin() + 1, parts.end());
    for (size_t i = 0; i + 1 < rest.size(); i += 2) std::swap(rest[i], rest[i + 1]);
    rest.insert(rest.begin(), parts[0]);
    return rest;
  }
  for (size_t i = 0; i + 1 < parts.size(); i += 2) std::swap(parts[i], parts[i + 1]);
  return parts;
}

// The search stops at every dump: a dump holds no run below it. Depth is
// bounded by the nesting a network can have (network -> node -> chip).
void collect(const fs::path& root, const fs::path& at, int depth,
             std::vector<std::pair<std::string, std::string>>& found) {
  if (depth > 4) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(at, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    const fs::path p = e.path();
    if (is_dump_dir(p / "args_dump")) {
      found.emplace_back(fs::relative(p, root, ec).string(), (p / "args_dump").string());
    } else {
      collect(root, p, depth + 1, found);
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> find_args_dumps(const std::string& dir) {
  const fs::path root(dir);
  if (is_dump_dir(root)) return {{"", root.string()}};
  if (is_dump_dir(root / "args_dump")) return {{"", (root / "args_dump").string()}};
  std::vector<std::pair<std::string, std::string>> found;
  collect(root, root, 0, found);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return order_key(a.first) < order_key(b.first); });
  return found;
}

}  // namespace simpler
