// Turns machine facts into a topology: each node's tier kind (with the reason), the tiers they
// form, and the initiator everything is relative to.

#include <algorithm>
#include <map>
#include <tuple>

#include "tierflow/error.hpp"
#include "tierflow/settings.hpp"
#include "topology/machine_facts.hpp"
#include "topology/tier_overrides.hpp"
#include "topology/topology_builder.hpp"

namespace tierflow {

namespace {

int kind_rank(tier_kind kind) {
  switch (kind) {
    case tier_kind::hbm:
      return 0;
    case tier_kind::host_hbm:
      return 1;
    case tier_kind::dram:
      return 2;
    case tier_kind::remote_dram:
      return 3;
    case tier_kind::cxl:
      return 4;
  }
  return 5;
}

bool is_on_package_hbm(const std::string& subtype) {
  return subtype == "MCDRAM" || subtype == "HBM";
}

numa_node_id choose_initiator(const std::vector<numa_node>& nodes,
                              const std::vector<gpu_device>& gpus,
                              const std::optional<numa_node_id>& requested) {
  auto with_cpu = [&](numa_node_id id) {
    return std::any_of(nodes.begin(), nodes.end(),
                       [&](const auto& n) { return n.id == id && n.has_cpu; });
  };
  if (requested) {
    if (!with_cpu(*requested)) {
      throw input_error("initiator", "node " + std::to_string(requested->value) +
                                         " is not a memory node with CPUs on this machine");
    }
    return *requested;
  }
  for (const auto& gpu : gpus) {
    for (const auto& id : gpu.nearest_nodes) {
      if (with_cpu(id)) {
        return id;
      }
    }
  }
  for (const auto& node : nodes) {
    if (node.has_cpu) {
      return node.id;
    }
  }
  return nodes.front().id;
}

std::string cxl_reason(const numa_node& node, const std::optional<int>& dram_memory_tier) {
  std::string reason = "CPU-less memory node";
  if (!node.dax_device.empty()) {
    reason += "; DAX device " + node.dax_device + " under a CXL region";
  }
  if (node.memory_tier) {
    reason += "; memory_tier" + std::to_string(*node.memory_tier);
    if (dram_memory_tier && *node.memory_tier > *dram_memory_tier) {
      reason += " (slower than DRAM's memory_tier" + std::to_string(*dram_memory_tier) + ")";
    }
  }
  if (!node.hwloc_subtype.empty()) {
    reason += "; hwloc subtype " + node.hwloc_subtype;
  }
  return reason;
}

void take_worse(perf_value& current, const perf_value& candidate, bool higher_is_better) {
  if (!candidate.known()) {
    return;
  }
  if (!current.known() ||
      (higher_is_better ? candidate.value < current.value : candidate.value > current.value)) {
    current = candidate;
  }
}

}  // namespace

void topology_builder::sum_memory(topology& topo) {
  for (auto& t : topo.tiers_) {
    if (t.kind == tier_kind::hbm) {
      continue;
    }
    t.capacity_bytes = 0;
    t.free_bytes = std::uint64_t{0};
    for (const auto& id : t.nodes) {
      const auto* node = topo.find_node(id);
      t.capacity_bytes += node->capacity_bytes;
      if (node->free_bytes && t.free_bytes) {
        *t.free_bytes += *node->free_bytes;
      } else {
        t.free_bytes.reset();
      }
    }
  }
}

topology topology_builder::build(detail::machine_facts facts, const discovery_options& options) {
  topology topo;
  std::sort(facts.nodes.begin(), facts.nodes.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  topo.nodes_ = std::move(facts.nodes);
  topo.distances_ = std::move(facts.distances);
  // Grouping reads the firmware's values (see classify), the topology keeps the measured ones.
  const auto firmware_access =
      facts.firmware_access.empty() ? facts.access : std::move(facts.firmware_access);
  topo.access_ = std::move(facts.access);
  topo.gpus_ = std::move(facts.gpus);
  topo.gpu_status_ = std::move(facts.gpu_status);
  topo.sources_ = std::move(facts.sources);
  topo.memory_from_sysfs_ = facts.memory_from_sysfs;
  topo.sysfs_root_ = options.sysfs_root;
  topo.initiator_ = choose_initiator(topo.nodes_, topo.gpus_, options.initiator);

  const auto overrides = read_overrides(topo, options);
  make_tiers(topo, classify(topo, overrides, firmware_access));
  sum_memory(topo);
  return topo;
}

std::vector<detail::tier_override> topology_builder::read_overrides(
    topology& topo, const discovery_options& options) {
  std::vector<int> node_ids;
  for (const auto& node : topo.nodes_) {
    node_ids.push_back(node.id.value);
  }
  std::optional<setting_value> spec;
  if (options.tiers_override) {
    spec = setting_value{*options.tiers_override, "tiers override"};
  } else {
    spec =
        (options.config != nullptr ? *options.config : settings::from_environment()).get("tiers");
  }
  if (!spec) {
    return {};
  }
  auto overrides = detail::parse_tier_overrides(spec->value, spec->origin, node_ids);
  topo.override_origin_ = spec->origin;
  return overrides;
}

topology_builder::node_groups topology_builder::classify(
    topology& topo, const std::vector<detail::tier_override>& overrides,
    const std::map<std::pair<int, int>, access_perf>& firmware_access) {
  const auto* initiator_node = topo.find_node(topo.initiator_);
  const auto dram_memory_tier =
      initiator_node != nullptr ? initiator_node->memory_tier : std::optional<int>{};

  // Key: kind, distance from the initiator, override entry (or -1), memory tier, firmware
  // bandwidth and latency.
  node_groups groups;
  for (auto& node : topo.nodes_) {
    int entry = -1;
    for (std::size_t i = 0; i < overrides.size(); ++i) {
      if (std::binary_search(overrides[i].nodes.begin(), overrides[i].nodes.end(), node.id.value)) {
        entry = static_cast<int>(i);
      }
    }
    const auto distance = topo.distance(topo.initiator_, node.id);
    if (entry >= 0) {
      node.kind = overrides[static_cast<std::size_t>(entry)].kind;
      node.kind_reason = "override from " + topo.override_origin_;
    } else if (is_on_package_hbm(node.hwloc_subtype)) {
      node.kind = tier_kind::host_hbm;
      node.kind_reason = "on-package memory (hwloc subtype " + node.hwloc_subtype + ")";
    } else if (node.has_cpu && node.id == topo.initiator_) {
      node.kind = tier_kind::dram;
      node.kind_reason = "has CPUs; the initiator";
    } else if (node.has_cpu) {
      node.kind = tier_kind::remote_dram;
      node.kind_reason = "has CPUs; not the initiator node " +
                         std::to_string(topo.initiator_.value) +
                         (distance ? " (distance " + std::to_string(*distance) + ")" : "");
    } else {
      node.kind = tier_kind::cxl;
      node.kind_reason = cxl_reason(node, dram_memory_tier);
    }
    // An override entry is one tier whatever its nodes' distances and memory tiers.
    const int distance_key = entry >= 0 ? 0 : (distance ? static_cast<int>(*distance) : 1 << 20);
    const int memory_tier_key = entry >= 0 ? -1 : node.memory_tier.value_or(-1);
    // Nodes that the initiator sees with different firmware values are different tiers;
    // measured values (tierflow bench: noisy, never equal) neither split nor merge a tier.
    const auto found = firmware_access.find({topo.initiator_.value, node.id.value});
    const access_perf perf = found == firmware_access.end() ? access_perf{} : found->second;
    const double bandwidth_key = entry >= 0 ? 0.0 : -perf.read_bandwidth.value;
    const double latency_key = entry >= 0 ? 0.0 : perf.read_latency.value;
    groups[{kind_rank(node.kind), distance_key, entry, memory_tier_key, bandwidth_key, latency_key}]
        .push_back(node.id);
  }
  return groups;
}

void topology_builder::make_tiers(topology& topo, const node_groups& groups) {
  // hbm tiers first: one per GPU the CUDA runtime sees.
  std::map<tier_kind, int> ordinal;
  for (std::size_t i = 0; i < topo.gpus_.size(); ++i) {
    const auto& gpu = topo.gpus_[i];
    if (gpu.cuda_index < 0) {
      continue;
    }
    tier t;
    t.kind = tier_kind::hbm;
    t.name = "hbm" + std::to_string(ordinal[tier_kind::hbm]++);
    t.gpu = static_cast<int>(i);
    t.capacity_bytes = gpu.memory_total_bytes;
    if (gpu.memory_free_bytes > 0) {
      t.free_bytes = gpu.memory_free_bytes;
    }
    t.nearest_gpus.push_back(static_cast<int>(i));
    topo.tiers_.push_back(std::move(t));
  }
  // The map orders groups by kind, then distance from the initiator: fastest first.
  for (const auto& [key, members] : groups) {
    tier t;
    t.kind = topo.find_node(members.front())->kind;
    t.name = std::string(to_string(t.kind)) + std::to_string(ordinal[t.kind]++);
    t.nodes = members;
    for (const auto& id : members) {
      const auto perf = topo.access(topo.initiator_, id);
      take_worse(t.perf.read_bandwidth, perf.read_bandwidth, true);
      take_worse(t.perf.write_bandwidth, perf.write_bandwidth, true);
      take_worse(t.perf.read_latency, perf.read_latency, false);
      take_worse(t.perf.write_latency, perf.write_latency, false);
    }
    for (std::size_t i = 0; i < topo.gpus_.size(); ++i) {
      const auto& near = topo.gpus_[i].nearest_nodes;
      if (std::any_of(members.begin(), members.end(), [&](const auto& id) {
            return std::find(near.begin(), near.end(), id) != near.end();
          })) {
        t.nearest_gpus.push_back(static_cast<int>(i));
      }
    }
    topo.tiers_.push_back(std::move(t));
  }
}

}  // namespace tierflow
