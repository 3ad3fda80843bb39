// `tierflow demo` as a user runs it: its files, the verify run, one-line errors.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "demo/link_probe.hpp"
#include "test_support.hpp"
#include "tierflow/device.hpp"

using nlohmann::json;
using namespace tierflow::test::cli;

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

TEST_CASE(
    "demo --overlap backward(_publish): the step starts in the backward pass, still bit "
    "for bit",
    "[cli][demo][overlap]") {
  tierflow::test::scratch_dir dir;
  auto gen = tierflow::test::rng(901);
  const std::string seed = std::to_string(gen() % 1000000);
  const auto demo = [&](const std::string& overlap) {
    return run_cli(
        {"demo",      "--layers", "3",         "--width",  "64",     "--batch", "16",
         "--samples", "64",       "--steps",   "40",       "--lr",   "3e-3",    "--window",
         "1",         "--seed",   seed,        "--verify", "--json", "--out",   dir.path().string(),
         "--device",  "emulated", "--overlap", overlap},
        "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
  };
  std::vector<double> losses;
  for (const std::string overlap : {"backward", "backward_publish"}) {
    const auto r = demo(overlap);
    INFO(overlap << ": stderr: " << r.err << "\nstdout: " << r.out);
    REQUIRE(r.exit_code == 0);
    const auto j = json::parse(r.out);
    CHECK(j["verify"]["bit_identical"] == true);
    CHECK(j["overlap"] == overlap);
    losses.push_back(j["loss_last"].get<double>());
    // Even steps announce their grads (20 of 40), odd steps are the plain baseline; no clip here.
    CHECK(j["speculative_steps"] == 20);
    CHECK(j["rollbacks"] == 0);
    const double exposed = j["exposed_seconds"].get<double>();
    const double plain = j["plain_step_seconds"].get<double>();
    CHECK(exposed > 0);
    CHECK(plain > 0);
    // A ratio of two noisy means on a shared machine: in range and consistent, not a speed claim.
    CHECK(j["exposed_fraction"].get<double>() > 0);
    CHECK(j["exposed_fraction"].get<double>() < 20);
    CHECK(j["exposed_fraction"].get<double>() == Approx(exposed / plain).epsilon(1e-9));
    CHECK(j["iteration_seconds"].get<double>() > exposed);
    CHECK(j["forward_backward_seconds"].get<double>() > 0);
  }

  const auto none = demo("none");
  INFO("stderr: " << none.err << "\nstdout: " << none.out);
  REQUIRE(none.exit_code == 0);
  const auto k = json::parse(none.out);
  CHECK(k["verify"]["bit_identical"] == true);
  CHECK(k["overlap"] == "none");
  CHECK(k["speculative_steps"] == 0);
  CHECK(k["exposed_fraction"].get<double>() == 1.0);
  // The same data, initial weights and steps: the same final loss, bit for bit.
  for (const double loss : losses) {
    CHECK(k["loss_last"].get<double>() == loss);
  }
}

TEST_CASE("demo: bad flags are one line and exit code 2", "[cli][demo]") {
  check_one_line_error(run_cli({"demo", "--adam-mode", "gpu", "--steps", "1", "--layers", "1",
                                "--width", "8", "--batch", "4", "--samples", "4"}),
                       "--adam-mode");
  check_one_line_error(run_cli({"demo", "--samples", "4", "--batch", "8"}), "--samples");
  check_one_line_error(run_cli({"demo", "--device", "cuda:7"}), "--device");
  check_one_line_error(run_cli({"demo", "--lr", "-1"}), "--lr");
  check_one_line_error(run_cli({"demo", "--state-dtype", "fp16"}), "--state-dtype");
  check_one_line_error(run_cli({"demo", "--state-dtype", "int8", "--adam-mode", "streamed"}),
                       "--state-dtype");
  check_one_line_error(run_cli({"demo", "--state-dtype", "int8", "--verify"}), "--state-dtype");
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
  // A folder the machine will not create: not bad input, the environment (exit 74).
  check_environment_error(demo({"--out", "/proc/tierflow-demo-out"}),
                          "--out: cannot create the folder '/proc/tierflow-demo-out'");
  check_one_line_error(demo({"--adam-chunk", "0"}), "--adam-chunk");
  check_one_line_error(demo({"--emu-link", "h2d=fast"}), "--emu-link");
  check_one_line_error(demo({"--layers", "0"}), "--layers");
  check_one_line_error(demo({"--overlap", "x"}), "--overlap");
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

TEST_CASE(
    "demo: a model beyond the machine and outputs that cannot be written are refused "
    "before any work",
    "[cli][demo][bad_input]") {
  // 10^6 layers x 65536^2 floats: far beyond any machine, refused before a weight is built.
  const auto huge = run_cli({"demo", "--layers", "1000000", "--width", "65536"});
  check_one_line_error(huge, "--layers: the model needs about ");
  CHECK_THAT(huge.err, Catch::Contains("of host memory; the machine has "));
  CHECK_THAT(huge.err, Catch::Contains("'1000000 layers x 65536'"));
  // An --out folder whose files cannot be created (/proc/self exists, takes no new files; /sys
  // refuses even root): the machine's refusal, exit 74, naming the file and the errno text.
  check_environment_error(run_cli({"demo", "--out", "/proc/self"}),
                          "--out: cannot write the file '/proc/self/metrics.json'");
  const auto sys = run_cli({"demo", "--out", "/sys"});
  check_environment_error(sys, "--out: cannot write the file '/sys/metrics.json'");
  CHECK_THAT(sys.err,
             Catch::Contains(std::strerror(EACCES)) || Catch::Contains(std::strerror(EROFS)));
}

TEST_CASE("demo: --lr below the smallest normal float, --hbm-budget 1e-300 and an empty --out",
          "[cli][demo][bad_input]") {
  const std::vector<std::string> small = {"--steps", "1",       "--layers", "1",         "--width",
                                          "64",      "--batch", "4",        "--samples", "4"};
  const auto demo = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"demo"};
    args.insert(args.end(), small.begin(), small.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  };
  // A subnormal rate is 0 in Adam's float arithmetic: the range says where it starts (it said
  // "from 0", which 1e-320 is in).
  for (const char* lr : {"1e-320", "1e-39", "0", "1e-400"}) {
    check_one_line_error(demo({"--lr", lr}),
                         "--lr: must be a finite number from 1.17549e-38 to "
                         "1e+06: '" +
                             std::string(lr) + "'");
  }
  // The value as given (it was echoed as 0.000000).
  const auto budget = demo({"--hbm-budget", "1e-300"});
  check_one_line_error(budget, "--hbm-budget: below one layer's weights (0.015625 MiB): '1e-300'");
  CHECK_THAT(budget.err, !Catch::Contains("0.000000"));
  // '' is no folder: bad input (exit 2), not the machine's refusal (74).
  check_one_line_error(demo({"--out", ""}), "--out: must not be empty");
}

TEST_CASE("demo: on the slowest link the config takes (1 MB/s) the link probe copies little",
          "[cli][demo]") {
  // As a user runs it: the probe copied 2 x 335 MiB at 1 MB/s (11 minutes); now about 2 MB.
  tierflow::test::scratch_dir dir;
  const auto r =
      run_cli({"demo", "--steps", "1", "--layers", "1", "--width", "8", "--batch", "4", "--samples",
               "4", "--device", "emulated", "--json", "--out", dir.path().string()},
              "TIERFLOW_EMU_LINK=h2d=1MB/s,d2h=1MB/s");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  const auto bytes = j["link"]["probe_bytes"].get<double>();
  CHECK(bytes > 0);
  CHECK(bytes <= 4.0 * 1048576);
  CHECK(j["link"]["h2d_benchmarked_gbps"].get<double>() > 0);

  // The plan itself: a fast link gets the full probe, a slow one a probe of about a second.
  namespace demo = tierflow::cli::demo;
  const auto full = demo::plan_probe(static_cast<double>(demo::probe_pilot_bytes) / 25e9);
  CHECK(full.small == 64 * 1024);
  CHECK(full.large == 8 * 1048576);
  CHECK(full.batches * full.per_batch == 40);
  CHECK(full.warm_up);
  const auto slowest = demo::plan_probe(static_cast<double>(demo::probe_pilot_bytes) / 1e6);
  CHECK(demo::plan_bytes(slowest) <= 1048576);
  CHECK(slowest.large >= 32 * slowest.small);
  const auto latency = demo::plan_probe(60.0);  // a 60 s latency: one copy of each size
  CHECK(latency.batches * latency.per_batch == 1);
  auto gen = tierflow::test::rng(0x349b);
  for (int i = 0; i < 200; ++i) {
    const double pilot = std::pow(10.0, std::uniform_real_distribution<double>(-7, 2)(gen));
    const auto p = demo::plan_probe(pilot);
    INFO("pilot " << pilot << " s");
    const double seconds = static_cast<double>(demo::plan_bytes(p)) * pilot /
                           static_cast<double>(demo::probe_pilot_bytes);
    CHECK(seconds <= 1.1 * std::max(1.0, 2.0 * pilot));
    CHECK(p.small >= 4096);
    CHECK(p.large > p.small);
  }
}

TEST_CASE("demo --state-dtype: compressed moments train and hold less state", "[cli][demo]") {
  tierflow::test::scratch_dir dir;
  auto gen = tierflow::test::rng(901);
  const std::string seed = std::to_string(gen() % 1000000);
  std::map<std::string, nlohmann::json> runs;
  for (const char* dtype : {"fp32", "int8"}) {
    const auto r = run_cli({"demo",     "--layers",  "2",
                            "--width",  "96",        "--batch",
                            "16",       "--samples", "64",
                            "--steps",  "60",        "--lr",
                            "3e-3",     "--seed",    seed,
                            "--json",   "--out",     (dir.path() / dtype).string(),
                            "--device", "emulated",  "--state-dtype",
                            dtype},
                           "TIERFLOW_EMU_LINK=h2d=20GB/s,d2h=20GB/s,latency=2us");
    INFO(dtype << " stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    runs[dtype] = nlohmann::json::parse(r.out);
    CHECK(runs[dtype]["state_dtype"] == dtype);
    CHECK(runs[dtype]["adam_mode"] == "cpu");
  }
  // The same data and seed: int8 moments learn as fp32 ones do, within their precision.
  const double fp32_last = runs["fp32"]["loss_last"].get<double>();
  const double int8_last = runs["int8"]["loss_last"].get<double>();
  CHECK(int8_last < runs["int8"]["loss_first"].get<double>() / 3);
  CHECK(std::fabs(int8_last - fp32_last) < 0.25 * fp32_last);
}
