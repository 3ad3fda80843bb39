#include "plan/plan_machine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/json_checker.hpp"
#include "tierflow/detail/input_file.hpp"

namespace tierflow::cli::plan {

namespace {

using json = nlohmann::json;

// A positive finite number at object[key], else an error naming where.
double positive(const json_checker& check, const json& object, const std::string& where,
                const char* key) {
  const json& v = check.member(object, where, key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
    check.fail(where + "." + key, "not a positive number", &v);
  }
  return v.get<double>();
}

// A bandwidth of `perf` in GB/s (topo writes MB/s = 10^6 B/s), or an error saying how to get one.
double bandwidth_gbps(const json_checker& check, const json& tier, const std::string& where,
                      const char* key) {
  const json& perf = check.member(tier, where, "perf");
  const std::string at = where + ".perf." + key;
  if (!perf.is_object()) {
    check.fail(where + ".perf", "not an object", &perf);
  }
  const json& entry = check.member(perf, where + ".perf", key);
  if (!entry.is_object()) {
    check.fail(at, "not an object", &entry);
  }
  const json& value = check.member(entry, at, "value");
  if (value.is_null()) {
    check.fail(at,
               "unknown (no HMAT value and nothing measured): run `tierflow bench` on that "
               "machine, then `tierflow topo --json` again");
  }
  return positive(check, entry, at, "value") / 1000.0;
}

}  // namespace

void apply_machine(plan_spec& spec, std::string_view text, const std::string& source) {
  const json_checker check(source);
  const json doc = check.parse_object(text, "not a `tierflow topo --json` document (an object)");
  const json& tiers = check.member(doc, "", "tiers");
  if (!tiers.is_array()) {
    check.fail("tiers", "not an array", &tiers);
  }
  std::vector<tier_spec> host;
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const json& t = tiers[i];
    const std::string where = "tiers[" + std::to_string(i) + "]";
    if (!t.is_object()) {
      check.fail(where, "not an object", &t);
    }
    const json& kind = check.member(t, where, "kind");
    const json& name = check.member(t, where, "name");
    if (!kind.is_string() || !name.is_string()) {
      check.fail(where, "kind and name must be strings", &t);
    }
    if (kind == "hbm") {
      continue;  // GPU memory: the GPUs below
    }
    tier_spec ts;
    ts.name = name.get<std::string>();
    if (ts.name.empty() || has_control_characters(ts.name)) {
      check.fail(where + ".name", "must be a non-empty printable name (no control characters)",
                 &name);
    }
    ts.capacity_bytes = positive(check, t, where, "capacity_bytes");
    ts.read_gbps = bandwidth_gbps(check, t, where + " (" + ts.name + ")", "read_bandwidth_mbps");
    ts.write_gbps = bandwidth_gbps(check, t, where + " (" + ts.name + ")", "write_bandwidth_mbps");
    host.push_back(std::move(ts));
  }
  if (host.empty() || host.size() > 16) {
    check.fail("tiers",
               "a node needs 1 to 16 host tiers; this one has " + std::to_string(host.size()));
  }
  // GPUs that CUDA saw, with their memory; none (a machine without GPUs): the spec's stay.
  std::uint64_t gpus = 0;
  double hbm = 0;
  if (const auto it = doc.find("gpus"); it != doc.end() && it->is_array()) {
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& g = (*it)[i];
      if (!g.is_object() || !g.contains("cuda_index") || g["cuda_index"].is_null()) {
        continue;
      }
      const double bytes =
          positive(check, g, "gpus[" + std::to_string(i) + "]", "memory_total_bytes");
      hbm = gpus == 0 ? bytes : std::min(hbm, bytes);
      ++gpus;
    }
  }
  spec.tiers = std::move(host);
  if (gpus > 0) {
    spec.gpus_per_node = gpus;
    spec.hbm_bytes = hbm;
  }
}

void load_machine(plan_spec& spec, const std::string& path) {
  constexpr std::uint64_t max_topo_bytes = 64ull << 20;  // as every report the CLI reads
  apply_machine(spec, detail::read_text_file(path, "topo report", max_topo_bytes), path);
}

}  // namespace tierflow::cli::plan
