// `tierflow plan` as a user runs it: the published configurations of examples/plan (the figures
// docs/cli/plan.md cites), the model's invariants on random specs, and bad input.

#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "cli_runner.hpp"
#include "plan/plan_model.hpp"
#include "plan/plan_spec.hpp"
#include "test_support.hpp"
#include "tierflow/error.hpp"

using nlohmann::json;
using namespace tierflow::test::cli;
namespace plan = tierflow::cli::plan;

namespace {

std::string example(const std::string& name) {
  return (tierflow::test::data_dir() / ".." / ".." / "examples" / "plan" / (name + ".plan.json"))
      .string();
}

json load_example(const std::string& name) {
  return json::parse(tierflow::test::read_file(example(name)));
}

// Runs `tierflow plan --json` on @p spec (written to a scratch file) with @p extra arguments.
json plan_json(const json& spec, const std::vector<std::string>& extra = {}) {
  tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "spec.plan.json";
  tierflow::test::write_file(path, spec.dump());
  std::vector<std::string> args = {"plan", "--json", "--spec", path.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run_cli(args);
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

run_result plan_run(const json& spec) {
  tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "spec.plan.json";
  tierflow::test::write_file(path, spec.dump());
  return run_cli({"plan", "--spec", path.string()});
}

// Model state of one rank (weights, grads, master, m, v) in HBM and host tiers together.
double model_state(const json& j) {
  double sum = 0;
  for (const char* where : {"hbm", "host"}) {
    for (const char* kind : {"weights", "grads", "master", "adam_m", "adam_v"}) {
      sum += j["memory"]["per_rank"][where][kind].get<double>();
    }
  }
  return sum;
}

}  // namespace

TEST_CASE("plan: ZeRO-Offload's 13B model fits one V100 32GB only with its state in host memory",
          "[cli][plan]") {
  json spec = load_example("zero_offload_13b_v100");
  const json j = plan_json(spec);
  CHECK(j["fits"] == true);
  const auto& hbm = j["memory"]["per_rank"]["hbm"];
  const auto& host = j["memory"]["per_rank"]["host"];
  CHECK(hbm["weights"].get<double>() == 26e9);  // 2 Ψ fp16 weights in HBM
  CHECK(host["grads"].get<double>() + host["master"].get<double>() + host["adam_m"].get<double>() +
            host["adam_v"].get<double>() ==
        14 * 13e9);  // 2 + 4 + 4 + 4 bytes per param
  CHECK(hbm["total"].get<double>() <= 32.0 * (1 << 30));
  CHECK(j["memory"]["spill"] == json::array({"dram"}));
  // The paper's 40 TFLOPS per V100 (its 10B run) is within the bound the plan allows.
  CHECK(j["step"]["mfu"].get<double>() * 125 >= 40);
  CHECK(j["step"]["bound_s"].get<double>() <= j["step"]["serial_s"].get<double>());

  // Without offload the 16 Ψ bytes stay in HBM: no fit, and the advice says what to offload.
  json no_offload = spec;
  no_offload["training"]["offload_optimizer"] = false;
  const json k = plan_json(no_offload);
  CHECK(k["fits"] == false);
  CHECK(model_state(k) == 16 * 13e9);
  CHECK_THAT(k["advice"][0].get<std::string>(), Catch::Contains("offload the optimizer"));
  // The paper's "over 13 billion" is about the largest: 20B's fp16 weights alone (40 GB)
  // exceed the 32 GiB.
  json bigger = spec;
  bigger["model"]["params"] = 20e9;
  CHECK(plan_json(bigger)["memory"]["hbm_fits"] == false);
}

TEST_CASE("plan: ZeRO's Table 1 bytes per GPU for 1T parameters on 1024 GPUs", "[cli][plan]") {
  json spec = load_example("zero_table1_1t_1024gpu");
  const std::pair<const char*, double> table[] = {
      {"none", 16000}, {"zero1", 4011.7}, {"zero2", 2013.7}, {"zero3", 15.6}, {"fsdp", 15.6}};
  for (const auto& [sharding, gb] : table) {
    spec["training"]["sharding"] = sharding;
    const json j = plan_json(spec);
    INFO(sharding);
    CHECK(j["ranks"] == 1024);
    CHECK(std::abs(model_state(j) / 1e9 - gb) < 0.05);
    CHECK(j["memory"]["hbm_fits"] == (gb < 32));
  }
}

TEST_CASE("plan: ZeRO-Infinity's 1T model on one DGX-2 spills from DRAM into NVMe", "[cli][plan]") {
  json spec = load_example("zero_infinity_1t_dgx2");
  const json j = plan_json(spec);
  CHECK(j["fits"] == true);
  CHECK(j["memory"]["spill"] == json::array({"dram", "nvme"}));
  CHECK(j["memory"]["tiers"][0]["used_bytes"] == j["memory"]["tiers"][0]["capacity_bytes"]);
  CHECK(model_state(j) * 16 == Approx(16e12));  // 16 Ψ bytes on the node
  // DRAM alone cannot hold 16 TB: the advice names the capacity to add.
  json dram_only = spec;
  dram_only["cluster"]["tiers"].erase(1);
  const json k = plan_json(dram_only);
  CHECK(k["fits"] == false);
  CHECK_THAT(k["advice"][0].get<std::string>(), Catch::Contains("of capacity per node"));
  // On 32 DGX-2 nodes (512 V100) each node's share fits DRAM, and the bound allows the paper's
  // 25 petaflops sustained on 512 GPUs.
  const json wide = plan_json(spec, {"--nodes", "32"});
  CHECK(wide["ranks"] == 512);
  CHECK(wide["memory"]["spill"] == json::array({"dram"}));
  // It falls between the bound (everything overlapped) and the serial sum (nothing overlapped).
  CHECK(wide["step"]["mfu"].get<double>() * 125 * 512 >= 25000);
  CHECK(6e12 * wide["step"]["tokens"].get<double>() / wide["step"]["serial_s"].get<double>() <
        25e15);
}

TEST_CASE("plan: the model's invariants on random specs", "[cli][plan]") {
  auto gen = tierflow::test::rng(2601);
  json spec = load_example("dgx_h100_cxl_1t");
  spec["training"].erase("tokens_per_step");
  const plan::sharding shardings[] = {plan::sharding::none, plan::sharding::zero1,
                                      plan::sharding::zero2, plan::sharding::zero3,
                                      plan::sharding::fsdp};
  std::uniform_real_distribution<double> unit(0.1, 1.0);
  for (int round = 0; round < 200; ++round) {
    plan::plan_spec s = plan::parse_plan_spec(spec.dump(), "spec");
    s.params = std::floor(1e9 + unit(gen) * 1e12);
    s.nodes = 1 + gen() % 64;
    s.host_link_gbps = 5 + unit(gen) * 60;
    s.tiers[0].read_gbps = 20 + unit(gen) * 400;
    s.tiers[1].capacity_bytes = unit(gen) * 1e13;
    s.shard = shardings[gen() % 5];
    s.offload_optimizer = gen() % 2 == 0;
    s.offload_params = gen() % 2 == 0;
    s.offload_activations = gen() % 2 == 0;
    s.micro_batch = 1 + gen() % 8;
    s.tokens_per_step = static_cast<double>(s.nodes * s.gpus_per_node * s.micro_batch * s.seq_len *
                                            (1 + gen() % 16));
    INFO("round " << round << ": params " << s.params << ", nodes " << s.nodes << ", sharding "
                  << plan::to_string(s.shard) << ", offload " << s.offload_optimizer
                  << s.offload_params << s.offload_activations);
    const plan::plan_result r = plan::size_plan(s);
    double slowest = 0;
    double serial = 0;
    for (const auto& st : r.stages) {
      slowest = std::max(slowest, st.time_s);
      serial += st.time_s;
      if (st.name != "compute") {
        CHECK(st.time_s == Approx(st.bytes / (st.rate * 1e9)));
      }
      if (st.name == r.bottleneck) {
        CHECK(st.time_s == r.step_bound_s);
      }
    }
    CHECK(r.step_bound_s == slowest);
    CHECK(r.step_serial_s == Approx(serial));
    CHECK(r.tokens_per_s == Approx(r.tokens_per_step / r.step_bound_s));
    CHECK(r.mfu <= 0.75 + 1e-12);  // 6 Ψ of the 8 Ψ with recompute
    CHECK(r.advice.size() == 1U + (r.hbm_fits ? 0U : 1U) + (r.host_fits ? 0U : 1U));
    // Under zero3 the N ranks hold the 16 Ψ bytes of model state between them, once.
    if (s.shard == plan::sharding::zero3) {
      const double state = r.hbm.weights + r.hbm.grads + r.hbm.master + r.hbm.adam_m +
                           r.hbm.adam_v + r.host.weights + r.host.grads + r.host.master +
                           r.host.adam_m + r.host.adam_v;
      CHECK(state * static_cast<double>(r.ranks) == Approx(16 * s.params));
    }
    // Twice the nodes never needs more HBM per rank, nor more host bytes per node.
    plan::plan_spec wider = s;
    wider.nodes *= 2;
    wider.tokens_per_step *= 2;
    const plan::plan_result w = plan::size_plan(wider);
    CHECK(w.hbm.total() <= r.hbm.total());
    CHECK(w.host.total() <= r.host.total());
  }
}

TEST_CASE("plan: the table names the bottleneck", "[cli][plan]") {
  const auto r = run_cli({"plan", "--spec", example("dgx_h100_cxl_1t")});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("<- bound"));
  CHECK_THAT(r.out, Catch::Contains("step bound"));
  CHECK_THAT(r.out, Catch::Contains("advice: "));
}

TEST_CASE("plan: bad specs are errors naming the field and the value", "[cli][plan]") {
  const json good = load_example("zero_offload_13b_v100");
  const auto refused = [&](const char* section, const char* key, const json& value,
                           const std::string& expected) {
    json s = good;
    s[section][key] = value;
    INFO(section << "." << key << " = " << value.dump());
    try {
      (void)plan::size_plan(plan::parse_plan_spec(s.dump(), "spec.json"));
      FAIL("accepted");
    } catch (const tierflow::input_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(expected));
    }
  };
  refused("model", "params", -13e9, "model.params: must be a whole number greater than 0");
  refused("model", "params", 0, "'0'");
  refused("model", "params", 2e15, "at most 1e+15");
  refused("model", "params", "nan", "model.params: must be a number: '\"nan\"'");
  refused("model", "layers", 2.5, "model.layers");
  refused("model", "param_dtype", "int4", "model.param_dtype: must be fp32, bf16, fp16 or fp8");
  refused("cluster", "hbm_gib", 0, "cluster.hbm_gib");
  refused("cluster", "gpu_tflops", -1, "cluster.gpu_tflops");
  refused("cluster", "nodes", 1e7, "cluster.nodes");
  refused("cluster", "tiers", json::array(), "cluster.tiers");
  refused("training", "sharding", "zero4", "training.sharding");
  refused("training", "micro_batch", true, "training.micro_batch: must be a number");
  refused("training", "tokens_per_step", 1000,
          "training.tokens_per_step: must be a positive multiple");
  refused("training", "offload", true, "unknown key \"offload\"");
  refused("training", "offload_params", "yes", "training.offload_params: must be true or false");
  json tier = good;
  tier["cluster"]["tiers"][0]["read_gbps"] = 0;
  CHECK_THROWS_WITH(plan::parse_plan_spec(tier.dump(), "f"),
                    Catch::Contains("cluster.tiers[0].read_gbps"));
  tier = good;
  tier["cluster"]["tiers"].push_back(good["cluster"]["tiers"][0]);
  CHECK_THROWS_WITH(plan::parse_plan_spec(tier.dump(), "f"), Catch::Contains("two tiers"));
  json huge =
      good;  // 10^6 nodes x 1024 GPUs x 4 x 10^8 tokens: more than 10^15 tokens per micro-step
  huge["cluster"]["nodes"] = 1e6;
  huge["cluster"]["gpus_per_node"] = 1024;
  huge["training"]["seq_len"] = 1e8;
  huge["training"].erase("tokens_per_step");
  CHECK_THROWS_WITH(plan::size_plan(plan::parse_plan_spec(huge.dump(), "f")),
                    Catch::Contains("training.micro_batch: ranks x micro_batch x seq_len"));
  json missing = good;
  missing["model"].erase("hidden");
  CHECK_THROWS_WITH(plan::parse_plan_spec(missing.dump(), "f"),
                    Catch::Contains("missing key \"hidden\""));
  // A number beyond double (inf once parsed) is refused by the reader.
  std::string text = good.dump();
  text.replace(text.find("13000000000.0"), 13, "1e999");
  CHECK_THROWS_WITH(plan::parse_plan_spec(text, "f"), Catch::Contains("out of range"));
  // As the user sees it: one line naming the file and the field, exit code 2, no table.
  json negative = good;
  negative["model"]["params"] = -1;
  check_one_line_error(plan_run(negative), "model.params");
  tierflow::test::scratch_dir dir;
  check_one_line_error(run_cli({"plan", "--spec", (dir.path() / "none.json").string()}),
                       "cannot read");
  // A FIFO or a folder is refused at once (never waited on), through the one file reader.
  const std::string fifo = (dir.path() / "spec.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  check_one_line_error(run_cli({"plan", "--spec", fifo}), "not a regular file");
  check_one_line_error(run_cli({"plan", "--spec", dir.path().string()}), "is a directory");
  check_one_line_error(run_cli({"plan", "--spec", example("dgx_h100_cxl_1t"), "--nodes", "0"}),
                       "--nodes");
}

TEST_CASE(
    "plan: rates below 1 MB/s, names with control characters and keys given twice are refused "
    "naming the file",
    "[cli][plan][bad_input]") {
  const json good = load_example("zero_offload_13b_v100");
  const auto refused = [](const std::string& text, const std::string& expected) {
    INFO(text);
    try {
      (void)plan::size_plan(plan::parse_plan_spec(text, "spec.json"));
      FAIL("accepted");
    } catch (const tierflow::input_error& e) {
      CHECK_THAT(e.what(), Catch::StartsWith("spec.json: " + expected));
    }
  };
  // Rates: 1e-300 GB/s made a 300-digit step time; 0.001 (1 MB/s) is the slowest taken.
  for (const char* key : {"gpu_tflops", "host_link_gbps", "network_gbps"}) {
    json s = good;
    s["cluster"][key] = 1e-300;
    refused(s.dump(), "cluster." + std::string(key) + ": must be a number from 0.001 to 1e+06");
  }
  json tier = good;
  tier["cluster"]["tiers"][0]["write_gbps"] = 9e-4;
  refused(tier.dump(), "cluster.tiers[0].write_gbps: must be a number from 0.001 to 1e+06");
  // At the slowest rates, the step's times stay a few characters long.
  json slow = good;
  for (const char* key : {"gpu_tflops", "host_link_gbps", "network_gbps"}) {
    slow["cluster"][key] = 0.001;
  }
  slow["cluster"]["tiers"][0]["read_gbps"] = 0.001;
  slow["cluster"]["tiers"][0]["write_gbps"] = 0.001;
  slow["model"]["params"] = 1e15;
  const auto table = plan_run(slow);
  INFO("stderr: " << table.err);
  REQUIRE(table.exit_code == 0);
  const auto at = table.out.find("step bound ");
  REQUIRE(at != std::string::npos);
  const auto end = table.out.find(" s (", at);
  REQUIRE(end != std::string::npos);
  CHECK(end - at - 11 <= 10);  // "1.234e+21", not 22 digits and a fraction
  for (std::size_t from = 0, nl = 0; (nl = table.out.find('\n', from)) != std::string::npos;
       from = nl + 1) {
    CHECK(nl - from < 160);
  }

  // Names are printed: a newline or an escape sequence in one is refused, naming the key.
  for (const char* name : {"dram\nstep bound 0.001 s", "\x1b[31mdram", "tab\tdram", "del\x7f"}) {
    json bad = good;
    bad["cluster"]["tiers"][0]["name"] = name;
    refused(bad.dump(), "cluster.tiers[0].name: must be printable");
    bad = good;
    bad["name"] = name;
    refused(bad.dump(), "name: must be printable");
  }
  json utf8 = good;
  utf8["cluster"]["tiers"][0]["name"] = "m\u00e9moire";  // not a control character
  CHECK_NOTHROW(plan::parse_plan_spec(utf8.dump(), "spec.json"));

  // A key given twice is refused (the parser kept the last), naming the object and the key.
  std::string text = good.dump();
  text.insert(text.find("\"model\":{") + 9, "\"layers\":3,");
  refused(text, "model: key \"layers\" given twice");
  text = good.dump();
  text.insert(1, "\"tierflow_plan_spec\":1,");
  refused(text, "key \"tierflow_plan_spec\" given twice");
  json two = good;
  two["cluster"]["tiers"].push_back(good["cluster"]["tiers"][0]);
  two["cluster"]["tiers"][1]["name"] = "cxl";
  text = two.dump();
  const auto second = text.find("\"read_gbps\":", text.find("\"read_gbps\":") + 1);
  REQUIRE(second != std::string::npos);
  text.insert(second, "\"read_gbps\":5,");
  refused(text, "cluster.tiers[1]: key \"read_gbps\" given twice");
  // The same key in two objects is no duplicate.
  CHECK_NOTHROW(plan::parse_plan_spec(two.dump(), "spec.json"));

  // The model's own refusals name the file too (they named only the field).
  json huge = good;
  huge["cluster"]["nodes"] = 1e6;
  huge["cluster"]["gpus_per_node"] = 1024;
  huge["training"]["seq_len"] = 1e8;
  huge["training"].erase("tokens_per_step");
  refused(huge.dump(), "training.micro_batch: ranks x micro_batch x seq_len");
  json uneven = good;
  uneven["training"]["tokens_per_step"] = 1000;
  refused(uneven.dump(), "training.tokens_per_step: must be a positive multiple");
  const auto r = plan_run(huge);
  check_one_line_error(r, "spec.plan.json: training.micro_batch: ");
}

TEST_CASE("plan --machine: a node's tiers come from a real machine's topo report", "[cli][plan]") {
  // The report of a two-socket machine with CXL (firmware values for some tiers), completed as
  // `tierflow bench` would complete it: random measured bandwidths where the firmware had none.
  const auto topo = run_cli({"topo", "--json", "--sysfs-root",
                             (tierflow::test::sysfs_fixture("two_socket_cxl")).string()});
  REQUIRE(topo.exit_code == 0);
  json report = json::parse(topo.out);
  tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "machine.json";
  tierflow::test::write_file(path, report.dump());
  const json spec = load_example("dgx_h100_cxl_1t");
  {  // tiers without a bandwidth: refused, saying how to get one
    tierflow::test::write_file(dir.path() / "spec.json", spec.dump());
    const auto r = run_cli(
        {"plan", "--spec", (dir.path() / "spec.json").string(), "--machine", path.string()});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(path.string()));
    CHECK_THAT(r.err, Catch::Contains("remote_dram0"));
    CHECK_THAT(r.err, Catch::Contains("tierflow bench"));
  }
  auto gen = tierflow::test::rng(0x91a7);
  std::uniform_real_distribution<double> mbps(5000, 400000);
  for (auto& t : report["tiers"]) {
    for (const char* key : {"read_bandwidth_mbps", "write_bandwidth_mbps"}) {
      if (t["perf"][key]["value"].is_null()) {
        t["perf"][key] = {{"value", mbps(gen)}, {"source", "measured"}};
      }
    }
  }
  tierflow::test::write_file(path, report.dump());
  // The spec's 4 Mi tokens a step are 128 micro-steps of 8 GPUs x 4096 tokens: a power of two
  // of nodes keeps them whole.
  const auto nodes = 1 << std::uniform_int_distribution<int>(0, 7)(gen);
  const json j = plan_json(spec, {"--machine", path.string(), "--nodes", std::to_string(nodes)});
  CHECK(j["machine"] == path.string());
  CHECK(j["nodes"] == nodes);
  REQUIRE(j["memory"]["tiers"].size() == report["tiers"].size());  // no GPU in the report
  for (std::size_t i = 0; i < report["tiers"].size(); ++i) {
    CHECK(j["memory"]["tiers"][i]["name"] == report["tiers"][i]["name"]);
    CHECK(j["memory"]["tiers"][i]["capacity_bytes"].get<double>() ==
          report["tiers"][i]["capacity_bytes"].get<double>());
  }
  // Each tier's stage runs at most at the report's bandwidth (MB/s / 1000 = GB/s).
  for (const auto& st : j["step"]["stages"]) {
    const std::string name = st["name"];
    if (name.rfind("tier:", 0) != 0 || st["bytes"].get<double>() <= 0) {
      continue;
    }
    for (const auto& t : report["tiers"]) {
      if ("tier:" + t["name"].get<std::string>() == name) {
        const double read = t["perf"]["read_bandwidth_mbps"]["value"].get<double>() / 1000;
        const double write = t["perf"]["write_bandwidth_mbps"]["value"].get<double>() / 1000;
        CHECK(st["rate"].get<double>() <= std::max(read, write) * (1 + 1e-9));
      }
    }
  }
  {  // not a topo report
    tierflow::test::write_file(path, R"({"tiers": "dram"})");
    const auto r = run_cli(
        {"plan", "--spec", (dir.path() / "spec.json").string(), "--machine", path.string()});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("tiers: not an array"));
  }
}

namespace {

// One Adam moment per param (m or v) of each state dtype: int8 codes carry a 4-byte scale per
// block of 256.
double moment_bytes(const std::string& dtype) {
  return dtype == "fp32" ? 4.0 : dtype == "bf16" ? 2.0 : 1.0 + 4.0 / 256.0;
}

}  // namespace

TEST_CASE("plan: optimizer state dtypes: bytes per param, the step's bytes, the larger model",
          "[cli][plan]") {
  // The issue's figures: bf16 weights and grads, both offloaded (where a remainder applies).
  json spec = load_example("dgx_h100_cxl_1t");
  spec["training"]["offload_params"] = true;
  const std::tuple<const char*, const char*, double, double> figures[] = {
      {"fp32", "fp32", 12, 28},           {"bf16", "fp32", 8, 20},
      {"int8", "fp32", 6.03125, 16.0625}, {"fp32", "remainder", 10, 26},
      {"bf16", "remainder", 6, 18},       {"int8", "remainder", 4.03125, 14.0625}};
  for (const auto& [dtype, master, state, step] : figures) {
    json s = spec;
    s["optimizer"] = {{"state_dtype", dtype}, {"master", master}};
    const json o = plan_json(s)["optimizer"];
    INFO(dtype << " + " << master << " master");
    CHECK(o["state_dtype"] == dtype);
    CHECK(o["master"] == master);
    CHECK(o["state_bytes_per_param"].get<double>() == state);
    CHECK(o["step_bytes_per_param"].get<double>() == step);
    CHECK(o["options"].size() == 6);
  }

  auto gen = tierflow::test::rng(3701);
  std::uniform_real_distribution<double> unit(0.1, 1.0);
  const json base = load_example("dgx_h100_cxl_1t");
  const char* param_dtypes[] = {"bf16", "fp16", "fp32"};
  const char* shardings[] = {"none", "zero1", "zero2", "zero3", "fsdp"};
  for (int round = 0; round < 16; ++round) {
    spec = base;
    spec["training"].erase("tokens_per_step");
    const double psi = std::floor(1e9 + unit(gen) * 1e12);
    spec["model"]["params"] = psi;
    const std::string param_dtype = param_dtypes[gen() % 3];
    spec["model"]["param_dtype"] = param_dtype;
    const auto nodes = 1 + gen() % 32;
    spec["cluster"]["nodes"] = nodes;
    spec["cluster"]["tiers"][1]["capacity_gib"] = 64 + unit(gen) * 4096;
    const std::string sharding = shardings[gen() % 5];
    spec["training"]["sharding"] = sharding;
    const bool offload_optimizer = gen() % 4 != 0;
    const bool offload_params = gen() % 2 == 0;
    spec["training"]["offload_optimizer"] = offload_optimizer;
    spec["training"]["offload_params"] = offload_params;
    spec["training"]["offload_activations"] = gen() % 2 == 0;
    INFO("round " << round << ": params " << psi << ", " << param_dtype << ", nodes " << nodes
                  << ", " << sharding << ", offload optimizer " << offload_optimizer << ", params "
                  << offload_params);

    // fp32 is the default: the key, or the flag, saying so changes nothing.
    const json fp32 = plan_json(spec);
    json explicit_fp32 = spec;
    explicit_fp32["optimizer"] = {{"state_dtype", "fp32"}, {"master", "fp32"}};
    CHECK(plan_json(explicit_fp32) == fp32);
    CHECK(plan_json(spec, {"--state-dtype", "fp32"}) == fp32);

    const double ranks = static_cast<double>(nodes * 8);
    const double b_p = param_dtype == "fp32" ? 4.0 : 2.0;
    const double b_g = 2.0;
    const bool gathers = sharding == "zero3" || sharding == "fsdp";
    const double psi_o = sharding == "none" ? psi : psi / ranks;  // optimizer shard
    const double psi_w = gathers ? psi / ranks : psi;             // weights per rank
    const bool remainder_applies = param_dtype == "bf16" && offload_optimizer && offload_params;
    // Host bytes per param of Ψ per rank (what grows with the model; the checkpoints do not).
    const auto host_per_param = [&](double state) {
      return ((offload_params ? psi_w * b_p : 0.0) + psi_o * (b_g + state)) / psi;
    };
    const double fp32_state = (b_p < 4 ? 4.0 : 0.0) + 8.0;
    for (const std::string dtype : {"fp32", "bf16", "int8"}) {
      for (const std::string master : {"fp32", "remainder"}) {
        if (master == "remainder" && !remainder_applies) {
          continue;
        }
        json s = spec;
        json j;
        if (gen() % 2 == 0) {
          s["optimizer"] = {{"state_dtype", dtype}, {"master", master}};
          j = plan_json(s);
        } else {
          s["optimizer"] = {{"master", master}};
          j = plan_json(s, {"--state-dtype", dtype});
        }
        INFO(dtype << " + " << master << " master");
        const json& o = j["optimizer"];
        for (const char* key : {"state_dtype", "master", "state_bytes_per_param",
                                "step_bytes_per_param", "max_params_hbm", "max_params_host",
                                "max_params", "vs_fp32", "state_in", "options"}) {
          CHECK(o.contains(key));
        }
        CHECK(o["state_dtype"] == dtype);
        CHECK(o["state_in"] == (offload_optimizer ? "host" : "hbm"));
        CHECK(o["options"].size() == (remainder_applies ? 6U : 3U));
        CHECK(o["options"][0]["state_dtype"] == "fp32");
        CHECK(o["options"][0]["master"] == "fp32");
        const double master_bytes = master == "remainder" ? 2.0 : b_p < 4 ? 4.0 : 0.0;
        const double state = master_bytes + 2.0 * moment_bytes(dtype);
        CHECK(o["state_bytes_per_param"].get<double>() == Approx(state));
        CHECK(o["step_bytes_per_param"].get<double>() ==
              Approx(2.0 * state + b_g + b_p + (master == "remainder" ? b_p : 0.0)));
        const json& held = j["memory"]["per_rank"][offload_optimizer ? "host" : "hbm"];
        CHECK(held["adam_m"].get<double>() == Approx(psi_o * moment_bytes(dtype)));
        CHECK(held["adam_v"].get<double>() == Approx(psi_o * moment_bytes(dtype)));
        CHECK(held["master"].get<double>() == Approx(psi_o * master_bytes));
        // Everything else is the fp32 run's.
        CHECK(held["weights"] ==
              fp32["memory"]["per_rank"][offload_optimizer ? "host" : "hbm"]["weights"]);
        CHECK(j["memory"]["per_rank"]["hbm"]["activations"] ==
              fp32["memory"]["per_rank"]["hbm"]["activations"]);
        if (!offload_optimizer || o["max_params_host"].is_null() ||
            o["options"][0]["max_params_host"].get<double>() <= 0) {
          continue;
        }
        // The host tiers hold a·Ψ + c per node: the ratio of the largest Ψ is that of a.
        CHECK(o["vs_fp32"].get<double>() ==
              Approx(host_per_param(fp32_state) / host_per_param(state)));
        // The largest model is the bound: just under it the host fits, just over it, not.
        const double most = o["max_params_host"].get<double>();
        if (most >= 2e9 && most <= 1e15) {
          json at = s;
          at["model"]["params"] = std::floor(most * 0.999);
          const json under = plan_json(at, {"--state-dtype", dtype});
          CHECK(under["memory"]["host_fits"] == true);
          at["model"]["params"] = std::floor(most * 1.001);
          if (most * 1.001 <= 1e15) {
            CHECK(plan_json(at, {"--state-dtype", dtype})["memory"]["host_fits"] == false);
          }
        }
      }
    }
  }
}

TEST_CASE("plan: the table shows the state dtype, its bytes and how much more the tiers hold",
          "[cli][plan]") {
  const auto r = run_cli({"plan", "--spec", example("dgx_h100_cxl_1t"), "--state-dtype", "int8"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("Optimizer state per param"));
  CHECK_THAT(r.out, Catch::Contains("int8 state: 6.03 B/param; the host tiers hold "));
  CHECK_THAT(r.out, Catch::Contains("x the params of fp32 state ("));
  CHECK_THAT(r.out, Catch::Contains("<- spec"));
  const auto fp32 = run_cli({"plan", "--spec", example("dgx_h100_cxl_1t")});
  CHECK_THAT(fp32.out, Catch::Contains("fp32 state: 12 B/param; the host tiers hold 1.00x"));
}

TEST_CASE("plan: bad optimizer state dtypes and masters are refused naming the key",
          "[cli][plan][bad_input]") {
  json good = load_example("dgx_h100_cxl_1t");
  good["training"]["offload_params"] = true;
  const auto refused = [](const json& s, const std::string& expected) {
    INFO(s["optimizer"].dump() << " " << s["model"].dump());
    try {
      (void)plan::parse_plan_spec(s.dump(), "spec.json");
      FAIL("accepted");
    } catch (const tierflow::input_error& e) {
      CHECK_THAT(e.what(), Catch::StartsWith("spec.json: " + expected));
    }
  };
  json s = good;
  for (const json& value : {json("int4"), json("f32"), json(8), json(nullptr)}) {
    s["optimizer"] = {{"state_dtype", value}};
    refused(s, "optimizer.state_dtype: must be fp32, bf16 or int8");
  }
  s["optimizer"] = {{"master", "bf16"}};
  refused(s, "optimizer.master: must be fp32 or remainder");
  s["optimizer"] = {{"moments", "int8"}};
  refused(s, "optimizer: unknown key \"moments\"");
  s["optimizer"] = "int8";
  refused(s, "optimizer: must be an object");
  // A remainder is the low half of a master whose high half is a bf16 weight in a host tier.
  s = good;
  s["optimizer"] = {{"master", "remainder"}};
  CHECK_NOTHROW(plan::parse_plan_spec(s.dump(), "spec.json"));
  for (const char* dtype : {"fp16", "fp32"}) {
    json t = s;
    t["model"]["param_dtype"] = dtype;
    refused(t,
            "optimizer.master: remainder keeps the fp32 master's low 16 bits beside a bf16 "
            "weight");
    CHECK_THROWS_WITH(plan::parse_plan_spec(t.dump(), "spec.json"),
                      Catch::Contains(std::string("model.param_dtype is ") + dtype));
  }
  for (const char* flag : {"offload_params", "offload_optimizer"}) {
    json t = s;
    t["training"][flag] = false;
    refused(t, "optimizer.master: remainder needs the bf16 weights in the host tiers");
  }
  // Compressed state is of fp32 state: not where model.state_dtype is narrower.
  s = good;
  s["model"]["state_dtype"] = "bf16";
  s["optimizer"] = {{"state_dtype", "int8"}};
  refused(s,
          "optimizer.state_dtype: compresses fp32 Adam state, and model.state_dtype is not "
          "fp32");
  s["optimizer"] = {{"state_dtype", "fp32"}};
  CHECK_NOTHROW(plan::parse_plan_spec(s.dump(), "spec.json"));
  plan::plan_spec narrow = plan::parse_plan_spec(s.dump(), "spec.json");
  CHECK_THROWS_WITH(plan::set_state_dtype(narrow, "bf16"),
                    Catch::StartsWith("spec.json: --state-dtype: compresses fp32 Adam state"));
  CHECK_THROWS_WITH(plan::set_state_dtype(narrow, "int4"),
                    Catch::StartsWith("spec.json: --state-dtype: must be fp32, bf16 or int8"));
  // As the user sees it: one line naming the flag or the key, exit code 2.
  check_one_line_error(
      run_cli({"plan", "--spec", example("dgx_h100_cxl_1t"), "--state-dtype", "int4"}),
      "--state-dtype");
  tierflow::test::scratch_dir dir;
  const auto path = (dir.path() / "narrow.plan.json").string();
  tierflow::test::write_file(path, s.dump());
  check_one_line_error(run_cli({"plan", "--spec", path, "--state-dtype", "int8"}),
                       "narrow.plan.json: --state-dtype: compresses fp32 Adam state");
  s["optimizer"] = {{"state_dtype", "int4"}};
  check_one_line_error(plan_run(s), "optimizer.state_dtype: must be fp32, bf16 or int8");
}
