#include "tierflow/error.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace tierflow {
namespace {

// An error is one line: control characters in any part of it (user text ends up in the
// problem too, e.g. an unknown key) are made visible. The offending text is also shortened.
std::string printable(const std::string& text, std::size_t max_chars) {
  std::string out;
  for (char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out;
}

std::string printable_excerpt(const std::string& text) {
  return printable(text, 80);
}

std::string format_input_error(const std::string& source, const std::string& problem,
                               const std::string& excerpt) {
  constexpr std::size_t unlimited = std::string::npos;
  std::string message = printable(source, unlimited) + ": " + printable(problem, unlimited);
  if (!excerpt.empty()) {
    message += ": '" + excerpt + "'";
  }
  return message;
}

}  // namespace

input_error::input_error(std::string source, std::string problem, std::string offending_text)
    : error(format_input_error(source, problem, printable_excerpt(offending_text))),
      source_(std::move(source)),
      problem_(std::move(problem)),
      offending_text_(printable_excerpt(offending_text)) {}

namespace {

std::string environment_message(const std::string& context, const std::string& resource,
                                int error_code) {
  std::string message =
      context.find(resource) == std::string::npos ? resource + ": " + context : context;
  if (error_code != 0) {
    message += std::string(": ") + std::strerror(error_code) + " (errno " +
               std::to_string(error_code) + ")";
  }
  return printable(message, std::string::npos);
}

}  // namespace

environment_error::environment_error(const std::string& context, std::string resource,
                                     int error_code)
    : error(environment_message(context, resource, error_code)),
      resource_(std::move(resource)),
      error_code_(error_code) {}

busy_error::busy_error(std::string call, const std::string& running)
    : error(call + ": refused: " + (running.empty() ? std::string("another call") : running) +
            " is in progress on this object in another thread (one call at a time; the refused "
            "call changed nothing)"),
      call_(std::move(call)) {}

std::string format_byte_count(std::uint64_t bytes) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    return std::to_string(bytes) + " B";
  }
  auto value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

out_of_capacity::out_of_capacity(std::string context, std::uint64_t requested_bytes,
                                 std::vector<tier_free> free)
    : context_(std::move(context)), requested_bytes_(requested_bytes), tiers_(std::move(free)) {
  message_ = context_ + ": " + format_byte_count(requested_bytes_) + " asked; free:";
  if (tiers_.empty()) {
    message_ += " (no tier)";
  }
  for (std::size_t i = 0; i < tiers_.size(); ++i) {
    message_ +=
        (i == 0 ? " " : ", ") + tiers_[i].tier + " " + format_byte_count(tiers_[i].free_bytes);
  }
}

namespace detail {
void throw_expects_failure(const char* condition, const std::string& message, const char* file,
                           int line) {
  throw error(std::string(file) + ":" + std::to_string(line) + ": expected " + condition + ": " +
              message);
}
}  // namespace detail

}  // namespace tierflow
