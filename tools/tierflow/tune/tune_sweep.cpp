// The sweeps of `tierflow tune` (tune_sweep.hpp): the demo's model or a plan file, at every
// setting, measured and/or predicted.
#include "tune/tune_sweep.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>

#include <unistd.h>

#include "common/format.hpp"
#include "common/svg_chart.hpp"
#include "demo/demo_train.hpp"
#include "tierflow/detail/stats.hpp"
#include "tierflow/error.hpp"
#include "tune/plan_workload.hpp"
#include "tune/tune_model.hpp"

namespace tierflow::cli::tune {

namespace {

std::vector<std::string> parse_modes(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!parse_adam_mode(item)) {
      throw input_error("--adam-modes", "expected a comma-separated list of cpu, streamed, auto",
                        text);
    }
    out.push_back(item);
  }
  if (out.empty()) {
    throw input_error("--adam-modes", "the list is empty", text);
  }
  return out;
}

void progress(const tune_options& t, const tune_point& p) {
  if (t.as_json) {
    return;
  }
  std::fprintf(stderr, "tune: window %llu, adam chunk %llu B, %s: step %.2f ms, stall %.1f %%",
               static_cast<unsigned long long>(p.window), static_cast<unsigned long long>(p.chunk),
               p.mode.c_str(), p.step_s * 1e3, 100 * p.stall);
  if (p.predicted_s != not_predicted) {
    std::fprintf(stderr, ", predicted %.2f ms", p.predicted_s * 1e3);
  }
  std::fprintf(stderr, "\n");
}

// The device a sweep runs on (the demo's: same --device, --emu-link / TIERFLOW_EMU_LINK
// handling) and the machine's topology.
struct sweep_machine {
  std::unique_ptr<device> dev;
  topology topo;
};

sweep_machine open_sweep_machine(const demo::demo_options& o) {
  std::string note;
  auto dev = demo::open_demo_device(o, note);
  return {std::move(dev), topology::discover()};
}

// The demo's model over windows × chunks × modes. Each (mode, chunk) is calibrated first when
// there is a model; a mode that fails at its first setting is skipped, saying why.
class demo_sweep {
 public:
  demo_sweep(const tune_options& t, const std::vector<std::uint64_t>& windows);
  void sweep_mode(const std::string& mode, const std::vector<std::uint64_t>& chunks);
  tune_sweep predict();

 private:
  void sweep_chunk(std::uint64_t chunk);
  void calibrate(std::uint64_t chunk);
  void measure(tune_point& p);

  const tune_options& t_;
  const std::vector<std::uint64_t>& windows_;
  demo::demo_options o_;
  sweep_machine machine_;
  bool model_;
  tune_sweep s_;
  link_fits links_;
  std::vector<demo_calibration> cals_;  // one per (mode, chunk) that ran
  std::vector<std::size_t> cal_of_point_;
};

demo::demo_options sweep_model_options(const tune_options& t) {
  demo::demo_options o = t.model;
  o.steps = t.warmup_steps + t.measure_steps;
  o.verify = false;
  o.log_every = 0;
  return o;
}

demo_sweep::demo_sweep(const tune_options& t, const std::vector<std::uint64_t>& windows)
    : t_(t),
      windows_(windows),
      o_(sweep_model_options(t)),
      machine_(open_sweep_machine(o_)),
      model_(t.model_only || t.with_model) {
  s_.workload = {{"layers", o_.layers}, {"width", o_.width}, {"batch", o_.batch}};
  s_.workload_text = "the demo's model, " + std::to_string(o_.layers) + " layers &times; " +
                     std::to_string(o_.width) + ", batch " + std::to_string(o_.batch) + ".";
  if (!model_) {
    return;
  }
  links_ = probe_model_links(*machine_.dev, machine_.topo, o_);
  s_.model = {{"links", links_json(links_)},
              {"calibration", "per (Adam mode, chunk): " + std::to_string(calibration_warmup) +
                                  " + " + std::to_string(calibration_steps) + " steps at window " +
                                  std::to_string(windows.back()) + " less a run of the first " +
                                  std::to_string(calibration_warmup) +
                                  "; per-layer compute averaged over every calibration run; "
                                  "per (Adam mode, chunk), its last Adam step"}};
}

void demo_sweep::sweep_mode(const std::string& mode, const std::vector<std::uint64_t>& chunks) {
  const std::size_t mode_start = s_.points.size();
  for (std::uint64_t c : chunks) {
    o_.adam_chunk = c;
    o_.adam_mode = mode;
    try {
      sweep_chunk(c);
    } catch (const input_error&) {
      throw;
    } catch (const error& e) {  // e.g. streamed mode over params that live in host memory
      if (c != chunks.front() || s_.points.size() != mode_start) {
        throw;  // it ran at the first setting: a failure now is not the mode's
      }
      s_.skipped.push_back({{"adam_mode", mode}, {"reason", e.what()}});
      return;
    }
  }
}

void demo_sweep::sweep_chunk(std::uint64_t chunk) {
  if (model_) {
    calibrate(chunk);
  }
  for (std::uint64_t w : windows_) {
    o_.window = w;
    tune_point p;
    p.window = w;
    p.chunk = chunk * sizeof(float);
    if (model_) {
      p.mode = cals_.back().mode;
    }
    if (!t_.model_only) {
      measure(p);
    }
    s_.points.push_back(p);
    cal_of_point_.push_back(cals_.size() - 1);  // unused without a model
  }
}

// At the largest window: the one every setting of the chunk shares.
void demo_sweep::calibrate(std::uint64_t chunk) {
  o_.window = windows_.back();
  cals_.push_back(calibrate_demo(o_, *machine_.dev, machine_.topo));
  const auto& cal = cals_.back();
  s_.model["calibrated"].push_back(
      {{"adam_mode", cal.mode},
       {"chunk_bytes", chunk * sizeof(float)},
       {"compute_s", std::accumulate(cal.compute_s.begin(), cal.compute_s.end(), 0.0)},
       {"adam_step_s", cal.adam_s}});
}

void demo_sweep::measure(tune_point& p) {
  const demo::run_result r = demo::train(o_, *machine_.dev, machine_.topo, false, true);
  p.mode = std::string(to_string(r.adam->mode));
  p.step_s = median_after(r.step_seconds, t_.warmup_steps);
  p.stall = r.sched.stall_fraction;
  p.hbm = r.sched.hbm_staging_peak_bytes + r.adam->hbm_staging_peak_bytes + r.adam->hbm_undo_bytes;
  progress(t_, p);
}

// Every point predicted (its step time with --model-only, else beside the measured one).
tune_sweep demo_sweep::predict() {
  if (cals_.empty()) {
    return std::move(s_);
  }
  // The layers' compute does not depend on the Adam chunk or mode: pool it over every
  // calibration run, so that one run on a busy machine does not move a whole line.
  std::vector<double> pooled(cals_.front().compute_s.size(), 0.0);
  for (const auto& cal : cals_) {
    for (std::size_t i = 0; i < pooled.size(); ++i) {
      pooled[i] += cal.compute_s[i] / static_cast<double>(cals_.size());
    }
  }
  s_.model["compute_s"] = std::accumulate(pooled.begin(), pooled.end(), 0.0);
  for (std::size_t i = 0; i < s_.points.size(); ++i) {
    tune_point& p = s_.points[i];
    demo_calibration cal = cals_[cal_of_point_[i]];
    cal.compute_s = pooled;
    o_.window = p.window;
    tune_point predicted_point = p;
    double predicted = 0;
    predict_demo(o_, cal, links_, predicted_point, predicted);
    if (t_.model_only) {
      p = predicted_point;
      p.step_s = predicted;
      progress(t_, p);
    } else {
      p.predicted_s = predicted;
    }
  }
  return std::move(s_);
}

std::uint64_t largest_staging_budget(const tune_plan& tp,
                                     const std::vector<std::uint64_t>& windows) {
  std::uint64_t largest = 0;
  for (std::uint64_t w : windows) {
    largest = std::max(largest, plan_staging_budget(tp, w));
  }
  return largest;
}

tune_sweep describe_plan(const tune_options& t, const tune_plan& tp) {
  tune_sweep s;
  s.workload = {{"plan", t.plan},
                {"buffers", tp.plan.buffers.size()},
                {"steps", tp.plan.steps.size()},
                {"bytes", tp.total_bytes}};
  s.workload_text = "the plan " + html_escape(t.plan) + ", " +
                    std::to_string(tp.plan.buffers.size()) + " buffers, " +
                    std::to_string(tp.plan.steps.size()) + " steps.";
  return s;
}

// Every buffer lives in host memory, and so does the emulated HBM: keep to half of RAM.
void check_plan_fits_memory(const tune_options& t, const tune_plan& tp,
                            std::uint64_t staging_bytes) {
  const auto ram = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                   static_cast<std::uint64_t>(::sysconf(_SC_PAGE_SIZE));
  if (tp.total_bytes + staging_bytes > ram / 2) {
    throw input_error(t.plan,
                      "running it needs " + format_byte_count(tp.total_bytes + staging_bytes) +
                          " of host memory (buffers and emulated HBM), more than half of this "
                          "machine's " +
                          format_byte_count(ram) + "; --model-only predicts it without running");
  }
}

// The points of every window as the model predicts them (predicted_s).
void predict_plan_points(tune_sweep& s, const tune_plan& tp,
                         const std::vector<std::uint64_t>& windows, const link_fits& links) {
  s.model = {{"links", links_json(links)}, {"calibration", "compute_ms of the plan"}};
  for (std::uint64_t w : windows) {
    tune_point p;
    p.window = w;
    p.mode = "none";
    predict_plan(tp, links, p, p.predicted_s);
    s.points.push_back(p);
  }
}

// Each window run; with a model its prediction kept beside the measurement.
void measure_plan_points(tune_sweep& s, const tune_options& t,
                         const std::vector<std::uint64_t>& windows, plan_workload& work,
                         device& dev) {
  for (std::size_t i = 0; i < windows.size(); ++i) {
    tune_point p = run_plan(work, dev, windows[i], t.warmup_steps, t.measure_steps);
    if (t.with_model) {
      p.predicted_s = s.points[i].predicted_s;
      s.points[i] = p;
    } else {
      s.points.push_back(p);
    }
    progress(t, p);
  }
}

}  // namespace

std::vector<std::uint64_t> parse_list(const std::string& text, const std::string& flag,
                                      bool allow_zero) {
  std::vector<std::uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    std::uint64_t value = 0;
    try {
      value = std::stoull(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || item[0] == '-' || (!allow_zero && value == 0)) {
      throw input_error(flag,
                        allow_zero ? "expected a comma-separated list of integers >= 0"
                                   : "expected a comma-separated list of integers > 0",
                        text);
    }
    out.push_back(value);
  }
  if (out.empty()) {
    throw input_error(flag, "the list is empty", text);
  }
  return out;
}

double median_after(std::vector<double> seconds, std::size_t warmup) {
  seconds.erase(seconds.begin(), seconds.begin() + static_cast<long>(warmup));
  return detail::median(std::move(seconds));
}

tune_sweep sweep_demo(const tune_options& t, const std::vector<std::uint64_t>& windows) {
  const auto chunks = parse_list(t.chunks, "--adam-chunks", false);
  const auto modes = parse_modes(t.adam_modes);
  demo_sweep sweep(t, windows);
  for (const auto& mode : modes) {
    sweep.sweep_mode(mode, chunks);
  }
  return sweep.predict();
}

tune_sweep sweep_plan(const tune_options& t, const std::vector<std::uint64_t>& windows) {
  tune_plan tp = load_tune_plan(t.plan);
  const std::uint64_t largest_budget = largest_staging_budget(tp, windows);
  tune_sweep s = describe_plan(t, tp);
  if (!t.model_only) {
    check_plan_fits_memory(t, tp, largest_budget);
  }
  // The demo's device: with a zero-width model its HBM is the staging budget plus its fixed
  // slack.
  demo::demo_options o = t.model;
  o.width = 0;
  o.hbm_budget_mib = t.model_only ? 0 : static_cast<double>(largest_budget) / 1048576.0 + 1;
  sweep_machine machine = open_sweep_machine(o);
  if (t.model_only || t.with_model) {
    predict_plan_points(s, tp, windows, probe_model_links(*machine.dev, machine.topo, o));
  }
  if (t.model_only) {
    for (auto& p : s.points) {
      p.step_s = p.predicted_s;
      p.predicted_s = not_predicted;
      progress(t, p);
    }
    return s;
  }
  plan_workload work(std::move(tp), machine.topo, o);
  measure_plan_points(s, t, windows, work, *machine.dev);
  return s;
}

}  // namespace tierflow::cli::tune
