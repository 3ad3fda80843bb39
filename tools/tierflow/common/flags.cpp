#include "common/flags.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tierflow/detail/parse.hpp"

namespace tierflow::cli {
namespace {

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace

CLI::Validator count_in(std::uint64_t min, std::uint64_t max) {
  const std::string range =
      max == std::numeric_limits<std::uint64_t>::max()
          ? "a whole number >= " + std::to_string(min)
          : "a whole number from " + std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        const auto value = detail::parse_u64(text);
        if (!value || *value < min || *value > max) {
          return "must be " + range + ": '" + text + "'";
        }
        return {};
      },
      range, "count_in");
}

CLI::Validator number_in(double min, double max) {
  const std::string range = "a finite number from " + number_text(min) + " to " + number_text(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        const std::string trimmed(detail::trim(text));
        char* end = nullptr;
        errno = 0;
        const double value = trimmed.empty() ? 0 : std::strtod(trimmed.c_str(), &end);
        const bool whole = !trimmed.empty() && end == trimmed.c_str() + trimmed.size();
        if (!whole || errno == ERANGE || !std::isfinite(value) || value < min || value > max) {
          return "must be " + range + ": '" + text + "'";
        }
        return {};
      },
      range, "number_in");
}

}  // namespace tierflow::cli
