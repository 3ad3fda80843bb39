// `tierflow plan`: sizes a training run on paper from a spec file (plan_spec.hpp), with the
// model of plan_model.hpp; a table or JSON (plan_report.hpp).
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common/format.hpp"
#include "plan/plan_machine.hpp"
#include "plan/plan_model.hpp"
#include "plan/plan_report.hpp"
#include "plan/plan_spec.hpp"

namespace tierflow::cli {

namespace {

using nlohmann::json;
using plan::plan_result;
using plan::rank_bytes;

struct plan_options {
  std::string spec;
  std::string machine;      // a `tierflow topo --json` document: the node's tiers and GPUs
  std::uint64_t nodes = 0;  // 0: the spec's
  std::string state_dtype;  // empty: the spec's
  bool json = false;
};

// One declaration of the state kinds, for the table and the JSON.
template <typename visit>
void for_each_kind(const rank_bytes& b, visit v) {
  v("weights", b.weights);
  v("grads", b.grads);
  v("master", b.master);
  v("adam_m", b.adam_m);
  v("adam_v", b.adam_v);
  v("staging", b.staging);
  v("activations", b.activations);
}

std::string bytes_text(double bytes) {
  if (bytes <= 0) {
    return "-";
  }
  return format_bytes(plan::byte_count(bytes));
}

// A stage or step time: milliseconds visible for the usual runs, and no more than a few
// digits for a long one (the caps on the spec bound it near 10^22 s).
std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, seconds < 1e6 ? "%.3f" : "%.4g", seconds);
  return text;
}

json kinds_json(const rank_bytes& b) {
  json j;
  for_each_kind(b, [&](const char* name, double bytes) { j[name] = bytes; });
  j["total"] = b.total();
  return j;
}

// A count of params, or "no bound" (inf: that memory holds none of what grows with the model).
std::string params_text(double params) {
  if (std::isinf(params)) {
    return "no bound";
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", std::floor(params));
  return text;
}

std::string per_param_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", bytes);
  return text;
}

// Where the optimizer state lives, the memory whose capacity it competes for, and its verb.
const char* state_memory_holds(const plan::plan_spec& s) {
  return s.offload_optimizer ? "the host tiers hold" : "HBM holds";
}

// The moments' dtype; uncompressed moments are of model.state_dtype, which may not be fp32.
std::string moments_name(const plan::plan_spec& s, adam_state_dtype d) {
  if (d == adam_state_dtype::f32 && s.state_bytes != 4) {
    return "model.state_dtype";
  }
  return std::string(to_string(d));
}

// inf (no bound) and nan (nothing fits with fp32 state) as JSON null.
json finite_or_null(double x) {
  return std::isfinite(x) ? json(x) : json();
}

json state_json(const plan::plan_spec& s, const plan::state_capacity& c) {
  return {{"state_dtype", moments_name(s, c.state_dtype)},
          {"master", plan::to_string(c.master)},
          {"state_bytes_per_param", c.state_bytes_per_param},
          {"step_bytes_per_param", c.step_bytes_per_param},
          {"max_params_hbm", finite_or_null(c.max_params_hbm)},
          {"max_params_host", finite_or_null(c.max_params_host)},
          {"max_params", finite_or_null(c.max_params())},
          {"vs_fp32", finite_or_null(c.vs_fp32)}};
}

json optimizer_json(const plan::plan_spec& s, const plan_result& r) {
  json j = state_json(s, r.state);
  j["state_in"] = s.offload_optimizer ? "host" : "hbm";
  j["options"] = json::array();
  for (const auto& c : r.state_options) {
    j["options"].push_back(state_json(s, c));
  }
  return j;
}

json result_json(const plan::plan_spec& s, const plan_result& r) {
  json j;
  j["spec"] = s.name;
  j["nodes"] = s.nodes;
  j["ranks"] = r.ranks;
  j["sharding"] = plan::to_string(s.shard);
  j["memory"]["per_rank"] = {{"hbm", kinds_json(r.hbm)}, {"host", kinds_json(r.host)}};
  j["memory"]["hbm_capacity_bytes"] = r.hbm_capacity_bytes;
  j["memory"]["hbm_fits"] = r.hbm_fits;
  for (const auto& t : r.tiers) {
    j["memory"]["tiers"].push_back(
        {{"name", t.name}, {"capacity_bytes", t.capacity_bytes}, {"used_bytes", t.used_bytes}});
  }
  j["memory"]["host_fits"] = r.host_fits;
  j["memory"]["spill"] = r.spill;
  j["fits"] = r.fits();
  j["optimizer"] = optimizer_json(s, r);
  for (const auto& st : r.stages) {
    j["step"]["stages"].push_back({{"name", st.name},
                                   {"scope", st.scope},
                                   {"bytes", st.bytes},
                                   {"rate", st.rate},
                                   {"time_s", st.time_s}});
  }
  j["step"]["grad_accumulation"] = r.grad_accumulation;
  j["step"]["tokens"] = r.tokens_per_step;
  j["step"]["bound_s"] = r.step_bound_s;
  j["step"]["serial_s"] = r.step_serial_s;
  j["step"]["bottleneck"] = r.bottleneck;
  j["step"]["tokens_per_s"] = r.tokens_per_s;
  j["step"]["mfu"] = r.mfu;
  j["advice"] = r.advice;
  return j;
}

void print_memory(std::FILE* out, const plan::plan_spec& s, const plan_result& r) {
  std::fprintf(
      out, "tierflow plan: %s: %.4g params, %llu nodes x %llu GPUs (%llu ranks), %s%s%s\n\n",
      s.name.c_str(), s.params, static_cast<unsigned long long>(s.nodes),
      static_cast<unsigned long long>(s.gpus_per_node), static_cast<unsigned long long>(r.ranks),
      plan::to_string(s.shard), s.offload_optimizer ? ", optimizer offloaded" : "",
      s.offload_params ? ", params offloaded" : "");
  std::vector<std::vector<std::string>> rows;
  for_each_kind(r.hbm, [&](const char* name, double) { rows.push_back({name}); });
  std::size_t i = 0;
  for_each_kind(r.hbm, [&](const char*, double b) { rows[i++].push_back(bytes_text(b)); });
  i = 0;
  for_each_kind(r.host, [&](const char*, double b) { rows[i++].push_back(bytes_text(b)); });
  rows.push_back({"total", bytes_text(r.hbm.total()), bytes_text(r.host.total())});
  std::fprintf(out, "Bytes per rank\n%s",
               render_table({"state", "hbm", "host tiers"}, rows).c_str());
  std::fprintf(out, "HBM: %s of %s per GPU: %s\n", bytes_text(r.hbm.total()).c_str(),
               bytes_text(r.hbm_capacity_bytes).c_str(), r.hbm_fits ? "fits" : "DOES NOT FIT");
  rows.clear();
  for (const auto& t : r.tiers) {
    rows.push_back({t.name, bytes_text(t.capacity_bytes), bytes_text(t.used_bytes)});
  }
  std::fprintf(out, "\nHost tiers per node, in spill order\n%s",
               render_table({"tier", "capacity", "used"}, rows).c_str());
  std::fprintf(out, "host tiers: %s\n\n", r.host_fits ? "fit" : "DO NOT FIT");
}

void print_optimizer(std::FILE* out, const plan::plan_spec& s, const plan_result& r) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : r.state_options) {
    const bool spec = c.state_dtype == r.state.state_dtype && c.master == r.state.master;
    rows.push_back({moments_name(s, c.state_dtype), plan::to_string(c.master),
                    per_param_text(c.state_bytes_per_param), per_param_text(c.step_bytes_per_param),
                    params_text(c.max_params_hbm), params_text(c.max_params_host),
                    std::isfinite(c.vs_fp32) ? format_number(c.vs_fp32, 2) + "x" : "-",
                    spec ? "<- spec" : ""});
  }
  std::fprintf(out,
               "Optimizer state per param, and the largest model each memory holds with it "
               "(x fp32: in %s)\n%s",
               s.offload_optimizer ? "the host tiers" : "HBM",
               render_table({"moments", "master", "B/param", "step B/param", "HBM holds",
                             "host tiers hold", "x fp32", ""},
                            rows)
                   .c_str());
  const plan::state_capacity& c = r.state;
  const double held = s.offload_optimizer ? c.max_params_host : c.max_params_hbm;
  const std::string ratio = std::isfinite(c.vs_fp32) ? format_number(c.vs_fp32, 2) + "x" : "-";
  std::fprintf(out, "%s state%s: %s B/param; %s %s the params of fp32 state (%s params)\n\n",
               moments_name(s, c.state_dtype).c_str(),
               c.master == plan::master_kind::remainder ? " + remainder master" : "",
               per_param_text(c.state_bytes_per_param).c_str(), state_memory_holds(s),
               ratio.c_str(), params_text(held).c_str());
}

void print_step(std::FILE* out, const plan_result& r) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& st : r.stages) {
    const bool compute = st.name == "compute";
    rows.push_back({st.name, st.scope, compute ? "-" : bytes_text(st.bytes),
                    compute ? format_number(st.rate, 0) + " TFLOPS" : format_bandwidth(st.rate),
                    seconds_text(st.time_s), st.name == r.bottleneck ? "<- bound" : ""});
  }
  std::fprintf(out, "Per step (%.4g tokens, %llu micro-batches per rank; GB/s = 10^9 B/s)\n%s",
               r.tokens_per_step, static_cast<unsigned long long>(r.grad_accumulation),
               render_table({"stage", "scope", "bytes", "rate", "time s", ""}, rows).c_str());
  std::fprintf(out, "step bound %s s (%s; serial %s s): %.4g tokens/s, MFU at most %.1f %%\n",
               seconds_text(r.step_bound_s).c_str(), r.bottleneck.c_str(),
               seconds_text(r.step_serial_s).c_str(), r.tokens_per_s, 100.0 * r.mfu);
  for (const auto& a : r.advice) {
    std::fprintf(out, "advice: %s\n", a.c_str());
  }
}

int run_plan(const plan_options& o) {
  plan::plan_spec s = plan::load_plan_spec(o.spec);
  if (!o.machine.empty()) {
    plan::load_machine(s, o.machine);
  }
  if (o.nodes > 0) {
    s.nodes = o.nodes;
  }
  if (!o.state_dtype.empty()) {
    plan::set_state_dtype(s, o.state_dtype);
  }
  plan::print_plan(stdout, s, plan::size_plan(s), o.json, o.machine);
  return exit_ok;
}

}  // namespace

namespace plan {

void print_plan(std::FILE* out, const plan_spec& s, const plan_result& r, bool as_json,
                const std::string& machine) {
  if (as_json) {
    json j = result_json(s, r);
    j["machine"] = machine.empty() ? json() : json(machine);
    std::fprintf(out, "%s\n", j.dump(2).c_str());
  } else {
    if (!machine.empty()) {
      std::fprintf(out, "each node as measured in %s\n", machine.c_str());
    }
    print_memory(out, s, r);
    print_optimizer(out, s, r);
    print_step(out, r);
  }
}

}  // namespace plan

action add_plan_command(CLI::App& app) {
  auto o = std::make_shared<plan_options>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Size a training run on paper: bytes per tier, per-step link bounds, bottleneck");
  cmd->add_option("--spec", o->spec, "Spec file (JSON: model, cluster, training)")->required();
  cmd->add_option("--machine", o->machine,
                  "A node's host tiers (and GPUs) from this `tierflow topo --json` report of a "
                  "real machine, instead of the spec's");
  cmd->add_option("--nodes", o->nodes, "Node count instead of the spec's")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1000000}));
  cmd->add_option("--state-dtype", o->state_dtype,
                  "How Adam's m and v are stored instead of the spec's optimizer.state_dtype: "
                  "fp32, bf16 or int8")
      ->check(CLI::IsMember({"fp32", "bf16", "int8"}));
  cmd->add_flag("--json", o->json, "Print JSON instead of tables");
  return [o] { return run_plan(*o); };
}

}  // namespace tierflow::cli
