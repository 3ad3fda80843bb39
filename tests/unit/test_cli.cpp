// The tierflow CLI as a user runs it: exit codes, one-line errors, JSON keys.

#include <cmath>
#include <cstdio>
#include <sstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "test_support.hpp"

using nlohmann::json;

namespace {

struct run_result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& arg) {
  std::string q = "'";
  for (char c : arg) {
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return q + "'";
}

run_result run_cli(const std::vector<std::string>& args, const std::string& env = "") {
  tierflow::test::scratch_dir dir;
  const auto err_path = dir.path() / "stderr";
  std::string command =
      "env -u TIERFLOW_TIERS -u TIERFLOW_CONFIG " + env + " " + quote(TIERFLOW_CLI_PATH);
  for (const auto& a : args) {
    command += " " + quote(a);
  }
  command += " 2>" + quote(err_path.string());
  run_result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    result.out.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = tierflow::test::read_file(err_path);
  return result;
}

void check_one_line_error(const run_result& r, const std::string& expected) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());  // never a partial table
  CHECK_THAT(r.err, Catch::StartsWith("tierflow: error: "));
  CHECK_THAT(r.err, Catch::Contains(expected));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

}  // namespace

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
  check_one_line_error(run_cli({"topo", "--config", missing}), "cannot read configuration file");
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

TEST_CASE("demo trains with offload, writes its files and verifies bit for bit", "[cli][demo]") {
  tierflow::test::scratch_dir dir;
  auto gen = tierflow::test::rng(900);
  const std::string seed = std::to_string(gen() % 1000000);
  const auto r = run_cli(
      {"demo",      "--layers", "3",       "--width",  "64",     "--batch", "16",
       "--samples", "64",       "--steps", "120",      "--lr",   "3e-3",    "--window",
       "1",         "--seed",   seed,      "--verify", "--json", "--out",   dir.path().string()},
      "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["steps"] == 120);
  CHECK(j["backend"] == "emulated");
  CHECK(j["adam_mode"] == "cpu");
  CHECK(j["loss_last"].get<double>() < j["loss_first"].get<double>() / 5);
  CHECK(j["verify"]["bit_identical"] == true);
  CHECK(j["verify"]["max_abs_diff"] == 0.0);
  for (const char* key :
       {"step_time_s", "lower_bound_s", "overlap_efficiency", "stall_fraction", "window"}) {
    CHECK(j["scheduler"].contains(key));
  }
  CHECK(j["scheduler"]["window"] == 1);
  // The weights were streamed: each iteration fetches every layer for the forward pass and,
  // but for the last one (still staged when the backward pass starts), again for the backward.
  CHECK(j["scheduler"]["bytes_in"].get<std::uint64_t>() >= (2u * 3 - 1) * 64 * 64 * 4 * 120);
  std::uint64_t params = 0;
  for (const auto& [tier, classes] : j["tiers"].items()) {
    params += classes.value("params", std::uint64_t{0});
  }
  CHECK(params == 3u * 64 * 64 * 4);
  const auto metrics =
      nlohmann::json::parse(tierflow::test::read_file(dir.path() / "metrics.json"));
  CHECK(metrics["adam"]["steps"] == 120);
  CHECK(metrics["scheduler"]["iterations"].get<int>() >= 100);
  const auto trace = nlohmann::json::parse(tierflow::test::read_file(dir.path() / "trace.json"));
  CHECK(!trace["traceEvents"].empty());
  CHECK_THAT(tierflow::test::read_file(dir.path() / "metrics.prom"),
             Catch::Contains("tierflow_scheduler_"));
}

TEST_CASE("demo: bad flags are one line and exit code 2", "[cli][demo]") {
  check_one_line_error(run_cli({"demo", "--adam-mode", "gpu", "--steps", "1", "--layers", "1",
                                "--width", "8", "--batch", "4", "--samples", "4"}),
                       "--adam-mode");
  check_one_line_error(run_cli({"demo", "--samples", "4", "--batch", "8"}), "--samples");
  check_one_line_error(run_cli({"demo", "--device", "cuda:7"}), "--device");
  check_one_line_error(run_cli({"demo", "--lr", "-1"}), "--lr");
}

TEST_CASE("tune sweeps window x chunk, marks the Pareto front and recommends within the budget",
          "[cli][demo]") {
  const auto r = run_cli(
      {"tune", "--layers", "3", "--width", "64", "--batch", "8", "--steps", "6", "--warmup", "2",
       "--windows", "0,1,3", "--adam-chunks", "1024,4096", "--hbm-budget", "0.04", "--json"},
      "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["sweep"].size() == 6);
  const auto budget = j["hbm_budget_bytes"].get<std::uint64_t>();
  double best = 1e30;
  for (const auto& p : j["sweep"]) {
    CHECK(p["step_time_s"].get<double>() > 0);
    if (p["hbm_staging_bytes"].get<std::uint64_t>() <= budget) {
      best = std::min(best, p["step_time_s"].get<double>());
    }
    // A point is on the front exactly when no other is as good in both and better in one.
    bool dominated = false;
    for (const auto& q : j["sweep"]) {
      const bool as_good =
          q["step_time_s"] <= p["step_time_s"] && q["hbm_staging_bytes"] <= p["hbm_staging_bytes"];
      const bool better =
          q["step_time_s"] < p["step_time_s"] || q["hbm_staging_bytes"] < p["hbm_staging_bytes"];
      dominated = dominated || (as_good && better);
    }
    CHECK(p["pareto"].get<bool>() == !dominated);
  }
  const auto& rec = j["recommended"];
  CHECK(j["best_step_time_s"].get<double>() == best);
  CHECK(rec["step_time_s"].get<double>() <= 1.02 * best);
  bool found = false;
  for (const auto& p : j["sweep"]) {
    if (p["window"] == rec["window"] && p["chunk_bytes"] == rec["chunk_bytes"]) {
      found = true;
      CHECK(p["hbm_staging_bytes"].get<std::uint64_t>() <= budget);
    }
  }
  CHECK(found);
  // 0.04 MiB holds at most window 0 or 1 of 16 KiB layers (plus the step's own slot).
  CHECK(rec["window"].get<int>() <= 1);
  check_one_line_error(run_cli({"tune", "--windows", "1,x"}), "--windows");
  check_one_line_error(run_cli({"tune", "--adam-chunks", "0"}), "--adam-chunks");
}
