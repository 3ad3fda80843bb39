// tune's model (tune_model.hpp).
#include "tune/tune_model.hpp"

#include <algorithm>

#include "demo/demo_model.hpp"
#include "demo/demo_train.hpp"
#include "tierflow/schedule_model.hpp"
#include "tune/plan_workload.hpp"

namespace tierflow::cli::tune {

namespace {

// The model's options from the probed links, at @p window within @p hbm_budget_bytes.
schedule_model_options model_options(const link_fits& links, std::uint64_t window,
                                     std::uint64_t hbm_budget_bytes) {
  schedule_model_options mo;
  mo.hbm_budget_bytes = hbm_budget_bytes;
  mo.window = window;
  mo.h2d = links.h2d;
  mo.d2h = links.d2h;
  mo.full_duplex = links.full_duplex;
  return mo;
}

// Each step's compute time plus what a step costs beside it.
std::vector<double> with_step_overhead(std::vector<double> compute_s, const link_fits& links) {
  for (auto& s : compute_s) {
    s += links.step_overhead_s;
  }
  return compute_s;
}

}  // namespace

link_fits probe_model_links(device& dev, const topology& topo, const demo::demo_options& o) {
  link_fits links = demo::probe_links(dev);
  links.step_overhead_s = probe_step_overhead(dev, topo, o);
  return links;
}

json links_json(const link_fits& links) {
  return {{"h2d", {{"gbps", links.h2d.gbps}, {"latency_s", links.h2d.latency_s}}},
          {"d2h", {{"gbps", links.d2h.gbps}, {"latency_s", links.d2h.latency_s}}},
          {"full_duplex", links.full_duplex},
          {"step_overhead_s", links.step_overhead_s}};
}

demo_calibration calibrate_demo(demo::demo_options o, device& dev, const topology& topo) {
  // A run's first steps fault in its fresh buffers and are slower: time a run of only those
  // steps too, and keep the difference, the steady state.
  o.steps = calibration_warmup;
  const demo::run_result cold = demo::train(o, dev, topo, false, true);
  o.steps = calibration_warmup + calibration_steps;
  const demo::run_result r = demo::train(o, dev, topo, false, true);
  demo_calibration c;
  for (std::size_t i = 0; i < r.sched.per_step.size(); ++i) {
    const auto& all = r.sched.per_step[i];
    const auto& first = cold.sched.per_step[i];
    const double seconds = std::max(0.0, all.compute_seconds - first.compute_seconds);
    c.compute_s.push_back(
        all.runs > first.runs ? seconds / static_cast<double>(all.runs - first.runs) : 0.0);
  }
  // The last step's: the first ones also place and fault in the optimizer state.
  c.adam_s = r.adam->last_step_seconds;
  c.adam_hbm = r.adam->hbm_staging_peak_bytes + r.adam->hbm_undo_bytes;
  c.mode = std::string(to_string(r.adam->mode));
  return c;
}

void predict_demo(const demo::demo_options& o, const demo_calibration& c, const link_fits& links,
                  tune_point& p, double& predicted) {
  schedule_model_options mo = model_options(links, o.window, demo::demo_staging_budget(o));
  mo.flush_each_iteration = true;
  const auto pred =
      predict_schedule(demo::demo_plan(o), with_step_overhead(c.compute_s, links), mo);
  predicted =
      2 * links.h2d.seconds(o.batch * o.width * sizeof(float)) + pred.iteration_s + c.adam_s;
  p.stall = pred.stall_s / predicted;
  p.hbm = pred.staging_peak_bytes + c.adam_hbm;
}

void predict_plan(const tune_plan& tp, const link_fits& links, tune_point& p, double& predicted) {
  const auto pred =
      predict_schedule(tp.plan, with_step_overhead(tp.compute_s, links),
                       model_options(links, p.window, plan_staging_budget(tp, p.window)));
  predicted = pred.iteration_s;
  p.stall = pred.stall_fraction;
  p.hbm = pred.staging_peak_bytes;
}

}  // namespace tierflow::cli::tune
