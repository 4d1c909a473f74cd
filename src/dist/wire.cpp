#include "dist/wire.h"

#include <cstring>
#include <map>

#include "base/errors.h"
#include "task/byte_runs.h"

namespace simpler::dist {

const char* msg_kind_name(MsgKind k) {
  switch (k) {
    case MsgKind::kHello:
      return "HELLO";
    case MsgKind::kHelloReply:
      return "HELLO_REPLY";
    case MsgKind::kRequest:
      return "REQUEST";
    case MsgKind::kAck:
      return "ACK";
    case MsgKind::kAccepted:
      return "ACCEPTED";
    case MsgKind::kTerminal:
      return "TERMINAL";
    case MsgKind::kHeartbeat:
      return "HEARTBEAT";
    case MsgKind::kStopped:
      return "STOPPED";
    case MsgKind::kShutdown:
      return "SHUTDOWN";
    case MsgKind::kMemoryQuery:
      return "MEMORY_QUERY";
    case MsgKind::kMemoryReply:
      return "MEMORY_REPLY";
    case MsgKind::kClockPing:
      return "CLOCK_PING";
    case MsgKind::kClockPong:
      return "CLOCK_PONG";
    case MsgKind::kFiles:
      return "FILES";
  }
  return "?";
}

namespace {

WireHeader header(MsgKind kind, uint64_t session, uint32_t entry, uint64_t generation, uint64_t run_epoch,
                  uint64_t dispatch_id, uint64_t value) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.session = session;
  h.entry = entry;
  h.generation = generation;
  h.run_epoch = run_epoch;
  h.dispatch_id = dispatch_id;
  h.value = value;
  return h;
}

std::vector<uint8_t> with_payload(WireHeader h, size_t payload) {
  h.payload_bytes = static_cast<uint32_t>(payload);
  std::vector<uint8_t> out(sizeof(WireHeader) + payload);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

// The payload length each kind allows, beyond what its own fields say.
bool kind_without_payload(MsgKind k) {
  return k == MsgKind::kHello || k == MsgKind::kAck || k == MsgKind::kAccepted || k == MsgKind::kHeartbeat ||
         k == MsgKind::kShutdown || k == MsgKind::kMemoryQuery || k == MsgKind::kClockPing || k == MsgKind::kClockPong;
}

Status decode_request(Message& m) {
  const auto p = m.payload;
  const uint32_t n = m.h.tensor_count;
  if (n > kMaxTaskArgs) return invalid_argument("REQUEST: tensor_count {} exceeds {}", n, kMaxTaskArgs);
  const size_t fixed = kRequestFixedBytes + size_t{n} * sizeof(TensorRow);
  if (p.size() < fixed) {
    return invalid_argument("REQUEST: payload_bytes {} is shorter than the digest and {} tensor rows ({} bytes)",
                            p.size(), n, fixed);
  }
  std::memcpy(m.callable.data(), p.data(), sizeof(Digest));
  m.rows.resize(n);
  if (n != 0) std::memcpy(m.rows.data(), p.data() + kRequestFixedBytes, size_t{n} * sizeof(TensorRow));
  for (uint32_t i = 0; i < n; ++i) {
    const TensorRow& r = m.rows[i];
    if (r.addr == 0) return invalid_argument("REQUEST: tensor row {}: addr is 0", i);
    if (r.bytes == 0 || r.bytes > kWireMaxTensorBytes) {
      return invalid_argument("REQUEST: tensor row {}: bytes {} outside [1, {}]", i, r.bytes, kWireMaxTensorBytes);
    }
    if (r.offset % kRowAlignment != 0 || r.offset > r.buffer_bytes || r.bytes > r.buffer_bytes - r.offset) {
      return invalid_argument(
          "REQUEST: tensor row {}: bytes [{}, +{}) are not a {}-byte aligned span of its {}-byte buffer", i, r.offset,
          r.bytes, kRowAlignment, r.buffer_bytes);
    }
    if (r.flags == 0 || (r.flags & ~(kToNode | kFromNode)) != 0) {
      return invalid_argument("REQUEST: tensor row {}: flags {:#x} are not a direction", i, r.flags);
    }
    if (r.reserved != 0) return invalid_argument("REQUEST: tensor row {}: reserved is {}", i, r.reserved);
    for (uint32_t j = 0; j < i; ++j) {
      if (m.rows[j].addr == r.addr) return invalid_argument("REQUEST: tensor rows {} and {} name one buffer", j, i);
    }
  }
  if (m.h.value > kWireMaxConfig || m.h.value > p.size() - fixed) {
    return invalid_argument("REQUEST: value (CallConfig bytes) {} exceeds {} or the {} payload bytes after the rows",
                            m.h.value, kWireMaxConfig, p.size() - fixed);
  }
  const size_t config_bytes = static_cast<size_t>(m.h.value);
  m.args_blob = p.subspan(fixed, p.size() - fixed - config_bytes);
  m.config = p.subspan(p.size() - config_bytes);
  if (m.args_blob.size() > kArgsBlobMaxBytes) {
    return invalid_argument("REQUEST: args blob of {} bytes exceeds {}", m.args_blob.size(), kArgsBlobMaxBytes);
  }
  SIMPLER_ASSIGN_OR_RETURN(const TaskArgs args, decode_args_blob(m.args_blob.data(), m.args_blob.size()),
                           "REQUEST: args blob");
  std::vector<bool> used(n, false);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != TaskArg::Kind::Tensor) continue;
    const TensorView& v = args[i].tensor;
    const DeviceBuffer& b = v.buffer();
    uint32_t k = 0;
    while (k < n && !(m.rows[k].addr == b.addr && m.rows[k].buffer_bytes == b.bytes)) ++k;
    if (k == n) {
      return invalid_argument("REQUEST: argument {}: buffer {:#x}+{} is no row of the tensor table", i, b.addr,
                              b.bytes);
    }
    // The node rebases the view into the row's bytes: it must lie inside them.
    const TensorRow& r = m.rows[k];
    if (v.numel() != 0 && (v.first_byte() < r.offset || v.end_byte() > r.offset + r.bytes)) {
      return invalid_argument("REQUEST: argument {}: bytes [{}, {}) of its buffer are outside tensor row {}'s [{}, {})",
                              i, v.first_byte(), v.end_byte(), k, r.offset, r.offset + r.bytes);
    }
    used[k] = true;
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (!used[k]) return invalid_argument("REQUEST: tensor row {} is named by no argument", k);
  }
  return Status();
}

Status decode_files(Message& m) {
  const auto p = m.payload;
  if (p.size() < sizeof(FileChunkHead)) {
    return invalid_argument("FILES: payload_bytes {} is shorter than the {}-byte chunk head", p.size(),
                            sizeof(FileChunkHead));
  }
  std::memcpy(&m.file, p.data(), sizeof(FileChunkHead));
  const FileChunkHead& f = m.file;
  if (f.name_bytes > p.size() - sizeof(FileChunkHead)) {
    return invalid_argument("FILES: name_bytes {} exceeds the {} payload bytes after the chunk head", f.name_bytes,
                            p.size() - sizeof(FileChunkHead));
  }
  m.file_name = std::string_view(reinterpret_cast<const char*>(p.data()) + sizeof(FileChunkHead), f.name_bytes);
  m.file_data = p.subspan(sizeof(FileChunkHead) + f.name_bytes);
  if (m.file_data.size() > kFileChunkBytes) {
    return invalid_argument("FILES: a chunk of {} bytes exceeds {}", m.file_data.size(), kFileChunkBytes);
  }
  if (f.offset > f.file_bytes || m.file_data.size() > f.file_bytes - f.offset) {
    return invalid_argument("FILES: offset {} and {} bytes of data lie outside the file's {} bytes", f.offset,
                            m.file_data.size(), f.file_bytes);
  }
  return Status();
}

Status decode_text(Message& m, std::span<const uint8_t> text) {
  if (text.size() > kWireMaxText) {
    return invalid_argument("{}: text of {} bytes exceeds {}", msg_kind_name(m.kind), text.size(), kWireMaxText);
  }
  m.text = std::string_view(reinterpret_cast<const char*>(text.data()), text.size());
  return Status();
}

}  // namespace

Result<Message> decode_message(std::span<const uint8_t> bytes) {
  Message m;
  if (bytes.size() < sizeof(WireHeader)) {
    return invalid_argument("message of {} bytes is shorter than the {}-byte header", bytes.size(), sizeof(WireHeader));
  }
  std::memcpy(&m.h, bytes.data(), sizeof(WireHeader));
  const WireHeader& h = m.h;
  if (h.magic != kWireMagic) return invalid_argument("magic is {:#x}, expected {:#x}", h.magic, kWireMagic);
  if (h.version != kWireVersion) return invalid_argument("version is {}, expected {}", h.version, kWireVersion);
  if (h.kind == 0 || h.kind > kMsgKindLast) return invalid_argument("kind {} is no message kind", h.kind);
  m.kind = static_cast<MsgKind>(h.kind);
  const char* kind = msg_kind_name(m.kind);
  if (h.payload_bytes != bytes.size() - sizeof(WireHeader)) {
    return invalid_argument("{}: payload_bytes is {}, but {} bytes follow the header", kind, h.payload_bytes,
                            bytes.size() - sizeof(WireHeader));
  }
  m.payload = bytes.subspan(sizeof(WireHeader));
  if (m.kind != MsgKind::kRequest && m.kind != MsgKind::kTerminal && m.kind != MsgKind::kFiles && h.tensor_count != 0) {
    return invalid_argument("{}: tensor_count is {}, expected 0", kind, h.tensor_count);
  }
  if (m.kind != MsgKind::kTerminal && h.status_code != 0) {
    return invalid_argument("{}: status_code is {}, expected 0", kind, h.status_code);
  }
  if (kind_without_payload(m.kind)) {
    if (!m.payload.empty()) return invalid_argument("{}: payload_bytes is {}, expected 0", kind, m.payload.size());
    return m;
  }
  switch (m.kind) {
    case MsgKind::kHelloReply: {
      if (m.payload.size() % sizeof(Digest) != 0 || m.payload.size() / sizeof(Digest) > kWireMaxCallables) {
        return invalid_argument("HELLO_REPLY: payload_bytes {} is not at most {} digests of {} bytes", m.payload.size(),
                                kWireMaxCallables, sizeof(Digest));
      }
      m.digests.resize(m.payload.size() / sizeof(Digest));
      if (!m.digests.empty()) std::memcpy(m.digests.data(), m.payload.data(), m.payload.size());
      return m;
    }
    case MsgKind::kRequest:
      SIMPLER_RETURN_IF_ERROR(decode_request(m));
      return m;
    case MsgKind::kTerminal: {
      if (h.status_code < 0 || !is_status_code(h.status_code)) {
        return invalid_argument("TERMINAL: status_code {} is no StatusCode", h.status_code);
      }
      if (h.tensor_count > kMaxTaskArgs) {
        return invalid_argument("TERMINAL: tensor_count {} exceeds {}", h.tensor_count, kMaxTaskArgs);
      }
      const size_t sizes = size_t{h.tensor_count} * sizeof(uint64_t);
      if (m.payload.size() < sizes) {
        return invalid_argument("TERMINAL: payload_bytes {} is shorter than {} buffer sizes", m.payload.size(),
                                h.tensor_count);
      }
      m.sizes.resize(h.tensor_count);
      if (sizes != 0) std::memcpy(m.sizes.data(), m.payload.data(), sizes);
      for (uint32_t i = 0; i < h.tensor_count; ++i) {
        if (m.sizes[i] == 0 || m.sizes[i] > kWireMaxTensorBytes) {
          return invalid_argument("TERMINAL: returned buffer {}: {} bytes outside [1, {}]", i, m.sizes[i],
                                  kWireMaxTensorBytes);
        }
      }
      SIMPLER_RETURN_IF_ERROR(decode_text(m, m.payload.subspan(sizes)));
      if (h.status_code == 0 && !m.text.empty()) return invalid_argument("TERMINAL: an OK status carries text");
      if (h.status_code != 0 && h.tensor_count != 0) {
        return invalid_argument("TERMINAL: a failed run returns {} buffers; a failure returns none", h.tensor_count);
      }
      return m;
    }
    case MsgKind::kStopped:
      SIMPLER_RETURN_IF_ERROR(decode_text(m, m.payload));
      return m;
    case MsgKind::kFiles:
      SIMPLER_RETURN_IF_ERROR(decode_files(m));
      return m;
    case MsgKind::kMemoryReply: {
      if (m.payload.size() != sizeof(uint64_t)) {
        return invalid_argument("MEMORY_REPLY: payload_bytes is {}, expected 8", m.payload.size());
      }
      uint64_t free_bytes = 0;
      std::memcpy(&free_bytes, m.payload.data(), sizeof free_bytes);
      if (free_bytes > h.value) {
        return invalid_argument("MEMORY_REPLY: free bytes {} exceed the total {}", free_bytes, h.value);
      }
      return m;
    }
    default:
      break;
  }
  return internal_error("{}: no decoder", kind);
}

Status validate_file_chunk(const Message& m) {
  const std::string_view name = m.file_name;
  if (m.h.tensor_count == 0 || m.h.tensor_count > kWireMaxFiles) {
    return invalid_argument("FILES: tensor_count (files) {} outside [1, {}]", m.h.tensor_count, kWireMaxFiles);
  }
  if (m.file.file_index >= m.h.tensor_count) {
    return invalid_argument("FILES: file_index {} is not below the {} files", m.file.file_index, m.h.tensor_count);
  }
  if (m.h.value > kWireMaxShipmentBytes) {
    return invalid_argument("FILES: value (shipment bytes) {} exceeds {}", m.h.value, kWireMaxShipmentBytes);
  }
  if (m.file.file_bytes > kWireMaxFileBytes || m.file.file_bytes > m.h.value) {
    return invalid_argument("FILES: file_bytes {} of file {} exceeds {} or the shipment's {}", m.file.file_bytes,
                            m.file.file_index, kWireMaxFileBytes, m.h.value);
  }
  if (name.empty() || name.size() > kWireMaxFileName) {
    return invalid_argument("FILES: name of {} bytes outside [1, {}]", name.size(), kWireMaxFileName);
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == '/';
    if (!ok) return invalid_argument("FILES: name holds byte {:#04x}, outside [A-Za-z0-9._-/]", uint8_t(c));
  }
  if (name.front() == '/') return invalid_argument("FILES: name \"{}\" is absolute", name);
  size_t at = 0;
  for (;;) {
    const size_t end = std::min(name.find('/', at), name.size());
    const std::string_view part = name.substr(at, end - at);
    if (part.empty() || part == "." || part == "..") {
      return invalid_argument("FILES: name \"{}\" has a component \"{}\" (empty, . or ..)", name, part);
    }
    if (end == name.size()) break;
    at = end + 1;
  }
  return Status();
}

std::vector<uint8_t> encode_simple(MsgKind kind, uint64_t session, uint32_t entry, uint64_t generation,
                                   uint64_t run_epoch, uint64_t dispatch_id, uint64_t value) {
  return with_payload(header(kind, session, entry, generation, run_epoch, dispatch_id, value), 0);
}

std::vector<uint8_t> encode_hello_reply(uint64_t session, uint64_t granted, std::span<const Digest> digests) {
  auto out = with_payload(header(MsgKind::kHelloReply, session, 0, 0, 0, 0, granted), digests.size_bytes());
  if (!digests.empty()) std::memcpy(out.data() + sizeof(WireHeader), digests.data(), digests.size_bytes());
  return out;
}

std::vector<uint8_t> encode_request(uint64_t session, uint32_t entry, uint64_t generation, uint64_t dispatch_id,
                                    const Digest& callable, std::span<const TensorRow> rows,
                                    std::span<const uint8_t> args_blob, std::span<const uint8_t> config) {
  WireHeader h = header(MsgKind::kRequest, session, entry, generation, 0, dispatch_id, config.size());
  h.tensor_count = static_cast<uint32_t>(rows.size());
  auto out = with_payload(h, kRequestFixedBytes + rows.size_bytes() + args_blob.size() + config.size());
  uint8_t* p = out.data() + sizeof(WireHeader);
  std::memcpy(p, callable.data(), sizeof(Digest));
  if (!rows.empty()) std::memcpy(p + kRequestFixedBytes, rows.data(), rows.size_bytes());
  if (!args_blob.empty()) std::memcpy(p + kRequestFixedBytes + rows.size_bytes(), args_blob.data(), args_blob.size());
  if (!config.empty()) {
    std::memcpy(p + kRequestFixedBytes + rows.size_bytes() + args_blob.size(), config.data(), config.size());
  }
  return out;
}

std::vector<uint8_t> encode_file_chunk(uint64_t session, uint32_t entry, uint64_t generation, uint64_t run_epoch,
                                       uint64_t dispatch_id, uint32_t files, uint64_t shipment_bytes,
                                       const FileChunkHead& head, std::string_view name,
                                       std::span<const uint8_t> data) {
  WireHeader h = header(MsgKind::kFiles, session, entry, generation, run_epoch, dispatch_id, shipment_bytes);
  h.tensor_count = files;
  auto out = with_payload(h, sizeof head + name.size() + data.size());
  uint8_t* p = out.data() + sizeof(WireHeader);
  FileChunkHead f = head;
  f.name_bytes = static_cast<uint32_t>(name.size());
  std::memcpy(p, &f, sizeof f);
  if (!name.empty()) std::memcpy(p + sizeof f, name.data(), name.size());
  if (!data.empty()) std::memcpy(p + sizeof f + name.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> encode_terminal(uint64_t session, uint32_t entry, uint64_t generation, uint64_t run_epoch,
                                     uint64_t dispatch_id, const Status& status, std::span<const uint64_t> sizes) {
  WireHeader h = header(MsgKind::kTerminal, session, entry, generation, run_epoch, dispatch_id, 0);
  h.status_code = static_cast<int32_t>(status.code());
  h.tensor_count = static_cast<uint32_t>(sizes.size());
  const std::string_view text = std::string_view(status.message()).substr(0, status.ok() ? 0 : size_t{kWireMaxText});
  auto out = with_payload(h, sizes.size_bytes() + text.size());
  uint8_t* p = out.data() + sizeof(WireHeader);
  if (!sizes.empty()) std::memcpy(p, sizes.data(), sizes.size_bytes());
  if (!text.empty()) std::memcpy(p + sizes.size_bytes(), text.data(), text.size());
  return out;
}

std::vector<uint8_t> encode_text(MsgKind kind, uint64_t session, std::string_view text) {
  text = text.substr(0, kWireMaxText);
  auto out = with_payload(header(kind, session, 0, 0, 0, 0, 0), text.size());
  if (!text.empty()) std::memcpy(out.data() + sizeof(WireHeader), text.data(), text.size());
  return out;
}

std::vector<uint8_t> encode_memory_reply(uint64_t session, uint64_t total, uint64_t free_bytes) {
  auto out = with_payload(header(MsgKind::kMemoryReply, session, 0, 0, 0, 0, total), sizeof free_bytes);
  std::memcpy(out.data() + sizeof(WireHeader), &free_bytes, sizeof free_bytes);
  return out;
}

Result<TensorPlan> plan_tensors(const TaskArgs& args) {
  TensorPlan plan;
  std::vector<uint64_t> ends;  // per row: the end of its views' span
  for (size_t i = 0; i < args.size(); ++i) {
    const TaskArg& a = args[i];
    if (a.kind != TaskArg::Kind::Tensor) continue;
    const DeviceBuffer& b = a.tensor.buffer();
    if (!b.bound()) {
      return invalid_argument(
          "argument {}: a runtime-allocated Output cannot go to a remote node (nothing to return it into); pass "
          "an OutputExisting buffer",
          i);
    }
    uint32_t flags = 0;
    switch (a.tag) {
      case Tag::Input:
      case Tag::NoDep:
        flags = kToNode;
        break;
      case Tag::InOut:
      case Tag::Output:
      case Tag::OutputExisting:
        flags = kToNode | kFromNode;
        break;
      default:
        return invalid_argument("argument {}: tag {} is no tag", i, static_cast<int>(a.tag));
    }
    const uint64_t first = a.tensor.numel() == 0 ? 0 : a.tensor.first_byte() / kRowAlignment * kRowAlignment;
    const uint64_t end = a.tensor.numel() == 0 ? std::min<uint64_t>(b.bytes, 1) : a.tensor.end_byte();
    size_t k = 0;
    while (k < plan.rows.size() && plan.rows[k].addr != b.addr) ++k;
    if (k == plan.rows.size()) {
      plan.rows.push_back(TensorRow{b.addr, b.bytes, first, 0, flags, 0});
      plan.writes.emplace_back();
      ends.push_back(end);
    } else if (plan.rows[k].buffer_bytes != b.bytes) {
      return invalid_argument("argument {}: buffer {:#x} is named with {} and {} bytes", i, b.addr,
                              plan.rows[k].buffer_bytes, b.bytes);
    } else {
      plan.rows[k].flags |= flags;
      plan.rows[k].offset = std::min(plan.rows[k].offset, first);
      ends[k] = std::max(ends[k], end);
    }
    if (tag_writes(a.tag) && a.tensor.numel() != 0) plan.writes[k].push_back(a.tensor);
  }
  for (size_t k = 0; k < plan.rows.size(); ++k) plan.rows[k].bytes = ends[k] - plan.rows[k].offset;
  return plan;
}

bool row_lands_in_place(const TensorRow& row, const std::vector<TensorView>& writes) {
  return writes.size() == 1 && is_dense(writes[0]) && writes[0].first_byte() == row.offset &&
         writes[0].end_byte() == row.offset + row.bytes;
}

void scatter_writes(const TensorRow& row, const std::vector<TensorView>& writes, const uint8_t* received,
                    uint8_t* buffer) {
  for (const TensorView& w : writes) {
    (void)for_each_byte_run(w, [&](uint64_t at, uint64_t bytes) {
      std::memcpy(buffer + at, received + (at - row.offset), bytes);
      return Status();
    });
  }
}

Classified classify_reply(const Message& m, uint64_t session, std::span<const EntryIdentity> entries) {
  const WireHeader& h = m.h;
  const char* kind = msg_kind_name(m.kind);
  if (h.session != session) {
    return {Verdict::kUnattributable,
            invalid_argument("{}: session {:#x} is not this network's {:#x}", kind, h.session, session)};
  }
  if (h.entry >= entries.size()) {
    return {Verdict::kUnattributable,
            invalid_argument("{}: entry {} is outside the {} entries", kind, h.entry, entries.size())};
  }
  if (h.generation % 2 == 0) {
    return {Verdict::kUnattributable,
            invalid_argument("{}: entry {} generation {} is even (no occupant)", kind, h.entry, h.generation)};
  }
  const EntryIdentity& e = entries[h.entry];
  if (h.generation != e.generation) {
    return {Verdict::kStale, invalid_argument("{}: entry {} generation {} is not its occupant's ({})", kind, h.entry,
                                              h.generation, e.generation)};
  }
  if (h.run_epoch == 0) {
    return {Verdict::kUnattributable, invalid_argument("{}: entry {} run_epoch is 0", kind, h.entry)};
  }
  if (m.kind == MsgKind::kAck) {
    if (e.run_epoch != 0) {
      return {Verdict::kUnattributable,
              invalid_argument("ACK: entry {} generation {} was already acknowledged", h.entry, h.generation)};
    }
    return {Verdict::kAccept, Status()};
  }
  if (h.run_epoch != e.run_epoch) {
    return {Verdict::kUnattributable, invalid_argument("{}: entry {} run_epoch {} contradicts the acknowledged {}",
                                                       kind, h.entry, h.run_epoch, e.run_epoch)};
  }
  return {Verdict::kAccept, Status()};
}

Classified classify_request(const Message& m, uint64_t session, uint32_t entry_count,
                            std::span<const EntryIdentity> entries) {
  const WireHeader& h = m.h;
  if (h.session != session) {
    return {Verdict::kUnattributable,
            invalid_argument("REQUEST: session {:#x} is not the network's {:#x}", h.session, session)};
  }
  if (h.entry >= entry_count || h.entry >= entries.size()) {
    return {Verdict::kUnattributable,
            invalid_argument("REQUEST: entry {} is outside the {} entries", h.entry, entry_count)};
  }
  if (h.generation % 2 == 0) {
    return {Verdict::kUnattributable,
            invalid_argument("REQUEST: entry {} generation {} is even (no occupant)", h.entry, h.generation)};
  }
  const EntryIdentity& e = entries[h.entry];
  if (e.run_epoch != 0) {
    return {Verdict::kStale, invalid_argument("REQUEST: entry {} generation {} while generation {} still runs there",
                                              h.entry, h.generation, e.generation)};
  }
  if (h.generation <= e.generation) {
    return {Verdict::kStale, invalid_argument("REQUEST: entry {} generation {} is not newer than the last taken ({})",
                                              h.entry, h.generation, e.generation)};
  }
  return {Verdict::kAccept, Status()};
}

}  // namespace simpler::dist
