#include "tierflow/topology.hpp"

#include <algorithm>

#include "platform/sysfs.hpp"
#include "tierflow/log.hpp"
#include "topology/machine_facts.hpp"
#include "topology/measured_cache.hpp"
#include "topology/topology_builder.hpp"

namespace tierflow {

topology topology::discover(const discovery_options& options) {
  const bool live_sysfs = options.sysfs_root == std::filesystem::path("/");
  // A kernel built without NUMA support has no node directory: hwloc alone describes it then.
  const bool live_without_numa_sysfs =
      live_sysfs && !detail::platform::path_exists("/sys/devices/system/node/online");
  if (live_without_numa_sysfs && !options.hwloc_xml) {
    detail::log(log_level::info,
                "topology: /sys/devices/system/node/online is missing; using hwloc alone");
  }
  const bool use_sysfs = !(live_sysfs && (options.hwloc_xml || live_without_numa_sysfs));
  // Live hwloc and CUDA describe this machine, not a fake sysfs tree or an XML file.
  const bool describes_live_machine = live_sysfs && !options.hwloc_xml;

  detail::machine_facts facts;
  if (use_sysfs) {
    facts = detail::read_sysfs(options.sysfs_root);
    if (options.use_hwloc && (options.hwloc_xml || describes_live_machine)) {
      const auto* xml = options.hwloc_xml ? &*options.hwloc_xml : nullptr;
      detail::merge_facts(facts, detail::read_hwloc(xml));
    }
  } else {
    facts = detail::read_hwloc(options.hwloc_xml ? &*options.hwloc_xml : nullptr);
  }

  if (options.use_cuda && describes_live_machine) {
    detail::add_cuda_gpus(facts, options.query_gpu_free_memory);
  } else {
    const auto on_pci = facts.gpus.size();
    facts.gpu_status = "no GPU visible (CUDA not consulted: the inputs describe another machine)";
    if (!options.use_cuda) {
      facts.gpu_status = "no GPU visible (CUDA not consulted: disabled by the caller)";
    }
    if (on_pci > 0) {
      facts.gpu_status += "; " + std::to_string(on_pci) + " NVIDIA GPU(s) on the PCI bus";
    }
  }
  // What tierflow bench measured here replaces firmware values (a cache never fails discovery,
  // but a bad TIERFLOW_CACHE_DIR is an input error like any other env var).
  if (options.use_measured_cache && (describes_live_machine || options.measured_cache_dir)) {
    const auto dir = options.measured_cache_dir ? options.measured_cache_dir
                                                : detail::default_measured_cache_dir();
    if (dir) {
      detail::apply_measured_cache(facts, *dir);
    } else {
      detail::log(log_level::debug, "topology: no cache folder (no HOME): no measured values");
    }
  }
  auto topo = topology_builder::build(std::move(facts), options);
  detail::log(log_level::debug, "topology: " + std::to_string(topo.nodes().size()) + " node(s), " +
                                    std::to_string(topo.tiers().size()) + " tier(s); " +
                                    topo.gpu_status());
  return topo;
}

const numa_node* topology::find_node(numa_node_id id) const noexcept {
  const auto it =
      std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& node) { return node.id == id; });
  return it == nodes_.end() ? nullptr : &*it;
}

const tier* topology::find_tier(std::string_view name) const noexcept {
  const auto it =
      std::find_if(tiers_.begin(), tiers_.end(), [&](const auto& t) { return t.name == name; });
  return it == tiers_.end() ? nullptr : &*it;
}

std::optional<std::uint32_t> topology::distance(numa_node_id from, numa_node_id to) const noexcept {
  const auto it = distances_.find({from.value, to.value});
  if (it == distances_.end()) {
    return std::nullopt;
  }
  return it->second;
}

access_perf topology::access(numa_node_id initiator, numa_node_id target) const noexcept {
  const auto it = access_.find({initiator.value, target.value});
  return it == access_.end() ? access_perf{} : it->second;
}

void topology::refresh_memory() {
  if (!memory_from_sysfs_) {
    return;  // an XML file's capacities do not change
  }
  // Read every node first so a failure leaves this topology as it was.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> fresh;
  fresh.reserve(nodes_.size());
  for (const auto& node : nodes_) {
    fresh.push_back(detail::read_node_meminfo(sysfs_root_, node.id.value));
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i].capacity_bytes = fresh[i].first;
    nodes_[i].free_bytes = fresh[i].second;
  }
  topology_builder::sum_memory(*this);
}

}  // namespace tierflow
