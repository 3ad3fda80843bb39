// The report of `tierflow tune` (tune_report.hpp).
#include "tune/tune_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "common/format.hpp"
#include "common/svg_chart.hpp"
#include "tierflow/detail/stats.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli::tune {

namespace {

std::string point_label(const tune_point& p) {
  return p.mode == "none" ? std::string("plan")
                          : p.mode + ", chunk " + std::to_string(p.chunk / 1024) + " KiB";
}

// The page of `tune --html`: step time and stall against the window, one line per (Adam mode,
// chunk), then every point with the front and the recommendation marked.
std::string tune_html(const std::vector<tune_point>& sweep, const tune_point& pick,
                      const std::string& workload_text, bool predicted) {
  std::map<std::pair<std::string, std::uint64_t>, std::pair<chart_series, chart_series>> lines;
  for (const auto& p : sweep) {
    auto& [time, stall] = lines[{p.mode, p.chunk}];
    time.label = stall.label = point_label(p);
    time.points.emplace_back(static_cast<double>(p.window), p.step_s * 1e3);
    stall.points.emplace_back(static_cast<double>(p.window), 100 * p.stall);
  }
  std::vector<chart_series> times;
  std::vector<chart_series> stalls;
  for (auto& [key, pair] : lines) {
    times.push_back(std::move(pair.first));
    stalls.push_back(std::move(pair.second));
  }
  const bool with_model = !sweep.empty() && sweep.front().predicted_s != not_predicted;
  const auto window_tick = [](double w) { return std::to_string(std::lround(w)); };
  const std::string unit = sweep.front().mode == "none" ? "steps" : "layers";
  chart_axes time_axes{"prefetch window (" + unit + ")", "ms per step", false, window_tick,
                       "step time against the prefetch window"};
  chart_axes stall_axes{"prefetch window (" + unit + ")", "stall %", false, window_tick,
                        "stall against the prefetch window"};
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<title>tierflow tune</title>\n<style>\nbody{font:14px/1.4 system-ui,sans-serif;"
       "margin:24px;color:#222;max-width:1100px}\ntable{border-collapse:collapse}td,th{border:"
       "1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}\n"
       "svg text{font:12px system-ui,sans-serif}.pick{font-weight:700;background:#fff6d5}\n"
       "</style></head><body>\n<h1>tierflow tune</h1>\n<p>Workload: "
    << workload_text << (predicted ? " Every figure is predicted by the model, not measured." : "")
    << " Recommended: window " << pick.window;
  if (pick.mode != "none") {
    o << ", Adam chunk " << pick.chunk / 1024 << " KiB, mode " << html_escape(pick.mode);
  }
  o << " (" << short_number(pick.step_s * 1e3, 4) << " ms per step).</p>\n<h2>Step time</h2>\n"
    << svg_line_chart(std::move(times), time_axes) << "<h2>Stall</h2>\n"
    << svg_line_chart(std::move(stalls), stall_axes)
    << "<h2>Every setting</h2>\n<table><tr><th>window</th><th>Adam chunk</th><th>mode</th>"
       "<th>ms per step</th>"
    << (with_model ? "<th>predicted ms</th>" : "")
    << "<th>stall %</th><th>HBM staging MiB</th><th>Pareto</th></tr>\n";
  for (const auto& p : sweep) {
    const bool picked = &p == &pick;
    o << "<tr" << (picked ? " class=\"pick\"" : "") << "><td>" << p.window << "</td><td>"
      << p.chunk / 1024 << " KiB</td><td>" << html_escape(p.mode) << "</td><td>"
      << short_number(p.step_s * 1e3, 4) << "</td>";
    if (with_model) {
      o << "<td>" << short_number(p.predicted_s * 1e3, 4) << "</td>";
    }
    o << "<td>" << short_number(100 * p.stall, 3) << "</td><td>"
      << short_number(static_cast<double>(p.hbm) / 1048576.0, 4) << "</td><td>"
      << (p.pareto ? "*" : "") << "</td></tr>\n";
  }
  o << "</table>\n</body></html>\n";
  return o.str();
}

// Pareto front over (step time, HBM staging bytes): no other point is at least as good in both
// and better in one.
void mark_pareto(std::vector<tune_point>& sweep) {
  for (auto& p : sweep) {
    p.pareto = std::none_of(sweep.begin(), sweep.end(), [&](const tune_point& q) {
      return q.step_s <= p.step_s && q.hbm <= p.hbm && (q.step_s < p.step_s || q.hbm < p.hbm);
    });
  }
}

// The fastest setting within the budget, and the recommendation: within 2 % of it, the least
// HBM. The skipped modes are said on stderr on the way.
// (Both null when no setting fits the budget.)
std::pair<const tune_point*, const tune_point*> recommend(const tune_options& t,
                                                          const tune_sweep& s,
                                                          std::uint64_t budget) {
  const auto& sweep = s.points;
  const tune_point* best = nullptr;
  for (const auto& p : sweep) {
    if (budget != 0 && p.hbm > budget) {
      continue;
    }
    if (best == nullptr || p.step_s < best->step_s) {
      best = &p;
    }
  }
  if (sweep.empty()) {
    throw input_error("--adam-modes", "this workload runs none of them",
                      t.adam_modes + " (" + s.skipped.front()["reason"].get<std::string>() + ")");
  }
  for (const auto& k : s.skipped) {
    if (!t.as_json) {
      std::fprintf(stderr, "tune: adam mode %s skipped: %s\n",
                   k["adam_mode"].get<std::string>().c_str(),
                   k["reason"].get<std::string>().c_str());
    }
  }
  if (best == nullptr) {  // nothing fits: the caller shows the sweep, then says so
    return {nullptr, nullptr};
  }
  const tune_point* pick = best;
  for (const auto& p : sweep) {
    if ((budget == 0 || p.hbm <= budget) && p.step_s <= best->step_s * 1.02 && p.hbm < pick->hbm) {
      pick = &p;
    }
  }
  return {best, pick};
}

// The sweep's rows as JSON; @p errors gets |predicted / measured - 1| of each predicted point.
json sweep_rows(const std::vector<tune_point>& sweep, std::uint64_t budget,
                std::vector<double>& errors) {
  json rows = json::array();
  for (const auto& p : sweep) {
    json row{{"window", p.window},        {"chunk_bytes", p.chunk},
             {"adam_mode", p.mode},       {"step_time_s", p.step_s},
             {"stall_fraction", p.stall}, {"hbm_staging_bytes", p.hbm},
             {"pareto", p.pareto},        {"fits_budget", budget == 0 || p.hbm <= budget}};
    if (p.predicted_s != not_predicted) {
      row["predicted_step_time_s"] = p.predicted_s;
      row["prediction_error"] = p.predicted_s / p.step_s - 1;
      errors.push_back(std::fabs(p.predicted_s / p.step_s - 1));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// The model's median and largest |error| into s.model.
void add_model_errors(tune_sweep& s, std::vector<double> errors) {
  if (errors.empty()) {
    return;
  }
  const auto summary = detail::summarize(std::move(errors));
  s.model["median_abs_error"] = summary.median;
  s.model["max_abs_error"] = summary.max;
}

// The sweep's table; with a budget, a column says which settings fit in it.
void print_sweep_table(const tune_options& t, const tune_sweep& s, bool with_model,
                       std::uint64_t budget) {
  if (t.model_only) {
    std::printf("predicted by the model (nothing was run but the link probe%s):\n",
                t.plan.empty() ? " and the calibration" : "");
  }
  std::printf("window  adam chunk    mode      step ms  %s stall %%  HBM staging  pareto%s\n",
              with_model ? "predicted ms  error %" : "", budget != 0 ? "  fits budget" : "");
  for (const auto& p : s.points) {
    std::printf("%6llu  %8.1f KiB  %-8s  %7.2f  ", static_cast<unsigned long long>(p.window),
                static_cast<double>(p.chunk) / 1024, p.mode.c_str(), p.step_s * 1e3);
    if (with_model) {
      std::printf("%12.2f  %7.1f ", p.predicted_s * 1e3, 100 * (p.predicted_s / p.step_s - 1));
    }
    std::printf("%7.1f  %8.2f MiB  %-6s%s\n", 100 * p.stall, static_cast<double>(p.hbm) / 1048576.0,
                p.pareto ? "*" : "", budget == 0 ? "" : (p.hbm <= budget ? "  yes" : "  no"));
  }
}

void print_tune_table(const tune_options& t, const tune_sweep& s, const tune_point& best,
                      const tune_point& pick, bool with_model, std::uint64_t budget,
                      bool html_written) {
  print_sweep_table(t, s, with_model, budget);
  if (pick.mode == "none") {
    std::printf("recommended: window %llu (step %.2f ms, best of the sweep %.2f ms)\n",
                static_cast<unsigned long long>(pick.window), pick.step_s * 1e3, best.step_s * 1e3);
  } else {
    std::printf(
        "recommended: --window %llu --adam-chunk %llu --adam-mode %s (step %.2f ms, best of "
        "the sweep %.2f ms)\n",
        static_cast<unsigned long long>(pick.window),
        static_cast<unsigned long long>(pick.chunk / sizeof(float)), pick.mode.c_str(),
        pick.step_s * 1e3, best.step_s * 1e3);
  }
  if (with_model) {
    std::printf("model: median |error| %.1f %%, max %.1f %%\n",
                100 * s.model["median_abs_error"].get<double>(),
                100 * s.model["max_abs_error"].get<double>());
  }
  if (html_written) {
    std::printf("report: %s\n", t.html.c_str());
  }
}

// No setting fits --hbm-budget: the sweep is still shown (it cost the run), then the refusal
// names the smallest staging the sweep needed.
int report_nothing_fits(const tune_options& t, const tune_sweep& s, json doc, bool with_model,
                        std::uint64_t budget) {
  std::uint64_t smallest = s.points.front().hbm;
  for (const auto& p : s.points) {
    smallest = std::min(smallest, p.hbm);
  }
  if (t.as_json) {
    doc["recommended"] = nullptr;
    doc["best_step_time_s"] = nullptr;
    std::printf("%s\n", doc.dump().c_str());
  } else {
    print_sweep_table(t, s, with_model, budget);
  }
  char need[64];
  std::snprintf(need, sizeof need, "%.2f MiB", static_cast<double>(smallest) / 1048576.0);
  std::fprintf(stderr,
               "tierflow: error: --hbm-budget: no setting of the sweep fits in it (none of the "
               "%zu above; the smallest needs %s): '%g MiB'\n",
               s.points.size(), need, t.hbm_budget_mib);
  return exit_bad_input;
}

}  // namespace

int report_tune(const tune_options& t, tune_sweep& s) {
  const std::uint64_t budget = static_cast<std::uint64_t>(t.hbm_budget_mib * 1048576.0);
  mark_pareto(s.points);
  const auto [best, pick] = recommend(t, s, budget);
  std::vector<double> errors;
  json rows = sweep_rows(s.points, budget, errors);
  if (best == nullptr) {
    add_model_errors(s, errors);
    json doc{{"workload", s.workload},
             {"predicted", t.model_only},
             {"hbm_budget_bytes", budget},
             {"sweep", rows},
             {"skipped", s.skipped}};
    return report_nothing_fits(t, s, std::move(doc), !errors.empty(), budget);
  }
  json doc{{"workload", s.workload},
           {"predicted", t.model_only},
           {"steps_measured", t.model_only ? std::size_t{0} : t.measure_steps},
           {"hbm_budget_bytes", budget},
           {"recommended",
            {{"window", pick->window},
             {"chunk_bytes", pick->chunk},
             {"adam_mode", pick->mode},
             {"step_time_s", pick->step_s}}},
           {"best_step_time_s", best->step_s},
           {"sweep", rows},
           {"skipped", s.skipped}};
  add_model_errors(s, errors);
  if (!s.model.is_null()) {
    doc["model"] = s.model;
  }
  // A page that cannot be written after all does not throw the sweep away: it is printed,
  // then the failure said.
  std::string html_failure;
  int html_failure_exit = exit_failure;
  if (!t.html.empty()) {
    try {
      write_text_file(t.html, tune_html(s.points, *pick, s.workload_text, t.model_only));
      doc["html"] = t.html;
    } catch (const std::exception& e) {
      html_failure = e.what();
      html_failure_exit = exit_code_for(e);
    }
  }
  if (t.as_json) {
    std::printf("%s\n", doc.dump().c_str());
  } else {
    print_tune_table(t, s, *best, *pick, !errors.empty(), budget,
                     !t.html.empty() && html_failure.empty());
  }
  if (!html_failure.empty()) {
    std::fprintf(stderr, "tierflow: error: --html: %s (the results are above)\n",
                 html_failure.c_str());
    return html_failure_exit;
  }
  return exit_ok;
}

}  // namespace tierflow::cli::tune
