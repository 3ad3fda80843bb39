// The workload files of `tierflow tune --plan` (tools/tierflow/tune/tune_plan.cpp): random valid
// plans parse to what they say; each kind of bad plan is rejected with one line naming the problem.

#include <set>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tune/tune_plan.hpp"

using nlohmann::json;
using tierflow::cli::parse_tune_plan;

namespace {

// A random name of 1..12 characters, printable ASCII and some UTF-8.
std::string random_name(std::mt19937_64& gen) {
  static const std::string alphabet =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/ :";
  std::string name;
  const auto length = 1 + gen() % 12;
  for (std::size_t i = 0; i < length; ++i) {
    name += gen() % 16 == 0 ? std::string("\xce\xbb")
                            : std::string(1, alphabet[gen() % alphabet.size()]);
  }
  return name;
}

json random_plan(std::mt19937_64& gen) {
  json plan{{"tierflow_plan", 1}, {"buffers", json::array()}, {"steps", json::array()}};
  std::set<std::string> names;
  const auto buffers = 1 + gen() % 20;
  while (names.size() < buffers) {
    const auto name = random_name(gen);
    if (!names.insert(name).second) {
      continue;
    }
    json b{{"name", name}, {"bytes", 1 + gen() % (std::uint64_t{1} << 35)}};
    if (gen() % 2 == 0) {
      b["resident"] = gen() % 3 == 0;
    }
    plan["buffers"].push_back(b);
  }
  std::set<std::string> step_names;
  const auto steps = 1 + gen() % 30;
  while (step_names.size() < steps) {
    const auto name = random_name(gen);
    if (!step_names.insert(name).second) {
      continue;
    }
    json s{{"name", name}, {"compute_ms", static_cast<double>(gen() % 100000) / 1000.0}};
    std::vector<json> order(plan["buffers"].begin(), plan["buffers"].end());
    std::shuffle(order.begin(), order.end(), gen);
    const auto used = gen() % (order.size() + 1);
    for (std::size_t i = 0; i < used; ++i) {
      s[gen() % 2 == 0 ? "reads" : "writes"].push_back(order[i]["name"]);
    }
    plan["steps"].push_back(s);
  }
  return plan;
}

void check_rejected(const std::string& text, const std::string& expected) {
  INFO("plan: " << text);
  try {
    (void)parse_tune_plan(text, "plan.json");
    FAIL("accepted");
  } catch (const tierflow::input_error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::StartsWith("plan.json: "));
    CHECK_THAT(what, Catch::Contains(expected));
    CHECK(what.find('\n') == std::string::npos);
  }
}

}  // namespace

TEST_CASE("tune plan: random valid plans parse to what they say", "[tune][plan]") {
  auto gen = tierflow::test::rng(0x7a9e);
  for (int round = 0; round < 200; ++round) {
    const json doc = random_plan(gen);
    INFO("plan: " << doc.dump());
    const auto parsed = parse_tune_plan(doc.dump(), "plan.json");
    REQUIRE(parsed.plan.buffers.size() == doc["buffers"].size());
    REQUIRE(parsed.plan.steps.size() == doc["steps"].size());
    REQUIRE(parsed.compute_s.size() == doc["steps"].size());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < parsed.plan.buffers.size(); ++i) {
      const auto& b = parsed.plan.buffers[i];
      CHECK(b.name == doc["buffers"][i]["name"]);
      CHECK(b.bytes == doc["buffers"][i]["bytes"]);
      CHECK(b.resident == doc["buffers"][i].value("resident", false));
      CHECK(b.data == nullptr);
      total += b.bytes;
    }
    CHECK(parsed.total_bytes == total);
    for (std::size_t i = 0; i < parsed.plan.steps.size(); ++i) {
      const auto& s = parsed.plan.steps[i];
      const auto& d = doc["steps"][i];
      CHECK(s.name == d["name"]);
      CHECK(parsed.compute_s[i] == Approx(d["compute_ms"].get<double>() / 1e3));
      for (const char* key : {"reads", "writes"}) {
        const auto& ids = key[0] == 'r' ? s.reads : s.writes;
        REQUIRE(ids.size() == d.value(key, json::array()).size());
        for (std::size_t k = 0; k < ids.size(); ++k) {
          CHECK(parsed.plan.buffers[ids[k]].name == d[key][k]);
        }
      }
    }
  }
}

TEST_CASE("tune plan: each kind of bad plan is one line naming the problem", "[tune][plan]") {
  const json good = json::parse(
      R"({"tierflow_plan":1,"buffers":[{"name":"w0","bytes":1048576,"resident":false},
          {"name":"g0","bytes":4096}],
          "steps":[{"name":"fwd0","reads":["w0"],"writes":[],"compute_ms":1.5},
                   {"name":"bwd0","reads":["w0"],"writes":["g0"],"compute_ms":2}]})");
  REQUIRE(parse_tune_plan(good.dump(), "plan.json").plan.steps.size() == 2);
  const auto with = [&](const json::json_pointer& at, const json& value) {
    json doc = good;
    doc[at] = value;
    return doc.dump();
  };
  const auto without = [&](const json::json_pointer& at) {
    json doc = good;
    doc[at.parent_pointer()].erase(at.back());
    return doc.dump();
  };
  using ptr = json::json_pointer;
  check_rejected("{\"tierflow_plan\":1,", "not valid JSON");
  check_rejected("[1,2]", "a plan is a JSON object");
  check_rejected(with(ptr("/tierflow_plan"), 2), "tierflow_plan: unsupported version");
  check_rejected(with(ptr("/tierflow_plan"), "1"), "tierflow_plan: unsupported version");
  check_rejected(without(ptr("/tierflow_plan")), "missing key \"tierflow_plan\"");
  check_rejected(with(ptr("/layers"), 3), "unknown key \"layers\"");
  check_rejected(with(ptr("/buffers"), json::array()), "buffers: must be a non-empty array");
  check_rejected(with(ptr("/steps"), json::array()), "steps: must be a non-empty array");
  check_rejected(with(ptr("/steps"), json::object()), "steps: must be a non-empty array");
  check_rejected(without(ptr("/buffers/1/bytes")), "buffers[1]: missing key \"bytes\"");
  check_rejected(without(ptr("/buffers/0/name")), "buffers[0]: missing key \"name\"");
  check_rejected(with(ptr("/buffers/0/name"), ""), "buffers[0].name: must be a non-empty");
  check_rejected(with(ptr("/buffers/0/name"), 7), "buffers[0].name: must be a non-empty");
  check_rejected(with(ptr("/buffers/1/name"), "w0"), "two buffers are named \"w0\"");
  check_rejected(with(ptr("/buffers/1/bytes"), 0), "buffers[1].bytes: must be an integer");
  check_rejected(with(ptr("/buffers/1/bytes"), -5), "buffers[1].bytes: must be an integer");
  check_rejected(with(ptr("/buffers/1/bytes"), 1.5), "buffers[1].bytes: must be an integer");
  check_rejected(with(ptr("/buffers/1/bytes"), (std::uint64_t{64} << 30) + 1), "64 GiB");
  check_rejected(with(ptr("/buffers/1/bytes"), ~std::uint64_t{0}), "64 GiB");
  check_rejected(with(ptr("/buffers/1/resident"), "yes"), "buffers[1].resident");
  check_rejected(with(ptr("/buffers/1/pinned"), true), "unknown key \"pinned\"");
  check_rejected(without(ptr("/steps/0/name")), "steps[0]: missing key \"name\"");
  check_rejected(with(ptr("/steps/1/name"), "fwd0"), "two steps are named \"fwd0\"");
  check_rejected(with(ptr("/steps/0/reads"), "w0"), "steps[0].reads: must be an array");
  check_rejected(with(ptr("/steps/0/reads/0"), 0), "steps[0].reads: must be an array");
  check_rejected(with(ptr("/steps/1/writes/0"), "w9"), "steps[1].writes: unknown buffer \"w9\"");
  check_rejected(with(ptr("/steps/1/writes/0"), "w0"), "names buffer \"w0\" twice");
  check_rejected(without(ptr("/steps/1/compute_ms")), "steps[1]: missing key \"compute_ms\"");
  check_rejected(with(ptr("/steps/1/compute_ms"), -0.5), "steps[1].compute_ms: must be a finite");
  check_rejected(with(ptr("/steps/1/compute_ms"), "2"), "steps[1].compute_ms: must be a finite");
  check_rejected(with(ptr("/steps/1/compute_ms"), 6e4 + 1), "from 0 to 60000");
  check_rejected(R"({"tierflow_plan":1,"buffers":[{"name":"w","bytes":1}],
                     "steps":[{"name":"s","compute_ms":1e999}]})",
                 "a number out of range");
  // More than 1 TiB in all: 17 buffers of 64 GiB.
  json big = good;
  big["buffers"] = json::array();
  for (int i = 0; i < 17; ++i) {
    big["buffers"].push_back(
        {{"name", "b" + std::to_string(i)}, {"bytes", std::uint64_t{64} << 30}});
  }
  big["steps"] = json::array({{{"name", "s"}, {"compute_ms", 1}}});
  check_rejected(big.dump(), "more than 1 TiB in all");
}
