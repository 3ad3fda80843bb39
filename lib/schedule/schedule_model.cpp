// The prefetch scheduler's pipeline, replayed without a device: the same staging decisions as
// prefetch_scheduler.cpp (window, best-fit arena, fences), timed on three FIFO streams.
#include "tierflow/schedule_model.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <string>

#include "schedule/staging_arena.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow {

namespace {

struct model_buffer {
  std::uint64_t bytes = 0;
  std::uint64_t aligned = 0;
  bool resident = false;
  bool staged = false;
  std::uint64_t offset = 0;
  std::uint32_t holders = 0;
  bool dirty = false;
  std::uint64_t last_writeback = 0;  // fence seq
};

struct model_step {
  std::vector<buffer_id> staged;  // non-resident buffers used, sorted, unique
  std::vector<buffer_id> writes;  // sorted, unique
  std::uint64_t staged_bytes = 0;
};

struct model_run {
  std::uint64_t seq = 0;
  std::vector<buffer_id> fetched;
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

class pipeline {
 public:
  pipeline(const schedule_plan& plan, const std::vector<double>& compute,
           const schedule_model_options& o)
      : o_(o), compute_(compute), arena_(0, 1) {
    std::uint64_t resident = 0;
    for (const auto& b : plan.buffers) {
      model_buffer m;
      m.bytes = b.bytes;
      m.aligned = detail::round_up(b.bytes, o.alignment);
      // A size near SIZE_MAX would round up to a small number and pass the budget check.
      TIERFLOW_EXPECTS(
          m.aligned >= b.bytes && resident <= std::numeric_limits<std::uint64_t>::max() - m.aligned,
          "predict_schedule: buffer '" + b.name + "' of " + std::to_string(b.bytes) +
              " bytes is too large to stage");
      m.resident = b.resident;
      resident += m.resident ? m.aligned : 0;
      buffers_.push_back(m);
    }
    std::uint64_t largest = 0;
    for (const auto& st : plan.steps) {
      model_step m;
      std::vector<buffer_id> uses = st.reads;
      uses.insert(uses.end(), st.writes.begin(), st.writes.end());
      m.writes = st.writes;
      for (auto* v : {&uses, &m.writes}) {
        std::sort(v->begin(), v->end());
        v->erase(std::unique(v->begin(), v->end()), v->end());
      }
      for (const auto id : uses) {
        TIERFLOW_EXPECTS(id < buffers_.size(), "predict_schedule: step '" + st.name +
                                                   "' names buffer " + std::to_string(id) + " of " +
                                                   std::to_string(buffers_.size()));
        if (!buffers_[id].resident) {
          m.staged.push_back(id);
          TIERFLOW_EXPECTS(
              m.staged_bytes <= std::numeric_limits<std::uint64_t>::max() - buffers_[id].aligned,
              "predict_schedule: step '" + st.name +
                  "' stages too large a total (its buffers' sizes wrap)");
          m.staged_bytes += buffers_[id].aligned;
        }
      }
      largest = std::max(largest, m.staged_bytes);
      steps_.push_back(std::move(m));
    }
    TIERFLOW_EXPECTS(resident + largest <= o.hbm_budget_bytes,
                     "predict_schedule: HBM budget " + std::to_string(o.hbm_budget_bytes) +
                         " B is too small for " + std::to_string(resident) +
                         " B of resident buffers plus the largest step's " +
                         std::to_string(largest) + " B");
    arena_ = detail::staging_arena(o.hbm_budget_bytes - resident, o.alignment);
  }

  schedule_prediction run() {
    const std::size_t n = steps_.size();
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
    out.staging_peak_bytes = peak_;
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

  [[nodiscard]] std::uint64_t ahead() const { return staged_.size() - (acquired_ ? 1 : 0); }

  bool try_stage(std::uint64_t seq) {
    const auto& info = steps_[seq % steps_.size()];
    model_run r;
    r.seq = seq;
    std::vector<std::uint64_t> sizes;
    for (const auto id : info.staged) {
      if (!buffers_[id].staged) {
        r.fetched.push_back(id);
        sizes.push_back(buffers_[id].aligned);
      }
    }
    std::vector<std::uint64_t> offsets;
    detail::fence after;
    if (!arena_.allocate_all(sizes, offsets, after)) {
      return false;
    }
    for (const auto id : info.staged) {
      ++buffers_[id].holders;
    }
    for (std::size_t i = 0; i < r.fetched.size(); ++i) {
      auto& b = buffers_[r.fetched[i]];
      b.staged = true;
      b.offset = offsets[i];
      b.dirty = false;
      after.merge({0, b.last_writeback});
      used_ += b.aligned;
    }
    peak_ = std::max(peak_, used_);
    if (!r.fetched.empty()) {
      double t = std::max({h2d_free_, releases_[after.compute], writebacks_[after.writeback]});
      for (const auto id : r.fetched) {
        t = transfer(t, buffers_[id].bytes, o_.h2d);
        bytes_in_ += buffers_[id].bytes;
      }
      h2d_free_ = t;
      r.h2d_end = t;
    }
    staged_.push_back(std::move(r));
    return true;
  }

  void pump() {
    const auto n = steps_.size();
    std::uint64_t bytes_ahead = 0;
    if (o_.unit == window_unit::bytes) {
      for (const auto& r : staged_) {
        bytes_ahead +=
            r.seq >= position_ + (acquired_ ? 1 : 0) ? steps_[r.seq % n].staged_bytes : 0;
      }
    }
    while (ahead() < n) {
      const auto next = staged_.empty() ? position_ : staged_.back().seq + 1;
      const auto next_bytes = steps_[next % n].staged_bytes;
      if (o_.unit == window_unit::steps ? ahead() >= o_.window
                                        : bytes_ahead + next_bytes > o_.window) {
        return;
      }
      if (!try_stage(next)) {
        return;
      }
      bytes_ahead += next_bytes;
    }
  }

  // Schedules step seq's compute after its fetch; returns its start (ready_: when the compute
  // stream came to it).
  double acquire(std::uint64_t seq) {
    position_ = seq;
    if (staged_.empty() && !try_stage(seq)) {
      throw error("predict_schedule: internal: a step does not fit an empty arena");
    }
    const auto& r = staged_.front();
    ready_ = compute_free_;
    const double start = std::max(ready_, r.h2d_end);
    compute_free_ = start + compute_[seq % steps_.size()];
    acquired_ = true;
    pump();
    return start;
  }

  void release(std::uint64_t seq) {
    model_run r = std::move(staged_.front());
    staged_.pop_front();
    acquired_ = false;
    position_ = seq + 1;
    const double done = compute_free_;
    const auto release_seq = releases_.push(done);
    const auto& info = steps_[seq % steps_.size()];
    const bool dirty = !info.writes.empty();
    std::vector<buffer_id> write_back;
    for (const auto id : info.staged) {
      auto& b = buffers_[id];
      if (dirty && std::binary_search(info.writes.begin(), info.writes.end(), id)) {
        b.dirty = true;
      }
      if (--b.holders == 0) {
        if (b.dirty) {
          write_back.push_back(id);
        } else {
          arena_.free(b.offset, b.aligned, {release_seq, 0});
          b.staged = false;
          used_ -= b.aligned;
        }
      }
    }
    if (!write_back.empty()) {
      double t = std::max(d2h_free_, done);
      for (const auto id : write_back) {
        t = transfer(t, buffers_[id].bytes, o_.d2h);
        bytes_out_ += buffers_[id].bytes;
      }
      d2h_free_ = t;
      const auto written = writebacks_.push(t);
      for (const auto id : write_back) {
        auto& b = buffers_[id];
        b.last_writeback = written;
        arena_.free(b.offset, b.aligned, {release_seq, written});
        b.staged = false;
        b.dirty = false;
        used_ -= b.aligned;
      }
    }
    pump();
  }

  // Writes back what is dirty, waits for the device, drops what was staged ahead.
  double flush() {
    double t = d2h_free_;
    for (auto& b : buffers_) {
      if (b.staged && b.dirty) {
        t = transfer(std::max(t, compute_free_), b.bytes, o_.d2h);
        bytes_out_ += b.bytes;
        b.dirty = false;
      }
    }
    const double idle = std::max({t, h2d_free_, compute_free_, link_free_});
    for (auto& b : buffers_) {
      b.staged = false;
      b.holders = 0;
    }
    staged_.clear();
    arena_.reset();
    used_ = 0;
    h2d_free_ = d2h_free_ = compute_free_ = link_free_ = idle;
    return idle;
  }

  const schedule_model_options& o_;
  const std::vector<double>& compute_;
  std::vector<model_buffer> buffers_;
  std::vector<model_step> steps_;
  detail::staging_arena arena_;
  std::deque<model_run> staged_;
  bool acquired_ = false;
  std::uint64_t position_ = 0;
  fence_times releases_;
  fence_times writebacks_;
  double h2d_free_ = 0;
  double d2h_free_ = 0;
  double compute_free_ = 0;
  double ready_ = 0;
  double link_free_ = 0;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
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
