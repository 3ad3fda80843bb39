#pragma once
// Median and spread of a set of samples: the one definition the library's accounting and every
// benchmark report.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace tierflow::detail {

/** @brief The median, minimum and maximum of a set of samples (all 0 when there are none). */
struct sample_summary {
  double median = 0;  ///< for an even count, the mean of the middle two
  double min = 0;
  double max = 0;
  std::size_t samples = 0;
};

/**
 * @brief Summarises @p values.
 * @param values taken by value: sorted here, the caller's order is kept
 * @return the median (the middle value; for an even count, the mean of the middle two, so one
 *         slow sample of two moves the median by half its excess), minimum, maximum and count
 */
inline sample_summary summarize(std::vector<double> values) {
  sample_summary s;
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

/** @brief The median of @p values as summarize() defines it; 0 when there are none. */
inline double median(std::vector<double> values) {
  return summarize(std::move(values)).median;
}

}  // namespace tierflow::detail
