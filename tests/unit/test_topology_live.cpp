// The live machine, read as it is now. Capacity moves on these VMs (memory is hot-plugged as
// it is used), so each check compares with meminfo read at the same moment.

#include <cmath>
#include <sstream>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;

TEST_CASE("live machine: every node's capacity matches meminfo now", "[topology][live]") {
  test::scoped_env env("TIERFLOW_TIERS", nullptr);
  auto topo = topology::discover();
  REQUIRE_FALSE(topo.nodes().empty());
  CHECK(std::find(topo.sources().begin(), topo.sources().end(), "sysfs:/") != topo.sources().end());
  CHECK(std::find(topo.sources().begin(), topo.sources().end(), "hwloc:live") !=
        topo.sources().end());
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      topo.refresh_memory();
    }
    for (const auto& node : topo.nodes()) {
      const auto now = static_cast<double>(test::mem_total_bytes(node.id.value));
      REQUIRE(now > 0);
      INFO("node " << node.id.value << " tierflow " << node.capacity_bytes << " meminfo " << now);
      CHECK(std::abs(static_cast<double>(node.capacity_bytes) - now) <= 0.01 * now);
      REQUIRE(node.free_bytes.has_value());
      CHECK(*node.free_bytes <= node.capacity_bytes);
    }
  }
  // Exactly one tier is the initiator's own DRAM.
  const auto dram_tiers = std::count_if(topo.tiers().begin(), topo.tiers().end(),
                                        [](const auto& t) { return t.kind == tier_kind::dram; });
  CHECK(dram_tiers == 1);
  const auto* dram = topo.find_tier("dram0");
  REQUIRE(dram != nullptr);
  CHECK(std::find(dram->nodes.begin(), dram->nodes.end(), topo.initiator()) != dram->nodes.end());
  CHECK(topo.find_node(topo.initiator())->has_cpu);
}

TEST_CASE("live machine: GPUs are listed or the reason for none is given", "[topology][live]") {
  test::scoped_env env("TIERFLOW_TIERS", nullptr);
  const auto topo = topology::discover();
  const auto visible = std::count_if(topo.gpus().begin(), topo.gpus().end(),
                                     [](const auto& g) { return g.cuda_index >= 0; });
  const auto hbm_tiers = std::count_if(topo.tiers().begin(), topo.tiers().end(),
                                       [](const auto& t) { return t.kind == tier_kind::hbm; });
  CHECK(hbm_tiers == visible);
  if (visible == 0) {
    CHECK_THAT(topo.gpu_status(), Catch::Matches("no GPU visible \\(.+\\).*"));
  } else {
    CHECK_THAT(topo.gpu_status(), Catch::StartsWith(std::to_string(visible) + " GPU(s)"));
  }
}
