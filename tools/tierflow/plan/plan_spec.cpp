// `tierflow plan`'s spec file (plan_spec.hpp): strict parsing, every field checked.
#include "plan/plan_spec.hpp"

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/json_checker.hpp"
#include "tierflow/detail/input_file.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli::plan {

namespace {

using json = nlohmann::json;
constexpr double gib = 1024.0 * 1024.0 * 1024.0;
constexpr double min_rate = 1e-3;

// Every check throws through this: the file, the field, what is wrong, the value.
class spec_checker : public json_checker {
 public:
  using json_checker::json_checker;

  const json& object(const json& parent, const std::string& where, const char* key,
                     std::initializer_list<const char*> allowed) const {
    const json& v = member(parent, where, key);
    const std::string at = where.empty() ? key : where + "." + key;
    if (!v.is_object()) {
      fail(at, "must be an object", &v);
    }
    only_keys(v, at, allowed);
    return v;
  }

  // A number > 0 and ≤ @p max (finite: JSON has no nan or inf, but a literal like 1e999 is
  // refused by the parser); @p integral: a whole number.
  double number(const json& object, const std::string& where, const char* key, double max,
                bool integral) const {
    return number_from(object, where, key, 0, max, integral);
  }

  // A bandwidth in GB/s (or a GPU's TFLOPS) from 0.001 (1 MB/s, the slowest link tierflow's
  // emulated device takes) to 10^6: below it no training run moves its bytes, and 1e-300 made
  // stage times of 300 digits.
  double rate(const json& object, const std::string& where, const char* key) const {
    return number_from(object, where, key, min_rate, 1e6, false);
  }

  // A number above @p min (at least @p min when @p min > 0) and ≤ @p max.
  double number_from(const json& object, const std::string& where, const char* key, double min,
                     double max, bool integral) const {
    const json& v = member(object, where, key);
    const std::string at = where + "." + key;
    if (!v.is_number()) {
      fail(at, "must be a number", &v);
    }
    const double x = v.get<double>();
    if (!std::isfinite(x) || x <= 0 || x < min || x > max || (integral && std::floor(x) != x)) {
      char range[128];
      if (min > 0) {
        std::snprintf(range, sizeof range, "must be a number from %g to %g", min, max);
      } else {
        std::snprintf(range, sizeof range, "must be %s greater than 0 and at most %g",
                      integral ? "a whole number" : "a number", max);
      }
      fail(at, range, &v);
    }
    return x;
  }

  std::uint64_t count(const json& object, const std::string& where, const char* key,
                      double max) const {
    return static_cast<std::uint64_t>(number(object, where, key, max, true));
  }

  bool flag(const json& object, const std::string& where, const char* key, bool fallback) const {
    const auto it = object.find(key);
    if (it == object.end()) {
      return fallback;
    }
    if (!it->is_boolean()) {
      fail(where + "." + key, "must be true or false", &*it);
    }
    return it->get<bool>();
  }

  std::string text(const json& object, const std::string& where, const char* key) const {
    const json& v = member(object, where, key);
    const std::string at = where.empty() ? key : where + "." + key;
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
      fail(at, "must be a non-empty string", &v);
    }
    // Names are printed in tables and headers: a newline or an escape sequence would forge or
    // garble the report.
    if (has_control_characters(v.get_ref<const std::string&>())) {
      fail(at, "must be printable (no control characters such as newlines or escapes)", &v);
    }
    return v.get<std::string>();
  }
};

double dtype_bytes(const json& object, const std::string& where, const char* key, double fallback,
                   const spec_checker& check, std::string* name_out = nullptr) {
  const auto it = object.find(key);
  if (it == object.end()) {
    return fallback;
  }
  const std::string name = it->is_string() ? it->get<std::string>() : "";
  if (name_out != nullptr) {
    *name_out = name;
  }
  if (name == "fp32") {
    return 4;
  }
  if (name == "bf16" || name == "fp16") {
    return 2;
  }
  if (name == "fp8") {
    return 1;
  }
  check.fail(where + "." + key, "must be fp32, bf16, fp16 or fp8", &*it);
}

void parse_model(const json& doc, const spec_checker& check, plan_spec& s) {
  const json& m = check.object(
      doc, "", "model", {"params", "layers", "hidden", "param_dtype", "grad_dtype", "state_dtype"});
  s.params = check.number(m, "model", "params", 1e15, true);
  s.layers = check.count(m, "model", "layers", 1e6);
  s.hidden = check.count(m, "model", "hidden", 1e7);
  s.param_bytes = dtype_bytes(m, "model", "param_dtype", 2, check, &s.param_dtype);
  s.grad_bytes = dtype_bytes(m, "model", "grad_dtype", 2, check);
  s.state_bytes = dtype_bytes(m, "model", "state_dtype", 4, check);
}

void parse_tiers(const json& c, const spec_checker& check, plan_spec& s) {
  const json& tiers = check.member(c, "cluster", "tiers");
  if (!tiers.is_array() || tiers.empty() || tiers.size() > 16) {
    check.fail("cluster.tiers", "must be an array of 1 to 16 tiers");
  }
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const std::string where = "cluster.tiers[" + std::to_string(i) + "]";
    if (!tiers[i].is_object()) {
      check.fail(where, "must be an object", &tiers[i]);
    }
    check.only_keys(tiers[i], where, {"name", "capacity_gib", "read_gbps", "write_gbps"});
    tier_spec t;
    t.name = check.text(tiers[i], where, "name");
    for (const auto& other : s.tiers) {
      if (other.name == t.name) {
        check.fail(where + ".name", "two tiers are named \"" + t.name + "\"");
      }
    }
    t.capacity_bytes = check.number(tiers[i], where, "capacity_gib", 1e9, false) * gib;
    t.read_gbps = check.rate(tiers[i], where, "read_gbps");
    t.write_gbps = check.rate(tiers[i], where, "write_gbps");
    s.tiers.push_back(std::move(t));
  }
}

void parse_cluster(const json& doc, const spec_checker& check, plan_spec& s) {
  const json& c = check.object(doc, "", "cluster",
                               {"nodes", "gpus_per_node", "hbm_gib", "gpu_tflops", "host_link_gbps",
                                "network_gbps", "tiers"});
  s.nodes = check.count(c, "cluster", "nodes", 1e6);
  s.gpus_per_node = check.count(c, "cluster", "gpus_per_node", 1024);
  s.hbm_bytes = check.number(c, "cluster", "hbm_gib", 1e6, false) * gib;
  s.gpu_tflops = check.rate(c, "cluster", "gpu_tflops");
  s.host_link_gbps = check.rate(c, "cluster", "host_link_gbps");
  s.network_gbps = check.rate(c, "cluster", "network_gbps");
  parse_tiers(c, check, s);
}

sharding parse_sharding(const json& t, const spec_checker& check) {
  const json& v = check.member(t, "training", "sharding");
  const std::string name = v.is_string() ? v.get<std::string>() : "";
  for (auto s :
       {sharding::none, sharding::zero1, sharding::zero2, sharding::zero3, sharding::fsdp}) {
    if (name == to_string(s)) {
      return s;
    }
  }
  check.fail("training.sharding", "must be none, zero1, zero2, zero3 or fsdp", &v);
}

void parse_training(const json& doc, const spec_checker& check, plan_spec& s) {
  const json& t =
      check.object(doc, "", "training",
                   {"sharding", "offload_optimizer", "offload_params", "micro_batch", "seq_len",
                    "tokens_per_step", "recompute", "offload_activations", "layer_tiles"});
  s.shard = parse_sharding(t, check);
  s.offload_optimizer = check.flag(t, "training", "offload_optimizer", false);
  s.offload_params = check.flag(t, "training", "offload_params", false);
  s.recompute = check.flag(t, "training", "recompute", true);
  s.offload_activations = check.flag(t, "training", "offload_activations", false);
  if (s.offload_activations && !s.recompute) {
    check.fail("training.offload_activations", "needs recompute (only checkpoints are offloaded)");
  }
  if (t.contains("layer_tiles")) {
    s.layer_tiles = check.count(t, "training", "layer_tiles", 1e6);
  }
  s.micro_batch = check.count(t, "training", "micro_batch", 1e6);
  s.seq_len = check.count(t, "training", "seq_len", 1e8);
  if (t.contains("tokens_per_step")) {
    s.tokens_per_step = check.number(t, "training", "tokens_per_step", 1e15, true);
  }
}

// The moments' dtypes as the spec and --state-dtype name them (the library's names, less its
// "f32" alias).
bool parse_state_dtype(const std::string& name, adam_state_dtype& out) {
  for (auto d : {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    if (name == to_string(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

constexpr const char* state_dtype_choices = "must be fp32, bf16 or int8";
constexpr const char* compressed_needs_fp32 =
    "compresses fp32 Adam state, and model.state_dtype is not fp32 (leave one of them out)";

// Optional: {"state_dtype": fp32 | bf16 | int8, "master": fp32 | remainder}; after the
// training object, whose offload flags a remainder master needs.
void parse_optimizer(const json& doc, const spec_checker& check, plan_spec& s) {
  if (!doc.contains("optimizer")) {
    return;
  }
  const json& o = check.object(doc, "", "optimizer", {"state_dtype", "master"});
  if (const auto it = o.find("state_dtype"); it != o.end()) {
    if (!it->is_string() || !parse_state_dtype(it->get<std::string>(), s.adam_state)) {
      check.fail("optimizer.state_dtype", state_dtype_choices, &*it);
    }
    if (s.adam_state != adam_state_dtype::f32 && s.state_bytes != 4) {
      check.fail("optimizer.state_dtype", compressed_needs_fp32, &*it);
    }
  }
  if (const auto it = o.find("master"); it != o.end()) {
    const std::string name = it->is_string() ? it->get<std::string>() : "";
    if (name == to_string(master_kind::remainder)) {
      s.master = master_kind::remainder;
    } else if (name != to_string(master_kind::fp32)) {
      check.fail("optimizer.master", "must be fp32 or remainder", &*it);
    }
    if (s.master == master_kind::remainder) {
      if (s.state_bytes != 4) {
        check.fail("optimizer.master", compressed_needs_fp32, &*it);
      }
      if (const std::string why = remainder_refusal(s); !why.empty()) {
        check.fail("optimizer.master", why, &*it);
      }
    }
  }
}

}  // namespace

const char* to_string(master_kind m) {
  return m == master_kind::remainder ? "remainder" : "fp32";
}

std::string remainder_refusal(const plan_spec& s) {
  if (s.param_dtype != "bf16") {
    return "remainder keeps the fp32 master's low 16 bits beside a bf16 weight, which is its "
           "high 16 bits; model.param_dtype is " +
           s.param_dtype;
  }
  if (!s.offload_optimizer || !s.offload_params) {
    return "remainder needs the bf16 weights in the host tiers beside the optimizer state, "
           "whose master they complete (training.offload_params and "
           "training.offload_optimizer both true)";
  }
  return {};
}

void set_state_dtype(plan_spec& s, std::string_view name) {
  const std::string text(name);
  adam_state_dtype d = adam_state_dtype::f32;
  if (!parse_state_dtype(text, d)) {
    throw input_error(s.source, std::string("--state-dtype: ") + state_dtype_choices, text);
  }
  if (d != adam_state_dtype::f32 && s.state_bytes != 4) {
    throw input_error(s.source, std::string("--state-dtype: ") + compressed_needs_fp32, text);
  }
  s.adam_state = d;
}

const char* to_string(sharding s) {
  switch (s) {
    case sharding::none:
      return "none";
    case sharding::zero1:
      return "zero1";
    case sharding::zero2:
      return "zero2";
    case sharding::zero3:
      return "zero3";
    case sharding::fsdp:
      return "fsdp";
  }
  return "?";
}

plan_spec parse_plan_spec(std::string_view text, const std::string& source) {
  const spec_checker check(source);
  const json doc = check.parse_object(
      text, "a spec is a JSON object with tierflow_plan_spec, model, cluster, training");
  check.only_keys(
      doc, "",
      {"tierflow_plan_spec", "name", "source", "model", "cluster", "training", "optimizer"});
  const json& version = check.member(doc, "", "tierflow_plan_spec");
  if (!version.is_number_integer() || version.get<std::int64_t>() != 1) {
    check.fail("tierflow_plan_spec", "unsupported version (this tierflow reads 1)", &version);
  }
  plan_spec s;
  s.source = source;
  s.name = doc.contains("name") ? check.text(doc, "", "name") : source;
  if (doc.contains("source")) {
    (void)check.text(doc, "", "source");
  }
  parse_model(doc, check, s);
  parse_cluster(doc, check, s);
  parse_training(doc, check, s);
  parse_optimizer(doc, check, s);
  return s;
}

plan_spec load_plan_spec(const std::string& path) {
  // A FIFO, a folder or a device is refused, never waited on; a spec is a few kB.
  constexpr std::uint64_t max_spec_bytes = 16ull << 20;
  return parse_plan_spec(detail::read_text_file(path, "spec file", max_spec_bytes), path);
}

}  // namespace tierflow::cli::plan
