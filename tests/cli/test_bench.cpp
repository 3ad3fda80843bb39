// `tierflow bench` as a user runs it: cases, the JSON matrix, the link cases, --from-json.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "cli_runner.hpp"
#include "test_support.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/detail/stagger.hpp"

using nlohmann::json;
using namespace tierflow::test::cli;

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
    } else if (name == "adam_bound" || name == "adam_cpu" || name == "adam_step" ||
               name == "adam_step_clip") {
      ++adam;
      CHECK(tc.at("bytes") == 28 * tc.at("params").get<std::uint64_t>());
      CHECK_THAT(tc.at("mparams_per_s").get<double>(),
                 Catch::WithinRel(tc.at("median").get<double>() * 1000.0 / 28.0, 1e-9));
      CHECK(tc.at("verified") == true);
      // The arrays staggered: no two at equal addresses modulo the aliasing span.
      CHECK(tc.at("layout").at("kind") == "staggered");
      std::vector<std::uintptr_t> at;
      for (const char* a : {"p", "g", "m", "v"}) {
        at.push_back(tc.at("layout").at(a).get<std::uintptr_t>() * 1024);
      }
      for (std::size_t i = 0; i < at.size(); ++i) {
        for (std::size_t j = i + 1; j < at.size(); ++j) {
          CHECK(tierflow::detail::alias_distance(at[i], at[j]) >= tierflow::detail::stagger_step);
        }
      }
      if (name == "adam_step" || name == "adam_step_clip") {
        CHECK(tc.at("bytes_d2h") == 0);  // the grads are read where they are
      }
    } else if (name == "adam_step_remainder") {
      ++adam;  // bf16 p and g, the master's 16 bits beside p: 28 - 12 + 10 B per param
      CHECK(tc.at("bytes") == 26 * tc.at("params").get<std::uint64_t>());
      CHECK(tc.at("verified") == true);
      CHECK(tc.at("bytes_d2h") == 0);
    } else if (name == "adam_step_bf16") {
      ++adam;  // bf16 p and g, an fp32 master: g 2, master 8, p read and written 4, m and v 16
      CHECK(tc.at("bytes") == 30 * tc.at("params").get<std::uint64_t>());
      CHECK(tc.at("verified") == true);
      CHECK(tc.at("bytes_d2h") == 0);
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
  CHECK(adam == 6 * static_cast<int>(nodes));

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
  tierflow::test::scratch_dir pages;
  const auto page = pages.path() / "small.html";
  const auto small = run_cli({"bench", "--case", "node_read", "--buffer-mib", "1", "--llc-mib", "1",
                              "--samples", "1", "--html", page.string()},
                             other_env);
  REQUIRE(small.exit_code == 0);
  CHECK_THAT(small.out, Catch::Contains("nothing cached"));
  CHECK(std::filesystem::is_empty(other.path()));
  // The page carries the caveats of the text: buffers inside the cache, nothing cached.
  const auto html = tierflow::test::read_file(page);
  for (const char* said :
       {"note: buffers are below 4 x the last-level cache", "nothing cached: no verified node case",
        "of 1 samples after 1 warm-up", "buffers 1 MiB per array"}) {
    CHECK_THAT(small.out, Catch::Contains(said));
    CHECK_THAT(html, Catch::Contains(said));
  }
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
                       {"settings",
                        {{"samples", 5},
                         {"buffer_bytes", 128u << 20},
                         {"latency_buffer_bytes", 256u << 20},
                         {"note",
                          "buffers are below 4 x the last-level cache: cache "
                          "bandwidth is measured"}}},
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
  // What the text says about how it measured, the page says too: the samples, the buffer
  // sizes, the last-level cache and the caveat that the buffers stayed in it.
  CHECK_THAT(r.out, Catch::Contains("of 5 samples after 1 warm-up; buffers 128 MiB per array"));
  CHECK_THAT(r.out, Catch::Contains("LLC 32 MiB"));
  CHECK_THAT(r.out, Catch::Contains("note: buffers are below 4 x the last-level cache"));
  CHECK_THAT(html, Catch::Contains("of 5 samples after 1 warm-up; buffers 128 MiB per array "
                                   "(latency: 256 MiB)"));
  CHECK_THAT(html, Catch::Contains("last-level cache 32 MiB"));
  CHECK_THAT(html, Catch::Contains("note: buffers are below 4 x the last-level cache: cache "
                                   "bandwidth is measured"));

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

TEST_CASE(
    "bench: inputs that are not regular files and outputs that cannot be written are "
    "refused before measuring",
    "[cli][bench][bad_input]") {
  tierflow::test::scratch_dir dir;
  const auto fifo = dir.path() / "report.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  struct row {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<row> rows = {
      {{"bench", "--from-json", fifo.string()},
       fifo.string() + ": the report is not a regular file"},
      {{"bench", "--from-json", dir.path().string()},
       dir.path().string() + ": the report is a directory"},
      {{"bench", "--from-json", "/dev/zero"}, "/dev/zero: the report is not a regular file"},
      {{"bench", "--case", "node_read", "--html", dir.path().string()}, "--html: is a folder"},
      {{"bench", "--case", "node_read", "--html", fifo.string()}, "--html: is not a regular file"},
      {{"bench", "--case", ""}, "--case: an empty case name selects nothing"},
  };
  for (const auto& r : rows) {
    INFO(r.args[1] << " " << r.args.back());
    const auto start = std::chrono::steady_clock::now();
    check_one_line_error(run_cli(r.args), r.expected);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));  // no hang
  }
  // A page the machine will not let us create (/proc takes no new files): exit 74, not 2.
  check_environment_error(
      run_cli({"bench", "--case", "node_read", "--html", "/proc/tierflow-x.html"}),
      "--html: cannot write the file");
}

TEST_CASE("bench --adam-layout aliased puts the Adam arrays 256 MiB apart, and says so",
          "[cli][bench]") {
  const auto r =
      run_cli({"bench", "--case", "adam_bound,adam_cpu", "--adam-layout", "aliased", "--buffer-mib",
               "4", "--samples", "1", "--threads", "1", "--json", "--no-cache"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  CHECK(doc.at("settings").at("adam_layout") == "aliased");
  int measured = 0;
  for (const auto& tc : doc.at("testcases")) {
    if (tc.at("status") == "waived") {
      continue;
    }
    ++measured;
    const auto& layout = tc.at("layout");
    CHECK(layout.at("kind") == "aliased");
    CHECK(layout.at("p") == layout.at("g"));
    CHECK(layout.at("p") == layout.at("m"));
    CHECK(layout.at("p") == layout.at("v"));
    CHECK(tc.at("verified") == true);
  }
  CHECK(measured >= 2);
  // Without a size that fits 256 MiB apart, refused naming the flag.
  const auto bad = run_cli({"bench", "--case", "adam_cpu", "--adam-layout", "aliased"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--adam-layout") && Catch::Contains("--buffer-mib"));
}

TEST_CASE("bench --state-dtype: each dtype's Adam cases, their bytes per param, verified",
          "[cli][bench]") {
  const auto r =
      run_cli({"bench", "--case", "adam_", "--state-dtype", "fp32,bf16,int8", "--buffer-mib", "4",
               "--samples", "1", "--threads", "1", "--json", "--no-cache"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto doc = json::parse(r.out);
  // Bytes per param: fp32 params and grads (12 B) and the moments; over bf16 params with the
  // master in 16 bits (remainder), 10 B and the moments.
  const std::map<std::string, double> moments{{"fp32", 16.0}, {"bf16", 8.0}, {"int8", 4.0625}};
  std::map<std::string, int> seen;
  for (const auto& tc : doc.at("testcases")) {
    const std::string name = tc.at("name");
    INFO(name);
    REQUIRE(tc.at("status") == "ok");
    const std::string dtype = tc.at("state_dtype");
    const std::string suffix = dtype == "fp32" ? "" : "_" + dtype;
    REQUIRE(name.size() > suffix.size());
    CHECK(name.substr(name.size() - suffix.size()) == suffix);
    const std::string base = name.substr(0, name.size() - suffix.size());
    const double expected = moments.at(dtype) + (base == "adam_step_remainder" ? 10.0
                                                 : base == "adam_step_bf16"    ? 14.0
                                                                               : 12.0);
    CHECK(tc.at("bytes_per_param").get<double>() == expected);
    CHECK(tc.at("verified") == true);
    ++seen[base];
  }
  for (const char* base : {"adam_bound", "adam_cpu", "adam_step", "adam_step_clip",
                           "adam_step_remainder", "adam_step_bf16"}) {
    INFO(base);
    CHECK(seen[base] == 3);
  }
}
