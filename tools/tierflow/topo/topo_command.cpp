// tierflow topo: what memory this machine has, as a table or as JSON (keys in docs/cli/topo.md).

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common/flags.hpp"
#include "common/format.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/topology.hpp"
#include "tierflow/where.hpp"

namespace tierflow::cli {
namespace {

using json = nlohmann::ordered_json;

struct topo_options {
  bool json_output = false;
  std::string hwloc_xml;
  std::string sysfs_root;
  std::string tiers;
  std::string config;
  int initiator = -1;
  bool no_hwloc = false;
  bool verify = false;
};

// --verify: a small allocation bound to each NUMA tier, populated, and located page by page.
struct tier_check {
  std::string tier;
  std::size_t bytes = 0;
  std::size_t total_pages = 0;
  std::size_t pages_on_tier = 0;
  std::string error;
  [[nodiscard]] bool ok() const { return error.empty() && pages_on_tier == total_pages; }
};

std::vector<tier_check> verify_tiers(const topology& topo) {
  constexpr std::size_t bytes = std::size_t{16} << 20;
  std::vector<tier_check> checks;
  for (const auto& t : topo.tiers()) {
    if (t.nodes.empty()) {
      continue;
    }
    tier_check check;
    check.tier = t.name;
    check.bytes = bytes;
    try {
      numa_resource_options o;
      o.nodes = t.nodes;
      o.populate = true;
      numa_resource resource(o);
      void* p = resource.allocate(bytes);
      const auto r = where(p, bytes);
      resource.deallocate(p, bytes);
      check.total_pages = r.total_pages;
      for (const auto& n : t.nodes) {
        check.pages_on_tier += r.pages_on(n.value);
      }
    } catch (const std::exception& e) {
      check.error = e.what();
    }
    checks.push_back(std::move(check));
  }
  return checks;
}

std::vector<int> ids_of(const std::vector<numa_node_id>& nodes) {
  std::vector<int> ids;
  for (const auto& id : nodes) {
    ids.push_back(id.value);
  }
  return ids;
}

std::optional<double> gbps(const perf_value& v) {
  return v.known() ? std::optional<double>(v.value / 1000.0) : std::nullopt;
}

std::optional<double> plain(const perf_value& v) {
  return v.known() ? std::optional<double>(v.value) : std::nullopt;
}

std::string perf_source(const access_perf& p) {
  for (const auto* v : {&p.read_bandwidth, &p.write_bandwidth, &p.read_latency, &p.write_latency}) {
    if (v->known()) {
      return std::string(to_string(v->source));
    }
  }
  return "unknown";
}

void print_table(const topology& topo) {
  std::printf("Memory tiers (relative to initiator node %d; GB/s = 10^9 B/s)\n",
              topo.initiator().value);
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : topo.tiers()) {
    std::string nearest;
    for (int g : t.nearest_gpus) {
      nearest += (nearest.empty() ? "gpu" : ",gpu") + std::to_string(g);
    }
    rows.push_back({t.name, std::string(to_string(t.kind)),
                    t.kind == tier_kind::hbm ? "gpu" + std::to_string(t.gpu)
                                             : detail::format_id_list(ids_of(t.nodes)),
                    format_bytes(t.capacity_bytes), format_bytes(t.free_bytes),
                    format_bandwidth(gbps(t.perf.read_bandwidth)),
                    format_bandwidth(gbps(t.perf.write_bandwidth)),
                    format_number(plain(t.perf.read_latency), 0), perf_source(t.perf),
                    nearest.empty() ? "-" : nearest});
  }
  std::fputs(render_table({"tier", "kind", "nodes", "capacity", "free", "read GB/s", "write GB/s",
                           "latency ns", "source", "nearest GPU"},
                          rows)
                 .c_str(),
             stdout);

  std::printf("\nNUMA nodes\n");
  rows.clear();
  for (const auto& n : topo.nodes()) {
    rows.push_back({std::to_string(n.id.value), n.has_cpu ? detail::format_id_list(n.cpus) : "-",
                    n.memory_tier ? std::to_string(*n.memory_tier) : "-",
                    std::string(to_string(n.kind)), n.kind_reason});
  }
  std::fputs(render_table({"node", "cpus", "memory tier", "kind", "why"}, rows).c_str(), stdout);

  std::printf("\nGPUs: %s\n", topo.gpu_status().c_str());
  for (std::size_t i = 0; i < topo.gpus().size(); ++i) {
    const auto& g = topo.gpus()[i];
    std::printf(
        "  gpu%zu  %s  %s  %s  nearest nodes %s\n", i,
        g.name.empty() ? "(not visible to CUDA)" : g.name.c_str(), g.pci_bus_id.c_str(),
        format_bytes(g.memory_total_bytes > 0 ? std::optional(g.memory_total_bytes) : std::nullopt)
            .c_str(),
        g.nearest_nodes.empty() ? "unknown"
                                : detail::format_id_list(ids_of(g.nearest_nodes)).c_str());
  }
  std::printf("\nSources: ");
  for (std::size_t i = 0; i < topo.sources().size(); ++i) {
    std::printf("%s%s", i ? ", " : "", topo.sources()[i].c_str());
  }
  std::printf("\n");
  if (!topo.override_origin().empty()) {
    std::printf("Tier override from %s\n", topo.override_origin().c_str());
  }
}

// The discovery that the flags ask for (the config file's settings are read by the caller).
discovery_options discovery_options_of(const topo_options& options, bool initiator_given) {
  discovery_options discover;
  if (!options.sysfs_root.empty()) {
    discover.sysfs_root = options.sysfs_root;
  }
  if (!options.hwloc_xml.empty()) {
    discover.hwloc_xml = options.hwloc_xml;
  }
  discover.use_hwloc = !options.no_hwloc;
  discover.query_gpu_free_memory = true;
  if (initiator_given) {
    if (options.initiator < 0) {
      throw input_error("--initiator", "expected a node number, 0 or more",
                        std::to_string(options.initiator));
    }
    discover.initiator = numa_node_id{options.initiator};
  }
  if (!options.tiers.empty()) {
    discover.tiers_override = options.tiers;
  }
  return discover;
}

// `tierflow topo`'s action; @p initiator_given: --initiator was on the command line.
int run_topo(const topo_options& options, bool initiator_given) {
  discovery_options discover = discovery_options_of(options, initiator_given);
  const auto config =
      options.config.empty() ? settings::from_environment() : settings::from_file(options.config);
  discover.config = &config;

  if (options.verify && (discover.hwloc_xml || discover.sysfs_root != "/")) {
    throw input_error("--verify",
                      "needs the live machine (not --hwloc-xml or --sysfs-root): it allocates");
  }
  const auto topo = topology::discover(discover);
  const auto checks = options.verify ? verify_tiers(topo) : std::vector<tier_check>{};
  const bool all_ok =
      std::all_of(checks.begin(), checks.end(), [](const tier_check& c) { return c.ok(); });
  if (options.json_output) {
    auto doc = json::parse(tierflow::to_json(topo));
    if (options.verify) {
      doc["verify"] = json::array();
      for (const auto& c : checks) {
        doc["verify"].push_back(json{{"tier", c.tier},
                                     {"bytes", c.bytes},
                                     {"total_pages", c.total_pages},
                                     {"pages_on_tier", c.pages_on_tier},
                                     {"ok", c.ok()},
                                     {"error", c.error.empty() ? json(nullptr) : json(c.error)}});
      }
    }
    std::cout << doc.dump(2) << '\n';
  } else {
    print_table(topo);
    if (options.verify) {
      std::printf("\nVerify (16 MiB bound to each tier, pages located with move_pages)\n");
      for (const auto& c : checks) {
        if (!c.error.empty()) {
          std::printf("  %-14s FAILED: %s\n", c.tier.c_str(), c.error.c_str());
        } else {
          std::printf("  %-14s %zu of %zu pages on the tier's nodes: %s\n", c.tier.c_str(),
                      c.pages_on_tier, c.total_pages, c.ok() ? "ok" : "MISPLACED");
        }
      }
    }
  }
  return all_ok ? exit_ok : exit_failure;
}

}  // namespace

action add_topo_command(CLI::App& app) {
  auto options = std::make_shared<topo_options>();
  auto* cmd = app.add_subcommand("topo", "Show the machine's memory tiers, nodes and GPUs");
  cmd->add_flag("--json", options->json_output, "Print JSON (keys documented in docs/cli/topo.md)");
  cmd->add_option("--hwloc-xml", options->hwloc_xml,
                  "Read the hwloc topology from this XML file instead of the live machine");
  cmd->add_option("--sysfs-root", options->sysfs_root,
                  "Read sysfs under this directory instead of / (a recorded or fake tree)");
  cmd->add_option("--tiers", options->tiers,
                  "Override the classification, e.g. 'cxl=2,3;dram=0' (wins over "
                  "TIERFLOW_TIERS and the config file)")
      ->check(non_empty("TIERFLOW_TIERS or the config file"));
  cmd->add_option("--config", options->config,
                  "Configuration file (key = value lines; default: env TIERFLOW_CONFIG)")
      ->check(non_empty("TIERFLOW_CONFIG"));
  auto* initiator =
      cmd->add_option("--initiator", options->initiator,
                      "Node that tier kinds are relative to (default: GPU 0's nearest node, else "
                      "the first node with CPUs)");
  cmd->add_flag("--no-hwloc", options->no_hwloc, "Do not consult hwloc");
  cmd->add_flag("--verify", options->verify,
                "Allocate 16 MiB bound to each NUMA tier and check where its pages land "
                "(live machine only)");

  return [options, initiator] { return run_topo(*options, initiator->count() > 0); };
}

}  // namespace tierflow::cli
