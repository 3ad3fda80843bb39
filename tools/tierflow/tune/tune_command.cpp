// `tierflow tune`: sweeps the prefetch window (× the Adam chunk and mode on the demo's model)
// on the demo's model or a plan file, measured or predicted, and recommends one setting
// (tune_sweep.hpp, tune_model.hpp, tune_report.hpp).
#include <algorithm>
#include <memory>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "common/flags.hpp"
#include "common/format.hpp"
#include "tierflow/error.hpp"
#include "tune/tune_report.hpp"
#include "tune/tune_sweep.hpp"

namespace tierflow::cli {

namespace {

// The most steps (measured or warm-up) per setting: each setting runs them all.
constexpr std::uint64_t max_tune_steps = 1000000;

int run_tune(const tune::tune_options& t) {
  const auto windows = tune::parse_list(t.windows, "--windows", true);
  if (t.measure_steps == 0) {
    throw input_error("--steps", "must be > 0");
  }
  if (t.model_only && t.with_model) {
    throw input_error("--model-only", "cannot go with --with-model (which also runs the sweep)");
  }
  if (!t.html.empty()) {
    check_output_file("--html", t.html);
  }
  tune::tune_sweep s = t.plan.empty() ? tune::sweep_demo(t, windows) : tune::sweep_plan(t, windows);
  return tune::report_tune(t, s);
}

}  // namespace

action add_tune_command(CLI::App& app) {
  auto t = std::make_shared<tune::tune_options>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Sweep the prefetch window (and the Adam chunk and mode) on the demo's model or a plan "
      "file; measure or predict; recommend one");
  cmd->add_option("--plan", t->plan,
                  "Workload file (JSON: buffers and steps with compute_ms) instead of the demo's "
                  "model");
  demo::add_model_shape_options(*cmd, t->model);
  cmd->add_option("--steps", t->measure_steps, "Steps measured per setting")
      ->check(count_in(1, max_tune_steps))
      ->capture_default_str();
  cmd->add_option("--warmup", t->warmup_steps, "Steps run first, not measured")
      ->check(count_in(0, max_tune_steps))
      ->capture_default_str();
  cmd->add_option("--windows", t->windows, "Prefetch windows to try, in layers (plan: steps)")
      ->capture_default_str();
  cmd->add_option("--adam-chunks", t->chunks, "Adam chunk sizes to try, in elements (not --plan)")
      ->capture_default_str();
  cmd->add_option("--adam-modes", t->adam_modes,
                  "Adam modes to try: cpu, streamed, auto (not --plan)")
      ->capture_default_str();
  cmd->add_option("--hbm-budget", t->hbm_budget_mib,
                  "Recommend only settings whose HBM staging fits, MiB (0: any)")
      ->check(number_in(0, demo::max_budget_mib))
      ->capture_default_str();
  cmd->add_option("--emu-link", t->model.emu_link, "Emulated link (else TIERFLOW_EMU_LINK)")
      ->check(non_empty("TIERFLOW_EMU_LINK or the config file"));
  cmd->add_option("--placement", t->model.placement, "Placement spec")
      ->check(non_empty("TIERFLOW_PLACEMENT or the config file"));
  cmd->add_flag("--model-only", t->model_only,
                "Predict the table from a link probe and compute times; run no sweep");
  cmd->add_flag("--with-model", t->with_model,
                "Run the sweep and the model; report the model's error per setting");
  cmd->add_flag("--json", t->as_json, "Print one JSON object");
  cmd->add_option("--html", t->html,
                  "Also write a page with step time and stall against the window (inline SVG)");
  return [t] {
    t->model.samples = std::max(t->model.samples, t->model.batch);
    return run_tune(*t);
  };
}

}  // namespace tierflow::cli
