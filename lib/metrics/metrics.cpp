#include "tierflow/metrics.hpp"

#include <cmath>
#include <cstdio>

#include "tierflow/error.hpp"

namespace tierflow::metrics {

void usage_counter::add(std::uint64_t amount) noexcept {
  const auto now = current_.fetch_add(amount, std::memory_order_relaxed) + amount;
  total_.fetch_add(amount, std::memory_order_relaxed);
  auto peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void usage_counter::sub(std::uint64_t amount) noexcept {
  // Giving back more than is held (a caller's size mismatch) stops at 0: a wrapped count would
  // read as 16 EiB held from then on.
  auto current = current_.load(std::memory_order_relaxed);
  while (!current_.compare_exchange_weak(current, current >= amount ? current - amount : 0,
                                         std::memory_order_relaxed)) {
  }
}

usage usage_counter::read() const noexcept {
  return {current_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
          total_.load(std::memory_order_relaxed)};
}

void link_counter::add(std::uint64_t bytes, double busy_seconds) noexcept {
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  transfers_.fetch_add(1, std::memory_order_relaxed);
  busy_ns_.fetch_add(static_cast<std::uint64_t>(busy_seconds * 1e9), std::memory_order_relaxed);
}

link_usage link_counter::read() const noexcept {
  return {bytes_.load(std::memory_order_relaxed), transfers_.load(std::memory_order_relaxed),
          static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) / 1e9};
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void json_writer::before_value() {
  TIERFLOW_EXPECTS(!done_, "json_writer: a value after the document ended");
  if (stack_.empty()) {
    return;
  }
  if (stack_.back()) {
    TIERFLOW_EXPECTS(!expecting_key_, "json_writer: a value where a key is due");
    expecting_key_ = true;
    return;
  }
  if (has_items_.back()) {
    out_ += ',';
  }
  has_items_.back() = true;
}

json_writer& json_writer::begin_object() {
  before_value();
  out_ += '{';
  stack_.push_back(true);
  has_items_.push_back(false);
  expecting_key_ = true;
  return *this;
}

json_writer& json_writer::end_object() {
  TIERFLOW_EXPECTS(!stack_.empty() && stack_.back() && expecting_key_,
                   "json_writer: end_object without a matching begin_object");
  out_ += '}';
  stack_.pop_back();
  has_items_.pop_back();
  expecting_key_ = !stack_.empty() && stack_.back();
  done_ = stack_.empty();
  return *this;
}

json_writer& json_writer::begin_array() {
  before_value();
  out_ += '[';
  stack_.push_back(false);
  has_items_.push_back(false);
  expecting_key_ = false;
  return *this;
}

json_writer& json_writer::end_array() {
  TIERFLOW_EXPECTS(!stack_.empty() && !stack_.back(),
                   "json_writer: end_array without a matching begin_array");
  out_ += ']';
  stack_.pop_back();
  has_items_.pop_back();
  expecting_key_ = !stack_.empty() && stack_.back();
  done_ = stack_.empty();
  return *this;
}

json_writer& json_writer::key(std::string_view name) {
  TIERFLOW_EXPECTS(!stack_.empty() && stack_.back() && expecting_key_,
                   "json_writer: a key outside an object");
  if (has_items_.back()) {
    out_ += ',';
  }
  has_items_.back() = true;
  out_ += json_quote(name);
  out_ += ':';
  expecting_key_ = false;
  return *this;
}

json_writer& json_writer::scalar(std::string_view text) {
  before_value();
  out_ += text;
  done_ = stack_.empty();
  return *this;
}

json_writer& json_writer::value(std::string_view text) {
  return scalar(json_quote(text));
}

json_writer& json_writer::value(double number) {
  if (!std::isfinite(number)) {
    return scalar("null");  // JSON has no inf or nan
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", number);
  return scalar(text);
}

json_writer& json_writer::value(std::uint64_t number) {
  return scalar(std::to_string(number));
}

json_writer& json_writer::value(std::int64_t number) {
  return scalar(std::to_string(number));
}

json_writer& json_writer::value(bool flag) {
  return scalar(flag ? "true" : "false");
}

json_writer& json_writer::null() {
  return scalar("null");
}

json_writer& json_writer::raw(std::string_view json) {
  return scalar(json);
}

std::string json_writer::str() const {
  TIERFLOW_EXPECTS(stack_.empty(), "json_writer: the document has unclosed objects or arrays");
  return out_;
}

}  // namespace tierflow::metrics
