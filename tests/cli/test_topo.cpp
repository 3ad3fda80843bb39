// `tierflow topo` (and --version, --help) as a user runs it: exit codes, one-line errors, JSON
// keys.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "cli_runner.hpp"
#include "test_support.hpp"

using nlohmann::json;
using namespace tierflow::test::cli;

TEST_CASE("topo --json on this machine: the DRAM tier holds node 0's MemTotal", "[cli][live]") {
  const auto r = run_cli({"topo", "--json"});
  const auto after = static_cast<double>(tierflow::test::mem_total_bytes(0));
  REQUIRE(after > 0);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  CHECK(doc.at("schema_version") == 1);
  int dram_tiers = 0;
  for (const auto& t : doc.at("tiers")) {
    if (t.at("kind") == "dram") {
      ++dram_tiers;
      if (t.at("nodes") == json::array({0})) {
        const auto capacity = t.at("capacity_bytes").get<double>();
        INFO("capacity " << capacity << " MemTotal " << after);
        CHECK(std::abs(capacity - after) <= 0.01 * after);
      }
    }
  }
  CHECK(dram_tiers == 1);
  CHECK_THAT(doc.at("gpu_status").get<std::string>(),
             Catch::Matches("(no GPU visible \\(.+\\).*)|([0-9]+ GPU\\(s\\) visible.*)"));
}

TEST_CASE("topo --json has the documented keys", "[cli]") {
  const auto r =
      run_cli({"topo", "--json", "--sysfs-root", tierflow::test::sysfs_fixture("two_socket_cxl")});
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  for (const char* key : {"schema_version", "sources", "initiator", "tiers_override", "gpu_status",
                          "tiers", "nodes", "access", "gpus"}) {
    CHECK(doc.contains(key));
  }
  const auto& cxl = doc.at("tiers").at(2);
  CHECK(cxl.at("name") == "cxl0");
  CHECK(cxl.at("kind") == "cxl");
  CHECK(cxl.at("nodes") == json::array({2}));
  CHECK(cxl.at("capacity_bytes") == 134217728ULL * 1024);
  CHECK(cxl.at("perf").at("read_bandwidth_mbps").at("value") == 32768.0);
  CHECK(cxl.at("perf").at("read_bandwidth_mbps").at("source") == "hmat");
  CHECK(cxl.at("perf").at("write_latency_ns").at("value") == 270.0);
  const auto& node2 = doc.at("nodes").at(2);
  CHECK(node2.at("has_cpu") == false);
  CHECK(node2.at("memory_tier") == 22);
  CHECK(node2.at("dax_device") == "dax0.0");
  CHECK(node2.at("distances").at("0") == 14);
}

TEST_CASE("topo prints a table", "[cli]") {
  const auto r = run_cli({"topo", "--sysfs-root", tierflow::test::sysfs_fixture("gpu_server")});
  REQUIRE(r.exit_code == 0);
  for (const char* text :
       {"tier", "kind", "capacity", "read GB/s", "latency ns", "nearest GPU", "dram0",
        "remote_dram0", "512.0 GiB", "gpu0,gpu1", "gpu2,gpu3", "0000:bd:00.0"}) {
    CHECK_THAT(r.out, Catch::Contains(text));
  }
}

TEST_CASE("topo takes overrides from --tiers, TIERFLOW_TIERS and --config", "[cli]") {
  const auto root = tierflow::test::sysfs_fixture("two_socket_cxl").string();
  auto kind_of_node3 = [](const run_result& r) {
    REQUIRE(r.exit_code == 0);
    return json::parse(r.out).at("nodes").at(3).at("kind").get<std::string>();
  };
  CHECK(kind_of_node3(run_cli({"topo", "--json", "--sysfs-root", root, "--tiers",
                               "remote_dram=3"})) == "remote_dram");
  CHECK(kind_of_node3(run_cli({"topo", "--json", "--sysfs-root", root},
                              "TIERFLOW_TIERS=host_hbm=3")) == "host_hbm");
  tierflow::test::scratch_dir dir;
  const auto conf = dir.path() / "t.conf";
  tierflow::test::write_file(conf, "tiers = dram=3\n");
  CHECK(kind_of_node3(run_cli(
            {"topo", "--json", "--sysfs-root", root, "--config", conf.string()})) == "dram");
}

TEST_CASE("topo: bad input is one line and exit code 2", "[cli]") {
  tierflow::test::scratch_dir dir;
  const auto missing = (dir.path() / "nope.xml").string();
  check_one_line_error(run_cli({"topo", "--hwloc-xml", missing}), missing + ": cannot read");

  const auto garbage = dir.path() / "garbage.xml";
  tierflow::test::write_file(garbage, "{\"not\": \"xml\"}\n");
  check_one_line_error(run_cli({"topo", "--hwloc-xml", garbage.string()}),
                       "not XML, expected hwloc topology XML: '{\"not\": \"xml\"}'");

  check_one_line_error(run_cli({"topo", "--sysfs-root", dir.path().string()}),
                       "sys/devices/system/node/online: cannot read");

  check_one_line_error(
      run_cli({"topo", "--sysfs-root", tierflow::test::sysfs_fixture("laptop").string(), "--tiers",
               "dram=0;cxl=0"}),
      "node 0 is in two tiers");
  check_one_line_error(run_cli({"topo", "--no-such-flag"}), "no-such-flag");
  check_one_line_error(run_cli({"topo", "--initiator", "many"}), "many");
  check_one_line_error(run_cli({"topo", "--initiator", "-3"}), "--initiator: expected a node");
  check_one_line_error(
      run_cli({"topo", "--sysfs-root", tierflow::test::sysfs_fixture("two_socket_cxl").string(),
               "--initiator", "3"}),
      "node 3 is not a memory node with CPUs");
  check_one_line_error(run_cli({"topo", "--config", missing}),
                       "cannot read the configuration file");
  check_one_line_error(
      run_cli({"topo", "--sysfs-root", tierflow::test::sysfs_fixture("laptop").string()},
              "TIERFLOW_TIERS=ssd=0"),
      "env TIERFLOW_TIERS: unknown tier kind 'ssd'");
}

TEST_CASE("topo --verify places a buffer in each tier and finds it there", "[cli][live]") {
  const auto r = run_cli({"topo", "--json", "--verify"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  REQUIRE(doc.at("verify").size() >= 1);
  for (const auto& c : doc.at("verify")) {
    CHECK(c.at("ok") == true);
    CHECK(c.at("total_pages").get<std::size_t>() == (16u << 20) / 4096);
    CHECK(c.at("pages_on_tier") == c.at("total_pages"));
  }
  const auto table = run_cli({"topo", "--verify"});
  CHECK_THAT(table.out, Catch::Contains("4096 of 4096 pages on the tier's nodes: ok"));
  check_one_line_error(
      run_cli({"topo", "--verify", "--sysfs-root", tierflow::test::sysfs_fixture("laptop")}),
      "--verify: needs the live machine");
}

TEST_CASE("tierflow --version and --help", "[cli]") {
  const auto version = run_cli({"--version"});
  CHECK(version.exit_code == 0);
  CHECK_THAT(version.out, Catch::StartsWith("tierflow 0."));
  const auto help = run_cli({"topo", "--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("--hwloc-xml"));
  CHECK_THAT(help.out, Catch::Contains("--sysfs-root"));
}

TEST_CASE("cli: parse errors are one line 'tierflow: error: SOURCE: PROBLEM: TEXT'",
          "[cli][bad_input]") {
  struct row {
    std::vector<std::string> args;
    std::string expected;  // the whole message after the prefix starts so
  };
  const std::vector<row> rows = {
      {{"nope"}, "command line: unknown command (topo, bench, demo, tune or plan): 'nope'"},
      {{"topo", "extra"},
       "command line: unknown command, flag or argument (see tierflow --help): 'extra'"},
      {{"topo", "--initiator", "abc"}, "--initiator: not a valid value: 'abc'"},
      {{"demo", "--steps", "1", "--steps", "2"}, "--steps: given more than once: '--steps'"},
      {{"demo", "--steps", "-3"}, "--steps: must be a whole number from 1 to "},
      {{}, "command line: a command is required"},
  };
  for (const auto& r : rows) {
    const auto result = run_cli(r.args);
    INFO("args: " << (r.args.empty() ? std::string() : r.args[0]));
    check_one_line_error(result, r.expected);
    CHECK_THAT(result.err, Catch::StartsWith("tierflow: error: " + r.expected));
    CHECK(occurrences(result.err, "tierflow") == 1 + occurrences(r.expected, "tierflow"));
  }
  // A library message that carries the prefix itself is not prefixed twice.
  tierflow::test::scratch_dir dir;
  const auto fifo = dir.path() / "config.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto r = run_cli({"topo", "--config", fifo.string()});
  check_one_line_error(r, fifo.string() + ": the configuration file is not a regular file");
  CHECK(occurrences(r.err, "error:") == 1);
}

TEST_CASE(
    "cli: every count flag refuses negatives and every number flag nan, inf and "
    "negatives, before any work",
    "[cli][bad_input]") {
  struct row {
    std::string command;
    std::string flag;
    std::string value;
  };
  std::vector<row> rows;
  const std::vector<std::pair<std::string, std::vector<std::string>>> counts = {
      {"demo",
       {"--layers", "--width", "--batch", "--samples", "--steps", "--window", "--adam-chunk",
        "--seed", "--log-every"}},
      {"tune", {"--layers", "--width", "--batch", "--steps", "--warmup"}},
      {"bench",
       {"--samples", "--buffer-mib", "--threads", "--link-mib", "--chunk-kib", "--latency-loads",
        "--llc-mib"}},
  };
  // "-1" on every count flag (each process costs time: the other shapes on one per command).
  for (const auto& [command, flags] : counts) {
    for (const auto& flag : flags) {
      rows.push_back({command, flag, "-1"});
    }
    for (const char* value : {"-18446744073709551615", "1.5", "1e3", "x"}) {
      rows.push_back({command, flags.front(), value});
    }
  }
  for (const auto& [command, flag] : std::vector<std::pair<std::string, std::string>>{
           {"demo", "--hbm-budget"}, {"demo", "--lr"}, {"tune", "--hbm-budget"}}) {
    for (const char* value : {"nan", "inf", "-1", "1e400", "x"}) {
      rows.push_back({command, flag, value});
    }
  }
  for (const auto& r : rows) {
    INFO(r.command << " " << r.flag << " " << r.value);
    const auto result = run_cli({r.command, r.flag, r.value});
    check_one_line_error(result, r.flag + ": must be a ");
    CHECK_THAT(result.err, Catch::EndsWith(": '" + r.value + "'\n"));
  }
}

TEST_CASE("cli: an empty --tiers, --config, --placement, --emu-link or --out is exit code 2",
          "[cli][bad_input]") {
  // They were taken as "not given" (the environment or the defaults silently in force), and
  // `demo --out ''` was the machine's refusal (exit 74).
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"topo", "--tiers"}, {"topo", "--config"},    {"demo", "--placement"}, {"demo", "--emu-link"},
      {"demo", "--out"},   {"tune", "--placement"}, {"tune", "--emu-link"}};
  for (const auto& [command, flag] : flags) {
    for (const char* value : {"", "  "}) {
      INFO(command << " " << flag << " '" << value << "'");
      const auto r = run_cli({command, flag, value});
      check_one_line_error(r, flag + ": must not be empty (leave the flag out for ");
      CHECK_THAT(r.err, Catch::EndsWith(": '" + std::string(value) + "'\n"));
    }
  }
}
