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

#include "tierflow/detail/stats.hpp"

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

/** Median, minimum and maximum of a set of samples (tierflow/detail/stats.hpp). */
using summary = detail::sample_summary;
using detail::summarize;

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
