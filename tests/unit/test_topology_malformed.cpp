// Missing and malformed inputs: each gives one input_error naming the file and the offending
// text, and no topology.

#include <functional>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;

namespace {

struct corruption {
  std::string name;
  std::string file;     // relative to the tree root
  std::string content;  // new content; empty with remove=true deletes the file
  bool remove = false;
  std::string problem;         // expected in what()
  std::string offending = {};  // expected in offending_text(); empty: no check
};

void expect_input_error(const std::function<void()>& action, const std::string& source_suffix,
                        const std::string& problem, const std::string& offending) {
  try {
    action();
    FAIL("no error");
  } catch (const input_error& e) {
    INFO("what: " << e.what());
    CHECK_THAT(e.source(), Catch::EndsWith(source_suffix));
    CHECK_THAT(e.what(), Catch::Contains(problem));
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    if (!offending.empty()) {
      CHECK_THAT(e.offending_text(), Catch::Contains(offending));
    }
  }
}

}  // namespace

TEST_CASE("malformed sysfs trees", "[topology][malformed]") {
  const std::string node = "sys/devices/system/node/";
  const corruption cases[] = {
      {"missing online", node + "online", "", true, "cannot read (No such file or directory)"},
      {"empty online", node + "online", "\n", false, "no online NUMA node listed"},
      {"garbage online", node + "online", "zero-three\n", false, "expected a list of ids",
       "zero-three"},
      {"reversed online", node + "online", "3-0\n", false, "expected a list of ids", "3-0"},
      {"no memory", node + "has_memory", "\n", false, "no online node has memory"},
      {"missing meminfo", node + "node2/meminfo", "", true, "cannot read"},
      {"garbage MemTotal", node + "node1/meminfo",
       "Node 1 MemTotal:       lots kB\nNode 1 MemFree:  1 kB\n", false, "expected 'Node 1",
       "lots kB"},
      {"wrong node in meminfo", node + "node1/meminfo",
       "Node 0 MemTotal:       1000 kB\nNode 0 MemFree:  1 kB\n", false, "expected 'Node 1",
       "Node 0 MemTotal"},
      {"wrong unit", node + "node1/meminfo",
       "Node 1 MemTotal:       1000 MB\nNode 1 MemFree:  1 kB\n", false, "expected 'Node 1",
       "1000 MB"},
      {"no MemTotal", node + "node0/meminfo", "Node 0 MemFree:  1 kB\n", false, "no MemTotal"},
      {"free above total", node + "node0/meminfo",
       "Node 0 MemTotal:  10 kB\nNode 0 MemFree:  11 kB\n", false, "MemFree is larger"},
      {"short distance row", node + "node0/distance", "10 21 14\n", false, "expected 4 distances",
       "10 21 14"},
      {"garbage distance", node + "node3/distance", "24 14 x 10\n", false,
       "expected SLIT distances", "24 14 x 10"},
      {"garbage cpulist", node + "node0/cpulist", "0-23,a\n", false, "expected a list of ids",
       "0-23,a"},
      {"overlapping memory tiers", "sys/devices/virtual/memory_tiering/memory_tier22/nodelist",
       "1-3\n", false, "is also in memory_tier", "1-3"},
      {"empty memory tier", "sys/devices/virtual/memory_tiering/memory_tier22/nodelist", "\n",
       false, "memory tier lists no node"},
      {"garbage HMAT", node + "node2/access0/initiators/read_bandwidth", "fast\n", false,
       "expected a whole number", "fast"},
      {"garbage dax target", "sys/bus/dax/devices/dax0.0/target_node", "two\n", false,
       "expected a node number or -1", "two"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      test::fixture_copy tree("two_socket_cxl");
      if (c.remove) {
        std::filesystem::remove(tree.at(c.file));
      } else {
        test::write_file(tree.at(c.file), c.content);
      }
      test::scoped_env env("TIERFLOW_TIERS", nullptr);
      discovery_options options;
      options.sysfs_root = tree.root();
      expect_input_error([&] { (void)topology::discover(options); }, c.file, c.problem,
                         c.offending);
    }
  }
}

TEST_CASE("malformed PCI entries", "[topology][malformed]") {
  test::fixture_copy tree("gpu_server");
  const std::string dev = "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/";
  test::scoped_env env("TIERFLOW_TIERS", nullptr);
  discovery_options options;
  options.sysfs_root = tree.root();
  SECTION("vendor") {
    test::write_file(tree.at(dev + "vendor"), "nvidia\n");
    expect_input_error([&] { (void)topology::discover(options); }, "0000:17:00.0/vendor",
                       "expected a hex vendor id", "nvidia");
  }
  SECTION("numa_node") {
    test::write_file(tree.at(dev + "numa_node"), "-7\n");
    expect_input_error([&] { (void)topology::discover(options); }, "0000:17:00.0/numa_node",
                       "expected a node number or -1", "-7");
  }
}

TEST_CASE("missing and malformed hwloc XML", "[topology][malformed]") {
  test::scratch_dir dir;
  test::scoped_env env("TIERFLOW_TIERS", nullptr);
  auto discover_file = [](const std::filesystem::path& path) {
    discovery_options options;
    options.hwloc_xml = path;
    (void)topology::discover(options);
  };
  const auto missing = dir.path() / "missing.xml";
  expect_input_error([&] { discover_file(missing); }, "missing.xml", "cannot read", "");

  const auto empty = dir.path() / "empty.xml";
  test::write_file(empty, "");
  expect_input_error([&] { discover_file(empty); }, "empty.xml", "empty file", "");

  const auto text = dir.path() / "text.xml";
  test::write_file(text, "this is not xml\nat all\n");
  expect_input_error([&] { discover_file(text); }, "text.xml", "not XML", "this is not xml");

  const auto other = dir.path() / "other.xml";
  test::write_file(other, "<?xml version=\"1.0\"?>\n<html><body/></html>\n");
  expect_input_error([&] { discover_file(other); }, "other.xml", "no <topology> element", "<?xml");

  // A real fixture cut short at a random point inside its body.
  const auto whole = test::read_file(test::hwloc_fixture("24em64t-2n6c2t-pci.xml"));
  auto gen = test::rng(4);
  const auto cut = std::uniform_int_distribution<std::size_t>(200, whole.size() / 2)(gen);
  INFO("cut at byte " << cut);
  const auto truncated = dir.path() / "truncated.xml";
  test::write_file(truncated, whole.substr(0, cut));
  expect_input_error([&] { discover_file(truncated); }, "truncated.xml",
                     "not a valid hwloc topology", "<?xml");
}
