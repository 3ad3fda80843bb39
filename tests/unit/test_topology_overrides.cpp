// TIERFLOW_TIERS / the `tiers` setting / discovery_options::tiers_override.

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;

namespace {

discovery_options cxl_machine() {
  discovery_options options;
  options.sysfs_root = test::sysfs_fixture("two_socket_cxl");
  return options;
}

std::vector<int> nodes_of(const topology& topo, const std::string& tier_name) {
  const auto* t = topo.find_tier(tier_name);
  REQUIRE(t != nullptr);
  std::vector<int> out;
  for (const auto& n : t->nodes) {
    out.push_back(n.value);
  }
  return out;
}

}  // namespace

TEST_CASE("an override regroups nodes into one tier per entry", "[topology][override]") {
  test::scoped_env no_env("TIERFLOW_TIERS", nullptr);
  auto options = cxl_machine();
  options.tiers_override = "cxl=2,3; dram = 0";
  const auto topo = topology::discover(options);
  CHECK(nodes_of(topo, "cxl0") == std::vector<int>{2, 3});
  CHECK(nodes_of(topo, "dram0") == std::vector<int>{0});
  CHECK(nodes_of(topo, "remote_dram0") == std::vector<int>{1});  // not listed: classified as usual
  CHECK(topo.find_tier("cxl0")->capacity_bytes == 2 * 134217728ULL * 1024);
  CHECK(topo.find_node({2})->kind_reason == "override from tiers override");
  CHECK(topo.override_origin() == "tiers override");
}

TEST_CASE("an override can relabel any node", "[topology][override]") {
  test::scoped_env no_env("TIERFLOW_TIERS", nullptr);
  auto options = cxl_machine();
  options.tiers_override = "host_hbm=3;cxl=1";
  const auto topo = topology::discover(options);
  CHECK(topo.find_node({3})->kind == tier_kind::host_hbm);
  CHECK(topo.find_node({1})->kind == tier_kind::cxl);
  CHECK(topo.find_node({2})->kind == tier_kind::cxl);  // unlisted CXL node keeps its own tier
  CHECK(nodes_of(topo, "host_hbm0") == std::vector<int>{3});
}

TEST_CASE("the override comes from TIERFLOW_TIERS, then the config file", "[topology][override]") {
  const auto file = settings::from_text("tiers = remote_dram=2-3\n", "site.conf");
  auto options = cxl_machine();
  options.config = &file;
  {
    test::scoped_env no_env("TIERFLOW_TIERS", nullptr);
    const auto topo = topology::discover(options);
    CHECK(nodes_of(topo, "remote_dram0") == std::vector<int>{2, 3});
    CHECK(topo.override_origin() == "site.conf:1");
  }
  {
    test::scoped_env env("TIERFLOW_TIERS", "cxl=1");
    const auto topo = topology::discover(options);
    CHECK(topo.find_node({1})->kind == tier_kind::cxl);
    CHECK(topo.find_node({2})->kind == tier_kind::cxl);
    CHECK(topo.override_origin() == "env TIERFLOW_TIERS");
  }
  {
    test::scoped_env env("TIERFLOW_TIERS", "cxl=1");
    options.tiers_override = "dram=1";  // code wins over both
    const auto topo = topology::discover(options);
    CHECK(topo.find_node({1})->kind == tier_kind::dram);
  }
}

TEST_CASE("malformed overrides are clear errors", "[topology][override]") {
  struct bad_case {
    const char* spec;
    const char* problem;
  };
  const bad_case cases[] = {
      {"", "empty tier override"},
      {"   ", "empty tier override"},
      {"cxl", "expected KIND=NODES"},
      {"cxl=2;;dram=0", "expected KIND=NODES"},
      {"ssd=2", "unknown tier kind 'ssd'"},
      {"hbm=2", "hbm tiers are GPU memory"},
      {"cxl=", "empty node list for cxl"},
      {"cxl=2-x", "expected node ids"},
      {"cxl=3-2", "expected node ids"},
      {"cxl=9", "node 9 is not a memory node of this machine (nodes: 0-3)"},
      {"cxl=2,3;dram=3", "node 3 is in two tiers (cxl and dram)"},
      {"cxl=2;cxl=2", "node 2 is in two tiers (cxl and cxl)"},
  };
  for (const auto& c : cases) {
    INFO("spec '" << c.spec << "'");
    test::scoped_env env("TIERFLOW_TIERS", nullptr);
    auto options = cxl_machine();
    options.tiers_override = c.spec;
    try {
      (void)topology::discover(options);
      FAIL("no error");
    } catch (const input_error& e) {
      CHECK(e.source() == "tiers override");
      CHECK_THAT(e.what(), Catch::Contains(c.problem));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("a bad TIERFLOW_TIERS names the variable", "[topology][override]") {
  test::scoped_env env("TIERFLOW_TIERS", "cxl=7");
  try {
    (void)topology::discover(cxl_machine());
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == "env TIERFLOW_TIERS");
    CHECK(e.offending_text() == "cxl=7");
  }
}

TEST_CASE("an initiator must be a node with CPUs", "[topology][override]") {
  test::scoped_env env("TIERFLOW_TIERS", nullptr);
  auto options = cxl_machine();
  options.initiator = numa_node_id{2};
  CHECK_THROWS_WITH(topology::discover(options),
                    Catch::Contains("node 2 is not a memory node with CPUs"));
  options.initiator = numa_node_id{42};
  CHECK_THROWS_AS(topology::discover(options), input_error);
}
