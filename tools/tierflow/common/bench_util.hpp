#pragma once
// Timing helpers for the bench programs: a monotonic clock and median/spread of samples.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace tierflow::bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/** A count such as `4M` (K, M, G or Ki, Mi, Gi: powers of 1024) given to @p flag.
 * @throws CLI::ValidationError naming @p flag for a malformed, unknown-suffix or non-positive
 *         count */
inline std::size_t parse_count(const std::string& text, const std::string& flag) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw CLI::ValidationError(flag, "expected a count such as 4M: '" + text + "'");
  }
  const std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "Ki") {
    scale = 1024;
  } else if (unit == "M" || unit == "Mi") {
    scale = 1024.0 * 1024;
  } else if (unit == "G" || unit == "Gi") {
    scale = 1024.0 * 1024 * 1024;
  } else if (!unit.empty()) {
    throw CLI::ValidationError(flag, "unknown suffix '" + unit + "' (K, M or G)");
  }
  if (!(value > 0) || !std::isfinite(value * scale)) {
    throw CLI::ValidationError(flag, "must be finite and > 0: '" + text + "'");
  }
  return static_cast<std::size_t>(value * scale);
}

/** Median, minimum and maximum of a set of samples. */
struct summary {
  double median = 0;
  double min = 0;
  double max = 0;
  std::size_t samples = 0;
};

inline summary summarize(std::vector<double> values) {
  summary s;
  if (values.empty()) {
    return s;
  }
  std::sort(values.begin(), values.end());
  s.samples = values.size();
  s.min = values.front();
  s.max = values.back();
  const auto mid = values.size() / 2;
  s.median = values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
  return s;
}

/** A summary as JSON, its values multiplied by @p scale (e.g. 1e6 for seconds to us). */
inline nlohmann::ordered_json summary_json(const summary& s, double scale = 1.0) {
  return {{"median", s.median * scale},
          {"min", s.min * scale},
          {"max", s.max * scale},
          {"samples", s.samples}};
}

/** Keeps the compiler from dropping a computation whose result is otherwise unused. */
template <typename T>
inline void keep(T const& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

}  // namespace tierflow::bench
