#include "schedule/scheduler_accounting.hpp"

#include <algorithm>
#include <chrono>

#include "tierflow/detail/stats.hpp"
#include "tierflow/error.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow::detail {

namespace {

// Adaptive window thresholds: grow above this stall fraction, consider shrinking below the other.
constexpr double grow_above = 0.02;
constexpr double shrink_below = 0.005;

}  // namespace

void scheduler_accounting::start(device& dev, event_ptr origin, const schedule_plan& plan,
                                 const scheduler_options& options) {
  origin_ = std::move(origin);
  dev.compute_stream().record(*origin_);
  origin_->synchronize();
  host_origin_ = metrics::trace_recorder::clock::now();
  options_ = options;
  properties_ = dev.properties();
  steps_in_plan_ = plan.steps.size();
  for (const auto& b : plan.buffers) {
    buffer_names_.push_back(b.name);
    buffer_bytes_.push_back(b.bytes);
  }
  for (const auto& s : plan.steps) {
    per_step_.push_back(step_metrics{s.name, 0, 0, 0, 0, 0, 0});
  }
}

double scheduler_accounting::seconds(event& e) const {
  return event::elapsed_ms(*origin_, e) / 1e3;
}

metrics::trace_recorder::clock::time_point scheduler_accounting::at(double t) const {
  return host_origin_ + std::chrono::duration_cast<metrics::trace_recorder::clock::duration>(
                            std::chrono::duration<double>(t));
}

// Accounts back-to-back transfers that began at @p start. With an end event per transfer (when
// tracing) each runs from the previous end to its own; with one for the batch, the batch's time
// is shared by bytes. Returns the time the last one ended.
double scheduler_accounting::transfers(const std::vector<buffer_id>& ids, event& start,
                                       const std::vector<event_ptr>& ends,
                                       metrics::link_counter& link, const char* track,
                                       const std::string& step, std::uint64_t& bytes) {
  double previous = seconds(start);
  if (ends.size() != ids.size()) {
    const double end = std::max(previous, seconds(*ends.back()));
    std::uint64_t total = 0;
    for (const auto id : ids) {
      total += buffer_bytes_[id];
    }
    for (const auto id : ids) {
      const auto n = buffer_bytes_[id];
      link.add(n, (end - previous) * static_cast<double>(n) / static_cast<double>(total));
    }
    bytes += total;
    return end;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const double end = std::max(previous, seconds(*ends[i]));
    const auto n = buffer_bytes_[ids[i]];
    link.add(n, end - previous);
    bytes += n;
    if (options_.trace) {
      trace_.span(track, buffer_names_[ids[i]], at(previous), at(end),
                  {{"bytes", static_cast<std::int64_t>(n)}, {"step", step}}, "transfer");
    }
    previous = end;
  }
  return previous;
}

std::optional<std::uint64_t> scheduler_accounting::add(const step_run& r, std::uint64_t window) {
  auto& per = per_step_[r.step];
  const double ready = seconds(*r.ready);
  const double begin = std::max(ready, seconds(*r.begin));
  const double done = std::max(begin, seconds(*r.done));
  std::uint64_t in = 0, out = 0;
  double last = done;
  double slack = 0;
  bool late = false;
  if (!r.fetched.empty()) {
    const double landed = transfers(r.fetched, *r.h2d_start, r.h2d_end, h2d_, "h2d", per.name, in);
    late = landed > ready;
    slack = ready - landed;
  }
  if (!r.written.empty()) {
    last =
        std::max(last, transfers(r.written, *r.d2h_start, r.d2h_end, d2h_, "d2h", per.name, out));
  }
  const double stall = begin - ready;
  const double compute = done - begin;
  if (options_.trace) {
    const auto pass = static_cast<std::int64_t>(r.seq / steps_in_plan_);
    if (stall > 0) {
      trace_.span("compute", "stall", at(ready), at(begin),
                  {{"step", per.name}, {"iteration", pass}}, "stall");
    }
    trace_.span("compute", per.name, at(begin), at(done),
                {{"iteration", pass},
                 {"bytes_in", static_cast<std::int64_t>(in)},
                 {"bytes_out", static_cast<std::int64_t>(out)}},
                "compute");
  }
  ++per.runs;
  per.bytes_in += in;
  per.bytes_out += out;
  per.compute_seconds += compute;
  per.stall_seconds += stall;
  per.late_prefetches += late ? 1 : 0;
  first_ = runs_ == 0 ? ready : std::min(first_, ready);
  last_ = runs_ == 0 ? last : std::max(last_, last);
  ++runs_;
  late_ += late ? 1 : 0;
  bytes_in_ += in;
  bytes_out_ += out;
  compute_ += compute;
  stall_ += stall;

  std::optional<std::uint64_t> change;
  if (r.step == 0) {
    if (open_ && current_.steps == steps_in_plan_) {
      current_.time = ready - current_start_;
      iterations_.push_back(current_);
      change = adapt(current_, r.budget_misses, window);
    }
    open_ = true;
    current_ = iteration{};
    current_start_ = ready;
    current_.misses_at_open = r.budget_misses;
  }
  if (open_) {
    current_.compute += compute;
    current_.stall += stall;
    current_.bytes_in += in;
    current_.bytes_out += out;
    ++current_.steps;
    if (!r.fetched.empty()) {
      current_.min_slack = current_.any_slack ? std::min(current_.min_slack, slack) : slack;
      current_.any_slack = true;
    }
  }
  return change;
}

std::optional<std::uint64_t> scheduler_accounting::adapt(const iteration& it, std::uint64_t misses,
                                                         std::uint64_t window) {
  if (!options_.adaptive || it.time <= 0) {
    return std::nullopt;
  }
  if (settling_) {  // this iteration ran partly under the old window
    settling_ = false;
    return std::nullopt;
  }
  const double stall_fraction = it.stall / it.time;
  const bool budget_bound = misses > it.misses_at_open;
  if (stall_fraction > grow_above && !budget_bound && window < options_.max_window) {
    stalled_floor_ = std::max(stalled_floor_, window);
    settling_ = true;
    return window + 1;
  }
  const double step_compute =
      it.compute / static_cast<double>(std::max<std::uint64_t>(it.steps, 1));
  if (stall_fraction < shrink_below && window > 1 && window - 1 > stalled_floor_ && it.any_slack &&
      it.min_slack > step_compute) {
    settling_ = true;
    return window - 1;
  }
  return std::nullopt;
}

void scheduler_accounting::discard(std::size_t runs) {
  failed_ += runs;
  open_ = false;
}

double scheduler_accounting::bandwidth(double given, const std::optional<double>& device_figure,
                                       const metrics::link_counter& measured) const {
  if (given > 0) {
    return given;
  }
  if (device_figure && *device_figure > 0) {
    return *device_figure;
  }
  return measured.read().achieved_gbps();
}

double scheduler_accounting::lower_bound(double compute, std::uint64_t in,
                                         std::uint64_t out) const {
  const double h2d = bandwidth(options_.h2d_gbps, properties_.h2d_gbps, h2d_);
  const double d2h = bandwidth(options_.d2h_gbps, properties_.d2h_gbps, d2h_);
  const double t_in = h2d > 0 ? static_cast<double>(in) / (h2d * 1e9) : 0;
  const double t_out = d2h > 0 ? static_cast<double>(out) / (d2h * 1e9) : 0;
  return properties_.full_duplex ? std::max({compute, t_in, t_out})
                                 : std::max(compute, t_in + t_out);
}

scheduler_metrics scheduler_accounting::snapshot() const {
  scheduler_metrics m;
  m.unit = options_.unit;
  m.adaptive = options_.adaptive;
  m.iterations = iterations_.size();
  m.steps = runs_;
  m.late_prefetches = late_;
  m.failed_steps = failed_;
  m.bytes_in = bytes_in_;
  m.bytes_out = bytes_out_;
  m.compute_seconds = compute_;
  m.stall_seconds = stall_;
  m.elapsed_seconds = runs_ > 0 ? last_ - first_ : 0;
  m.h2d_gbps = bandwidth(options_.h2d_gbps, properties_.h2d_gbps, h2d_);
  m.d2h_gbps = bandwidth(options_.d2h_gbps, properties_.d2h_gbps, d2h_);
  m.full_duplex = properties_.full_duplex;
  m.h2d = h2d_.read();
  m.d2h = d2h_.read();
  m.per_step = per_step_;
  if (!iterations_.empty()) {
    std::vector<double> times, bounds, stalls, efficiencies;
    for (const auto& it : iterations_) {
      const double bound = lower_bound(it.compute, it.bytes_in, it.bytes_out);
      times.push_back(it.time);
      bounds.push_back(bound);
      stalls.push_back(it.time > 0 ? it.stall / it.time : 0);
      efficiencies.push_back(it.time > 0 ? bound / it.time : 0);
    }
    m.step_time_s = median(times);
    m.lower_bound_s = median(bounds);
    m.stall_fraction = median(stalls);
    // Each iteration against its own bound: the ratio of the two medians could pair a slow
    // iteration's bound with a fast one's time when iterations differ (a preempted host).
    m.overlap_efficiency = median(efficiencies);
  } else if (runs_ > 0) {
    const double scale = static_cast<double>(steps_in_plan_) / static_cast<double>(runs_);
    m.step_time_s = m.elapsed_seconds * scale;
    m.lower_bound_s = lower_bound(compute_, bytes_in_, bytes_out_) * scale;
    m.stall_fraction = m.elapsed_seconds > 0 ? stall_ / m.elapsed_seconds : 0;
    m.overlap_efficiency = m.step_time_s > 0 ? m.lower_bound_s / m.step_time_s : 0;
  }
  return m;
}

}  // namespace tierflow::detail

namespace tierflow {

// The scheduler's scalar figures, declared once (mimalloc's way with its stats): the JSON key
// (docs/scheduler.md), the member, how Prometheus exports it (gauge, counter, or none: the
// JSON only, or exported with labels below) and its Prometheus name and help. to_json() writes
// them in this order, then window_unit and the nested objects.
#define TIERFLOW_SCHEDULER_METRICS(X)                                                              \
  X(step_time_s, step_time_s, gauge, "scheduler_step_time_seconds",                                \
    "Median time of one iteration of the plan")                                                    \
  X(lower_bound_s, lower_bound_s, gauge, "scheduler_lower_bound_seconds",                          \
    "max(compute, bytes in / h2d bandwidth, bytes out / d2h bandwidth) per iteration")             \
  X(overlap_efficiency, overlap_efficiency, gauge, "scheduler_overlap_efficiency_ratio",           \
    "Median of each iteration's lower bound / achieved time")                                      \
  X(stall_fraction, stall_fraction, gauge, "scheduler_stall_fraction_ratio",                       \
    "Share of the time compute waited for a prefetch")                                             \
  X(bytes_in, bytes_in, counter, "scheduler_bytes_in_total", "Bytes fetched into HBM staging")     \
  X(bytes_out, bytes_out, counter, "scheduler_bytes_out_total",                                    \
    "Bytes written back to their tiers")                                                           \
  X(bytes_discarded, bytes_discarded, counter, "scheduler_bytes_discarded_total",                  \
    "Bytes fetched ahead and dropped unused")                                                      \
  X(hbm_staging_peak_bytes, hbm_staging_peak_bytes, gauge, "scheduler_hbm_staging_peak_bytes",     \
    "Most HBM staging held at once")                                                               \
  X(window, window, none, "", "")                                                                  \
  X(adaptive, adaptive, none, "", "")                                                              \
  X(hbm_resident_bytes, hbm_resident_bytes, gauge, "scheduler_hbm_resident_bytes",                 \
    "HBM held by resident buffers")                                                                \
  X(hbm_budget_bytes, hbm_budget_bytes, gauge, "scheduler_hbm_budget_bytes",                       \
    "HBM budget of the scheduler")                                                                 \
  X(iterations, iterations, counter, "scheduler_iterations_total", "Complete iterations measured") \
  X(steps, steps, counter, "scheduler_steps_total", "Step runs measured")                          \
  X(late_prefetches, late_prefetches, counter, "scheduler_late_prefetches_total",                  \
    "Step runs whose prefetch landed late")                                                        \
  X(failed_steps, failed_steps, counter, "scheduler_failed_steps_total",                           \
    "Step runs discarded after a device failure")                                                  \
  X(compute_s, compute_seconds, counter, "scheduler_compute_seconds_total",                        \
    "Time of the steps' work on the compute stream")                                               \
  X(stall_s, stall_seconds, counter, "scheduler_stall_seconds_total",                              \
    "Time compute waited for prefetches")                                                          \
  X(elapsed_s, elapsed_seconds, none, "", "")

namespace {

void link_json(metrics::json_writer& w, const metrics::link_usage& u) {
  w.begin_object()
      .key("bytes")
      .value(u.bytes)
      .key("transfers")
      .value(u.transfers)
      .key("busy_seconds")
      .value(u.busy_seconds)
      .key("achieved_gbps")
      .value(u.achieved_gbps())
      .end_object();
}

}  // namespace

std::string scheduler_metrics::to_json() const {
  metrics::json_writer w;
  w.begin_object();
#define TIERFLOW_JSON_FIELD(json_name, field, kind, prometheus_name, help) \
  w.key(#json_name).value(field);
  TIERFLOW_SCHEDULER_METRICS(TIERFLOW_JSON_FIELD)
#undef TIERFLOW_JSON_FIELD
  w.key("window_unit").value(to_string(unit));
  w.key("bound_gbps")
      .begin_object()
      .key("h2d")
      .value(h2d_gbps)
      .key("d2h")
      .value(d2h_gbps)
      .key("full_duplex")
      .value(full_duplex)
      .end_object();
  w.key("links").begin_object().key("h2d");
  link_json(w, h2d);
  w.key("d2h");
  link_json(w, d2h);
  w.end_object();
  w.key("per_step").begin_array();
  for (const auto& s : per_step) {
    w.begin_object()
        .key("name")
        .value(s.name)
        .key("runs")
        .value(s.runs)
        .key("bytes_in")
        .value(s.bytes_in)
        .key("bytes_out")
        .value(s.bytes_out)
        .key("compute_s")
        .value(s.compute_seconds)
        .key("stall_s")
        .value(s.stall_seconds)
        .key("late_prefetches")
        .value(s.late_prefetches)
        .end_object();
  }
  w.end_array();
  w.end_object();
  return w.str();
}

void scheduler_metrics::to_prometheus(metrics::prometheus_writer& out) const {
  const auto d = [](auto v) { return static_cast<double>(v); };
  const auto none = [](std::string_view, std::string_view, double) {};
  const auto gauge = [&](std::string_view name, std::string_view help, double value) {
    out.gauge(name, help, value);
  };
  const auto counter = [&](std::string_view name, std::string_view help, double value) {
    out.counter(name, help, value);
  };
#define TIERFLOW_PROMETHEUS_FIELD(json_name, field, kind, prometheus_name, help) \
  kind(prometheus_name, help, d(field));
  TIERFLOW_SCHEDULER_METRICS(TIERFLOW_PROMETHEUS_FIELD)
#undef TIERFLOW_PROMETHEUS_FIELD
  out.gauge("scheduler_window", "Prefetch window now", d(window),
            {{"unit", std::string(to_string(unit))}});
  for (const auto& [name, u] : {std::pair{"h2d", h2d}, std::pair{"d2h", d2h}}) {
    out.counter("scheduler_link_bytes_total", "Bytes the scheduler moved per link", d(u.bytes),
                {{"link", name}});
    out.counter("scheduler_link_busy_seconds_total", "Time the scheduler's transfers took",
                u.busy_seconds, {{"link", name}});
  }
  for (const auto& s : per_step) {
    const metrics::prometheus_writer::labels step{{"step", s.name}};
    out.counter("scheduler_step_bytes_in_total", "Bytes fetched for a step", d(s.bytes_in), step);
    out.counter("scheduler_step_bytes_out_total", "Bytes written back after a step", d(s.bytes_out),
                step);
    out.counter("scheduler_step_compute_seconds_total", "Compute time of a step", s.compute_seconds,
                step);
    out.counter("scheduler_step_stall_seconds_total", "Stall before a step", s.stall_seconds, step);
    out.counter("scheduler_step_late_prefetches_total", "Late prefetches of a step",
                d(s.late_prefetches), step);
  }
}

}  // namespace tierflow
