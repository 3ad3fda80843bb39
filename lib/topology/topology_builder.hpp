#pragma once
// The friend that assembles a topology from discovered facts.

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "tierflow/topology.hpp"
#include "topology/machine_facts.hpp"
#include "topology/tier_overrides.hpp"

namespace tierflow {

struct topology_builder {
  /** Classifies @p facts into nodes and tiers. @throws input_error on a bad override. */
  static topology build(detail::machine_facts facts, const discovery_options& options);
  /** Recomputes each node tier's capacity and free bytes from its nodes. */
  static void sum_memory(topology& topo);

 private:
  /** Node ids that look alike (the same override entry, kind, distance from the initiator,
   * memory tier and firmware access values), fastest group first. */
  using node_groups =
      std::map<std::tuple<int, int, int, int, double, double>, std::vector<numa_node_id>>;
  /** The override from the options, else the `tiers` setting; records its origin in @p topo. */
  static std::vector<detail::tier_override> read_overrides(topology& topo,
                                                           const discovery_options& options);
  /** Sets each node's kind and reason, and groups the nodes. */
  static node_groups classify(topology& topo, const std::vector<detail::tier_override>& overrides,
                              const std::map<std::pair<int, int>, access_perf>& firmware_access);
  /** One hbm tier per GPU the CUDA runtime sees, then one tier per group. */
  static void make_tiers(topology& topo, const node_groups& groups);
};

}  // namespace tierflow
