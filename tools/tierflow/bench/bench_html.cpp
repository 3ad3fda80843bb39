// The HTML report of `tierflow bench`: everything inline (SVG charts, CSS), so the file opens
// offline, mails as one attachment and screenshots in headless Chromium.

#include "bench/bench_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/format.hpp"
#include "common/svg_chart.hpp"

namespace tierflow::cli {
namespace {

using json = nlohmann::ordered_json;

std::string field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) {
    return "";
  }
  const auto& v = j[key];
  if (v.is_string()) {
    return v.get<std::string>();
  }
  if (v.is_number_float()) {
    return short_number(v.get<double>(), 4);
  }
  return v.dump();
}

double value(const json& j, const char* key, double fallback = NAN) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

std::string size_label(double bytes) {
  if (bytes >= 1024.0 * 1024.0) {
    return short_number(bytes / (1024.0 * 1024.0)) + " MiB";
  }
  return short_number(bytes / 1024.0) + " KiB";
}

bool ok(const json& tc) {
  return tc.value("status", "") == "ok";
}

// Fill of a heat-map cell: light for the matrix minimum, dark for its maximum.
std::string heat(double v, double lo, double hi) {
  const double t = hi > lo ? (v - lo) / (hi - lo) : 1.0;
  const int lightness = static_cast<int>(std::lround(92.0 - 55.0 * t));
  return "hsl(210,70%," + std::to_string(lightness) + "%)";
}

// A byte count of the report as the text output writes it (`128 MiB`), "" when absent.
std::string bytes_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned()) {
    return "";
  }
  return format_bytes(j[key].get<std::uint64_t>());
}

// What the text output says about how it measured: samples, buffer sizes, the last-level cache,
// the caveat when the buffers are too small to leave the cache, and what was cached.
void settings_summary(std::ostringstream& o, const json& report, const json& machine) {
  const json empty = json::object();
  const json& s = report.contains("settings") ? report["settings"] : empty;
  const std::string warmup = field(s, "warmup");
  o << "<p class=\"settings\">Median [min&ndash;max] of " << html_escape(field(s, "samples"))
    << " samples after " << (warmup.empty() ? "1" : html_escape(warmup)) << " warm-up; buffers "
    << bytes_field(s, "buffer_bytes") << " per array";
  if (const std::string latency = bytes_field(s, "latency_buffer_bytes"); !latency.empty()) {
    o << " (latency: " << latency << ")";
  }
  if (const std::string link = bytes_field(s, "link_bytes"); !link.empty()) {
    o << "; " << link << " per host&#8596;device copy";
  }
  o << "; last-level cache " << bytes_field(machine, "llc_bytes");
  if (const std::string from = field(s, "llc_bytes_from"); !from.empty()) {
    o << " (from " << html_escape(from) << ")";
  }
  o << ".</p>\n";
  if (s.contains("note")) {
    o << "<p class=\"bad\">note: " << html_escape(field(s, "note")) << "</p>\n";
  }
  if (report.contains("cache")) {
    o << "<p class=\"legend\">Measured values cached in " << html_escape(field(report, "cache"))
      << " (--no-cache to skip).</p>\n";
  } else if (report.contains("cache_note")) {
    o << "<p class=\"legend\">" << html_escape(field(report, "cache_note")) << "</p>\n";
  }
}

void heat_maps(std::ostringstream& o, const json& testcases) {
  std::vector<std::string> names;
  for (const auto& tc : testcases) {
    const auto name = tc.value("name", "");
    if (tc.value("group", "") == "node_bandwidth" && ok(tc) &&
        std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  o << "<h2>Bandwidth matrix (initiator &times; target, most threads measured)</h2>\n";
  if (names.empty()) {
    o << "<p>No node bandwidth case ran.</p>\n";
    return;
  }
  for (const auto& name : names) {
    std::map<std::pair<int, int>, const json*> best;  // most threads per pair
    std::set<int> initiators;
    std::set<int> targets;
    for (const auto& tc : testcases) {
      if (tc.value("name", "") != name || !ok(tc)) {
        continue;
      }
      const std::pair<int, int> key{tc.value("initiator", -1), tc.value("target", -1)};
      initiators.insert(key.first);
      targets.insert(key.second);
      auto& slot = best[key];
      if (slot == nullptr || tc.value("threads", 0) > slot->value("threads", 0)) {
        slot = &tc;
      }
    }
    double lo = INFINITY;
    double hi = 0;
    for (const auto& [key, tc] : best) {
      lo = std::min(lo, value(*tc, "median"));
      hi = std::max(hi, value(*tc, "median"));
    }
    const int cw = 120;
    const int ch = 44;
    const int left = 110;
    const int top = 40;
    const int width = left + cw * static_cast<int>(targets.size()) + 10;
    const int height = top + ch * static_cast<int>(initiators.size()) + 10;
    o << "<figure><figcaption>" << html_escape(name) << " (GB/s)</figcaption>\n<svg class=\"heat\" "
      << "width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << ' '
      << height << "\" role=\"img\" aria-label=\"" << html_escape(name) << " bandwidth matrix\">\n";
    int col = 0;
    for (const int t : targets) {
      o << "<text x=\"" << left + col * cw + cw / 2 << "\" y=\"" << top - 12
        << "\" text-anchor=\"middle\">target " << t << "</text>\n";
      ++col;
    }
    int row = 0;
    for (const int i : initiators) {
      const int y = top + row * ch;
      o << "<text x=\"" << left - 8 << "\" y=\"" << y + ch / 2 + 5
        << "\" text-anchor=\"end\">initiator " << i << "</text>\n";
      col = 0;
      for (const int t : targets) {
        const int x = left + col * cw;
        const auto it = best.find({i, t});
        if (it == best.end()) {
          o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cw - 2 << "\" height=\""
            << ch - 2 << "\" fill=\"#eee\"/>\n";
        } else {
          const double v = value(*it->second, "median");
          const double t_frac = hi > lo ? (v - lo) / (hi - lo) : 1.0;
          o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cw - 2 << "\" height=\""
            << ch - 2 << "\" fill=\"" << heat(v, lo, hi) << "\"><title>" << html_escape(name) << ' '
            << i << "&#8594;" << t << ": " << short_number(v, 4) << " GB/s, "
            << field(*it->second, "threads") << " threads</title></rect>\n<text x=\"" << x + cw / 2
            << "\" y=\"" << y + ch / 2 + 5 << "\" text-anchor=\"middle\" fill=\""
            << (t_frac > 0.5 ? "#fff" : "#000") << "\">" << short_number(v, 4) << "</text>\n";
        }
        ++col;
      }
      ++row;
    }
    o << "</svg></figure>\n";
  }
}

void latency_bars(std::ostringstream& o, const json& testcases) {
  std::vector<const json*> bars;
  double hi = 0;
  for (const auto& tc : testcases) {
    if (tc.value("name", "") == "node_latency" && ok(tc)) {
      bars.push_back(&tc);
      hi = std::max({hi, value(tc, "max", 0), value(tc, "hmat", 0)});
    }
  }
  o << "<h2>Latency (dependent loads, ns per load)</h2>\n";
  if (bars.empty()) {
    o << "<p>No latency case ran.</p>\n";
    return;
  }
  const int left = 140;
  const int span = 460;
  const int bh = 26;
  const int height = 20 + bh * static_cast<int>(bars.size());
  o << "<svg class=\"bars\" width=\"" << left + span + 90 << "\" height=\"" << height
    << "\" role=\"img\" aria-label=\"latency bars\">\n";
  for (std::size_t k = 0; k < bars.size(); ++k) {
    const json& tc = *bars[k];
    const int y = 10 + bh * static_cast<int>(k);
    const double v = value(tc, "median");
    const int w = hi > 0 ? static_cast<int>(std::lround(span * v / hi)) : 0;
    o << "<text x=\"" << left - 8 << "\" y=\"" << y + 16 << "\" text-anchor=\"end\">"
      << field(tc, "initiator") << " &#8594; " << field(tc, "target") << "</text>\n<rect x=\""
      << left << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bh - 6
      << "\" fill=\"#1f77b4\"><title>median " << short_number(v, 4) << " ns, min "
      << field(tc, "min") << ", max " << field(tc, "max") << "</title></rect>\n<text x=\""
      << left + w + 6 << "\" y=\"" << y + 16 << "\">" << short_number(v, 4) << " ns</text>\n";
    const double firmware = value(tc, "hmat");
    if (std::isfinite(firmware) && hi > 0) {
      const int fx = left + static_cast<int>(std::lround(span * firmware / hi));
      o << "<line x1=\"" << fx << "\" x2=\"" << fx << "\" y1=\"" << y - 2 << "\" y2=\""
        << y + bh - 4 << "\" stroke=\"#d62728\" stroke-width=\"3\"><title>HMAT "
        << short_number(firmware, 4) << " ns</title></line>\n";
    }
  }
  o << "</svg>\n<p class=\"legend\">Red tick: the firmware's (HMAT) latency, where reported.</p>\n";
}

void chunk_sweep(std::ostringstream& o, const json& testcases) {
  // one series per (case, initiator)
  std::map<std::pair<std::string, int>, chart_series> series;
  for (const auto& tc : testcases) {
    if (tc.value("group", "") == "link_sweep" && ok(tc) && tc.contains("chunk_bytes")) {
      auto& s = series[{tc.value("name", ""), tc.value("initiator", -1)}];
      s.label = tc.value("name", "") + " (node " + std::to_string(tc.value("initiator", -1)) + ")";
      s.points.emplace_back(value(tc, "chunk_bytes"), value(tc, "median"));
    }
  }
  o << "<h2>Host &#8596; device bandwidth against chunk size</h2>\n";
  if (series.empty()) {
    o << "<p>No chunk-size sweep ran.</p>\n";
    return;
  }
  std::vector<chart_series> lines;
  for (auto& [key, s] : series) {
    lines.push_back(std::move(s));
  }
  chart_axes axes;
  axes.x_label = "chunk size";
  axes.y_label = "GB/s";
  axes.log_x = true;
  axes.x_tick = size_label;
  axes.aria_label = "bandwidth against chunk size";
  o << svg_line_chart(std::move(lines), axes);
}

void firmware_table(std::ostringstream& o, const json& testcases) {
  o << "<h2>Measured against the firmware (HMAT)</h2>\n";
  std::ostringstream rows;
  int count = 0;
  for (const auto& tc : testcases) {
    if (!ok(tc) || !tc.contains("hmat")) {
      continue;
    }
    const double measured = value(tc, "median");
    const double firmware = value(tc, "hmat");
    rows << "<tr><td>" << html_escape(field(tc, "name")) << "</td><td>" << field(tc, "initiator")
         << "</td><td>" << field(tc, "target") << "</td><td>" << field(tc, "threads") << "</td><td>"
         << short_number(measured, 4) << "</td><td>" << short_number(firmware, 4) << "</td><td>"
         << (firmware > 0 ? short_number(measured / firmware, 3) : "-") << "</td><td>"
         << html_escape(field(tc, "unit")) << "</td><td>" << html_escape(field(tc, "hmat_source"))
         << "</td></tr>\n";
    ++count;
  }
  if (count == 0) {
    o << "<p>This machine's firmware reports no access attributes (no HMAT): nothing to compare "
         "against.</p>\n";
    return;
  }
  o << "<table><tr><th>case</th><th>initiator</th><th>target</th><th>threads</th>"
       "<th>measured</th><th>HMAT</th><th>measured / HMAT</th><th>unit</th><th>source</th>"
       "</tr>\n"
    << rows.str() << "</table>\n";
}

void all_cases(std::ostringstream& o, const json& testcases) {
  o << "<h2>Every testcase</h2>\n<table><tr><th>name</th><th>initiator</th><th>target</th>"
       "<th>threads</th><th>pinned</th><th>chunk</th><th>median</th><th>min</th><th>max</th>"
       "<th>unit</th><th>samples</th><th>verified</th></tr>\n";
  std::ostringstream waived;
  for (const auto& tc : testcases) {
    if (!ok(tc)) {
      waived << "<li><b>" << html_escape(field(tc, "name"))
             << "</b>: " << html_escape(field(tc, "reason")) << "</li>\n";
      continue;
    }
    const double chunk = value(tc, "chunk_bytes");
    o << "<tr><td>" << html_escape(field(tc, "name")) << "</td><td>" << field(tc, "initiator")
      << "</td><td>" << field(tc, "target") << "</td><td>" << field(tc, "threads") << "</td><td>"
      << field(tc, "pinned") << "</td><td>" << (std::isfinite(chunk) ? size_label(chunk) : "")
      << "</td><td>" << short_number(value(tc, "median"), 4) << "</td><td>"
      << short_number(value(tc, "min"), 4) << "</td><td>" << short_number(value(tc, "max"), 4)
      << "</td><td>" << html_escape(field(tc, "unit")) << "</td><td>" << field(tc, "samples")
      << "</td><td" << (tc.value("verified", true) ? ">yes" : " class=\"bad\">NO")
      << "</td></tr>\n";
  }
  o << "</table>\n";
  const auto w = waived.str();
  if (!w.empty()) {
    o << "<h2>Waived</h2>\n<ul>\n" << w << "</ul>\n";
  }
}

}  // namespace

std::string render_bench_html(const json& report) {
  const json empty = json::object();
  const json& machine = report.contains("machine") ? report["machine"] : empty;
  const json& testcases = report.contains("testcases") ? report["testcases"] : json::array();
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>tierflow bench: "
    << html_escape(field(machine, "hostname")) << "</title>\n<style>\n"
    << "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}\n"
    << "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px "
       "8px;text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}\n"
    << "svg text{font:12px system-ui,sans-serif}figure{margin:8px 0 18px}figcaption{font-weight:"
       "600}\n.bad{color:#b00;font-weight:700}.legend{color:#555;font-size:12px}\n"
    << "</style></head><body>\n<h1>tierflow bench</h1>\n<p>"
    << html_escape(field(machine, "hostname")) << " &middot; "
    << html_escape(field(machine, "cpu_model")) << " &middot; " << field(machine, "cpus")
    << " CPUs &middot; kernel " << html_escape(field(machine, "kernel")) << " &middot; ISA "
    << html_escape(field(machine, "isa")) << " &middot; tierflow "
    << html_escape(field(report, "tierflow_version")) << " &middot; "
    << html_escape(field(report, "date"))
    << "</p>\n<p>Bandwidth in GB/s (10<sup>9</sup> B/s), sizes in "
       "MiB (2<sup>20</sup> B), latency in ns. Copy counts bytes read plus bytes written, triad "
       "its three streams (write-allocate traffic not counted).</p>\n";
  settings_summary(o, report, machine);
  if (machine.contains("note")) {
    o << "<p class=\"legend\">" << html_escape(field(machine, "note")) << "</p>\n";
  }
  if (machine.contains("device") && machine["device"].is_object()) {
    o << "<p>Link cases ran on: " << html_escape(field(machine["device"], "name")) << " ("
      << html_escape(field(machine["device"], "backend")) << ")</p>\n";
  }
  heat_maps(o, testcases);
  latency_bars(o, testcases);
  chunk_sweep(o, testcases);
  firmware_table(o, testcases);
  all_cases(o, testcases);
  o << "</body></html>\n";
  return o.str();
}

}  // namespace tierflow::cli
