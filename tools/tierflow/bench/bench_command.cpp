// tierflow bench: every memory tier and link of this machine (cases in cases_*.cpp, registered in
// case_registry.cpp; JSON and CSV columns in docs/cli/bench.md).

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "bench/bench_html.hpp"
#include "bench/bench_run.hpp"
#include "commands.hpp"
#include "common/flags.hpp"
#include "common/format.hpp"
#include "common/svg_chart.hpp"
#include "tierflow/detail/input_file.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/error.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::cli {
namespace {

using json = nlohmann::ordered_json;

struct bench_options {
  bench_config config;
  bool list = false;
  bool json_output = false;
  bool csv_output = false;
  std::string html;
  bool no_cache = false;
  bool no_huge_pages = false;
  std::string adam_layout = "staggered";
  std::vector<std::string> state_dtypes;
  std::size_t buffer_mib = 0;
  std::size_t link_mib = 256;
  std::size_t llc_mib = 0;
  std::string from_json;
  std::vector<std::size_t> chunk_kib;
};

std::string number(const json& tc, const char* key, int digits = 3) {
  return tc.contains(key) && tc[key].is_number() ? short_number(tc[key].get<double>(), digits)
                                                 : "-";
}

std::string cell(const json& tc) {
  return number(tc, "median") + " [" + number(tc, "min") + "-" + number(tc, "max") + "]";
}

std::string text_of(const json& tc, const char* key) {
  if (!tc.contains(key) || tc[key].is_null()) {
    return "";
  }
  return tc[key].is_string() ? tc[key].get<std::string>() : tc[key].dump();
}

// node_* bandwidth cases: one initiator x target matrix each, at the most threads measured,
// then GB/s per thread count.
void print_matrices(const json& testcases) {
  std::vector<std::string> names;
  for (const auto& tc : testcases) {
    const auto name = tc["name"].get<std::string>();
    if (tc["group"] == "node_bandwidth" && tc["status"] == "ok" &&
        std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  for (const auto& name : names) {
    std::map<std::pair<int, int>, const json*> best;
    std::set<int> targets;
    std::map<std::pair<int, int>, std::vector<const json*>> by_pair;
    for (const auto& tc : testcases) {
      if (tc["name"] != name || tc["group"] != "node_bandwidth" || tc["status"] != "ok") {
        continue;
      }
      const std::pair<int, int> key{tc["initiator"].get<int>(), tc["target"].get<int>()};
      targets.insert(key.second);
      by_pair[key].push_back(&tc);
      if (!best[key] || (*best[key])["threads"].get<int>() < tc["threads"].get<int>()) {
        best[key] = &tc;
      }
    }
    std::vector<std::string> header = {name + " GB/s"};
    for (const int t : targets) {
      header.push_back("to node " + std::to_string(t));
    }
    std::vector<std::vector<std::string>> rows;
    std::set<int> initiators;
    for (const auto& [key, tc] : best) {
      initiators.insert(key.first);
    }
    for (const int i : initiators) {
      std::vector<std::string> row = {"from node " + std::to_string(i)};
      for (const int t : targets) {
        const auto it = best.find({i, t});
        row.push_back(
            it == best.end() ? "-" : cell(*it->second) + " x" + text_of(*it->second, "threads"));
      }
      rows.push_back(row);
    }
    std::printf("%s", render_table(header, rows).c_str());
    std::vector<std::vector<std::string>> scaling;
    for (const auto& [key, list] : by_pair) {
      std::string line;
      for (const auto* tc : list) {
        line += (line.empty() ? "" : ", ") + text_of(*tc, "threads") + ": " + number(*tc, "median");
      }
      scaling.push_back({std::to_string(key.first) + " -> " + std::to_string(key.second), line});
    }
    std::printf("%s\n", render_table({"  threads", "GB/s by thread count"}, scaling).c_str());
  }
}

void print_group(const json& testcases, const std::string& group, const std::string& title,
                 const std::vector<std::pair<std::string, std::string>>& columns) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& tc : testcases) {
    if (tc["group"] != group || tc["status"] != "ok") {
      continue;
    }
    std::vector<std::string> row = {tc["name"].get<std::string>()};
    for (const auto& [key, label] : columns) {
      if (key == "value") {
        row.push_back(cell(tc) + " " + text_of(tc, "unit"));
      } else if (key == "chunk_bytes" && tc.contains(key)) {
        row.push_back(format_bytes(tc[key].get<std::uint64_t>()));
      } else if (tc.contains(key) && tc[key].is_number_float()) {
        row.push_back(number(tc, key.c_str(), 4));
      } else {
        row.push_back(text_of(tc, key.c_str()));
      }
    }
    rows.push_back(row);
  }
  if (rows.empty()) {
    return;
  }
  std::vector<std::string> header = {title};
  for (const auto& [key, label] : columns) {
    header.push_back(label);
  }
  std::printf("%s\n", render_table(header, rows).c_str());
}

void print_human(const json& report) {
  const auto& m = report["machine"];
  const auto& s = report["settings"];
  std::printf(
      "tierflow bench %s on %s (%s, %s CPUs, LLC %s, %s), %s\n"
      "GB/s = 10^9 B/s; sizes in MiB = 2^20 B; median [min-max] of %s samples after 1 warm-up; "
      "buffers %s per array\n",
      report["tierflow_version"].get<std::string>().c_str(), text_of(m, "hostname").c_str(),
      text_of(m, "cpu_model").c_str(), text_of(m, "cpus").c_str(),
      format_bytes(m["llc_bytes"].get<std::uint64_t>()).c_str(), text_of(m, "isa").c_str(),
      text_of(report, "date").c_str(), text_of(s, "samples").c_str(),
      format_bytes(s["buffer_bytes"].get<std::uint64_t>()).c_str());
  if (s.contains("note")) {
    std::printf("note: %s\n", s["note"].get<std::string>().c_str());
  }
  std::printf("\n");
  const auto& tcs = report["testcases"];
  print_matrices(tcs);
  print_group(tcs, "node_latency", "latency",
              {{"initiator", "from"},
               {"target", "to"},
               {"value", "median [min-max]"},
               {"hmat", "hmat ns"},
               {"huge_pages", "huge pages"}});
  print_group(tcs, "link", "link",
              {{"initiator", "host node"},
               {"value", "median [min-max]"},
               {"backend", "backend"},
               {"verified", "verified"}});
  print_group(tcs, "link_sweep", "chunk sweep",
              {{"initiator", "host node"},
               {"chunk_bytes", "chunk"},
               {"value", "median [min-max]"},
               {"backend", "backend"}});
  print_group(tcs, "adam", "adam",
              {{"target", "state on node"},
               {"threads", "threads"},
               {"value", "median [min-max]"},
               {"mparams_per_s", "Mparam/s"},
               {"kernel", "kernel"},
               {"verified", "verified"}});
  std::vector<std::vector<std::string>> waived;
  for (const auto& tc : tcs) {
    if (tc["status"] == "waived") {
      waived.push_back({tc["name"].get<std::string>(), text_of(tc, "reason")});
    }
  }
  if (!waived.empty()) {
    std::printf("%s", render_table({"WAIVED", "reason"}, waived).c_str());
  }
}

std::string csv_field(std::string text) {
  if (text.find_first_of(",\"\n") == std::string::npos) {
    return text;
  }
  std::string out = "\"";
  for (const char c : text) {
    out += c == '"' ? std::string("\"\"") : std::string(1, c);
  }
  return out + "\"";
}

void print_csv(const json& report) {
  const std::vector<std::string> columns = {
      "name",        "status",  "unit",    "median",    "min",    "max",
      "samples",     "bytes",   "threads", "initiator", "target", "pinned",
      "chunk_bytes", "backend", "hmat",    "verified",  "reason"};
  std::string line;
  for (const auto& c : columns) {
    line += (line.empty() ? "" : ",") + c;
  }
  std::printf("%s\n", line.c_str());
  for (const auto& tc : report["testcases"]) {
    line.clear();
    for (std::size_t k = 0; k < columns.size(); ++k) {
      line += (k == 0 ? "" : ",") + csv_field(text_of(tc, columns[k].c_str()));
    }
    std::printf("%s\n", line.c_str());
  }
}

// The values placement and tuning read back: read and write bandwidth at the most threads
// measured, and latency, per (initiator, target).
// Only what was measured over memory, not cache: bandwidth from arrays of at least 4 x the
// last-level cache, latency over at least 8 x.
std::vector<measured_access> measured_values(const json& report) {
  const auto llc = report["machine"]["llc_bytes"].get<std::uint64_t>();
  std::map<int, int> cpus;  // per node: a bandwidth is the node's only from all of its CPUs
  for (const auto& n : report["machine"]["nodes"]) {
    cpus[n["id"].get<int>()] = n["cpus"].get<int>();
  }
  std::map<std::pair<int, int>, measured_access> values;
  std::map<std::pair<int, int>, int> read_threads, write_threads;
  for (const auto& tc : report["testcases"]) {
    if (tc["status"] != "ok" || !tc.contains("target") || !tc.value("verified", false)) {
      continue;
    }
    const bool latency = tc["name"] == "node_latency";
    const auto size = tc.value(latency ? "bytes" : "array_bytes", std::uint64_t{0});
    if (size < (latency ? 8 : 4) * llc) {
      continue;
    }
    const std::pair<int, int> key{tc["initiator"].get<int>(), tc["target"].get<int>()};
    auto& m = values[key];
    m.initiator = numa_node_id{key.first};
    m.target = numa_node_id{key.second};
    const double median = tc["median"].get<double>();
    const int threads = tc.value("threads", 1);
    if (!latency && threads < cpus[key.first]) {
      continue;  // --threads below the CPU count: not what placement should plan with
    }
    if (tc["name"] == "node_read" && threads >= read_threads[key]) {
      read_threads[key] = threads;
      m.read_bandwidth_mbps = median * 1000.0;
    } else if (tc["name"] == "node_write" && threads >= write_threads[key]) {
      write_threads[key] = threads;
      m.write_bandwidth_mbps = median * 1000.0;
    } else if (tc["name"] == "node_latency") {
      m.read_latency_ns = median;
    }
  }
  std::vector<measured_access> out;
  for (const auto& [key, m] : values) {
    if (m.read_bandwidth_mbps || m.write_bandwidth_mbps || m.read_latency_ns) {
      out.push_back(m);
    }
  }
  return out;
}

// Measures on this machine and, unless --no-cache, keeps what placement can use.
json measure(bench_options& o) {
  // Firmware values to compare with: discovery without the measured cache.
  discovery_options d;
  d.use_measured_cache = false;
  const auto topo = topology::discover(d);
  const bool tty = ::isatty(2) != 0;
  bench_progress progress;
  if (tty) {
    progress = [](std::size_t done, std::size_t planned, const std::string& label) {
      const std::size_t width = 30;
      const std::size_t filled = planned ? std::min(width, done * width / planned) : width;
      std::fprintf(stderr, "\r[%s%s] %zu/%zu %-40.40s", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done, planned, label.c_str());
      std::fflush(stderr);
    };
  }
  auto report = run_bench(o.config, topo, progress);
  if (tty) {
    std::fprintf(stderr, "\r%-90s\r", "");
  }
  if (!o.no_cache) {
    const auto values = measured_values(report);
    if (values.empty()) {
      report["cache_note"] =
          "nothing cached: no verified node case over buffers of at least 4 x the last-level "
          "cache (8 x for latency), with bandwidth from all of the initiator's CPUs";
    } else {
      try {
        report["cache"] = save_measured_access(topo, values).string();
      } catch (const std::exception& e) {  // the measurement stands; say why it was not kept
        std::fprintf(stderr, "tierflow bench: warning: measured values not cached: %s\n", e.what());
      }
    }
  }
  return report;
}

// A report written by `tierflow bench --json`, checked before anything is drawn from it.
json load_report(const std::string& path) {
  constexpr std::uint64_t max_report_bytes = std::uint64_t{64} << 20;
  const std::string text = detail::read_text_file(path, "report", max_report_bytes);
  json report;
  try {
    report = json::parse(text);
  } catch (const json::parse_error& e) {
    throw input_error(path, std::string("not JSON: ") + e.what());
  }
  const auto need = [&](bool ok, const std::string& what) {
    if (!ok) {
      throw input_error(path, "not a tierflow bench report: " + what);
    }
  };
  need(report.is_object(), "the document is not an object");
  for (const char* key : {"tierflow_version", "date"}) {
    need(report.contains(key) && report[key].is_string(), std::string("no string \"") + key + '"');
  }
  need(report.contains("machine") && report["machine"].is_object() &&
           report["machine"].contains("llc_bytes") &&
           report["machine"]["llc_bytes"].is_number_unsigned(),
       "no \"machine\" object with \"llc_bytes\"");
  need(report.contains("settings") && report["settings"].is_object() &&
           report["settings"].contains("samples") &&
           report["settings"].value("buffer_bytes", json()).is_number_unsigned(),
       "no \"settings\" object with \"samples\" and \"buffer_bytes\"");
  need(report.contains("testcases") && report["testcases"].is_array(), "no \"testcases\" array");
  need(!report["settings"].contains("note") || report["settings"]["note"].is_string(),
       "\"settings.note\" is not text");
  // What the measuring run did with its results is not this run's doing.
  for (const char* key : {"cache", "cache_note", "html"}) {
    report.erase(key);
  }
  std::size_t k = 0;
  for (const auto& tc : report["testcases"]) {
    const std::string where = "testcases[" + std::to_string(k++) + "]";
    need(tc.is_object() && tc.contains("name") && tc["name"].is_string() && tc.contains("group") &&
             tc["group"].is_string() && tc.contains("status") &&
             (tc["status"] == "ok" || tc["status"] == "waived"),
         where + " needs \"name\", \"group\" and \"status\" (ok or waived)");
    need(!tc.contains("verified") || tc["verified"].is_boolean(),
         where + " \"verified\" is not true or false");
    need(!tc.contains("reason") || tc["reason"].is_string(), where + " \"reason\" is not text");
    if (tc["status"] == "ok") {
      for (const char* key : {"median", "min", "max"}) {
        need(tc.contains(key) && tc[key].is_number(), where + " has no number \"" + key + '"');
      }
      need(tc.contains("unit") && tc["unit"].is_string(), where + " has no \"unit\"");
      const bool matrix = tc["group"] == "node_bandwidth";
      for (const char* key : {"initiator", "target", "threads"}) {
        need(matrix ? tc.contains(key) && tc[key].is_number_integer()
                    : !tc.contains(key) || tc[key].is_number_integer(),
             where + " \"" + key + "\" is " + (matrix ? "missing or " : "") + "not an integer");
      }
      need(!tc.contains("chunk_bytes") || tc["chunk_bytes"].is_number_unsigned(),
           where + " \"chunk_bytes\" is not a byte count");
    }
  }
  return report;
}

int run(bench_options& o) {
  check_case_patterns(o.config.cases);
  if (o.list) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : bench_cases()) {
      if (case_selected(c.name, o.config.cases)) {
        rows.push_back({c.name, c.group, c.what});
      }
    }
    std::printf("%s", render_table({"case", "group", "measures"}, rows).c_str());
    return exit_ok;
  }
  if (o.json_output + o.csv_output > 1) {
    throw input_error("--json, --csv", "choose one");
  }
  o.config.buffer_bytes = o.buffer_mib << 20;
  o.config.link_bytes = o.link_mib << 20;
  o.config.llc_bytes = o.llc_mib << 20;
  o.config.huge_pages = !o.no_huge_pages;
  o.config.adam_aliased = o.adam_layout == "aliased";
  if (o.config.adam_aliased &&
      (o.config.buffer_bytes == 0 || o.config.buffer_bytes > detail::alias_span)) {
    throw input_error("--adam-layout",
                      "aliased needs --buffer-mib of at most 256 (the four arrays sit 256 MiB "
                      "apart in one buffer)",
                      o.adam_layout);
  }
  if (!o.state_dtypes.empty()) {
    o.config.state_dtypes.clear();
    for (const auto& name : o.state_dtypes) {
      const auto dtype = parse_adam_state_dtype(name);
      if (!dtype) {
        throw input_error("--state-dtype", "must be fp32, bf16 or int8 (a comma-separated list)",
                          name);
      }
      if (std::find(o.config.state_dtypes.begin(), o.config.state_dtypes.end(), *dtype) !=
          o.config.state_dtypes.end()) {
        throw input_error("--state-dtype", "is named twice", name);
      }
      o.config.state_dtypes.push_back(*dtype);
    }
  }
  for (const auto kib : o.chunk_kib) {
    if ((kib << 10) > o.config.link_bytes) {
      throw input_error("--chunk-kib",
                        "a chunk larger than the copy (--link-mib " + std::to_string(o.link_mib) +
                            ") measures nothing new",
                        std::to_string(kib));
    }
    o.config.chunk_sizes.push_back(kib << 10);
  }
  if (!o.html.empty()) {  // refuse before measuring, not after
    check_output_file("--html", o.html);
  }
  json report = o.from_json.empty() ? measure(o) : load_report(o.from_json);
  // The measurement is the work: a page that cannot be written after all is said after the
  // results are printed, never instead of them.
  std::string html_failure;
  int html_failure_exit = exit_failure;
  if (!o.html.empty()) {
    try {
      write_text_file(o.html, render_bench_html(report));
      report["html"] = o.html;
    } catch (const std::exception& e) {
      html_failure = e.what();
      html_failure_exit = exit_code_for(e);
    }
  }
  if (o.json_output) {
    std::cout << report.dump(2) << '\n';
  } else if (o.csv_output) {
    print_csv(report);
  } else {
    print_human(report);
    if (report.contains("cache")) {
      std::printf("\nmeasured values cached in %s (--no-cache to skip)\n",
                  report["cache"].get<std::string>().c_str());
    } else if (report.contains("cache_note")) {
      std::printf("\n%s\n", report["cache_note"].get<std::string>().c_str());
    }
    if (report.contains("html")) {
      std::printf("report: %s\n", o.html.c_str());
    }
  }
  if (!html_failure.empty()) {
    std::fprintf(stderr, "tierflow: error: --html: %s (the results are above)\n",
                 html_failure.c_str());
    return html_failure_exit;
  }
  bool verified = true;
  for (const auto& tc : report["testcases"]) {
    verified = verified && tc.value("verified", true);
  }
  if (!verified) {
    std::fprintf(stderr,
                 "tierflow bench: error: a case's data did not verify (see "
                 "\"verified\": false)\n");
    return exit_failure;
  }
  return exit_ok;
}

}  // namespace

action add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure every memory tier and link: bandwidth matrix, latency, host<->device, Adam "
      "(GB/s = 10^9 B/s)");
  cmd->add_flag("--list", o->list, "List the cases (with --case: the ones it selects)");
  cmd->add_option("--case", o->config.cases,
                  "Cases to run, by name or prefix (e.g. node_, h2d_pinned); default all")
      ->delimiter(',');
  cmd->add_option("--samples", o->config.samples,
                  "Timed samples per measurement (after one "
                  "warm-up)")
      ->check(count_in(1, 1000))
      ->capture_default_str();
  cmd->add_option("--buffer-mib", o->buffer_mib,
                  "MiB per array (default: 4 x the last-level cache; 8 x for latency)")
      ->check(count_in(1, 1 << 20));
  cmd->add_option("--threads", o->config.threads,
                  "Thread counts for the bandwidth cases (default 1, 2, 4, ... and all CPUs of "
                  "the initiator)")
      ->delimiter(',')
      ->check(count_in(1, 4096));
  cmd->add_option("--device", o->config.device,
                  "Device for the link cases: auto, emulated, "
                  "cuda, cuda:N")
      ->capture_default_str();
  cmd->add_option("--link-mib", o->link_mib, "MiB per host<->device copy")
      ->check(count_in(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--chunk-kib", o->chunk_kib,
                  "Chunk sizes of the sweep in KiB (default 64,256,...,65536)")
      ->delimiter(',')
      ->check(count_in(1, 1 << 20));
  cmd->add_option("--latency-loads", o->config.latency_loads, "Dependent loads per latency sample")
      ->check(count_in(1024, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--llc-mib", o->llc_mib,
                  "Last-level cache size the buffer rule uses, in MiB (default: detected)")
      ->check(count_in(1, 1 << 16));
  cmd->add_flag("--json", o->json_output, "Print one JSON document (keys in docs/cli/bench.md)");
  cmd->add_flag("--csv", o->csv_output, "Print CSV, one row per testcase");
  cmd->add_option("--html", o->html, "Also write a self-contained HTML report to this file");
  cmd->add_option("--from-json", o->from_json,
                  "Measure nothing: show (or --html/--csv) a report saved with --json");
  cmd->add_flag("--no-huge-pages", o->no_huge_pages,
                "Refuse transparent huge pages for the node and Adam buffers (4 KiB pages, as "
                "most programs get)");
  cmd->add_option("--adam-layout", o->adam_layout,
                  "Where the Adam cases' p, g, m, v start: staggered (apart modulo 256 MiB) or "
                  "aliased (exactly 256 MiB apart, the layout that slows the step)")
      ->check(CLI::IsMember({"staggered", "aliased"}));
  cmd->add_option("--state-dtype", o->state_dtypes,
                  "The Adam cases' moments: fp32, bf16, int8, or a list measured side by side "
                  "(fp32,int8); each with its own bound (default fp32)")
      ->delimiter(',');
  cmd->add_flag("--no-cache", o->no_cache,
                "Do not store the measured values for placement and tuning (~/.cache/tierflow)");
  return [o] { return run(*o); };
}

}  // namespace tierflow::cli
