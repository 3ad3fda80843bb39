#pragma once
// The prefetch scheduler's accounting: turns the events of finished step runs into times,
// bytes, stalls, per-iteration bounds, trace spans and adaptive-window decisions.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tierflow/device.hpp"
#include "tierflow/exporters.hpp"
#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::detail {

using event_ptr = std::shared_ptr<event>;

/** One run of one plan step, from its prefetch to its write-back, as device events. */
struct step_run {
  std::uint64_t seq = 0;  // iteration * steps + step
  std::size_t step = 0;
  std::vector<buffer_id> fetched;
  event_ptr h2d_start;
  std::vector<event_ptr> h2d_end;  // one per fetched buffer when tracing, else one
  event_ptr ready;                 // compute stream: ready for the step
  event_ptr begin;                 // compute stream: after waiting for the prefetch
  event_ptr done;                  // compute stream: the step's work done
  std::vector<buffer_id> written;
  event_ptr d2h_start;
  std::vector<event_ptr> d2h_end;   // one per written-back buffer, in order
  std::uint64_t budget_misses = 0;  // prefetches the budget had held back when it was released
};

class scheduler_accounting {
 public:
  /** Records @p origin on the compute stream and waits for it: times are seconds after it. */
  void start(device& dev, event_ptr origin, const schedule_plan& plan,
             const scheduler_options& options);
  /** Accounts a run whose events have all fired without error. Returns a new window when
   *  adapting. */
  std::optional<std::uint64_t> add(const step_run& r, std::uint64_t window);
  /** Runs thrown away after a failure: counted, and the open iteration is abandoned. */
  void discard(std::size_t runs);
  [[nodiscard]] scheduler_metrics snapshot() const;
  [[nodiscard]] const metrics::trace_recorder& trace() const noexcept { return trace_; }

 private:
  struct iteration {
    double time = 0, compute = 0, stall = 0;
    std::uint64_t bytes_in = 0, bytes_out = 0;
    double min_slack = 0;  // earliest margin by which a prefetch beat its step (s)
    bool any_slack = false;
    std::uint64_t steps = 0;
    std::uint64_t misses_at_open = 0;
  };
  double seconds(event& e) const;
  metrics::trace_recorder::clock::time_point at(double t) const;
  double transfers(const std::vector<buffer_id>& ids, event& start,
                   const std::vector<event_ptr>& ends, metrics::link_counter& link,
                   const char* track, const std::string& step, std::uint64_t& bytes);
  std::optional<std::uint64_t> adapt(const iteration& it, std::uint64_t misses,
                                     std::uint64_t window);  // misses: as of the closing run
  [[nodiscard]] double lower_bound(double compute, std::uint64_t in, std::uint64_t out) const;
  [[nodiscard]] double bandwidth(double given, const std::optional<double>& device_figure,
                                 const metrics::link_counter& measured) const;

  event_ptr origin_;
  metrics::trace_recorder::clock::time_point host_origin_;
  scheduler_options options_;
  device_properties properties_;
  std::vector<std::string> buffer_names_;
  std::vector<std::uint64_t> buffer_bytes_;
  std::vector<step_metrics> per_step_;
  metrics::link_counter h2d_, d2h_;
  metrics::trace_recorder trace_;
  std::uint64_t steps_in_plan_ = 0;
  std::uint64_t runs_ = 0, failed_ = 0, late_ = 0, bytes_in_ = 0, bytes_out_ = 0;
  double compute_ = 0, stall_ = 0, first_ = 0, last_ = 0;
  bool open_ = false;
  iteration current_;
  double current_start_ = 0;
  std::vector<iteration> iterations_;
  std::uint64_t stalled_floor_ = 0;  // adaptive: the largest window that stalled
  bool settling_ = false;            // adaptive: the iteration after a change is not judged
};

}  // namespace tierflow::detail
