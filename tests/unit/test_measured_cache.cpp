// The measured-attribute cache: tierflow bench writes it, discovery applies it (source
// `measured`), a bad file is ignored with a warning and never stops discovery.

#include <fstream>
#include <random>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/topology.hpp"
#include "topology/measured_cache.hpp"

using namespace tierflow;

namespace {

topology live(const std::filesystem::path& cache_dir, bool use = true) {
  discovery_options o;
  o.use_cuda = false;
  o.measured_cache_dir = cache_dir;
  o.use_measured_cache = use;
  return topology::discover(o);
}

}  // namespace

TEST_CASE("measured values round-trip through the cache and replace firmware values",
          "[topology][measured]") {
  auto gen = test::rng(9201);
  std::uniform_real_distribution<double> bw(1000.0, 400000.0);
  std::uniform_real_distribution<double> ns(50.0, 900.0);
  test::scratch_dir dir;
  const auto before = live(dir.path());
  std::vector<measured_access> values;
  for (const auto& from : before.nodes()) {
    if (!from.has_cpu) {
      continue;
    }
    for (const auto& to : before.nodes()) {
      values.push_back({from.id, to.id, bw(gen), bw(gen), ns(gen)});
    }
  }
  REQUIRE_FALSE(values.empty());
  const auto path = save_measured_access(before, values, dir.path());
  CHECK(path == measured_cache_file(before, dir.path()));
  CHECK(std::filesystem::exists(path));

  const auto after = live(dir.path());
  for (const auto& v : values) {
    const auto perf = after.access(v.initiator, v.target);
    CHECK(perf.read_bandwidth.source == attr_source::measured);
    CHECK(perf.read_bandwidth.value == Approx(*v.read_bandwidth_mbps).epsilon(1e-5));
    CHECK(perf.write_bandwidth.value == Approx(*v.write_bandwidth_mbps).epsilon(1e-5));
    CHECK(perf.read_latency.source == attr_source::measured);
    CHECK(perf.read_latency.value == Approx(*v.read_latency_ns).epsilon(1e-5));
  }
  CHECK(std::find(after.sources().begin(), after.sources().end(), "measured:" + path.string()) !=
        after.sources().end());
  // The initiator's own tier reports the measured values too.
  const auto& dram = after.tiers().front();
  CHECK(dram.perf.read_bandwidth.source == attr_source::measured);

  // Off when asked, and for inputs that describe another machine.
  const auto off = live(dir.path(), false);
  CHECK(off.access(values[0].initiator, values[0].target).read_bandwidth.source !=
        attr_source::measured);
  discovery_options fixture;
  fixture.sysfs_root = test::sysfs_fixture("two_socket_cxl");
  const auto other = topology::discover(fixture);  // no cache dir given: never applied
  for (const auto& s : other.sources()) {
    CHECK_THAT(s, !Catch::StartsWith("measured:"));
  }
}

TEST_CASE("a cache of another machine, or a malformed one, is ignored with a warning",
          "[topology][measured]") {
  test::scratch_dir dir;
  const auto topo = live(dir.path(), false);
  const auto path = measured_cache_file(topo, dir.path());
  const auto write = [&](const std::string& text) { std::ofstream(path, std::ios::trunc) << text; };
  const auto applied = [&] {
    const auto t = live(dir.path());
    return std::any_of(t.sources().begin(), t.sources().end(),
                       [](const std::string& s) { return s.rfind("measured:", 0) == 0; });
  };
  write("tierflow-measured 1\nkey another|host|0\naccess 0 0 read_bandwidth_mbps 5000\n");
  CHECK_FALSE(applied());
  const std::string key = detail::measured_cache_key({topo.nodes().front().id.value});
  for (const auto& bad :
       {std::string("garbage\n"),
        "tierflow-measured 1\nkey " + key + "\naccess 0 0 read_bandwidth_mbps -4\n",
        "tierflow-measured 1\nkey " + key + "\naccess 0 0 colour 7\n",
        "tierflow-measured 1\nkey " + key + "\naccess zero 0 read_latency_ns 9\n",
        std::string("")}) {
    write(bad);
    test::captured_log logs;
    CHECK_FALSE(applied());
    CHECK_THAT(logs.text(), Catch::Contains("ignoring the measured-attribute cache"));
    CHECK_THAT(logs.text(), Catch::Contains(path.string()));
  }
}

TEST_CASE("the cache parser names the line and what was wrong", "[topology][measured][parse]") {
  std::string key;
  const auto values = detail::parse_measured_cache(
      "tierflow-measured 1\n# comment\nkey h|6.1|0-1\naccess 0 1 read_bandwidth_mbps 1234.5\n"
      "access 0 1 read_latency_ns 210\naccess 1 0 write_bandwidth_mbps 99\n",
      "cache", key);
  CHECK(key == "h|6.1|0-1");
  REQUIRE(values.size() == 2);
  CHECK(values[0].read_bandwidth_mbps == 1234.5);
  CHECK(values[0].read_latency_ns == 210.0);
  CHECK_FALSE(values[0].write_bandwidth_mbps);
  CHECK(values[1].write_bandwidth_mbps == 99.0);
  const auto text = detail::format_measured_cache(key, values);
  std::string again_key;
  const auto again = detail::parse_measured_cache(text, "round trip", again_key);
  CHECK(again_key == key);
  CHECK(again.size() == values.size());

  const auto fails = [](const std::string& input, const std::string& expected) {
    std::string k;
    try {
      (void)detail::parse_measured_cache(input, "f", k);
      FAIL("accepted: " << input);
    } catch (const input_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(expected));
    }
  };
  fails("nope\n", "f:1: not a tierflow measured-attribute cache");
  fails("tierflow-measured 1\nkey k\naccess 0 1 read_latency_ns inf\n", "f:3");
  fails("tierflow-measured 1\nkey k\naccess 0 1 read_latency_ns\n", "expected 'access");
  fails("tierflow-measured 1\naccess 0 1 read_latency_ns 5\n", "no 'key' line");
  fails("tierflow-measured 1\nkey k\naccess 0 99999 read_latency_ns 5\n", "0..4095");
}

TEST_CASE("saving refuses bad values and unknown nodes, and TIERFLOW_CACHE_DIR is validated",
          "[topology][measured]") {
  test::scratch_dir dir;
  const auto topo = live(dir.path(), false);
  const auto node = topo.nodes().front().id;
  CHECK_THROWS_AS(save_measured_access(topo, {{node, node, -1.0, {}, {}}}, dir.path()),
                  input_error);
  CHECK_THROWS_AS(save_measured_access(topo, {{node, numa_node_id{4000}, 5.0, {}, {}}}, dir.path()),
                  input_error);
  CHECK_FALSE(std::filesystem::exists(measured_cache_file(topo, dir.path())));  // nothing kept
  {
    test::scoped_env env("TIERFLOW_CACHE_DIR", "relative/dir");
    CHECK_THROWS_WITH(measured_cache_dir(), Catch::Contains("TIERFLOW_CACHE_DIR"));
  }
  {
    test::scoped_env env("TIERFLOW_CACHE_DIR", dir.path().c_str());
    CHECK(measured_cache_dir() == dir.path() / "");
  }
}

TEST_CASE("saving merges with this machine's cache: a run of one case keeps the others' values",
          "[topology][measured]") {
  auto gen = test::rng(9202);
  std::uniform_real_distribution<double> bw(1000.0, 400000.0);
  test::scratch_dir dir;
  const auto topo = live(dir.path(), false);
  const auto node = topo.nodes().front().id;
  const double read = bw(gen), write = bw(gen), latency = bw(gen) / 1000.0;
  save_measured_access(topo, {{node, node, read, write, {}}}, dir.path());
  save_measured_access(topo, {{node, node, {}, {}, latency}}, dir.path());
  const auto perf = live(dir.path()).access(node, node);
  CHECK(perf.read_bandwidth.value == read);  // 17 digits: the exact double comes back
  CHECK(perf.write_bandwidth.value == write);
  CHECK(perf.read_latency.value == latency);
  CHECK(perf.read_latency.source == attr_source::measured);
  const double again = bw(gen);
  save_measured_access(topo, {{node, node, again, {}, {}}}, dir.path());
  const auto after = live(dir.path()).access(node, node);
  CHECK(after.read_bandwidth.value == again);
  CHECK(after.write_bandwidth.value == write);
  // A malformed file is replaced, not merged.
  test::write_file(measured_cache_file(topo, dir.path()), "garbage\n");
  save_measured_access(topo, {{node, node, {}, {}, latency}}, dir.path());
  const auto fresh = live(dir.path()).access(node, node);
  CHECK(fresh.read_latency.value == latency);
  CHECK(fresh.read_bandwidth.source != attr_source::measured);
}

TEST_CASE("no cache folder at all (no HOME) is no measured values, not a failed discovery",
          "[topology][measured]") {
  test::scoped_env a("TIERFLOW_CACHE_DIR", nullptr);
  test::scoped_env b("XDG_CACHE_HOME", "relative/xdg");  // ignored, as the XDG spec says
  test::scoped_env c("HOME", nullptr);
  discovery_options o;
  o.use_cuda = false;
  const auto topo = topology::discover(o);
  CHECK_FALSE(topo.nodes().empty());
  CHECK_THROWS_WITH(measured_cache_dir(), Catch::Contains("no cache folder"));
  test::scoped_env d("HOME", "/home/someone");
  CHECK(measured_cache_dir() == std::filesystem::path("/home/someone/.cache/tierflow"));
}

TEST_CASE("measured values never split a tier: twin expanders stay one tier however they measure",
          "[topology][measured]") {
  // two_socket_cxl, with node 3 made node 2's twin as node 0 sees it: same distance, same
  // memory tier, the same HMAT values for initiator node 0.
  test::fixture_copy tree("two_socket_cxl");
  const std::string node = "sys/devices/system/node/";
  test::write_file(tree.at(node + "node0/distance"), "10 21 14 14\n");
  test::write_file(tree.at(node + "node3/distance"), "14 24 26 10\n");
  for (const char* access : {"access0", "access1"}) {
    const auto dir = tree.at(node + "node3/" + access + "/initiators");
    if (std::filesystem::exists(dir)) {
      std::filesystem::remove(dir / "node1");
      std::filesystem::create_directory_symlink("../../../node0", dir / "node0");
      for (const char* attr :
           {"read_bandwidth", "write_bandwidth", "read_latency", "write_latency"}) {
        std::filesystem::copy_file(tree.at(node + "node2/" + access + "/initiators/" + attr),
                                   dir / attr, std::filesystem::copy_options::overwrite_existing);
      }
    }
  }
  test::scoped_env no_override("TIERFLOW_TIERS", nullptr);
  test::scratch_dir cache;
  discovery_options o;
  o.sysfs_root = tree.root();
  o.use_cuda = false;
  o.measured_cache_dir = cache.path();
  const auto before = topology::discover(o);
  const auto* cxl = before.find_tier("cxl0");
  REQUIRE(cxl != nullptr);
  REQUIRE(cxl->nodes == std::vector<numa_node_id>{numa_node_id{2}, numa_node_id{3}});

  auto gen = test::rng(9203);
  std::uniform_real_distribution<double> bw(20000.0, 40000.0);
  const double a = bw(gen), b = a * 1.0001;  // a measurement's last digits
  save_measured_access(before,
                       {{numa_node_id{0}, numa_node_id{2}, a, {}, 250.0},
                        {numa_node_id{0}, numa_node_id{3}, b, {}, 251.0}},
                       cache.path());
  const auto after = topology::discover(o);
  CHECK(after.access(numa_node_id{0}, numa_node_id{3}).read_bandwidth.value == b);
  CHECK(after.access(numa_node_id{0}, numa_node_id{3}).read_bandwidth.source ==
        attr_source::measured);
  const auto* twin = after.find_tier("cxl0");
  REQUIRE(twin != nullptr);
  CHECK(twin->nodes == cxl->nodes);
  CHECK(after.find_tier("cxl1") == nullptr);
  CHECK(twin->perf.read_bandwidth.value == std::min(a, b));  // the worst member

  // Nor do they merge what the firmware tells apart: node 3 is the slower expander by HMAT,
  // however alike the two measure.
  for (const char* access : {"access0", "access1"}) {
    const auto file = tree.at(node + "node3/" + access + "/initiators/read_bandwidth");
    if (std::filesystem::exists(file)) {
      test::write_file(file, "16384\n");
    }
  }
  save_measured_access(before, {{numa_node_id{0}, numa_node_id{3}, a, {}, 250.0}}, cache.path());
  const auto apart = topology::discover(o);
  CHECK(apart.access(numa_node_id{0}, numa_node_id{2}).read_bandwidth.value ==
        apart.access(numa_node_id{0}, numa_node_id{3}).read_bandwidth.value);
  REQUIRE(apart.find_tier("cxl1") != nullptr);
  CHECK(apart.find_tier("cxl0")->nodes == std::vector<numa_node_id>{numa_node_id{2}});
  CHECK(apart.find_tier("cxl1")->nodes == std::vector<numa_node_id>{numa_node_id{3}});
}
