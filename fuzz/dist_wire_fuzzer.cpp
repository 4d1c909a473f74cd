// T7 for the MPI wire: decode_message, then both classifiers, on whatever a
// remote rank could send. Input: byte 0 picks the entry count (1 + byte % 8)
// and the current generations of the entries are the next 8 bytes (one each,
// read as small numbers); the rest is the message. Seeds:
// fuzz/corpus/fuzz_dist_wire/, from fuzz/make_seeds.py.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dist/wire.h"
#include "fuzz_check.h"

namespace simpler::dist {
namespace {

constexpr uint64_t kSession = 0x5e55;

void check(std::span<const uint8_t> in) {
  if (in.size() < 9) return;
  const uint32_t count = 1 + in[0] % 8;
  std::vector<EntryIdentity> entries(count);
  for (uint32_t i = 0; i < count; ++i) entries[i] = {in[1 + i], (in[1 + i] & 1) ? uint64_t{in[1 + i]} * 3 : 0};
  auto m = decode_message(in.subspan(9));
  if (!m.ok()) {
    FUZZ_CHECK(!m.status().message().empty());
    return;
  }
  // The views never leave the input, and the sizes agree with the header.
  FUZZ_CHECK(m->payload.size() == m->h.payload_bytes);
  FUZZ_CHECK(m->rows.size() <= kMaxTaskArgs && m->sizes.size() <= kMaxTaskArgs);
  for (const TensorRow& r : m->rows) {
    FUZZ_CHECK(r.bytes != 0 && r.bytes <= kWireMaxTensorBytes);
    FUZZ_CHECK(r.offset % kRowAlignment == 0 && r.offset <= r.buffer_bytes && r.bytes <= r.buffer_bytes - r.offset);
  }
  FUZZ_CHECK(m->config.size() <= kWireMaxConfig);
  if (m->kind == MsgKind::kFiles) {
    // A chunk lies inside its file; a name that passes the check stays inside the run's directory.
    FUZZ_CHECK(m->file_data.size() <= kFileChunkBytes && m->file.offset <= m->file.file_bytes &&
               m->file_data.size() <= m->file.file_bytes - m->file.offset);
    if (validate_file_chunk(*m).ok()) {
      // Relative, and no part is empty, "." or ".." ("..S" is a name like any other).
      FUZZ_CHECK(!m->file_name.empty() && m->file_name.front() != '/');
      std::string_view rest = m->file_name;
      for (;;) {
        const size_t slash = rest.find('/');
        const std::string_view part = rest.substr(0, slash);
        FUZZ_CHECK(!part.empty() && part != "." && part != "..");
        if (slash == std::string_view::npos) break;
        rest.remove_prefix(slash + 1);
      }
    }
  }
  const Classified reply = classify_reply(*m, kSession, entries);
  if (reply.verdict == Verdict::kAccept) {
    FUZZ_CHECK(m->h.entry < count && m->h.generation % 2 == 1 && m->h.generation == entries[m->h.entry].generation);
  } else {
    FUZZ_CHECK(!reply.why.ok());
  }
  if (reply.verdict == Verdict::kStale) FUZZ_CHECK(m->h.entry < count && m->h.generation % 2 == 1);
  if (m->kind == MsgKind::kRequest) {
    const Classified req = classify_request(*m, kSession, count, entries);
    if (req.verdict == Verdict::kAccept) {
      FUZZ_CHECK(m->h.entry < count && m->h.generation % 2 == 1 && entries[m->h.entry].run_epoch == 0 &&
                 m->h.generation > entries[m->h.entry].generation);
      auto args = decode_args_blob(m->args_blob.data(), m->args_blob.size());
      FUZZ_CHECK(args.ok());
    }
  }
}

}  // namespace
}  // namespace simpler::dist

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  simpler::dist::check(std::span<const uint8_t>(data, size));
  return 0;
}
