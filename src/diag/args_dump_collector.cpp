#include "diag/args_dump_collector.h"

#include <filesystem>
#include <mutex>

#include <unistd.h>

#include <fmt/format.h>

#include "base/errors.h"

namespace simpler {

Result<std::unique_ptr<ArgsDumpCollector>> ArgsDumpCollector::start(Options options) {
  if (options.lanes == 0) return invalid_argument("an argument dump needs at least one lane");
  SIMPLER_RETURN_IF_ERROR(check_dump_lane_config(options.lane));
  std::unique_ptr<ArgsDumpCollector> c(new ArgsDumpCollector(std::move(options)));
  SIMPLER_ASSIGN_OR_RETURN(c->writer_, ArgsDumpWriter::open(c->options_.dir));
  for (uint32_t i = 0; i < c->options_.lanes; ++i) {
    SIMPLER_ASSIGN_OR_RETURN(std::unique_ptr<DumpLane> lane, DumpLane::create(c->options_.lane, &c->bell_));
    c->lanes_.push_back(std::move(lane));
    c->sinks_.push_back(c->writer_->sink_for(i));
  }
  c->thread_ = std::thread([p = c.get()] { p->drain_loop(); });
  return c;
}

ArgsDumpCollector::ArgsDumpCollector(Options options) : options_(std::move(options)) {}

ArgsDumpCollector::~ArgsDumpCollector() { (void)finish(false); }

void ArgsDumpCollector::drain_loop() {
  for (;;) {
    const uint32_t armed = bell_.arm();
    size_t n = 0;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (options_.hold && options_.hold(static_cast<uint32_t>(i))) continue;
      n += lanes_[i]->drain(sinks_[i]);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // A producer rings after every publication, so parking cannot miss one;
    // the deadline only bounds how late a stop is noticed if a ring is lost.
    if (n == 0) bell_.park(armed, now_ns() + 100'000'000);
  }
}

Status ArgsDumpCollector::finish(bool producers_stopped) {
  if (finished_) return finish_status_;
  finished_ = true;
  stop_.store(true, std::memory_order_release);
  bell_.ring();
  if (thread_.joinable()) thread_.join();
  ArgsDumpWriter::Summary s;
  s.run_epoch = options_.run_epoch;
  s.selection = options_.selection;
  s.kernel_name = options_.kernel_name;
  s.complete = producers_stopped;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    // Without the stop proof a producer may still be mid-record: reading its
    // open buffer could publish half a record, so only what it published counts.
    if (producers_stopped) {
      if (!lanes_[i]->drain_final(sinks_[i]).ok()) s.complete = false;
    } else {
      lanes_[i]->drain(sinks_[i]);
    }
    s.lanes.push_back(lanes_[i]->counts());
  }
  finish_status_ = writer_ != nullptr ? writer_->finish(s) : Status();
  if (!options_.publish_dir.empty()) {
    Status published = publish(options_.dir, options_.publish_dir);
    if (finish_status_.ok()) finish_status_ = std::move(published);
  }
  return finish_status_;
}

Status ArgsDumpCollector::publish(const std::string& staging, const std::string& dir) {
  namespace fs = std::filesystem;
  // rename() cannot replace a non-empty directory: the old dump moves aside
  // first. Serialised, so two finishing runs never interleave the two steps.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const std::string aside = fmt::format("{}.{}.old", staging, ::getpid());
  std::error_code ec;
  fs::remove_all(aside, ec);
  if (fs::exists(dir, ec)) {
    fs::rename(dir, aside, ec);
    if (ec) return internal_error("args dump: cannot move the previous {} aside: {}", dir, ec.message());
  }
  fs::rename(staging, dir, ec);
  if (ec) return internal_error("args dump: cannot move {} to {}: {}", staging, dir, ec.message());
  fs::remove_all(aside, ec);
  return Status();
}

}  // namespace simpler
