#pragma once
// The friend that assembles a topology from discovered facts.

#include "tierflow/topology.hpp"
#include "topology/machine_facts.hpp"

namespace tierflow {

struct topology_builder {
  /** Classifies @p facts into nodes and tiers. @throws input_error on a bad override. */
  static topology build(detail::machine_facts facts, const discovery_options& options);
  /** Recomputes each node tier's capacity and free bytes from its nodes. */
  static void sum_memory(topology& topo);
};

}  // namespace tierflow
