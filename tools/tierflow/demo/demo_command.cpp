// `tierflow demo`: trains a stack of dense layers whose parameters live in a host tier (cold
// parameters, as ZeRO-Infinity keeps them) and are streamed into HBM by the prefetch scheduler
// for the forward and the backward pass, with offload_adam's state in the optimizer_state tier
// (demo_train.hpp; the model in demo_model.hpp, its math in demo_compute.hpp: on the emulated
// device host callbacks over its memory, on a CUDA device the kernels of demo_kernels.cu).
//
// --verify runs the same training a second time with every weight resident in HBM and an
// Adam written out here over HBM-resident state (no offload at all), and compares the final
// weights bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common/flags.hpp"
#include "common/format.hpp"
#include "demo/demo_options.hpp"
#include "demo/demo_train.hpp"
#include "demo/link_probe.hpp"
#include "tierflow/error.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using namespace demo;

// Bad flags, before anything runs.
void check_demo_options(const demo_options& o) {
  if (o.layers == 0 || o.width == 0 || o.batch == 0 || o.steps == 0) {
    throw input_error("--layers", "--layers, --width, --batch and --steps must be > 0",
                      std::to_string(o.layers));
  }
  if (o.samples < o.batch) {
    throw input_error("--samples", "must be at least --batch", std::to_string(o.samples));
  }
  (void)checked_adam_mode(o.adam_mode);
  (void)checked_adam_overlap(o.overlap);
  if (checked_state_dtype(o.state_dtype, o.adam_mode) != adam_state_dtype::f32 && o.verify) {
    throw input_error("--state-dtype",
                      "--verify compares against a resident run with fp32 moments: compressed "
                      "moments follow it only within their precision",
                      o.state_dtype);
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    throw input_error("--lr", "must be finite and > 0", flag_number_text(o.lr));
  }
  if (o.adam_chunk == 0) {
    throw input_error("--adam-chunk", "must be > 0 (elements per chunk)", "0");
  }
  if (!std::isfinite(o.hbm_budget_mib) || o.hbm_budget_mib < 0) {
    throw input_error("--hbm-budget", "must be finite and >= 0 (0: window + 2 layers)",
                      flag_number_text(o.hbm_budget_mib));
  }
  if (const double layer_mib = static_cast<double>(o.width * o.width * sizeof(float)) / 1048576.0;
      o.hbm_budget_mib > 0 && o.hbm_budget_mib < layer_mib) {
    throw input_error("--hbm-budget",
                      "below one layer's weights (" + flag_number_text(layer_mib) + " MiB)",
                      flag_number_text(o.hbm_budget_mib));
  }
}

// Host memory the run needs, roughly (in double: the flags' caps keep it finite but not within
// 64 bits): the initial weights, params, grads, master weights and two moments (x 6), the
// resident reference run of --verify (x 2 of all that), and the data set with its targets.
double demo_host_bytes(const demo_options& o) {
  const auto width = static_cast<double>(o.width);
  const double weights = static_cast<double>(o.layers) * width * width * sizeof(float);
  const double data = 2.0 * static_cast<double>(o.samples) * width * sizeof(float);
  const double activations =
      3.0 * static_cast<double>(o.layers) * static_cast<double>(o.batch) * width * sizeof(float);
  return (o.verify ? 2.0 : 1.0) * (6.0 * weights + activations) + data;
}

// A model that cannot fit the machine's host memory is refused before its weights are built
// (they used to be, and the kernel's OOM killer ended the run).
void check_demo_fits(const demo_options& o, const topology& topo) {
  double host = 0;
  for (const auto& t : topo.tiers()) {
    if (t.kind != tier_kind::hbm) {
      host += static_cast<double>(t.capacity_bytes);
    }
  }
  const double needed = demo_host_bytes(o);
  if (host > 0 && needed > host) {
    const auto mib = [](double bytes) {
      char text[64];
      std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
      return std::string(text);
    };
    throw input_error("--layers",
                      "the model needs about " + mib(needed) + " of host memory; the machine has " +
                          mib(host) + " (lower --layers, --width, --batch or --samples)",
                      std::to_string(o.layers) + " layers x " + std::to_string(o.width));
  }
}

// Bad input the machine decides, before anything runs: the output folder, then the placement.
topology check_demo_environment(const demo_options& o) {
  std::error_code made;
  std::filesystem::create_directories(o.out, made);
  std::error_code type_ec;
  if (std::filesystem::exists(o.out, type_ec) && !std::filesystem::is_directory(o.out, type_ec)) {
    throw input_error("--out", "not a folder", o.out);
  }
  if (made || !std::filesystem::is_directory(o.out, type_ec)) {
    // The machine refused (no permission, a read-only or full file system): not bad input.
    throw environment_error("--out: cannot create the folder '" + o.out + "'", o.out, made.value());
  }
  for (const char* name : {"metrics.json", "trace.json", "metrics.prom"}) {
    check_output_file("--out", (std::filesystem::path(o.out) / name).string());
  }
  topology topo = topology::discover();
  if (!o.placement.empty()) {
    (void)placement_spec::parse(o.placement, "--placement", topo);
  }
  check_demo_fits(o, topo);
  return topo;
}

void print_demo_header(const demo_options& o, const device& dev, const std::string& note) {
  if (o.as_json) {
    return;
  }
  if (!note.empty()) {
    std::fprintf(stderr, "tierflow demo: %s\n", note.c_str());
  }
  std::fprintf(stderr,
               "tierflow demo: %zu layers x %zu (%.1f MiB of weights), batch %zu, %zu steps, "
               "window %llu, device %s\n",
               o.layers, o.width, static_cast<double>(o.layers * o.width * o.width * 4) / 1048576.0,
               o.batch, o.steps, static_cast<unsigned long long>(o.window),
               dev.properties().name.c_str());
}

void write_run_files(const std::filesystem::path& dir, const run_result& run) {
  json metrics = json::parse(run.sched_json);
  metrics["adam"] = json::parse(run.adam->to_json())["adam"];
  metrics["placement"] = json::parse(to_json(run.placement))["placement"];
  write_text_file(dir / "metrics.json", metrics.dump(2) + "\n");
  write_text_file(dir / "trace.json", run.trace);
  write_text_file(dir / "metrics.prom", run.prometheus);
}

// The same training with everything resident in HBM and no offload, compared bit for bit.
json verify_against_resident(const demo_options& o, device& dev, const topology& topo,
                             const run_result& run) {
  const run_result ref = train(o, dev, topo, true, true);
  bool same = ref.final_weights.size() == run.final_weights.size();
  double max_diff = 0;
  for (std::size_t l = 0; same && l < run.final_weights.size(); ++l) {
    const auto& a = ref.final_weights[l];
    const auto& b = run.final_weights[l];
    same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
  }
  return {{"bit_identical", same}, {"max_abs_diff", max_diff}};
}

// The summary of `demo --json`: one object, keys as documented in README.md.
json demo_json(const demo_options& o, const device& dev, const run_result& run,
               const link_fits& probed, const json& verify, const std::filesystem::path& dir) {
  const auto& s = run.sched;
  const overlap_summary ov = summarize_overlap(o, run);
  json tiers = json::object();
  for (const auto& [cls, per_tier] : run.placement.class_bytes) {
    for (const auto& [tier, bytes] : per_tier) {
      tiers[tier][std::string(to_string(cls))] = bytes;
    }
  }
  json doc{{"loss_first", run.losses.front()},
           {"loss_last", run.losses.back()},
           {"steps", run.steps},
           {"backend", dev.properties().backend},
           {"adam_mode", to_string(run.adam->mode)},
           {"adam_mode_reason", run.adam->mode_reason},
           {"scheduler",
            {{"step_time_s", s.step_time_s},
             {"lower_bound_s", s.lower_bound_s},
             {"overlap_efficiency", s.overlap_efficiency},
             {"stall_fraction", s.stall_fraction},
             {"window", s.window},
             {"bytes_in", s.bytes_in},
             {"hbm_staging_peak_bytes", s.hbm_staging_peak_bytes},
             {"h2d_achieved_gbps", s.h2d.achieved_gbps()},
             {"h2d_link_gbps", s.h2d_gbps}}},
           {"link",
            {{"h2d_achieved_gbps", s.h2d.achieved_gbps()},
             {"h2d_benchmarked_gbps", probed.h2d.gbps},
             {"d2h_benchmarked_gbps", probed.d2h.gbps},
             {"h2d_latency_us", probed.h2d.latency_s * 1e6},
             {"probe_bytes", probed.probe_bytes}}},
           {"tiers", tiers},
           {"state_pages", run.state_pages},
           {"seconds", run.seconds},
           {"overlap", ov.overlap},
           {"state_dtype", o.state_dtype},
           {"exposed_seconds", ov.exposed_seconds},
           {"exposed_fraction", ov.exposed_fraction},
           {"plain_step_seconds", ov.plain_step_seconds},
           {"forward_backward_seconds", ov.forward_backward_seconds},
           {"iteration_seconds", ov.iteration_seconds},
           {"plain_iteration_seconds", ov.plain_iteration_seconds},
           {"speculative_steps", run.adam->speculative_steps},
           {"rollbacks", run.adam->rollbacks},
           {"files",
            {{"metrics", (dir / "metrics.json").string()},
             {"trace", (dir / "trace.json").string()},
             {"prometheus", (dir / "metrics.prom").string()}}}};
  if (o.verify) {
    doc["verify"] = verify;
  }
  return doc;
}

// One line: the step() left after the backward pass against the plain step's, and the
// speculation's counts.
void print_overlap_line(const demo_options& o, const run_result& run) {
  const overlap_summary ov = summarize_overlap(o, run);
  std::printf(
      "overlap %s: step() after the backward pass %.2f ms = %.2f of the plain step's %.2f ms "
      "(%s); iteration %.2f ms vs forward + backward %.2f ms; %llu speculative steps, %llu "
      "rollbacks\n",
      ov.overlap.c_str(), 1e3 * ov.exposed_seconds, ov.exposed_fraction,
      1e3 * ov.plain_step_seconds,
      o.overlap == "none" ? "every step plain" : "odd steps plain, interleaved",
      1e3 * ov.iteration_seconds, 1e3 * ov.forward_backward_seconds,
      static_cast<unsigned long long>(run.adam->speculative_steps),
      static_cast<unsigned long long>(run.adam->rollbacks));
}

// The summary as text: the loss, where the bytes lived, prefetch, link, Adam, verify, files.
void print_demo_summary(const demo_options& o, const device& dev, const run_result& run,
                        const link_fits& probed, const json& verify,
                        const std::filesystem::path& dir) {
  const auto& s = run.sched;
  std::printf("\ntierflow demo: %zu steps in %.1f s; loss %.6f -> %.6f (%.1fx lower)\n", run.steps,
              run.seconds, run.losses.front(), run.losses.back(),
              run.losses.front() / run.losses.back());
  std::printf("where the bytes lived:\n");
  for (const auto& [cls, per_tier] : run.placement.class_bytes) {
    for (const auto& [tier, bytes] : per_tier) {
      std::printf("  %-16s %-10s %10.1f MiB\n", std::string(to_string(cls)).c_str(), tier.c_str(),
                  static_cast<double>(bytes) / 1048576.0);
    }
  }
  std::printf("  %-16s %-10s %10.1f MiB peak (budget %.1f MiB)\n", "staging", "hbm",
              static_cast<double>(s.hbm_staging_peak_bytes) / 1048576.0,
              static_cast<double>(s.hbm_budget_bytes) / 1048576.0);
  std::printf(
      "prefetch: window %llu, step %.2f ms vs lower bound %.2f ms (overlap efficiency "
      "%.2f), stall %.1f %%\n",
      static_cast<unsigned long long>(s.window), s.step_time_s * 1e3, s.lower_bound_s * 1e3,
      s.overlap_efficiency, 100.0 * s.stall_fraction);
  // Achieved: the weights' bytes over the whole run's time (compute included); benchmarked:
  // the probe's 8 MiB copies on this device, alone.
  std::printf(
      "link: h2d achieved %.2f GB/s; benchmarked %.2f GB/s h2d, %.2f GB/s d2h (8 MiB "
      "copies on this device, alone)",
      s.h2d.achieved_gbps(), probed.h2d.gbps, probed.d2h.gbps);
  if (dev.properties().backend == "emulated") {
    std::printf("; the emulated link's cap %.2f GB/s\n", s.h2d_gbps);
  } else {
    std::printf("\n");
  }
  std::printf("adam: mode %s (%s), kernel %s, %.1f ms per step\n",
              std::string(to_string(run.adam->mode)).c_str(), run.adam->mode_reason.c_str(),
              std::string(to_string(run.adam->kernel)).c_str(),
              1e3 * run.adam->step_seconds_total / static_cast<double>(run.steps));
  print_overlap_line(o, run);
  if (o.verify) {
    std::printf(
        "verify: against the same run with everything resident in HBM and no "
        "offload: %s (max abs diff %g)\n",
        verify["bit_identical"].get<bool>() ? "bit-identical" : "DIFFERENT",
        verify["max_abs_diff"].get<double>());
  }
  std::printf("files: %s, %s, %s\n", (dir / "metrics.json").c_str(), (dir / "trace.json").c_str(),
              (dir / "metrics.prom").c_str());
}

int run_demo(const demo_options& o) {
  check_demo_options(o);
  const topology topo = check_demo_environment(o);
  std::string note;
  auto dev = open_demo_device(o, note);
  print_demo_header(o, *dev, note);
  const run_result run = train(o, *dev, topo, false, o.as_json);
  // What the link does on this device with nothing else running, for "achieved vs
  // benchmarked": the same probe as tune --with-model (copies of 64 KiB and 8 MiB).
  const link_fits probed = probe_links(*dev);

  const auto dir = std::filesystem::path(o.out);
  // The run is the work: files that cannot be written after all (checked at the start) are
  // said after the summary, never instead of it.
  std::string files_failure;
  int files_failure_exit = exit_failure;
  try {
    write_run_files(dir, run);
  } catch (const std::exception& e) {
    files_failure = e.what();
    files_failure_exit = exit_code_for(e);
  }
  const json verify = o.verify ? verify_against_resident(o, *dev, topo, run) : json();
  if (o.as_json) {
    std::printf("%s\n", demo_json(o, *dev, run, probed, verify, dir).dump().c_str());
  } else {
    print_demo_summary(o, *dev, run, probed, verify, dir);
  }
  if (!files_failure.empty()) {
    std::fprintf(stderr, "tierflow: error: --out: %s (the results are above)\n",
                 files_failure.c_str());
    return files_failure_exit;
  }
  if (o.verify && !verify["bit_identical"].get<bool>()) {
    return exit_failure;
  }
  return exit_ok;
}

}  // namespace

action add_demo_command(CLI::App& app) {
  auto o = std::make_shared<demo::demo_options>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Train a dense stack with its weights streamed from a host tier and Adam offloaded");
  demo::add_model_shape_options(*cmd, *o);
  cmd->add_option("--samples", o->samples, "Size of the fixed data set")
      ->check(count_in(1, max_count))
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Training steps")
      ->check(count_in(1, max_count))
      ->capture_default_str();
  cmd->add_option("--window", o->window, "Prefetch window, in layers")
      ->check(count_in(0, demo::max_layers))
      ->capture_default_str();
  cmd->add_option("--hbm-budget", o->hbm_budget_mib,
                  "HBM for staging weights, MiB (0: window + 2 layers)")
      ->check(number_in(0, demo::max_budget_mib))
      ->capture_default_str();
  cmd->add_option("--adam-mode", o->adam_mode, "cpu, streamed or auto")->capture_default_str();
  cmd->add_option("--overlap", o->overlap,
                  "none, or backward: each layer's Adam update starts (speculatively) as soon "
                  "as its grad is final in the backward pass; backward_publish: also its new "
                  "weights are written then, not in step()")
      ->capture_default_str();
  cmd->add_option("--state-dtype", o->state_dtype,
                  "How the Adam moments are stored: fp32, bf16 or int8 (8-bit codes, a scale "
                  "per 256 elements; cpu mode)")
      ->capture_default_str();
  cmd->add_option("--placement", o->placement,
                  "Placement spec, e.g. 'optimizer_state=cxl,dram' (else TIERFLOW_PLACEMENT)")
      ->check(non_empty("TIERFLOW_PLACEMENT or the config file"));
  cmd->add_option("--emu-link", o->emu_link,
                  "Emulated link, e.g. 'h2d=25GB/s,d2h=25GB/s,latency=10us' (else "
                  "TIERFLOW_EMU_LINK)")
      ->check(non_empty("TIERFLOW_EMU_LINK or the config file"));
  cmd->add_option("--device", o->device,
                  "auto (CUDA device 0 when usable, else emulated), cuda, cuda:N or emulated")
      ->capture_default_str();
  // Adam computes in float: a rate below the smallest normal float is 0 or a subnormal there.
  cmd->add_option("--lr", o->lr, "Adam learning rate")
      ->check(number_in(std::numeric_limits<float>::min(), 1e6))
      ->capture_default_str();
  cmd->add_option("--adam-chunk", o->adam_chunk, "Elements per Adam chunk")
      ->check(count_in(1, max_count))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the data and the initial weights")
      ->check(count_in(0))
      ->capture_default_str();
  cmd->add_option("--log-every", o->log_every, "Progress line every N steps (0: none)")
      ->check(count_in(0, max_count))
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Directory for metrics.json, trace.json, metrics.prom")
      ->check(non_empty("the default folder"))
      ->capture_default_str();
  cmd->add_flag("--verify", o->verify,
                "Also train with everything resident in HBM and no offload; compare bit for bit");
  cmd->add_flag("--json", o->as_json, "Print one JSON object (last) instead of the summary");
  return [o] { return run_demo(*o); };
}

}  // namespace tierflow::cli
