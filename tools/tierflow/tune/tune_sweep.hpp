#pragma once
// `tierflow tune`: sweep the prefetch window × the Adam chunk × the Adam mode.
//
// Two workloads: the demo's model (demo::train, unchanged) or a plan file (tune_plan.hpp:
// buffers and steps, each step's compute a timed host callback). Both give a list of
// tune_points, measured, predicted by predict_schedule(), or both; one report (tune_report.hpp:
// table, JSON, HTML, Pareto front, recommendation) serves them all.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo/demo_options.hpp"

namespace tierflow::cli::tune {

using json = nlohmann::ordered_json;

/** @brief The options of `tierflow tune` (one field per flag). */
struct tune_options {
  demo::demo_options model;
  std::size_t measure_steps = 20;
  std::size_t warmup_steps = 5;
  std::string windows = "0,1,2,3,4";
  std::string chunks = "65536,262144,1048576";
  std::string adam_modes = "cpu,streamed";
  double hbm_budget_mib = 0;  // 0: no limit
  bool as_json = false;
  std::string html;
  std::string plan;  // a plan file instead of the demo's model
  bool model_only = false;
  bool with_model = false;
};

/** @brief predicted_s of a point the model did not predict. */
inline constexpr double not_predicted = -1.0;

/** @brief One setting of the sweep and what it gave. */
struct tune_point {
  std::uint64_t window = 0;
  std::uint64_t chunk = 0;  // bytes; 0 for a plan (no Adam)
  std::string mode;         // the mode that ran (auto resolved); "none" for a plan
  double step_s = 0;        // measured, or predicted with --model-only
  double stall = 0;
  std::uint64_t hbm = 0;               // the staging peak (+ streamed Adam's)
  double predicted_s = not_predicted;  // --with-model: the model's step time
  bool pareto = false;
};

/** @brief What was swept and how: filled by the workload, read by the report. */
struct tune_sweep {
  std::vector<tune_point> points;
  json skipped = json::array();  // Adam modes this workload cannot run, with the reason
  json workload;
  std::string workload_text;  // for the page, HTML-escaped
  json model;                 // the link fits and calibration; null without a model
};

/** @brief A comma-separated list of integers given to @p flag.
 *  @throws input_error for an empty list, a negative or malformed item, or 0 unless
 *          @p allow_zero */
std::vector<std::uint64_t> parse_list(const std::string& text, const std::string& flag,
                                      bool allow_zero);

/** @brief The median of @p seconds after the first @p warmup (as detail::median defines it). */
double median_after(std::vector<double> seconds, std::size_t warmup);

/** @brief The demo's model at every window × chunk × mode of @p t, measured and/or predicted.
 *  @throws input_error for bad lists; error when a setting fails after its mode's first ran */
tune_sweep sweep_demo(const tune_options& t, const std::vector<std::uint64_t>& windows);

/** @brief The plan file of @p t at every window, measured and/or predicted.
 *  @throws input_error for a bad plan, or one too large to run on this machine */
tune_sweep sweep_plan(const tune_options& t, const std::vector<std::uint64_t>& windows);

}  // namespace tierflow::cli::tune
