#include "bench/case_registry.hpp"

namespace tierflow::cli {

const std::vector<case_group>& case_groups() {
  static const std::vector<case_group> groups = {node_bandwidth_group(), node_latency_group(),
                                                 link_group(), adam_group()};
  return groups;
}

const std::vector<bench_case>& bench_cases() {
  static const std::vector<bench_case> cases = [] {
    std::vector<bench_case> all;
    for (const auto& group : case_groups()) {
      for (const auto& c : group.cases) {
        all.push_back(c.info);
      }
    }
    return all;
  }();
  return cases;
}

}  // namespace tierflow::cli
