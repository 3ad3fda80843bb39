#include "common/flags.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tierflow/detail/parse.hpp"

namespace tierflow::cli {

std::string flag_number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

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
  const std::string range =
      "a finite number from " + flag_number_text(min) + " to " + flag_number_text(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        const std::string trimmed(detail::trim(text));
        char* end = nullptr;
        errno = 0;
        const double value = trimmed.empty() ? 0 : std::strtod(trimmed.c_str(), &end);
        const bool whole = !trimmed.empty() && end == trimmed.c_str() + trimmed.size();
        // ERANGE is also strtod's word for an underflow: a subnormal result (1e-320) is checked
        // against the range like any other value; an overflow (HUGE_VAL) or a number that
        // became 0 (1e-400) is refused.
        const bool out_of_double = errno == ERANGE && (std::fabs(value) >= 1.0 || value == 0.0);
        if (!whole || out_of_double || !std::isfinite(value) || value < min || value > max) {
          return "must be " + range + ": '" + text + "'";
        }
        return {};
      },
      range, "number_in");
}

CLI::Validator non_empty(const std::string& without) {
  return CLI::Validator(
      [without](std::string& text) -> std::string {
        if (detail::trim(text).empty()) {
          return "must not be empty (leave the flag out for " + without + "): '" + text + "'";
        }
        return {};
      },
      "TEXT", "non_empty");
}

}  // namespace tierflow::cli
