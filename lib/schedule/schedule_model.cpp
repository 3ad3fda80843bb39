// The prefetch scheduler's pipeline, replayed without a device: the scheduler's own staging
// policy (staging_policy.hpp: window, best-fit arena, fences), timed on three FIFO streams.
#include "tierflow/schedule_model.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <string>

#include "schedule/staging_policy.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow {

namespace {

// A staged run: when its fetch lands.
struct model_run {
  double h2d_end = -1;  // < 0: nothing fetched
};

// Device times of the fence events, by sequence number (1-based; 0 = no fence).
struct fence_times {
  std::vector<double> at{0.0};
  std::uint64_t push(double t) {
    at.push_back(t);
    return at.size() - 1;
  }
  [[nodiscard]] double operator[](std::uint64_t seq) const { return at[seq]; }
};

// Drives the staging policy and is its device: simulated clocks instead of streams and events.
class pipeline final : detail::staging_device {
 public:
  pipeline(const schedule_plan& plan, const std::vector<double>& compute,
           const schedule_model_options& o)
      : o_(o), compute_(compute), policy_(*this, o.unit) {
    std::uint64_t resident = 0;
    for (const auto& b : plan.buffers) {
      detail::staging_buffer m;
      m.bytes = b.bytes;
      m.aligned = detail::round_up(b.bytes, o.alignment);
      // A size near SIZE_MAX would round up to a small number and pass the budget check.
      TIERFLOW_EXPECTS(
          m.aligned >= b.bytes && resident <= std::numeric_limits<std::uint64_t>::max() - m.aligned,
          "predict_schedule: buffer '" + b.name + "' of " + std::to_string(b.bytes) +
              " bytes is too large to stage");
      m.resident = b.resident;
      resident += m.resident ? m.aligned : 0;
      policy_.add_buffer(m);
    }
    std::uint64_t largest = 0;
    for (const auto& st : plan.steps) {
      detail::staging_step m;
      std::vector<buffer_id> uses = st.reads;
      uses.insert(uses.end(), st.writes.begin(), st.writes.end());
      m.writes = st.writes;
      for (auto* v : {&uses, &m.writes}) {
        std::sort(v->begin(), v->end());
        v->erase(std::unique(v->begin(), v->end()), v->end());
      }
      for (const auto id : uses) {
        const auto buffers = policy_.buffer_count();
        TIERFLOW_EXPECTS(id < buffers, "predict_schedule: step '" + st.name + "' names buffer " +
                                           std::to_string(id) + " of " + std::to_string(buffers));
        const auto& b = policy_.buffer(id);
        if (!b.resident) {
          m.staged.push_back(id);
          TIERFLOW_EXPECTS(m.staged_bytes <= std::numeric_limits<std::uint64_t>::max() - b.aligned,
                           "predict_schedule: step '" + st.name +
                               "' stages too large a total (its buffers' sizes wrap)");
          m.staged_bytes += b.aligned;
        }
      }
      largest = std::max(largest, m.staged_bytes);
      policy_.add_step(std::move(m));
    }
    TIERFLOW_EXPECTS(resident + largest <= o.hbm_budget_bytes,
                     "predict_schedule: HBM budget " + std::to_string(o.hbm_budget_bytes) +
                         " B is too small for " + std::to_string(resident) +
                         " B of resident buffers plus the largest step's " +
                         std::to_string(largest) + " B");
    policy_.set_arena(o.hbm_budget_bytes - resident, o.alignment);
    policy_.set_window(o.window);
  }

  schedule_prediction run() {
    const std::size_t n = compute_.size();
    const std::size_t iterations = o_.iterations;
    // Without flushes the reported iteration ends where the next one's step 0 begins.
    const std::size_t simulated = o_.flush_each_iteration ? iterations : iterations + 1;
    std::vector<double> begin_of(simulated, 0.0);
    double iteration_start = 0;
    schedule_prediction out;
    for (std::size_t it = 0; it < simulated; ++it) {
      const bool reported = it + 1 == iterations;
      const std::uint64_t in_before = bytes_in_;
      const std::uint64_t out_before = bytes_out_;
      double stall = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t seq = it * n + i;
        const double start = acquire(seq);
        stall += start - ready_;
        if (i == 0) {
          begin_of[it] = start;
        }
        release(seq);
      }
      double end = 0;
      if (o_.flush_each_iteration) {
        end = flush();
      }
      if (reported) {
        out.stall_s = stall;
        out.bytes_in = bytes_in_ - in_before;
        out.bytes_out = bytes_out_ - out_before;
        out.iteration_s = o_.flush_each_iteration ? end - iteration_start : 0;
      }
      iteration_start = end;
    }
    if (!o_.flush_each_iteration) {
      out.iteration_s = begin_of[iterations] - begin_of[iterations - 1];
    }
    for (const double c : compute_) {
      out.compute_s += c;
    }
    out.stall_fraction = out.iteration_s > 0 ? out.stall_s / out.iteration_s : 0;
    const double in_s = static_cast<double>(out.bytes_in) / (o_.h2d.gbps * 1e9);
    const double out_s = static_cast<double>(out.bytes_out) / (o_.d2h.gbps * 1e9);
    out.lower_bound_s =
        std::max(out.compute_s, o_.full_duplex ? std::max(in_s, out_s) : in_s + out_s);
    out.staging_peak_bytes = policy_.staging_used().read().peak;
    return out;
  }

 private:
  // A copy that may start at @p start (its stream is free, its fences fired): returns its end.
  double transfer(double start, std::uint64_t bytes, const link_fit& link) {
    if (!o_.full_duplex) {
      start = std::max(start, link_free_);
    }
    const double end = start + link.seconds(bytes);
    link_free_ = std::max(link_free_, end);
    return end;
  }

  // --- staging_device: the policy's decisions on the simulated clocks ---
  void stage(std::uint64_t /*seq*/, const std::vector<buffer_id>& fetched,
             const detail::fence& after) override {
    model_run r;
    if (!fetched.empty()) {
      double t = std::max({h2d_free_, releases_[after.compute], writebacks_[after.writeback]});
      for (const auto id : fetched) {
        t = transfer(t, policy_.buffer(id).bytes, o_.h2d);
        bytes_in_ += policy_.buffer(id).bytes;
      }
      h2d_free_ = t;
      r.h2d_end = t;
    }
    staged_.push_back(r);
  }

  // The front run's compute starts when the compute stream comes to it (ready_) and its fetch
  // has landed.
  void launch() override {
    ready_ = compute_free_;
    start_ = std::max(ready_, staged_.front().h2d_end);
    compute_free_ = start_ + compute_[policy_.position() % compute_.size()];
  }

  std::uint64_t complete(bool /*dirty*/) override {
    staged_.pop_front();
    done_ = compute_free_;
    return releases_.push(done_);
  }

  std::uint64_t write_back(const std::vector<buffer_id>& ids) override {
    double t = std::max(d2h_free_, done_);
    for (const auto id : ids) {
      t = transfer(t, policy_.buffer(id).bytes, o_.d2h);
      bytes_out_ += policy_.buffer(id).bytes;
    }
    d2h_free_ = t;
    return writebacks_.push(t);
  }

  // Schedules step seq's compute after its fetch; returns its start (ready_: when the compute
  // stream came to it).
  double acquire(std::uint64_t seq) {
    if (!policy_.acquire(static_cast<std::size_t>(seq % compute_.size()))) {
      throw error("predict_schedule: internal: a step does not fit an empty arena");
    }
    return start_;
  }

  // The scheduler's caller says whether a step changed what it writes; the model assumes every
  // step that writes does.
  void release(std::uint64_t seq) {
    policy_.release(!policy_.step(static_cast<std::size_t>(seq % compute_.size())).writes.empty());
    policy_.pump();
  }

  // Writes back what is dirty, waits for the device, drops what was staged ahead.
  double flush() {
    double t = d2h_free_;
    for (buffer_id id = 0; id < policy_.buffer_count(); ++id) {
      const auto& b = policy_.buffer(id);
      if (b.staged && b.dirty) {
        t = transfer(std::max(t, compute_free_), b.bytes, o_.d2h);
        bytes_out_ += b.bytes;
        policy_.mark_clean(id);
      }
    }
    const double idle = std::max({t, h2d_free_, compute_free_, link_free_});
    policy_.drop_staged();
    staged_.clear();
    h2d_free_ = d2h_free_ = compute_free_ = link_free_ = idle;
    return idle;
  }

  const schedule_model_options& o_;
  const std::vector<double>& compute_;
  detail::staging_policy policy_;
  std::deque<model_run> staged_;  // as the policy's staged runs
  fence_times releases_;
  fence_times writebacks_;
  double h2d_free_ = 0;
  double d2h_free_ = 0;
  double compute_free_ = 0;
  double ready_ = 0;
  double start_ = 0;  // of the compute launched last
  double done_ = 0;   // of the compute completed last
  double link_free_ = 0;
  std::uint64_t bytes_in_ = 0;
  std::uint64_t bytes_out_ = 0;
};

}  // namespace

schedule_prediction predict_schedule(const schedule_plan& plan,
                                     const std::vector<double>& compute_s,
                                     const schedule_model_options& options) {
  TIERFLOW_EXPECTS(!plan.steps.empty(), "predict_schedule: the plan has no steps");
  TIERFLOW_EXPECTS(compute_s.size() == plan.steps.size(),
                   "predict_schedule: " + std::to_string(compute_s.size()) +
                       " compute times for a plan of " + std::to_string(plan.steps.size()) +
                       " steps");
  for (const double c : compute_s) {
    TIERFLOW_EXPECTS(std::isfinite(c) && c >= 0,
                     "predict_schedule: compute times must be finite and >= 0");
  }
  for (const auto* link : {&options.h2d, &options.d2h}) {
    TIERFLOW_EXPECTS(std::isfinite(link->gbps) && link->gbps > 0 &&
                         std::isfinite(link->latency_s) && link->latency_s >= 0,
                     "predict_schedule: a link needs a bandwidth > 0 and a latency >= 0");
  }
  TIERFLOW_EXPECTS(options.iterations >= 2, "predict_schedule: simulate at least 2 iterations");
  TIERFLOW_EXPECTS(options.alignment > 0 && (options.alignment & (options.alignment - 1)) == 0,
                   "predict_schedule: the alignment must be a power of two");
  pipeline p(plan, compute_s, options);
  return p.run();
}

}  // namespace tierflow
