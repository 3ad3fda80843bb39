#pragma once
// Timing helpers for the bench programs: a monotonic clock and median/spread of samples.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tierflow::bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
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
