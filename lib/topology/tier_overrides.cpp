#include "topology/tier_overrides.hpp"

#include <algorithm>
#include <map>

#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow::detail {

std::vector<tier_override> parse_tier_overrides(std::string_view spec, const std::string& origin,
                                                const std::vector<int>& memory_nodes) {
  const std::string text(spec);
  if (trim(spec).empty()) {
    throw input_error(origin, "empty tier override, expected KIND=NODES[;KIND=NODES...]", text);
  }
  auto entries = split(trim(spec), ';');
  if (entries.size() > 1 && trim(entries.back()).empty()) {
    entries.pop_back();  // a trailing ';' is harmless
  }
  std::vector<tier_override> result;
  std::map<int, tier_kind> kind_of_node;
  for (auto entry : entries) {
    entry = trim(entry);
    const auto equals = entry.find('=');
    if (entry.empty() || equals == std::string_view::npos) {
      throw input_error(origin, "expected KIND=NODES (e.g. cxl=2,3) in each ';'-separated entry",
                        text);
    }
    const auto kind_name = trim(entry.substr(0, equals));
    const auto kind = parse_tier_kind(kind_name);
    if (!kind) {
      throw input_error(origin,
                        "unknown tier kind '" + std::string(kind_name) +
                            "' (expected host_hbm, dram, remote_dram or cxl)",
                        text);
    }
    if (*kind == tier_kind::hbm) {
      throw input_error(origin,
                        "hbm tiers are GPU memory found through CUDA, not NUMA nodes "
                        "(use host_hbm for HBM NUMA nodes)",
                        text);
    }
    const auto list_text = trim(entry.substr(equals + 1));
    const auto nodes = parse_id_list(list_text);
    if (!nodes) {
      throw input_error(origin, "expected node ids like 2,3 or 2-3 for " + std::string(kind_name),
                        text);
    }
    if (nodes->empty()) {
      throw input_error(origin, "empty node list for " + std::string(kind_name), text);
    }
    for (int id : *nodes) {
      if (!std::binary_search(memory_nodes.begin(), memory_nodes.end(), id)) {
        throw input_error(origin,
                          "node " + std::to_string(id) +
                              " is not a memory node of this machine (nodes: " +
                              format_id_list(memory_nodes) + ")",
                          text);
      }
      if (auto [it, inserted] = kind_of_node.emplace(id, *kind); !inserted) {
        throw input_error(origin,
                          "node " + std::to_string(id) + " is in two tiers (" +
                              std::string(to_string(it->second)) + " and " +
                              std::string(kind_name) + ")",
                          text);
      }
    }
    result.push_back({*kind, *nodes});
  }
  return result;
}

}  // namespace tierflow::detail
