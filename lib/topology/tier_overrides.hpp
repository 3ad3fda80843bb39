#pragma once
// The user's tier classification override: `KIND=NODES[;KIND=NODES...]`.

#include <string>
#include <string_view>
#include <vector>

#include "tierflow/topology.hpp"

namespace tierflow::detail {

struct tier_override {
  tier_kind kind = tier_kind::dram;
  std::vector<int> nodes;
};

/**
 * Parses @p spec. @p origin names where it came from (`env TIERFLOW_TIERS`, `FILE:LINE`,
 * `--tiers`); @p memory_nodes are the machine's node ids, which every listed node must be.
 * @throws input_error on any malformed entry, unknown kind or node, or a node listed twice.
 */
std::vector<tier_override> parse_tier_overrides(std::string_view spec, const std::string& origin,
                                                const std::vector<int>& memory_nodes);

}  // namespace tierflow::detail
