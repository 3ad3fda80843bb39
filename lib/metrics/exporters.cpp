#include "tierflow/exporters.hpp"

#include <cmath>
#include <cstdio>

#include "tierflow/error.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow::metrics {

namespace {

bool valid_name(std::string_view name, bool allow_colon) {
  if (name.empty()) {
    return false;
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) {
      return false;
    }
  }
  return true;
}

std::string escape_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) {
    return "NaN";
  }
  if (std::isinf(value)) {
    return value > 0 ? "+Inf" : "-Inf";
  }
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

}  // namespace

void prometheus_writer::gauge(std::string_view name, std::string_view help, double value,
                              const labels& label_values) {
  add("gauge", name, help, value, label_values);
}

void prometheus_writer::counter(std::string_view name, std::string_view help, double value,
                                const labels& label_values) {
  TIERFLOW_EXPECTS(name.size() > 6 && name.substr(name.size() - 6) == "_total",
                   "prometheus: counter '" + std::string(name) + "' must end in _total");
  add("counter", name, help, value, label_values);
}

void prometheus_writer::add(std::string_view type, std::string_view name, std::string_view help,
                            double value, const labels& label_values) {
  TIERFLOW_EXPECTS(valid_name(name, true),
                   "prometheus: invalid metric name '" + std::string(name) + "'");
  const std::string full = "tierflow_" + std::string(name);
  auto it = families_.find(full);
  if (it == families_.end()) {
    it = families_.emplace(full, family{std::string(type), escape_help(help), {}}).first;
    order_.push_back(full);
  }
  TIERFLOW_EXPECTS(it->second.type == type, "prometheus: metric '" + full + "' given as " +
                                                it->second.type + " and " + std::string(type));
  std::string sample = full;
  if (!label_values.empty()) {
    sample += '{';
    for (std::size_t i = 0; i < label_values.size(); ++i) {
      const auto& [label, text] = label_values[i];
      TIERFLOW_EXPECTS(valid_name(label, false) && label.rfind("__", 0) != 0,
                       "prometheus: invalid label name '" + label + "'");
      sample += (i ? "," : "") + label + "=\"" + escape_label(text) + "\"";
    }
    sample += '}';
  }
  it->second.samples.push_back(sample + " " + format_value(value));
}

std::string prometheus_writer::str() const {
  std::string out;
  for (const auto& name : order_) {
    const auto& f = families_.at(name);
    out += "# HELP " + name + " " + f.help + "\n";
    out += "# TYPE " + name + " " + f.type + "\n";
    for (const auto& s : f.samples) {
      out += s + "\n";
    }
  }
  return out;
}

trace_recorder::trace_recorder() : origin_(clock::now()) {}

double trace_recorder::micros(clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

int trace_recorder::track_id(std::string_view track) {
  const auto it = tracks_.find(track);
  if (it != tracks_.end()) {
    return it->second;
  }
  const int id = static_cast<int>(tracks_.size()) + 1;
  tracks_.emplace(std::string(track), id);
  return id;
}

void trace_recorder::span(std::string_view track, std::string_view name, clock::time_point start,
                          clock::time_point end, args arguments, std::string_view category) {
  TIERFLOW_EXPECTS(end >= start, "trace: span '" + std::string(name) + "' ends before it starts");
  const std::lock_guard lock(mutex_);
  entries_.push_back({'X', track_id(track), std::string(name), std::string(category), micros(start),
                      micros(end) - micros(start), std::move(arguments)});
}

void trace_recorder::instant(std::string_view track, std::string_view name, clock::time_point at,
                             args arguments) {
  const std::lock_guard lock(mutex_);
  entries_.push_back(
      {'i', track_id(track), std::string(name), "tierflow", micros(at), 0.0, std::move(arguments)});
}

std::size_t trace_recorder::size() const {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

std::string trace_recorder::json() const {
  const std::lock_guard lock(mutex_);
  json_writer w;
  w.begin_object().key("traceEvents").begin_array();
  for (const auto& [track, id] : tracks_) {
    w.begin_object();
    w.key("ph").value("M").key("name").value("thread_name").key("pid").value(1);
    w.key("tid").value(id).key("args").begin_object().key("name").value(track).end_object();
    w.end_object();
  }
  for (const auto& e : entries_) {
    w.begin_object();
    w.key("ph").value(std::string(1, e.phase)).key("name").value(e.name);
    w.key("cat").value(e.category).key("pid").value(1).key("tid").value(e.track);
    w.key("ts").value(e.start_us);
    if (e.phase == 'X') {
      w.key("dur").value(e.duration_us);
    } else {
      w.key("s").value("t");
    }
    w.key("args").begin_object();
    for (const auto& [key, value] : e.arguments) {
      w.key(key);
      std::visit([&](const auto& v) { w.value(v); }, value);
    }
    w.end_object();
    w.end_object();
  }
  w.end_array().key("displayTimeUnit").value("ms").end_object();
  return w.str();
}

}  // namespace tierflow::metrics
