// The metrics leaf: counters, the JSON writer, Prometheus exposition and the trace format.

#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/exporters.hpp"
#include "tierflow/metrics.hpp"

using namespace tierflow;
using namespace tierflow::metrics;

TEST_CASE("usage counters track current, peak and total", "[metrics]") {
  usage_counter c;
  c.add(10);
  c.add(5);
  c.sub(12);
  c.add(4);
  const auto u = c.read();
  CHECK(u.current == 7);
  CHECK(u.peak == 15);
  CHECK(u.total == 19);

  usage_counter shared;
  auto work = [&] {
    for (int i = 0; i < 10000; ++i) {
      shared.add(3);
      shared.sub(3);
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  CHECK(shared.read().current == 0);
  CHECK(shared.read().total == 60000);
  CHECK(shared.read().peak >= 3);
  CHECK(shared.read().peak <= 6);
}

TEST_CASE("link counters give achieved bandwidth", "[metrics]") {
  link_counter link;
  CHECK(link.read().achieved_gbps() == 0.0);
  link.add(2'000'000'000, 0.5);
  link.add(1'000'000'000, 0.5);
  CHECK(link.read().bytes == 3'000'000'000ULL);
  CHECK(link.read().transfers == 2);
  CHECK(link.read().achieved_gbps() == Approx(3.0));
}

TEST_CASE("the JSON writer writes what a parser reads back", "[metrics]") {
  auto gen = test::rng(600);
  std::string tricky = "quote\" backslash\\ newline\n tab\t bell\x07 ";
  for (int i = 0; i < 20; ++i) {
    tricky += static_cast<char>(std::uniform_int_distribution<int>(1, 126)(gen));
  }
  const double number = std::uniform_real_distribution<double>(-1e9, 1e9)(gen);
  const auto big = gen();
  json_writer w;
  w.begin_object();
  w.key("text").value(tricky).key("number").value(number).key("big").value(big);
  w.key("list").begin_array().value(1).value(true).null().begin_object().end_object().end_array();
  w.key("nan").value(std::nan(""));
  w.end_object();
  const auto doc = nlohmann::json::parse(w.str());
  CHECK(doc.at("text") == tricky);
  CHECK(doc.at("number").get<double>() == number);
  CHECK(doc.at("big").get<std::uint64_t>() == big);
  CHECK(doc.at("list").size() == 4);
  CHECK(doc.at("nan").is_null());

  json_writer bad;
  bad.begin_object();
  CHECK_THROWS_AS(bad.value(1), error);  // a value where a key is due
  CHECK_THROWS_AS(bad.str(), error);     // unclosed
  json_writer bad2;
  CHECK_THROWS_AS(bad2.end_array(), error);
}

TEST_CASE("Prometheus exposition follows the text format", "[metrics][prometheus]") {
  auto gen = test::rng(601);
  prometheus_writer p;
  std::map<std::string, double> expected;
  for (int i = 0; i < 10; ++i) {
    const double v = std::uniform_real_distribution<double>(0, 1e12)(gen);
    const std::string tier = "tier\"" + std::to_string(i) + "\\\n";
    p.gauge("tier_held_bytes", "Bytes held in a tier", v, {{"tier", tier}, {"kind", "dram"}});
    expected[tier] = v;
  }
  p.counter("link_bytes_total", "Bytes moved over a link\nper direction", 12345, {{"link", "h2d"}});
  p.gauge("overlap_efficiency", "Lower bound over achieved step time", 0.97);
  const auto text = p.str();

  CHECK(test::prometheus_format_problems(text).empty());
  CHECK(test::prometheus_format_problems(text + "tierflow_untyped 1\n").size() == 1);
  CHECK(test::prometheus_format_problems(text + "# TYPE tierflow_x_bytes count\n").size() == 1);
  std::istringstream lines(text);
  std::string line;
  int helps = 0, types = 0, samples = 0;
  while (std::getline(lines, line)) {
    helps += line.rfind("# HELP", 0) == 0 ? 1 : 0;
    types += line.rfind("# TYPE", 0) == 0 ? 1 : 0;
    samples += line.rfind("tierflow_", 0) == 0 ? 1 : 0;
  }
  CHECK(helps == 3);
  CHECK(types == 3);
  CHECK(samples == 12);
  CHECK_THAT(text, Catch::Contains("# TYPE tierflow_link_bytes_total counter\n"));
  CHECK_THAT(text, Catch::Contains("Bytes moved over a link\\nper direction"));
  CHECK_THAT(text, Catch::Contains("tierflow_overlap_efficiency 0.96999999999999997\n"));
  CHECK_THAT(text, Catch::Contains(R"(tier="tier\"3\\\n")"));

  CHECK_THROWS_AS(p.counter("bytes", "no _total", 1), error);
  CHECK_THROWS_AS(p.gauge("2bad", "starts with a digit", 1), error);
  CHECK_THROWS_AS(p.gauge("ok_bytes", "bad label", 1, {{"bad-label", "x"}}), error);
  CHECK_THROWS_AS(p.gauge("ok_bytes", "reserved label", 1, {{"__name", "x"}}), error);
  CHECK_THROWS_WITH(p.gauge("link_bytes_total", "same name, other type", 1),
                    Catch::Contains("given as counter and gauge"));
}

TEST_CASE("traces are valid Chrome trace JSON with a track per stream", "[metrics][trace]") {
  trace_recorder trace;
  const auto t0 = trace_recorder::clock::now();
  auto record = [&](const std::string& track, int count) {
    for (int i = 0; i < count; ++i) {
      const auto start = trace_recorder::clock::now();
      const auto end = start + std::chrono::microseconds(10 + i);
      trace.span(
          track, "copy " + std::to_string(i), start, end,
          {{"bytes", std::int64_t{4096} * i}, {"buffer", std::string("layer\"7")}, {"gbps", 1.5}});
    }
  };
  std::thread a(record, "h2d", 50), b(record, "compute", 50);
  a.join();
  b.join();
  trace.instant("compute", "stall", t0 + std::chrono::microseconds(5),
                {{"why", std::string("late")}});
  CHECK(trace.size() == 101);
  CHECK_THROWS_AS(trace.span("h2d", "backwards", t0, t0 - std::chrono::microseconds(1)), error);

  const auto doc = nlohmann::json::parse(trace.json());
  CHECK(doc.at("displayTimeUnit") == "ms");
  std::map<int, std::string> names;
  int spans = 0, instants = 0;
  for (const auto& e : doc.at("traceEvents")) {
    const auto ph = e.at("ph").get<std::string>();
    if (ph == "M") {
      names[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    } else if (ph == "X") {
      ++spans;
      // microseconds as doubles: the 10 us span may print as 9.999999...
      CHECK(e.at("dur").get<double>() >= 10.0 - 1e-6);
      CHECK(e.at("ts").get<double>() >= 0.0);
      CHECK(e.at("args").at("buffer") == "layer\"7");
      CHECK(names.count(e.at("tid").get<int>()) == 1);  // metadata comes first
    } else if (ph == "i") {
      ++instants;
      CHECK(e.at("args").at("why") == "late");
    }
  }
  CHECK(spans == 100);
  CHECK(instants == 1);
  CHECK(names.size() == 2);
}
