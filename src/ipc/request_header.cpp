#include "ipc/request_header.h"

#include "base/errors.h"

namespace simpler {

void store_request_fields(RequestHeader& h, const RequestFields& f) {
  store_relaxed(h.protocol_version, f.protocol_version);
  store_relaxed(h.entry_index, f.entry_index);
  store_relaxed(h.entry_generation, f.entry_generation);
  store_relaxed(h.run_id, f.run_id);
  store_relaxed(h.dispatch_id, f.dispatch_id);
  store_relaxed(h.task_slot, f.task_slot);
  store_relaxed(h.config_bytes, f.config_bytes);
  store_relaxed(h.args_bytes, f.args_bytes);
}

RequestHeader load_request_header(const RequestHeader& h) {
  RequestHeader s{};
  // Acquire first: the fields below are the ones written before this publication.
  s.publication = load_acquire(h.publication);
  s.protocol_version = load_relaxed(h.protocol_version);
  s.entry_index = load_relaxed(h.entry_index);
  s.entry_generation = load_relaxed(h.entry_generation);
  s.run_id = load_relaxed(h.run_id);
  s.dispatch_id = load_relaxed(h.dispatch_id);
  s.task_slot = load_relaxed(h.task_slot);
  s.config_bytes = load_relaxed(h.config_bytes);
  s.args_bytes = load_relaxed(h.args_bytes);
  return s;
}

DecodedHeader decode_request_header(const RequestHeader& s, const MailboxView& view) {
  DecodedHeader d;
  d.publication = s.publication;
  d.fields = RequestFields{s.protocol_version, s.entry_index, s.entry_generation, s.run_id,
                           s.dispatch_id,      s.task_slot,   s.config_bytes,     s.args_bytes};
  if (s.entry_index >= view.entry_count() || s.entry_generation % 2 == 0) {
    d.verdict = HeaderVerdict::kUnattributable;
    d.why = failed_precondition("entry {} generation {} (table has {} entries)", s.entry_index, s.entry_generation,
                                view.entry_count());
    return d;
  }
  const MailboxRunEntry& e = view.entry(s.entry_index);
  // The entry's run words are the parent's, stored before the generation
  // this acquire reads: a header that names this generation but not this run
  // is not the occupant's request, however well formed.
  if (load_acquire(e.entry_generation) != s.entry_generation || s.publication == 0 ||
      load_acquire(e.state) != kMailboxIdle || load_relaxed(e.run_id) != s.run_id ||
      load_relaxed(e.dispatch_id) != s.dispatch_id) {
    d.verdict = HeaderVerdict::kRefused;
    return d;
  }
  if (s.protocol_version != kMailboxProtocolVersion) {
    d.verdict = HeaderVerdict::kMalformed;
    d.why = invalid_argument("request protocol version {} is not {}", s.protocol_version, kMailboxProtocolVersion);
  } else if (s.config_bytes > kRequestConfigCapacity || s.args_bytes > kRequestArgsCapacity) {
    d.verdict = HeaderVerdict::kMalformed;
    d.why = invalid_argument("request sizes config {} args {} exceed the frame ({} / {})", s.config_bytes, s.args_bytes,
                             kRequestConfigCapacity, kRequestArgsCapacity);
  } else {
    d.verdict = HeaderVerdict::kAccepted;
  }
  return d;
}

}  // namespace simpler
