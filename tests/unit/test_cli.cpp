// The tierflow CLI as a user runs it: exit codes, one-line errors, JSON keys.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "test_support.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/device.hpp"

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
  // A fresh measured-attribute cache: neither the user's nor another test's (env may set one).
  std::string command = "env -u TIERFLOW_TIERS -u TIERFLOW_CONFIG " +
                        quote("TIERFLOW_CACHE_DIR=" + (dir.path() / "cache").string()) + " " + env +
                        " " + quote(TIERFLOW_CLI_PATH);
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

// How often @p what occurs in @p text (overlapping ones too).
std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
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
       "1",         "--seed",   seed,      "--verify", "--json", "--out",   dir.path().string(),
       "--device",  "emulated"},
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
  // Achieved against benchmarked: the probe's copies alone run near the 20 GB/s cap (and never
  // beyond it; under a sanitizer only that), the run's average (compute included) below.
  const auto& link = j["link"];
  const double slowest = tierflow::test::under_sanitizer ? 0.0 : 2.0;
  CHECK(link["h2d_benchmarked_gbps"].get<double>() > slowest);
  CHECK(link["h2d_benchmarked_gbps"].get<double>() < 20.0 * 1.1);
  CHECK(link["d2h_benchmarked_gbps"].get<double>() > slowest);
  CHECK(link["h2d_achieved_gbps"].get<double>() < link["h2d_benchmarked_gbps"].get<double>());
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
  check_one_line_error(run_cli({"demo", "--device", "gpu"}), "--device");
  // Reported before anything runs (no progress line first), each naming its flag.
  const std::vector<std::string> small = {"--steps", "1",       "--layers", "1",         "--width",
                                          "64",      "--batch", "4",        "--samples", "4"};
  const auto demo = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"demo"};
    args.insert(args.end(), small.begin(), small.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  };
  check_one_line_error(demo({"--placement", "weights=dram"}), "--placement");
  check_one_line_error(demo({"--hbm-budget", "0.001"}), "--hbm-budget");
  check_one_line_error(demo({"--hbm-budget", "-1"}), "--hbm-budget");
  check_one_line_error(demo({"--out", "/proc/tierflow-demo-out"}), "--out");
  check_one_line_error(demo({"--adam-chunk", "0"}), "--adam-chunk");
  check_one_line_error(demo({"--emu-link", "h2d=fast"}), "--emu-link");
  check_one_line_error(demo({"--layers", "0"}), "--layers");
}

TEST_CASE("demo --device cuda without a usable GPU is one line and exit code 2", "[cli][demo]") {
  try {
    (void)tierflow::open_device("cuda");
    SUCCEED("a CUDA device is usable here: the cuda-labelled demo_cuda test runs the demo on it");
    return;
  } catch (const tierflow::device_error&) {
  }
  const auto r = run_cli({"demo", "--device", "cuda", "--steps", "1", "--layers", "1", "--width",
                          "8", "--batch", "4", "--samples", "4"});
  check_one_line_error(r, "--device");
  CHECK_THAT(r.err, Catch::Contains("no usable CUDA device"));
}

TEST_CASE("tune sweeps window x chunk, marks the Pareto front and recommends within the budget",
          "[cli][demo]") {
  tierflow::test::scratch_dir dir;
  const auto page = dir.path() / "tune.html";
  const auto r =
      run_cli({"tune",   "--layers",      "3",         "--width",      "64",   "--batch",
               "8",      "--steps",       "6",         "--warmup",     "2",    "--windows",
               "0,1,3",  "--adam-chunks", "1024,4096", "--hbm-budget", "0.04", "--json",
               "--html", page.string()},
              "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["sweep"].size() == 6);
  // The default modes are cpu and streamed; the demo's params live in host memory, which
  // streamed mode cannot update: it is skipped with the reason, the cpu sweep stands.
  REQUIRE(j["skipped"].size() == 1);
  CHECK(j["skipped"][0]["adam_mode"] == "streamed");
  CHECK_THAT(j["skipped"][0]["reason"].get<std::string>(), Catch::Contains("host memory"));
  for (const auto& p : j["sweep"]) {
    CHECK(p["adam_mode"] == "cpu");
  }
  // The page: step time and stall against the window, a line per (mode, chunk), every row.
  const auto html = tierflow::test::read_file(page);
  const auto count = [&](const std::string& what) { return occurrences(html, what); };
  CHECK(count("<svg") == 2);
  CHECK(count("<polyline") == 4);
  CHECK(count("<circle") == 12);
  CHECK(count("<tr") == 7);
  CHECK(count("class=\"pick\"") == 1);
  CHECK(count("http") == 0);
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
  check_one_line_error(run_cli({"tune", "--adam-modes", "cpu,gpu"}), "--adam-modes");
  check_one_line_error(run_cli({"tune", "--html", "/nonexistent/dir/t.html"}), "--html");
  check_one_line_error(run_cli({"tune", "--adam-modes", "streamed", "--layers", "2", "--width",
                                "16", "--batch", "4", "--steps", "1", "--warmup", "0"}),
                       "runs none of them");
}

namespace {

// A small random plan: 3..5 buffers of 16..256 KiB (one resident), a forward and a backward
// step per buffer, 0.1..0.6 ms of compute each.
json small_random_plan(std::mt19937_64& gen) {
  json plan{{"tierflow_plan", 1}, {"buffers", json::array()}, {"steps", json::array()}};
  const std::size_t layers = 3 + gen() % 3;
  for (std::size_t l = 0; l < layers; ++l) {
    plan["buffers"].push_back(
        {{"name", "w" + std::to_string(gen() % 1000) + "_" + std::to_string(l)},
         {"bytes", (16 + gen() % 240) * 1024},
         {"resident", l == 0}});
  }
  plan["buffers"].push_back({{"name", "grads"}, {"bytes", 4096 + gen() % 4096}});
  for (std::size_t l = 0; l < layers; ++l) {
    plan["steps"].push_back({{"name", "fwd" + std::to_string(l)},
                             {"reads", {plan["buffers"][l]["name"]}},
                             {"compute_ms", 0.1 + static_cast<double>(gen() % 500) / 1000}});
  }
  for (std::size_t l = layers; l-- > 0;) {
    plan["steps"].push_back({{"name", "bwd" + std::to_string(l)},
                             {"reads", {plan["buffers"][l]["name"]}},
                             {"writes", {"grads"}},
                             {"compute_ms", 0.1 + static_cast<double>(gen() % 500) / 1000}});
  }
  return plan;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

}  // namespace

TEST_CASE("tune --plan --with-model: a sweep over windows, a recommendation, the model's error",
          "[cli][tune]") {
  auto gen = tierflow::test::rng(0x70e5);
  tierflow::test::scratch_dir dir;
  const auto plan_path = dir.path() / "plan.json";
  const json plan = small_random_plan(gen);
  write_file(plan_path, plan.dump());
  INFO("plan: " << plan.dump());
  std::uint64_t largest = 0;
  for (const auto& b : plan["buffers"]) {
    largest = std::max(largest, b["bytes"].get<std::uint64_t>());
  }
  // A budget that holds window 0 (one step staged, two at the turn).
  const double budget_mib = static_cast<double>(3 * largest) / 1048576.0;
  const auto r = run_cli({"tune", "--plan", plan_path.string(), "--windows", "0,1,4", "--steps",
                          "6", "--warmup", "2", "--hbm-budget", std::to_string(budget_mib),
                          "--with-model", "--json", "--html", (dir.path() / "t.html").string()},
                         "TIERFLOW_EMU_LINK=h2d=2GB/s,d2h=2GB/s,latency=20us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = json::parse(r.out);
  CHECK(j["predicted"] == false);
  CHECK(j["workload"]["steps"] == plan["steps"].size());
  CHECK(j["workload"]["plan"] == plan_path.string());
  REQUIRE(j["sweep"].size() == 3);
  const auto budget = j["hbm_budget_bytes"].get<std::uint64_t>();
  double best = 1e30;
  for (const auto& p : j["sweep"]) {
    CHECK(p["adam_mode"] == "none");
    CHECK(p["chunk_bytes"] == 0);
    CHECK(p["step_time_s"].get<double>() > 0);
    CHECK(p["predicted_step_time_s"].get<double>() > 0);
    CHECK(p["prediction_error"].get<double>() ==
          Approx(p["predicted_step_time_s"].get<double>() / p["step_time_s"].get<double>() - 1));
    // An iteration is at least its compute (the plan's compute_ms summed).
    double compute = 0;
    for (const auto& s : plan["steps"]) {
      compute += s["compute_ms"].get<double>() / 1e3;
    }
    CHECK(p["step_time_s"].get<double>() >= 0.95 * compute);
    CHECK(p["predicted_step_time_s"].get<double>() >= 0.999 * compute);
    if (p["hbm_staging_bytes"].get<std::uint64_t>() <= budget) {
      best = std::min(best, p["step_time_s"].get<double>());
    }
  }
  CHECK(j["best_step_time_s"].get<double>() == best);
  CHECK(j["recommended"]["step_time_s"].get<double>() <= 1.02 * best);
  for (const auto& p : j["sweep"]) {
    if (p["window"] == j["recommended"]["window"]) {
      CHECK(p["hbm_staging_bytes"].get<std::uint64_t>() <= budget);
    }
  }
  CHECK(j["recommended"]["adam_mode"] == "none");
  const auto& m = j["model"];
  CHECK(m["links"]["h2d"]["gbps"].get<double>() > 0);
  CHECK(m["links"]["d2h"]["latency_s"].get<double>() >= 0);
  CHECK(m["links"]["step_overhead_s"].get<double>() > 0);
  CHECK(m["median_abs_error"].get<double>() >= 0);
  CHECK(m["max_abs_error"].get<double>() >= m["median_abs_error"].get<double>());
  // Sanity only: on a loaded machine tiny steps are mostly host overhead, which the model
  // leaves out; its accuracy is measured on real sizes in BENCHMARKS.md.
  CHECK(std::isfinite(m["max_abs_error"].get<double>()));
  const auto html = tierflow::test::read_file(dir.path() / "t.html");
  CHECK(occurrences(html, "<tr") == 4);
  CHECK(occurrences(html, "predicted ms") == 1);

  // The table, with the model's columns.
  const auto table = run_cli({"tune", "--plan", plan_path.string(), "--windows", "0,2", "--steps",
                              "3", "--warmup", "1", "--with-model"});
  INFO("stderr: " << table.err);
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("predicted ms"));
  CHECK_THAT(table.out, Catch::Contains("recommended: window "));
  CHECK_THAT(table.out, Catch::Contains("model: median |error|"));
}

TEST_CASE("tune --model-only predicts the table without running the sweep", "[cli][tune]") {
  tierflow::test::scratch_dir dir;
  // 200 GiB of buffers: far too much to run here, nothing to predict.
  json plan{{"tierflow_plan", 1}, {"buffers", json::array()}, {"steps", json::array()}};
  for (int l = 0; l < 4; ++l) {
    plan["buffers"].push_back({{"name", "w" + std::to_string(l)}, {"bytes", 50ULL << 30}});
    plan["steps"].push_back({{"name", "s" + std::to_string(l)},
                             {"reads", {"w" + std::to_string(l)}},
                             {"compute_ms", 900}});
  }
  const auto path = (dir.path() / "huge.json").string();
  write_file(path, plan.dump());
  const auto r = run_cli({"tune", "--plan", path, "--windows", "0,1,2", "--model-only", "--json"},
                         "TIERFLOW_EMU_LINK=h2d=25GB/s,d2h=25GB/s,latency=10us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = json::parse(r.out);
  CHECK(j["predicted"] == true);
  CHECK(j["steps_measured"] == 0);
  REQUIRE(j["sweep"].size() == 3);
  CHECK(!j["model"].contains("median_abs_error"));
  // 50 GiB at ~25 GB/s is ~2.1 s a step against 0.9 s of compute: link-bound at every window,
  // and a window overlaps the next fetch with compute.
  for (const auto& p : j["sweep"]) {
    CHECK(p["step_time_s"].get<double>() > 4 * 1.5);
    CHECK(!p.contains("predicted_step_time_s"));
  }
  CHECK(j["sweep"][1]["step_time_s"].get<double>() < j["sweep"][0]["step_time_s"].get<double>());
  // Running it is refused, in one line that points at --model-only.
  check_one_line_error(run_cli({"tune", "--plan", path}), "--model-only predicts it");

  // The demo's model: a short calibration per (mode, chunk), then the predicted table.
  const auto demo =
      run_cli({"tune", "--layers", "3", "--width", "64", "--batch", "8", "--windows", "0,2",
               "--adam-chunks", "1024,4096", "--adam-modes", "cpu", "--model-only", "--json"},
              "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  INFO("stderr: " << demo.err << "\nstdout: " << demo.out);
  REQUIRE(demo.exit_code == 0);
  const auto d = json::parse(demo.out);
  CHECK(d["predicted"] == true);
  REQUIRE(d["sweep"].size() == 4);
  for (const auto& p : d["sweep"]) {
    CHECK(p["adam_mode"] == "cpu");
    CHECK(p["step_time_s"].get<double>() > 0);
  }
  const auto table = run_cli({"tune", "--plan", path, "--windows", "1", "--model-only"});
  CHECK_THAT(table.out, Catch::StartsWith("predicted by the model"));
}

TEST_CASE("tune --with-model on the demo's model reports the model's error", "[cli][tune]") {
  const auto r = run_cli({"tune", "--layers", "3", "--width", "64", "--batch", "8", "--steps", "4",
                          "--warmup", "1", "--windows", "0,2", "--adam-chunks", "4096",
                          "--adam-modes", "cpu,streamed", "--with-model", "--json"},
                         "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  const auto j = json::parse(r.out);
  REQUIRE(j["sweep"].size() == 2);
  REQUIRE(j["skipped"].size() == 1);  // streamed: params in host memory
  for (const auto& p : j["sweep"]) {
    CHECK(p["predicted_step_time_s"].get<double>() > 0);
  }
  CHECK(j["model"]["max_abs_error"].get<double>() >= j["model"]["median_abs_error"].get<double>());
  CHECK(std::isfinite(j["model"]["max_abs_error"].get<double>()));
  REQUIRE(j["model"]["calibrated"].size() == 1);
  CHECK(j["model"]["calibrated"][0]["adam_mode"] == "cpu");
  CHECK(j["model"]["calibrated"][0]["adam_step_s"].get<double>() > 0);
}

TEST_CASE("tune --plan: bad plans and flags are one line and exit code 2", "[cli][tune]") {
  tierflow::test::scratch_dir dir;
  const auto missing = (dir.path() / "none.json").string();
  check_one_line_error(run_cli({"tune", "--plan", missing}), missing + ": cannot read the file");
  const auto bad = (dir.path() / "bad.json").string();
  write_file(bad, R"({"tierflow_plan":1,"buffers":[{"name":"w","bytes":64}],
                      "steps":[{"name":"s","reads":["v"],"compute_ms":1}]})");
  check_one_line_error(run_cli({"tune", "--plan", bad}),
                       bad + ": steps[0].reads: unknown buffer \"v\"");
  write_file(bad, "{\"tierflow_plan\":3}");
  check_one_line_error(run_cli({"tune", "--plan", bad, "--model-only"}), "unsupported version");
  check_one_line_error(run_cli({"tune", "--model-only", "--with-model"}), "--model-only");
}

// ---- tierflow bench ----------------------------------------------------------------------

namespace {

const std::vector<std::string> bench_case_names = {
    "node_read",    "node_write",        "node_write_nt",     "node_copy",    "node_triad",
    "node_latency", "h2d_pinned",        "d2h_pinned",        "h2d_pageable", "d2h_pageable",
    "bidir_pinned", "h2d_pinned_chunks", "d2h_pinned_chunks", "adam_bound",   "adam_cpu"};

// The statistics every measured testcase carries, and its data check.
void check_measured(const json& tc, int samples) {
  INFO(tc.dump());
  CHECK(tc.at("status") == "ok");
  CHECK(tc.at("samples") == samples);
  const double lo = tc.at("min").get<double>();
  const double mid = tc.at("median").get<double>();
  const double hi = tc.at("max").get<double>();
  CHECK(lo > 0);
  CHECK(lo <= mid);
  CHECK(mid <= hi);
  CHECK(std::isfinite(hi));
  CHECK(tc.at("verified") == true);
}

// The nodes with CPUs, and how many each has, as `tierflow topo --json` sees them.
std::map<int, int> cpu_nodes_of_this_machine() {
  const auto r = run_cli({"topo", "--json"});
  REQUIRE(r.exit_code == 0);
  std::map<int, int> cpus;
  const auto doc = json::parse(r.out);
  for (const auto& n : doc.at("nodes")) {
    if (n.at("has_cpu").get<bool>()) {
      const auto list = tierflow::detail::parse_id_list(n.at("cpus").get<std::string>());
      REQUIRE(list);
      cpus[n.at("id").get<int>()] = static_cast<int>(list->size());
    }
  }
  return cpus;
}

}  // namespace

TEST_CASE("bench --list names every case, --case selects by name or prefix", "[cli][bench]") {
  const auto all = run_cli({"bench", "--list"});
  REQUIRE(all.exit_code == 0);
  for (const auto& name : bench_case_names) {
    CHECK_THAT(all.out, Catch::Contains(name + " "));
  }
  const auto some = run_cli({"bench", "--list", "--case", "h2d_,adam_cpu"});
  REQUIRE(some.exit_code == 0);
  for (const auto& name : bench_case_names) {
    const bool expected = name.rfind("h2d_", 0) == 0 || name == "adam_cpu";
    CHECK((some.out.find(name + " ") != std::string::npos) == expected);
  }
  // A case's own name is that case alone, though it begins another's.
  const auto one = run_cli({"bench", "--list", "--case", "h2d_pinned"});
  REQUIRE(one.exit_code == 0);
  CHECK_THAT(one.out, Catch::Contains("h2d_pinned "));
  CHECK_THAT(one.out, !Catch::Contains("h2d_pinned_chunks"));
}

TEST_CASE("bench --json: the initiator x target matrix, its units and byte counts, Adam, cache",
          "[cli][bench]") {
  const auto initiators = cpu_nodes_of_this_machine();
  tierflow::test::scratch_dir cache;
  const std::string env = "TIERFLOW_CACHE_DIR=" + cache.path().string();
  // --llc-mib 1: 8 MiB buffers count as beyond the cache, so the values are kept.
  const auto r = run_cli({"bench", "--case", "node_,adam", "--buffer-mib", "8", "--llc-mib", "1",
                          "--samples", "2", "--latency-loads", "20000", "--json"},
                         env);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  for (const char* key :
       {"tierflow_version", "date", "units", "machine", "settings", "testcases"}) {
    CHECK(doc.contains(key));
  }
  CHECK(doc.at("units").at("bandwidth") == "GB/s (10^9 B/s)");
  CHECK(doc.at("machine").at("llc_bytes") == 1u << 20);
  CHECK(doc.at("settings").at("huge_pages") == true);
  const auto nodes = doc.at("machine").at("nodes").size();
  REQUIRE(nodes >= 1);
  // One testcase per op x initiator x target x thread count, each counting its streams.
  const std::map<std::string, int> streams = {{"node_read", 1},
                                              {"node_write", 1},
                                              {"node_write_nt", 1},
                                              {"node_copy", 2},
                                              {"node_triad", 3}};
  std::map<std::string, std::set<std::tuple<int, int, int>>> cells;
  std::set<std::pair<int, int>> latency_pairs;
  int adam = 0;
  for (const auto& tc : doc.at("testcases")) {
    const auto name = tc.at("name").get<std::string>();
    if (tc.at("status") == "waived") {
      CHECK_FALSE(tc.at("reason").get<std::string>().empty());
      continue;
    }
    check_measured(tc, 2);
    if (streams.count(name) == 1) {
      CHECK(tc.at("unit") == "GB/s");
      CHECK(tc.at("array_bytes") == 8u << 20);
      const double huge = tc.at("huge_page_fraction").get<double>();
      CHECK((huge == -1.0 || (huge >= 0.0 && huge <= 1.0)));
      CHECK(tc.at("bytes") == streams.at(name) * (8ull << 20));
      cells[name].insert(
          {tc.at("initiator").get<int>(), tc.at("target").get<int>(), tc.at("threads").get<int>()});
    } else if (name == "node_latency") {
      CHECK(tc.at("unit") == "ns");
      CHECK(tc.at("loads") == 20000);
      latency_pairs.insert({tc.at("initiator").get<int>(), tc.at("target").get<int>()});
    } else if (name == "adam_bound" || name == "adam_cpu") {
      ++adam;
      CHECK(tc.at("bytes") == 28 * tc.at("params").get<std::uint64_t>());
      CHECK_THAT(tc.at("mparams_per_s").get<double>(),
                 Catch::WithinRel(tc.at("median").get<double>() * 1000.0 / 28.0, 1e-9));
    } else {
      FAIL("a case --case node_,adam did not select: " << name);
    }
  }
  for (const auto& [name, count] : streams) {
    INFO(name);
    std::size_t expected = 0;
    for (const auto& [from, cpus] : initiators) {
      // 1, 2, 4, ... below the CPU count, then the CPU count, to every target.
      std::vector<int> counts;
      for (int t = 1; t < cpus; t *= 2) {
        counts.push_back(t);
      }
      counts.push_back(cpus);
      expected += counts.size() * nodes;
      for (const int t : counts) {
        CHECK(cells[name].count({from, from, t}) == 1);
      }
    }
    CHECK(cells[name].size() == expected);
  }
  CHECK(latency_pairs.size() == initiators.size() * nodes);
  CHECK(adam == 2 * static_cast<int>(nodes));

  // The kept values are what topology discovery now reports, with source "measured".
  const auto topo = run_cli({"topo", "--json"}, env);
  REQUIRE(topo.exit_code == 0);
  const auto t = json::parse(topo.out);
  bool measured = false;
  for (const auto& a : t.at("access")) {
    if (a.at("read_bandwidth_mbps").at("source") == "measured") {
      measured = true;
      CHECK(a.at("read_bandwidth_mbps").at("value").get<double>() > 0);
      CHECK(a.at("read_latency_ns").at("source") == "measured");
    }
  }
  CHECK(measured);
  CHECK_THAT(t.at("sources").dump(), Catch::Contains("measured:" + cache.path().string()));

  // --no-cache keeps nothing; buffers inside the cache are measured but never kept.
  tierflow::test::scratch_dir other;
  const std::string other_env = "TIERFLOW_CACHE_DIR=" + other.path().string();
  const auto uncached = run_cli({"bench", "--case", "node_read", "--buffer-mib", "8", "--llc-mib",
                                 "1", "--samples", "1", "--no-cache", "--no-huge-pages", "--json"},
                                other_env);
  REQUIRE(uncached.exit_code == 0);
  const auto small_pages = json::parse(uncached.out);
  CHECK(small_pages.at("settings").at("huge_pages") == false);
  for (const auto& tc : small_pages.at("testcases")) {
    CHECK(tc.at("huge_page_fraction").get<double>() <= 0.0);  // refused: none, or unreadable
  }
  const auto small = run_cli(
      {"bench", "--case", "node_read", "--buffer-mib", "1", "--llc-mib", "1", "--samples", "1"},
      other_env);
  REQUIRE(small.exit_code == 0);
  CHECK_THAT(small.out, Catch::Contains("nothing cached"));
  CHECK(std::filesystem::is_empty(other.path()));
}

TEST_CASE(
    "bench link cases on the emulated device: labelled, capped by the link, and the chunk "
    "sweep rises with chunk size on a latency-bound link",
    "[cli][bench]") {
  const auto r = run_cli(
      {"bench", "--case",
       "h2d_pinned,d2h_pinned,h2d_pageable,bidir,h2d_pinned_chunks,d2h_pinned_chunks", "--device",
       "emulated", "--link-mib", "4", "--chunk-kib", "64,256,1024", "--samples", "2", "--json"},
      "TIERFLOW_EMU_LINK=h2d=4GB/s,d2h=4GB/s,latency=300us");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  CHECK(doc.at("machine").at("device").at("backend") == "emulated");
  std::map<std::pair<std::string, int>, std::map<std::uint64_t, double>> sweep;
  int plain = 0;
  for (const auto& tc : doc.at("testcases")) {
    check_measured(tc, 2);
    CHECK(tc.at("backend") == "emulated");
    CHECK_THAT(tc.at("note").get<std::string>(), Catch::StartsWith("emulated device"));
    const auto name = tc.at("name").get<std::string>();
    // The link model caps each direction at 4 GB/s plus 300 us per copy; a copy may start up
    // to 500 us in the past when the link was busy just before (the emulator's catch-up).
    const double seconds = (4u << 20) / 4e9 + 300e-6 - 500e-6;
    const double cap = (name == "bidir_pinned" ? 2 : 1) * (4u << 20) / seconds / 1e9;
    CHECK(tc.at("median").get<double>() <= cap * 1.02);
    CHECK(tc.at("pinned") == (name.find("pageable") == std::string::npos));
    if (tc.contains("chunk_bytes")) {
      sweep[{name, tc.at("initiator").get<int>()}][tc.at("chunk_bytes").get<std::uint64_t>()] =
          tc.at("median").get<double>();
    } else {
      ++plain;
      CHECK(tc.at("bytes") == (name == "bidir_pinned" ? 2u : 1u) * (4u << 20));
    }
  }
  CHECK(plain > 0);
  REQUIRE_FALSE(sweep.empty());
  for (const auto& [key, points] : sweep) {
    INFO(key.first << " from node " << key.second);
    REQUIRE(points.size() == 3);
    // 300 us per copy: 64 KiB chunks cannot reach a quarter of what 1 MiB chunks reach.
    // Under a sanitizer the emulator's memcpy is instrumented (~0.3 GB/s): the copies, not the
    // latency, dominate, and only the ends of the sweep are far enough apart to compare.
    if (tierflow::test::under_sanitizer) {
      CHECK(points.at(64u << 10) < points.at(1u << 20));
      continue;
    }
    double previous = 0;
    for (const auto& [chunk, gbps] : points) {
      CHECK(gbps > previous);
      previous = gbps;
    }
    CHECK(points.at(64u << 10) < points.at(1u << 20) / 4);
  }
}

TEST_CASE(
    "bench --from-json redraws a report: tables, CSV and an HTML page with the matrix, "
    "latency bars, the chunk sweep and HMAT ratios",
    "[cli][bench]") {
  auto gen = tierflow::test::rng(0xbe4c);
  std::uniform_real_distribution<double> gbps(5.0, 300.0);
  json tcs = json::array();
  std::map<std::pair<int, int>, double> matrix;
  for (int from = 0; from < 2; ++from) {
    for (int to = 0; to < 3; ++to) {
      for (int threads : {1, 8}) {
        const double v = gbps(gen);
        if (threads == 8) {
          matrix[{from, to}] = v;
        }
        json tc = {{"name", "node_read"}, {"group", "node_bandwidth"},
                   {"status", "ok"},      {"unit", "GB/s"},
                   {"median", v},         {"min", v * 0.9},
                   {"max", v * 1.1},      {"samples", 5},
                   {"bytes", 1u << 30},   {"threads", threads},
                   {"initiator", from},   {"target", to},
                   {"verified", true}};
        if (to == 2) {
          tc["hmat"] = 2 * v;
          tc["hmat_source"] = "hmat";
        }
        tcs.push_back(tc);
      }
      const double ns = 80.0 + 100.0 * to + gbps(gen);
      tcs.push_back({{"name", "node_latency"},
                     {"group", "node_latency"},
                     {"status", "ok"},
                     {"unit", "ns"},
                     {"median", ns},
                     {"min", ns},
                     {"max", ns},
                     {"samples", 5},
                     {"initiator", from},
                     {"target", to},
                     {"threads", 1},
                     {"verified", true}});
    }
  }
  for (const char* name : {"h2d_pinned_chunks", "d2h_pinned_chunks"}) {
    for (std::uint64_t chunk = 64u << 10; chunk <= 64u << 20; chunk *= 4) {
      const double v = gbps(gen) / 10;
      tcs.push_back({{"name", name},
                     {"group", "link_sweep"},
                     {"status", "ok"},
                     {"unit", "GB/s"},
                     {"median", v},
                     {"min", v},
                     {"max", v},
                     {"samples", 5},
                     {"initiator", 0},
                     {"chunk_bytes", chunk},
                     {"pinned", true},
                     {"verified", true}});
    }
  }
  tcs.push_back({{"name", "h2d_pageable"},
                 {"group", "link"},
                 {"status", "waived"},
                 {"reason", "no device: <no GPU> & no emulation"}});
  const json report = {{"tierflow_version", "0.1.0"},
                       {"date", "2026-12-04T00:00:00Z"},
                       {"machine",
                        {{"hostname", "cxl<box>"},
                         {"cpu_model", "Test CPU"},
                         {"cpus", 16},
                         {"llc_bytes", 32u << 20},
                         {"isa", "avx2"},
                         {"kernel", "6.1"}}},
                       {"settings", {{"samples", 5}, {"buffer_bytes", 128u << 20}}},
                       {"testcases", tcs}};
  tierflow::test::scratch_dir dir;
  const auto in = dir.path() / "report.json";
  const auto page = dir.path() / "report.html";
  tierflow::test::write_file(in, report.dump());

  const auto r = run_cli({"bench", "--from-json", in.string(), "--html", page.string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("from node 1"));
  CHECK_THAT(r.out, Catch::Contains("to node 2"));
  CHECK_THAT(r.out, Catch::Contains("WAIVED"));
  const auto html = tierflow::test::read_file(page);
  const auto count = [&](const std::string& what) { return occurrences(html, what); };
  CHECK_THAT(html, Catch::StartsWith("<!DOCTYPE html>"));
  CHECK(count("<svg") == count("</svg>"));
  CHECK(count("<svg") == 3);  // one matrix, the latency bars, the sweep
  CHECK(count("http") == 0);  // self-contained: nothing fetched
  // Each matrix cell holds the value at the most threads, to 4 significant digits.
  for (const auto& [key, v] : matrix) {
    char text[32];
    std::snprintf(text, sizeof text, ">%.4g</text>", v);
    CHECK_THAT(html, Catch::Contains(text));
  }
  CHECK(count("<polyline") == 2);
  CHECK(count("<circle") == 12);
  CHECK(count("measured / HMAT") == 1);
  CHECK_THAT(html, Catch::Contains("<td>0.5</td>"));  // measured / HMAT, target 2
  CHECK_THAT(html, Catch::Contains("cxl&lt;box&gt;"));
  CHECK_THAT(html, Catch::Contains("&lt;no GPU&gt; &amp; no emulation"));
  CHECK(html.find("<no GPU>") == std::string::npos);

  const auto csv = run_cli({"bench", "--from-json", in.string(), "--csv"});
  REQUIRE(csv.exit_code == 0);
  CHECK_THAT(csv.out, Catch::StartsWith("name,status,unit,median,min,max,samples,bytes,threads,"
                                        "initiator,target,pinned,chunk_bytes,backend,hmat,"
                                        "verified,reason\n"));
  CHECK(std::count(csv.out.begin(), csv.out.end(), '\n') == static_cast<long>(tcs.size()) + 1);

  // What the measuring run cached is not redone, and entries of other groups that share a
  // matrix case's name are not drawn into the matrix.
  auto odd = report;
  odd["cache"] = "/somewhere/measured.txt";
  odd["testcases"].push_back({{"name", "node_read"},
                              {"group", "link"},
                              {"status", "ok"},
                              {"unit", "GB/s"},
                              {"median", 1.0},
                              {"min", 1.0},
                              {"max", 1.0}});
  tierflow::test::write_file(in, odd.dump());
  const auto redrawn = run_cli({"bench", "--from-json", in.string()});
  INFO("stderr: " << redrawn.err);
  CHECK(redrawn.exit_code == 0);
  CHECK_THAT(redrawn.out, !Catch::Contains("cached in"));

  // A report that is not one: one line, exit 2, the file named.
  auto broken = report;
  broken["testcases"][3].erase("median");
  tierflow::test::write_file(in, broken.dump());
  check_one_line_error(run_cli({"bench", "--from-json", in.string()}),
                       "testcases[3] has no number \"median\"");
  broken = report;
  broken["testcases"].back()["verified"] = "yes";  // on the waived entry
  tierflow::test::write_file(in, broken.dump());
  check_one_line_error(run_cli({"bench", "--from-json", in.string()}), "not true or false");
  tierflow::test::write_file(in, "{\"tierflow_version\": ");
  check_one_line_error(run_cli({"bench", "--from-json", in.string()}), "not JSON");
}

TEST_CASE("bench: bad flags are one line and exit code 2", "[cli][bench]") {
  check_one_line_error(run_cli({"bench", "--case", "nope"}), "--case");
  check_one_line_error(run_cli({"bench", "--list", "--case", "node_x"}), "node_x");
  check_one_line_error(run_cli({"bench", "--samples", "0"}), "--samples");
  check_one_line_error(run_cli({"bench", "--json", "--csv", "--case", "node_read"}), "--csv");
  check_one_line_error(run_cli({"bench", "--link-mib", "4", "--chunk-kib", "8192"}), "--chunk-kib");
  check_one_line_error(run_cli({"bench", "--html", "/nonexistent/dir/x.html"}), "--html");
  check_one_line_error(run_cli({"bench", "--threads", "0"}), "--threads");
  // A bad device spec stops the run before the node cases (which would take a while here).
  check_one_line_error(run_cli({"bench", "--device", "gpu0", "--buffer-mib", "4096"}), "gpu0");
  check_one_line_error(run_cli({"bench", "--from-json", "/nonexistent.json"}), "/nonexistent.json");
}
