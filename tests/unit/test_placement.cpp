// The placement policy: spill order, out_of_capacity contents, specs from code, env and
// config, malformed specs, accounting, and real placement on this machine.

#include <cstring>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/where.hpp"

using namespace tierflow;

namespace {

constexpr std::uint64_t mib = 1 << 20;

topology fixture_topology(const std::string& name) {
  test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  discovery_options o;
  o.sysfs_root = test::sysfs_fixture(name);
  return topology::discover(o);
}

// The fixture's tiers are served from node 0 of this machine, capped by tier limits: a
// simulated-capacity machine with four tiers.
struct simulated_machine {
  topology topo = fixture_topology("two_socket_cxl");
  numa_resource node0{[] {
    numa_resource_options o;
    o.nodes = {numa_node_id{0}};
    return o;
  }()};

  placement_policy make(placement_options options) {
    placement_policy policy(topo, std::move(options));
    for (const auto& t : topo.tiers()) {
      policy.attach_resource(t.name, node0);
    }
    return policy;
  }
};

placement_options limited(std::map<std::string, std::uint64_t> limits) {
  placement_options o;
  o.tier_limits = std::move(limits);
  o.spec = "params=dram0,cxl0,cxl1";
  return o;
}

}  // namespace

TEST_CASE("default placement follows the design's rules of thumb", "[placement]") {
  const auto topo = fixture_topology("two_socket_cxl");
  const auto spec = placement_spec::defaults(topo);
  // State: largest tiers first (192 GiB DRAM sockets before 128 GiB CXL).
  CHECK(spec.describe(data_class::optimizer_state) == "dram0, remote_dram0, cxl0, cxl1");
  CHECK(spec.describe(data_class::master_params) == "dram0, remote_dram0, cxl0, cxl1");
  // Cold parameters: DRAM nearest the GPU, then CXL.
  CHECK(spec.describe(data_class::params) == "dram0, cxl0, cxl1, remote_dram0");
  CHECK(spec.describe(data_class::staging) == "dram0, remote_dram0");
}

TEST_CASE("allocations spill to the next tier in order", "[placement]") {
  test::scoped_env env("TIERFLOW_PLACEMENT", nullptr);
  simulated_machine machine;
  test::captured_log log;
  auto policy = machine.make(limited({{"dram0", 4 * mib}, {"cxl0", 8 * mib}, {"cxl1", 2 * mib}}));
  std::vector<tier_allocation> held;
  std::vector<std::string> landed;
  for (int i = 0; i < 7; ++i) {
    held.push_back(policy.allocate(data_class::params, 2 * mib));
    landed.push_back(held.back().tier());
    std::memset(held.back().data(), i + 1, held.back().size());
  }
  CHECK(landed ==
        std::vector<std::string>{"dram0", "dram0", "cxl0", "cxl0", "cxl0", "cxl0", "cxl1"});
  // Each spill is logged once, not once per allocation.
  const auto lines = log.text();
  const std::string dram_full = "placement: params: dram0 is full";
  CHECK(lines.find(dram_full) != std::string::npos);
  CHECK(lines.find(dram_full) == lines.rfind(dram_full));
  try {
    (void)policy.allocate(data_class::params, 2 * mib);
    FAIL("no error");
  } catch (const out_of_capacity& e) {
    CHECK(e.context() == "params");
    CHECK(e.requested_bytes() == 2 * mib);
    REQUIRE(e.tiers().size() == 3);
    CHECK(e.tiers()[0].tier == "dram0");
    CHECK(e.tiers()[1].tier == "cxl0");
    CHECK(e.tiers()[2].tier == "cxl1");
    for (const auto& t : e.tiers()) {
      CHECK(t.free_bytes == 0);
    }
    CHECK_THAT(e.what(), Catch::StartsWith("params: 2.0 MiB asked; free: dram0 0 B, cxl0 0 B"));
  }
  const auto snap = policy.snapshot();
  auto usage = [&](const std::string& name) {
    for (const auto& t : snap.tiers) {
      if (t.tier == name) {
        return t;
      }
    }
    FAIL("no tier " << name);
    return tier_usage{};
  };
  CHECK(usage("dram0").held_bytes == 4 * mib);
  CHECK(usage("dram0").allocations == 2);
  CHECK(usage("dram0").spills_out == 6);  // allocations 3-7 and the failed one
  CHECK(usage("cxl0").spills_in == 4);
  CHECK(usage("cxl1").spills_in == 1);
  CHECK(usage("cxl1").limit_bytes == 2 * mib);
  CHECK(snap.class_bytes.at(data_class::params).at("cxl0") == 8 * mib);
  // Contents survived every later allocation.
  for (std::size_t i = 0; i < held.size(); ++i) {
    const auto* bytes = static_cast<const unsigned char*>(held[i].data());
    CHECK(bytes[0] == i + 1);
    CHECK(bytes[held[i].size() - 1] == i + 1);
  }
  // Freeing makes room again, in the first tier.
  held[0].reset();
  CHECK(policy.allocate(data_class::params, 2 * mib).tier() == "dram0");
}

TEST_CASE("a tier is full when its nodes' free memory less the reserve is short", "[placement]") {
  test::scoped_env env("TIERFLOW_PLACEMENT", nullptr);
  simulated_machine machine;
  const auto dram_free = *machine.topo.find_tier("dram0")->free_bytes;
  placement_options options;
  options.spec = "activations=dram0,remote_dram0";
  options.reserve_bytes = dram_free - 3 * mib;  // dram0 has 3 MiB to give
  auto policy = machine.make(options);
  auto a = policy.allocate(data_class::activations, 2 * mib);
  CHECK(a.tier() == "dram0");
  auto b = policy.allocate(data_class::activations, 4 * mib);
  CHECK(b.tier() == "remote_dram0");
}

TEST_CASE("placement specs from code, TIERFLOW_PLACEMENT and the config file", "[placement]") {
  const auto topo = fixture_topology("two_socket_cxl");
  const auto file = settings::from_text("placement = optimizer_state=cxl\n", "site.conf");
  placement_options options;
  options.config = &file;
  {
    test::scoped_env env("TIERFLOW_PLACEMENT", nullptr);
    placement_policy policy(topo, options);
    CHECK(policy.spec().describe(data_class::optimizer_state) == "cxl0, cxl1");
    CHECK(policy.snapshot().spec_origin == "site.conf:1");
    CHECK(policy.spec().describe(data_class::params) == "dram0, cxl0, cxl1, remote_dram0");
  }
  {
    test::scoped_env env("TIERFLOW_PLACEMENT", "optimizer_state=remote_dram;grads=cxl1,dram");
    placement_policy policy(topo, options);
    CHECK(policy.spec().describe(data_class::optimizer_state) == "remote_dram0");
    CHECK(policy.spec().describe(data_class::grads) == "cxl1, dram0");
    CHECK(policy.snapshot().spec_origin == "env TIERFLOW_PLACEMENT");
  }
  {
    test::scoped_env env("TIERFLOW_PLACEMENT", "optimizer_state=remote_dram");
    options.spec = "optimizer_state=dram0:3+cxl0:1, cxl1";
    placement_policy policy(topo, options);
    CHECK(policy.spec().describe(data_class::optimizer_state) == "dram0:3+cxl0:1, cxl1");
    const auto& choice = policy.spec().choices(data_class::optimizer_state).front();
    CHECK(choice.tiers == std::vector<std::pair<std::string, unsigned>>{{"dram0", 3}, {"cxl0", 1}});
  }
}

TEST_CASE("a kind this machine lacks is skipped", "[placement]") {
  const auto topo = fixture_topology("laptop");
  const auto spec = placement_spec::parse("optimizer_state=cxl,dram", "test", topo);
  CHECK(spec.describe(data_class::optimizer_state) == "dram0");
  CHECK_THROWS_WITH(placement_spec::parse("optimizer_state=cxl", "test", topo),
                    Catch::Contains("no tier of this machine is left for optimizer_state"));
}

TEST_CASE("malformed placement specs are clear errors", "[placement]") {
  const auto topo = fixture_topology("two_socket_cxl");
  struct bad_case {
    const char* spec;
    const char* problem;
  };
  const bad_case cases[] = {
      {"", "empty placement"},
      {"optimizer_state", "expected CLASS=TIER"},
      {"weights=dram", "unknown data class 'weights'"},
      {"params=ssd0", "unknown tier 'ssd0' (tiers here: dram0, remote_dram0, cxl0, cxl1"},
      {"params=", "empty tier list for params"},
      {"params=dram0,,cxl0", "empty tier in the list"},
      {"params=dram0;params=cxl0", "data class 'params' given twice"},
      {"params=dram0:0+cxl0:1", "weight 0 for 'dram0'"},
      {"params=dram0:x+cxl0:1", "expected TIER:WEIGHT+TIER:WEIGHT"},
      {"params=dram0:2+dram0:1", "tier dram0 appears twice"},
  };
  for (const auto& c : cases) {
    INFO("spec '" << c.spec << "'");
    try {
      (void)placement_spec::parse(c.spec, "env TIERFLOW_PLACEMENT", topo);
      FAIL("no error");
    } catch (const input_error& e) {
      CHECK(e.source() == "env TIERFLOW_PLACEMENT");
      CHECK_THAT(e.what(), Catch::Contains(c.problem));
      CHECK(e.offending_text() == std::string(c.spec).substr(0, 80));
    }
  }
  test::scoped_env env("TIERFLOW_PLACEMENT", "params=nowhere");
  CHECK_THROWS_AS(placement_policy(topo), input_error);
  placement_options bad_limit;
  bad_limit.tier_limits = {{"dram9", 1}};
  bad_limit.spec = "params=dram0";
  CHECK_THROWS_WITH(placement_policy(topo, bad_limit), Catch::Contains("unknown tier 'dram9'"));
}

TEST_CASE("placement on this machine lands on node 0, populated", "[placement][live]") {
  test::scoped_env env("TIERFLOW_PLACEMENT", nullptr);
  test::scoped_env tiers("TIERFLOW_TIERS", nullptr);
  const auto topo = topology::discover();
  placement_policy policy(topo);
  auto gen = test::rng(300);
  const auto bytes = std::uniform_int_distribution<std::size_t>(16 * mib, 64 * mib)(gen);
  auto state = policy.allocate(data_class::optimizer_state, bytes);
  CHECK(state.tier() == "dram0");
  CHECK(state.size() == bytes);
  const auto r = where(state.data(), bytes);
  const int node = topo.find_tier("dram0")->nodes.front().value;
  CHECK(r.pages_on(node) == r.total_pages);

  const auto doc = nlohmann::json::parse(to_json(policy.snapshot()));
  CHECK(doc.at("schema_version") == 1);
  const auto& placement = doc.at("placement");
  CHECK(placement.at("classes").at("optimizer_state").at("bytes") == bytes);
  CHECK(placement.at("classes").at("optimizer_state").at("tiers").at("dram0") == bytes);
  const auto& tier = placement.at("tiers").at(0);
  CHECK(tier.at("name") == "dram0");
  CHECK(tier.at("held_bytes") == bytes);
  CHECK(tier.at("peak_bytes") == bytes);
  CHECK(tier.at("allocations") == 1);
  CHECK(tier.at("capacity_bytes").get<std::uint64_t>() > bytes);
  CHECK(tier.at("limit_bytes").is_null());
  CHECK(placement.at("spec").at("optimizer_state") == "dram0");
}

TEST_CASE("an allocation may outlive its policy", "[placement][live]") {
  test::scoped_env env("TIERFLOW_PLACEMENT", nullptr);
  test::scoped_env tiers("TIERFLOW_TIERS", nullptr);
  tier_allocation survivor;
  {
    placement_policy policy(topology::discover());
    tier_allocation first = policy.allocate(data_class::grads, mib);
    survivor = std::move(first);
    CHECK_FALSE(first);
    CHECK(survivor.tier() == "dram0");
  }
  std::memset(survivor.data(), 0xab, survivor.size());  // still mapped: the state lives on
  CHECK(static_cast<unsigned char*>(survivor.data())[mib - 1] == 0xab);
  survivor.reset();
  CHECK_FALSE(survivor);
  CHECK(survivor.data() == nullptr);
}
