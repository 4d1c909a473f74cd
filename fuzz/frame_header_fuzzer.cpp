// T7: decode_request_header, what the child makes of a request frame's header
// before it stores anything. Input: byte 0 picks the grant G = 1 + byte % 8
// (M = G + K entries); the next 64 bytes are the header words; the rest are
// the entries, 28 bytes each: the generation (8), the state (4), the run id
// (8) and the dispatch id (8) (an entry past the input's end reads 0, IDLE,
// 0, 0: free). Seeds:
// fuzz/corpus/fuzz_frame_header/, from fuzz/make_seeds.py.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fuzz_check.h"
#include "ipc/mailbox_layout.h"
#include "ipc/request_header.h"

namespace simpler {
namespace {

inline constexpr size_t kMaxGrant = 8;

// One mapping for the largest grant, reused by every input: only the words
// the decoder reads are rewritten per input.
uint8_t* mailbox() {
  static uint8_t* base = [] {
    const size_t bytes = *mailbox_size(kMaxGrant);
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(alignof(MailboxRunEntry), bytes));
    std::memset(p, 0, bytes);
    return p;
  }();
  return base;
}

void check_verdict(const DecodedHeader& d, const MailboxView& view) {
  const RequestFields& f = d.fields;
  if (d.verdict == HeaderVerdict::kUnattributable) {
    FUZZ_CHECK(f.entry_index >= view.entry_count() || f.entry_generation % 2 == 0);
    FUZZ_CHECK(!d.why.ok());
    return;
  }
  // Every other verdict names an entry of this table and an occupied generation.
  FUZZ_CHECK(f.entry_index < view.entry_count());
  FUZZ_CHECK(f.entry_index <= UINT32_MAX);  // RunRequest keeps it in 32 bits
  FUZZ_CHECK(f.entry_generation % 2 == 1);
  const MailboxRunEntry& e = view.entry(f.entry_index);
  const bool ours = e.entry_generation == f.entry_generation && d.publication != 0 && e.state == kMailboxIdle &&
                    e.run_id == f.run_id && e.dispatch_id == f.dispatch_id;
  if (d.verdict == HeaderVerdict::kRefused) {
    FUZZ_CHECK(!ours);
    return;
  }
  FUZZ_CHECK(ours);
  const bool fits = f.protocol_version == kMailboxProtocolVersion && f.config_bytes <= kRequestConfigCapacity &&
                    f.args_bytes <= kRequestArgsCapacity;
  if (d.verdict == HeaderVerdict::kMalformed) {
    FUZZ_CHECK(!fits && !d.why.ok());
    return;
  }
  FUZZ_CHECK(d.verdict == HeaderVerdict::kAccepted);
  FUZZ_CHECK(fits && d.why.ok());
  FUZZ_CHECK(sizeof(RequestFrame::config) >= f.config_bytes && sizeof(RequestFrame::args) >= f.args_bytes);
}

}  // namespace
}  // namespace simpler

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace simpler;
  if (size < 1 + sizeof(RequestHeader)) return -1;  // not a header: keep it out of the corpus
  const uint64_t grant = 1 + data[0] % kMaxGrant;
  const Result<MailboxView> view = MailboxView::attach(mailbox(), *mailbox_size(kMaxGrant), grant);
  FUZZ_CHECK(view.ok());
  constexpr size_t kEntryBytes = 3 * sizeof(uint64_t) + sizeof(uint32_t);
  const uint8_t* entries = data + 1 + sizeof(RequestHeader);
  const size_t given = (size - 1 - sizeof(RequestHeader)) / kEntryBytes;
  for (uint64_t i = 0; i < view->entry_count(); ++i) {
    uint64_t g = 0;
    uint32_t state = kMailboxIdle;
    uint64_t run = 0;
    uint64_t dispatch = 0;
    if (i < given) {
      const uint8_t* at = entries + i * kEntryBytes;
      std::memcpy(&g, at, sizeof g);
      std::memcpy(&state, at + sizeof g, sizeof state);
      std::memcpy(&run, at + sizeof g + sizeof state, sizeof run);
      std::memcpy(&dispatch, at + 2 * sizeof g + sizeof state, sizeof dispatch);
    }
    view->entry(i).entry_generation = g;
    view->entry(i).state = state;
    view->entry(i).run_id = run;
    view->entry(i).dispatch_id = dispatch;
  }
  RequestHeader& shared = view->frame(0).header;
  std::memcpy(&shared, data + 1, sizeof shared);

  const DecodedHeader d = decode_request_header(load_request_header(shared), *view);
  FUZZ_CHECK(d == decode_request_header(load_request_header(shared), *view));
  check_verdict(d, *view);

  // Round trip through the parent's own store of the fields.
  RequestHeader again{};
  store_request_fields(again, d.fields);
  again.publication = d.publication;
  FUZZ_CHECK(decode_request_header(again, *view) == d);
  return 0;
}
