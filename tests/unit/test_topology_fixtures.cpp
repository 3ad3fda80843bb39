// Classification of recorded and fake machines: fake sysfs trees (tests/data/sysfs) and hwloc
// XML of real machines (tests/data/hwloc).

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;

namespace {

constexpr std::uint64_t kib = 1024;

topology discover_sysfs(const std::string& name, discovery_options options = {}) {
  test::scoped_env no_override("TIERFLOW_TIERS", nullptr);
  options.sysfs_root = test::sysfs_fixture(name);
  return topology::discover(options);
}

topology discover_xml(const std::string& name, discovery_options options = {}) {
  test::scoped_env no_override("TIERFLOW_TIERS", nullptr);
  options.hwloc_xml = test::hwloc_fixture(name);
  return topology::discover(options);
}

std::vector<int> ids(const std::vector<numa_node_id>& nodes) {
  std::vector<int> out;
  for (const auto& n : nodes) {
    out.push_back(n.value);
  }
  return out;
}

// name -> (kind, nodes) for every tier, to compare whole classifications at once.
std::map<std::string, std::pair<tier_kind, std::vector<int>>> summary(const topology& topo) {
  std::map<std::string, std::pair<tier_kind, std::vector<int>>> out;
  for (const auto& t : topo.tiers()) {
    out[t.name] = {t.kind, ids(t.nodes)};
  }
  return out;
}

using tier_map = std::map<std::string, std::pair<tier_kind, std::vector<int>>>;

}  // namespace

TEST_CASE("laptop: one DRAM tier", "[topology][sysfs]") {
  const auto topo = discover_sysfs("laptop");
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}}});
  const auto& node = topo.nodes().at(0);
  CHECK(node.has_cpu);
  CHECK(node.cpus == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(node.capacity_bytes == 16303424 * kib);
  CHECK(node.free_bytes == 9871236 * kib);
  CHECK(node.memory_tier == 4);
  CHECK(topo.distance({0}, {0}) == 10u);
  CHECK(topo.tiers().at(0).capacity_bytes == node.capacity_bytes);
  CHECK(topo.gpus().empty());
  CHECK_THAT(topo.gpu_status(), Catch::StartsWith("no GPU visible ("));
  CHECK(topo.initiator() == numa_node_id{0});
}

TEST_CASE("two-socket server: local and remote DRAM", "[topology][sysfs]") {
  const auto topo = discover_sysfs("two_socket");
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1}}}});
  CHECK(topo.distance({0}, {1}) == 21u);
  CHECK(topo.distance({1}, {0}) == 21u);
  const auto local = topo.access({0}, {0});
  CHECK(local.read_bandwidth.value == 131072.0);
  CHECK(local.write_bandwidth.value == 98304.0);
  CHECK(local.read_latency.value == 90.0);
  CHECK(local.write_latency.value == 100.0);
  CHECK(local.read_bandwidth.source == attr_source::hmat);
  CHECK_FALSE(topo.access({0}, {1}).read_bandwidth.known());

  SECTION("kinds follow the initiator") {
    discovery_options options;
    options.initiator = numa_node_id{1};
    const auto from_one = discover_sysfs("two_socket", options);
    CHECK(summary(from_one) == tier_map{{"dram0", {tier_kind::dram, {1}}},
                                        {"remote_dram0", {tier_kind::remote_dram, {0}}}});
  }
}

TEST_CASE("two-socket server with two CXL expanders", "[topology][sysfs]") {
  const auto topo = discover_sysfs("two_socket_cxl");
  // Node 2 hangs off socket 0 (distance 14), node 3 off socket 1 (distance 24): from node 0
  // they are different tiers.
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1}}},
                                  {"cxl0", {tier_kind::cxl, {2}}},
                                  {"cxl1", {tier_kind::cxl, {3}}}});
  for (int id : {2, 3}) {
    const auto* node = topo.find_node({id});
    REQUIRE(node != nullptr);
    CHECK_FALSE(node->has_cpu);
    CHECK(node->cpus.empty());
    CHECK(node->memory_tier == 22);
    CHECK(node->capacity_bytes == 134217728 * kib);
    CHECK(node->dax_device == (id == 2 ? "dax0.0" : "dax1.0"));
    CHECK_THAT(node->kind_reason, Catch::Contains("CXL region"));
    CHECK_THAT(node->kind_reason, Catch::Contains("slower than DRAM's memory_tier4"));
  }
  const auto* cxl0 = topo.find_tier("cxl0");
  REQUIRE(cxl0 != nullptr);
  CHECK(cxl0->perf.read_bandwidth.value == 32768.0);
  CHECK(cxl0->perf.write_bandwidth.value == 24576.0);
  CHECK(cxl0->perf.read_latency.value == 250.0);
  CHECK(cxl0->perf.write_latency.value == 270.0);
  CHECK(topo.access({1}, {3}).read_latency.value == 250.0);
  CHECK(topo.distance({2}, {3}) == 26u);
  // Tiers come fastest kind first.
  CHECK(topo.tiers().front().kind == tier_kind::dram);
  CHECK(topo.tiers().back().kind == tier_kind::cxl);
}

TEST_CASE("GPU server: GPUs on the PCI bus and their nearest nodes", "[topology][sysfs]") {
  const auto topo = discover_sysfs("gpu_server");
  REQUIRE(topo.gpus().size() == 4);  // the NVMe drive and the NIC are not GPUs
  const std::vector<std::pair<std::string, int>> expected = {
      {"0000:17:00.0", 0}, {"0000:3d:00.0", 0}, {"0000:99:00.0", 1}, {"0000:bd:00.0", 1}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(topo.gpus()[i].pci_bus_id == expected[i].first);
    CHECK(ids(topo.gpus()[i].nearest_nodes) == std::vector<int>{expected[i].second});
    CHECK(topo.gpus()[i].cuda_index == -1);
  }
  CHECK(topo.find_tier("dram0")->nearest_gpus == std::vector<int>{0, 1});
  CHECK(topo.find_tier("remote_dram0")->nearest_gpus == std::vector<int>{2, 3});
  // hbm tiers need the CUDA runtime, which does not describe a fake tree.
  CHECK(topo.find_tier("hbm0") == nullptr);
  CHECK_THAT(topo.gpu_status(), Catch::Contains("4 NVIDIA GPU(s) on the PCI bus"));
}

TEST_CASE("GPU locality falls back to local_cpulist", "[topology][sysfs]") {
  test::fixture_copy tree("gpu_server");
  const std::string gpu = "sys/devices/pci0000:97/0000:97:02.0/0000:99:00.0/";
  test::write_file(tree.at(gpu + "numa_node"), "-1\n");
  test::write_file(tree.at(gpu + "local_cpulist"), "40-47\n");
  test::scoped_env no_override("TIERFLOW_TIERS", nullptr);
  discovery_options options;
  options.sysfs_root = tree.root();
  const auto topo = topology::discover(options);
  CHECK(ids(topo.gpus().at(2).nearest_nodes) == std::vector<int>{1});
}

TEST_CASE("capacity and free are read again on refresh", "[topology][sysfs]") {
  test::fixture_copy tree("laptop");
  test::scoped_env no_override("TIERFLOW_TIERS", nullptr);
  discovery_options options;
  options.sysfs_root = tree.root();
  auto topo = topology::discover(options);
  auto gen = test::rng(3);
  const auto total_kib = std::uniform_int_distribution<std::uint64_t>(1 << 20, 1ULL << 36)(gen);
  const auto free_kib = std::uniform_int_distribution<std::uint64_t>(1, total_kib)(gen);
  test::write_file(tree.at("sys/devices/system/node/node0/meminfo"),
                   "Node 0 MemTotal:       " + std::to_string(total_kib) +
                       " kB\nNode 0 MemFree:        " + std::to_string(free_kib) + " kB\n");
  topo.refresh_memory();
  CHECK(topo.nodes().at(0).capacity_bytes == total_kib * kib);
  CHECK(topo.nodes().at(0).free_bytes == free_kib * kib);
  CHECK(topo.tiers().at(0).capacity_bytes == total_kib * kib);
  CHECK(topo.tiers().at(0).free_bytes == free_kib * kib);

  SECTION("a failed refresh leaves the topology as it was") {
    test::write_file(tree.at("sys/devices/system/node/node0/meminfo"), "garbage\n");
    CHECK_THROWS_AS(topo.refresh_memory(), input_error);
    CHECK(topo.nodes().at(0).capacity_bytes == total_kib * kib);
  }
}

TEST_CASE("hwloc XML: Xeon Phi with MCDRAM", "[topology][hwloc]") {
  const auto topo = discover_xml("64intel64-fakeKNL-SNC4-hybrid.xml");
  REQUIRE(topo.nodes().size() == 8);
  for (int id = 0; id < 8; ++id) {
    const auto* node = topo.find_node({id});
    REQUIRE(node != nullptr);
    CHECK(node->has_cpu == (id < 4));
    CHECK(node->hwloc_subtype == (id < 4 ? "DRAM" : "MCDRAM"));
    CHECK(node->kind ==
          (id == 0 ? tier_kind::dram : (id < 4 ? tier_kind::remote_dram : tier_kind::host_hbm)));
    CHECK_FALSE(node->free_bytes.has_value());  // XML records no free memory
  }
  CHECK(topo.find_node({0})->cpus.size() == 16);
  // MCDRAM node 7 shares node 0's cluster: 90 GB/s from HMAT; 4-6 have no value from node 0.
  CHECK(summary(topo) == tier_map{{"host_hbm0", {tier_kind::host_hbm, {7}}},
                                  {"host_hbm1", {tier_kind::host_hbm, {4, 5, 6}}},
                                  {"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1, 2, 3}}}});
  CHECK(topo.find_tier("host_hbm0")->perf.read_bandwidth.value == 90000.0);
  CHECK(topo.find_tier("host_hbm0")->capacity_bytes == 2147483648ULL);
  CHECK(topo.find_tier("dram0")->perf.read_bandwidth.value == 22500.0);
  CHECK(topo.tiers().front().kind == tier_kind::host_hbm);
}

TEST_CASE("hwloc XML: two sockets with GPUs on PCI", "[topology][hwloc]") {
  const auto topo = discover_xml("24em64t-2n6c2t-pci.xml");
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1}}}});
  CHECK(topo.distance({0}, {1}) == 20u);
  CHECK(topo.find_node({0})->capacity_bytes == 19316633600ULL);
  REQUIRE(topo.gpus().size() == 3);
  CHECK(topo.gpus()[0].pci_bus_id == "0000:06:00.0");
  CHECK(ids(topo.gpus()[0].nearest_nodes) == std::vector<int>{0});
  CHECK(ids(topo.gpus()[1].nearest_nodes) == std::vector<int>{1});
  CHECK(ids(topo.gpus()[2].nearest_nodes) == std::vector<int>{1});
}

TEST_CASE("hwloc XML: four sockets", "[topology][hwloc]") {
  const auto topo = discover_xml("96em64t-4n4d3ca2co-pci.xml");
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1, 2, 3}}}});
  CHECK(topo.find_tier("remote_dram0")->capacity_bytes == 3 * 51271172096ULL);
  CHECK(topo.distance({0}, {3}) == 26u);
  CHECK(topo.find_node({2})->cpus.size() == 24);
}

TEST_CASE("hwloc XML: memory attributes", "[topology][hwloc]") {
  const auto topo = discover_xml("8intel64-4n2t-memattrs.xml");
  // Bandwidth 20 MB/s to node 1 from every initiator (initiator cpuset is the whole machine).
  for (int initiator = 0; initiator < 4; ++initiator) {
    const auto perf = topo.access({initiator}, {1});
    CHECK(perf.read_bandwidth.value == 20.0);
    CHECK(perf.write_bandwidth.value == 20.0);
    CHECK(perf.read_bandwidth.source == attr_source::hmat);
  }
  CHECK_FALSE(topo.access({0}, {2}).read_bandwidth.known());
  CHECK(summary(topo) == tier_map{{"dram0", {tier_kind::dram, {0}}},
                                  {"remote_dram0", {tier_kind::remote_dram, {1}}},
                                  {"remote_dram1", {tier_kind::remote_dram, {2, 3}}}});
}
